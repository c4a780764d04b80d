"""`flax.linen.normalization`'s names with this package's layers (``nn.normalization.LayerNorm``).

>>> nn.normalization.LayerNorm is nn.LayerNorm
True
"""
from linen_ext.layers.ready_made import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm
from linen_ext.layers.weight_norms import SpectralNorm, WeightNorm

__all__ = ['BatchNorm', 'GroupNorm', 'InstanceNorm', 'LayerNorm', 'RMSNorm', 'SpectralNorm',
           'WeightNorm']
