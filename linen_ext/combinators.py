"""`flax.linen.combinators`'s name for this package's `Sequential` (``nn.combinators.Sequential``).

>>> nn.combinators.Sequential is nn.Sequential
True
"""
from linen_ext.layers.ready_made import Sequential

__all__ = ['Sequential']
