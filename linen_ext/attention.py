"""`flax.linen.attention`'s names with this package's layers (``nn.attention.SelfAttention``).

>>> y = nn.attention.dot_product_attention(q, k, v)
"""
from flax.linen.attention import (Array, DotGeneralT, Dtype, Initializer, PRNGKey, PrecisionLike,
                                  Shape, combine_masks, default_kernel_init,
                                  dot_product_attention, dot_product_attention_weights,
                                  make_attention_mask, make_causal_mask, merge_param,
                                  promote_dtype)

from linen_ext.layers.ready_made import (DenseGeneral, LayerNorm, MultiHeadAttention,
                                         MultiHeadDotProductAttention, SelfAttention)
from linen_ext.module import Module, compact

__all__ = ['Array', 'DenseGeneral', 'DotGeneralT', 'Dtype', 'Initializer', 'LayerNorm', 'Module',
           'MultiHeadAttention', 'MultiHeadDotProductAttention', 'PRNGKey', 'PrecisionLike',
           'SelfAttention', 'Shape', 'combine_masks', 'compact', 'default_kernel_init',
           'dot_product_attention', 'dot_product_attention_weights', 'make_attention_mask',
           'make_causal_mask', 'merge_param', 'promote_dtype']
