"""`flax.linen.dtypes`: Flax's dtype helpers (``from linen_ext.dtypes import promote_dtype``).

>>> from linen_ext.dtypes import canonicalize_dtype
>>> canonicalize_dtype(jnp.ones((1,), jnp.bfloat16), dtype=None)
dtype(bfloat16)
"""
from flax.linen.dtypes import Dtype, T, canonicalize_dtype, promote_dtype

__all__ = ['Dtype', 'T', 'canonicalize_dtype', 'promote_dtype']
