"""`flax.linen.combinators`'s names for this package's `Sequential` (``nn.combinators.Sequential``).

>>> nn.combinators.Sequential is nn.Sequential
True
"""
from linen_ext.layers.ready_made import Sequential
from linen_ext.module import Module, compact

__all__ = ['Module', 'Sequential', 'compact']
