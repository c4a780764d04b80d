"""`flax.linen.linear`'s names with this package's layers, so ``nn.linear.Dense`` ports.

Flax's helpers are Flax's own functions, among them the private ones layers written after
``DenseGeneral`` and ``Conv`` use (a LoRA adapter normalizing its axes with
``_canonicalize_tuple`` and ``_normalize_axes``); ``_Conv``, the base of ``Conv`` and
``ConvLocal``, is this package's, for a convolution that defines its own ``shared_weights``.

>>> nn.linear.Dense is nn.Dense and nn.linear._normalize_axes((-1, 0), 3)
(0, 2)
"""
from flax.linen.linear import (Array, ConvGeneralDilatedT, DotGeneralT, Dtype, Initializer,
                               LaxPadding, PaddingLike, PrecisionLike, PRNGKey, PromoteDtypeFn,
                               Shape, ShapedArray, canonicalize_padding, default_embed_init,
                               default_kernel_init, eval_shape, promote_dtype)
from flax.linen.linear import _canonicalize_tuple as _canonicalize_tuple
from flax.linen.linear import _conv_dimension_numbers as _conv_dimension_numbers
from flax.linen.linear import _normalize_axes as _normalize_axes

from linen_ext.layers.ready_made import (Conv, ConvLocal, ConvTranspose, Dense, DenseGeneral,
                                         Einsum, Embed)
from linen_ext.layers.ready_made import _Conv as _Conv
from linen_ext.module import Module, compact

__all__ = ['Array', 'Conv', 'ConvGeneralDilatedT', 'ConvLocal', 'ConvTranspose', 'Dense',
           'DenseGeneral', 'DotGeneralT', 'Dtype', 'Einsum', 'Embed', 'Initializer', 'LaxPadding',
           'Module', 'PRNGKey', 'PaddingLike', 'PrecisionLike', 'PromoteDtypeFn', 'Shape',
           'ShapedArray', 'canonicalize_padding', 'compact', 'default_embed_init',
           'default_kernel_init', 'eval_shape', 'promote_dtype']
