"""`flax.linen.attention`'s names with this package's layers (``nn.attention.SelfAttention``).

>>> y = nn.attention.dot_product_attention(q, k, v)
"""
from flax.linen.attention import (combine_masks, dot_product_attention,
                                  dot_product_attention_weights, make_attention_mask,
                                  make_causal_mask)

from linen_ext.layers.ready_made import MultiHeadAttention, MultiHeadDotProductAttention, SelfAttention

__all__ = ['MultiHeadAttention', 'MultiHeadDotProductAttention', 'SelfAttention',
           'combine_masks', 'dot_product_attention', 'dot_product_attention_weights',
           'make_attention_mask', 'make_causal_mask']
