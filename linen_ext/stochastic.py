"""`flax.linen.stochastic`'s name for this package's `Dropout` (``nn.stochastic.Dropout``)."""
from linen_ext.layers.ready_made import Dropout

__all__ = ['Dropout']
