"""`flax.linen.stochastic`'s names for this package's `Dropout` (``nn.stochastic.Dropout``)."""
from flax.linen.stochastic import PRNGKey, merge_param

from linen_ext.layers.ready_made import Dropout
from linen_ext.module import Module, compact

__all__ = ['Dropout', 'Module', 'PRNGKey', 'compact', 'merge_param']
