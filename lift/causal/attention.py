"""`causal_self_attention` with a KV-cache step for `as_scan`.

Layout as `flax.linen.dot_product_attention`: `[batch..., length, heads,
features]`. Under `as_scan` the length axis (-3) is the step axis when the
scan axis arrives there: inputs `[T, heads, features]` built from `xs` of
shape `[T, ...]`, or `[batch, T, heads, features]` after moving time to
axis 1 inside the function. If time is one of the batch axes instead, each
step attends within its own whole sequence and the full form runs per step.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from lift.causal.custom import custom_causal


class KVCache(NamedTuple):
  """Keys and values of every position, `[batch..., length, heads, feat]`."""
  keys: jax.Array
  values: jax.Array


def _scaled(query: jax.Array) -> jax.Array:
  depth = query.shape[-1]
  return query / jnp.sqrt(depth).astype(query.dtype)


def _weights(logits: jax.Array, visible: jax.Array, dtype) -> jax.Array:
  logits = jnp.where(visible, logits, jnp.finfo(logits.dtype).min)
  return jax.nn.softmax(logits).astype(dtype)


@custom_causal(axis=-3)
def causal_self_attention(q: jax.Array, k: jax.Array,
                          v: jax.Array) -> jax.Array:
  """Causal dot-product attention along the length axis (-3).

  Matches `flax.linen.dot_product_attention` with a causal mask: logits
  scaled by `1/sqrt(features)`, softmax over keys. Under `as_scan` it steps
  with a KV cache of the full length. Not for bidirectional attention or
  other masks: use `flax.linen.dot_product_attention`.

  Args:
    q: queries, `[batch..., length, heads, features]`.
    k: keys, shaped like `q`.
    v: values, shaped like `q`.

  Returns:
    `[batch..., length, heads, features]`.

  Examples:
    >>> x = jnp.ones((3, 2, 4))
    >>> causal_self_attention(x, x, x).shape
    (3, 2, 4)
  """
  length = q.shape[-3]
  logits = jnp.einsum("...qhd,...khd->...hqk", _scaled(q), k)
  visible = jnp.tril(jnp.ones((length, length), bool))
  weights = _weights(logits, visible, q.dtype)
  return jnp.einsum("...hqk,...khd->...qhd", weights, v)


@causal_self_attention.def_init
def _init(q, k, v) -> KVCache:
  del q
  return KVCache(jnp.zeros(k.shape, k.dtype), jnp.zeros(v.shape, v.dtype))


@causal_self_attention.def_step
def _step(cache: KVCache, index: jax.Array, q, k, v):
  axis = cache.keys.ndim - 3
  keys = lax.dynamic_update_index_in_dim(cache.keys, k, index, axis)
  values = lax.dynamic_update_index_in_dim(cache.values, v, index, axis)
  logits = jnp.einsum("...hd,...khd->...hk", _scaled(q), keys)
  visible = jnp.arange(keys.shape[axis], dtype=jnp.int32) <= index
  weights = _weights(logits, visible, q.dtype)
  return KVCache(keys, values), jnp.einsum("...hk,...khd->...hd", weights,
                                           values)


@causal_self_attention.def_prefill
def _prefill(cache: KVCache, q, k, v):
  axis = cache.keys.ndim - 3
  keys = lax.dynamic_update_slice_in_dim(cache.keys, k, 0, axis)
  values = lax.dynamic_update_slice_in_dim(cache.values, v, 0, axis)
  return KVCache(keys, values), causal_self_attention.fun(q, k, v)
