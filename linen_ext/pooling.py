"""`flax.linen.pooling`: Flax's pooling functions (``from linen_ext.pooling import max_pool``).

>>> from linen_ext.pooling import max_pool
>>> max_pool(jnp.arange(4.0).reshape(1, 4, 1), (2,), strides=(2,)).ravel()
Array([1., 3.], dtype=float32)
"""
from flax.linen.pooling import avg_pool, max_pool, min_pool, pool

__all__ = ['avg_pool', 'max_pool', 'min_pool', 'pool']
