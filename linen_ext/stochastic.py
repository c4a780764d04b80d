"""`flax.linen.stochastic`'s name for this package's `Dropout` (``nn.stochastic.Dropout``)."""
from linen_ext.layers.flax_layers import Dropout

__all__ = ['Dropout']
