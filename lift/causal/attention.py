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
  """Keys `[batch..., heads, feat, length]` and values `[batch..., heads, length, feat]`
  of every position: the layouts the step's two products read without a transpose."""
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
  *batch, length, heads, depth = k.shape
  return KVCache(jnp.zeros((*batch, heads, depth, length), k.dtype),
                 jnp.zeros((*batch, heads, length, v.shape[-1]), v.dtype))


@causal_self_attention.def_step
def _step(cache: KVCache, index: jax.Array, q, k, v):
  keys = lax.dynamic_update_index_in_dim(cache.keys, k, index, cache.keys.ndim - 1)
  values = lax.dynamic_update_index_in_dim(cache.values, v, index, cache.values.ndim - 2)
  logits = jnp.einsum("...hd,...hdk->...hk", _scaled(q), keys)
  visible = jnp.arange(keys.shape[-1], dtype=jnp.int32) <= index
  weights = _weights(logits, visible, q.dtype)
  return KVCache(keys, values), jnp.einsum("...hk,...hkd->...hd", weights, values)


@causal_self_attention.def_prefill
def _prefill(cache: KVCache, q, k, v):
  keys = lax.dynamic_update_slice_in_dim(cache.keys, jnp.moveaxis(k, -3, -1), 0, -1)
  values = lax.dynamic_update_slice_in_dim(cache.values, jnp.moveaxis(v, -3, -2), 0, -2)
  return KVCache(keys, values), causal_self_attention.fun(q, k, v)
