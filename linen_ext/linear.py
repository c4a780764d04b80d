"""`flax.linen.linear`'s names with this package's layers, so ``nn.linear.Dense`` ports.

>>> nn.linear.Dense(4) is not None and nn.linear.default_kernel_init is not None
True
"""
from flax.linen.linear import (PromoteDtypeFn, canonicalize_padding, default_embed_init,
                               default_kernel_init)

from linen_ext.layers.ready_made import Conv, ConvLocal, ConvTranspose, Dense, DenseGeneral, Einsum, Embed

__all__ = ['Conv', 'ConvLocal', 'ConvTranspose', 'Dense', 'DenseGeneral', 'Einsum', 'Embed',
           'PromoteDtypeFn', 'canonicalize_padding', 'default_embed_init', 'default_kernel_init']
