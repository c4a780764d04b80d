"""`causal_self_attention` with a KV-cache step for `as_scan`, in two implementations.

Layout as `flax.linen.dot_product_attention`: `[batch..., length, heads,
features]`; keys and values may have fewer heads than the queries (grouped-query
attention: query head i reads key/value head ``i // (heads // kv_heads)``). Under
`as_scan` the length axis (-3) is the step axis when the scan axis arrives there:
inputs `[T, heads, features]` built from `xs` of shape `[T, ...]`, or `[batch, T,
heads, features]` after moving time to axis 1 inside the function. If time is one of
the batch axes instead, each step attends within its own whole sequence and the full
form runs per step.

``implementation='flash'`` computes the full form with the Pallas TPU flash-attention
kernel that ships with JAX, which never materialises the ``[length, length]`` scores;
the default, ``None``, picks it on a TPU target (`lift/causal/attention_choice.py`).
The step and prefill forms are the same for both implementations, so a model trained
with the kernel decodes with the same KV cache.
"""
from __future__ import annotations

import functools
import importlib
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from lift.causal.attention_choice import choose_attention
from lift.causal.custom import CustomCausal, custom_causal
from lift.errors import AttentionArgumentError

IMPLEMENTATIONS = (None, 'xla', 'flash')


class KVCache(NamedTuple):
  """Keys `[batch..., kv_heads, feat, length]` and values `[batch..., kv_heads, length,
  feat]` of every position: the layouts the step's two products read without a transpose."""
  keys: jax.Array
  values: jax.Array


def _scaled(query: jax.Array) -> jax.Array:
  depth = query.shape[-1]
  return query / jnp.sqrt(depth).astype(query.dtype)


def _weights(logits: jax.Array, visible: jax.Array, dtype) -> jax.Array:
  logits = jnp.where(visible, logits, jnp.finfo(logits.dtype).min)
  return jax.nn.softmax(logits).astype(dtype)


def _grouped(query: jax.Array, kv_heads: int) -> jax.Array:
  """``[..., heads, features]`` as ``[..., kv_heads, heads // kv_heads, features]``."""
  return query.reshape(*query.shape[:-2], kv_heads, -1, query.shape[-1])


def _reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """The full form in XLA: every score of the ``[length, length]`` matrix."""
  length = q.shape[-3]
  visible = jnp.tril(jnp.ones((length, length), bool))
  if k.shape[-2] == q.shape[-2]:  # Flax's products, to the bit
    logits = jnp.einsum("...qhd,...khd->...hqk", _scaled(q), k)
    return jnp.einsum("...hqk,...khd->...qhd", _weights(logits, visible, q.dtype), v)
  logits = jnp.einsum("...qhgd,...khd->...hgqk", _grouped(_scaled(q), k.shape[-2]), k)
  out = jnp.einsum("...hgqk,...khd->...qhgd", _weights(logits, visible, q.dtype), v)
  return out.reshape(q.shape[:-1] + v.shape[-1:])


def _flash(q: jax.Array, k: jax.Array, v: jax.Array, mesh_axes) -> jax.Array:
  """The full form by the kernel: batch axes flattened into one, and, with ``mesh_axes``,
  the kernel run on each device's shard (XLA cannot split a kernel call itself)."""
  batch = q.shape[:-3]
  q, k, v = (x.reshape((-1,) + x.shape[-3:]) for x in (q, k, v))
  # Loaded on first use: importing Pallas costs every `import lift` a tenth of a second.
  kernel = importlib.import_module('lift.causal.flash').flash_kernel
  if mesh_axes is not None:
    spec = PartitionSpec(*mesh_axes)
    kernel = jax.shard_map(kernel, in_specs=(spec,) * 3, out_specs=spec, check_vma=False)
  out = kernel(q, k, v)
  return out.reshape(batch + out.shape[1:])


def _init(q, k, v) -> KVCache:
  del q
  *batch, length, heads, depth = k.shape
  return KVCache(jnp.zeros((*batch, heads, depth, length), k.dtype),
                 jnp.zeros((*batch, heads, length, v.shape[-1]), v.dtype))


def _step(cache: KVCache, index: jax.Array, q, k, v):
  keys = lax.dynamic_update_index_in_dim(cache.keys, k, index, cache.keys.ndim - 1)
  values = lax.dynamic_update_index_in_dim(cache.values, v, index, cache.values.ndim - 2)
  visible = jnp.arange(keys.shape[-1], dtype=jnp.int32) <= index
  if k.shape[-2] == q.shape[-2]:
    logits = jnp.einsum("...hd,...hdk->...hk", _scaled(q), keys)
    weights = _weights(logits, visible, q.dtype)
    return KVCache(keys, values), jnp.einsum("...hk,...hkd->...hd", weights, values)
  logits = jnp.einsum("...hgd,...hdk->...hgk", _grouped(_scaled(q), k.shape[-2]), keys)
  out = jnp.einsum("...hgk,...hkd->...hgd", _weights(logits, visible, q.dtype), values)
  return KVCache(keys, values), out.reshape(q.shape[:-1] + v.shape[-1:])


def _prefill(cache: KVCache, q, k, v):
  keys = lax.dynamic_update_slice_in_dim(cache.keys, jnp.moveaxis(k, -3, -1), 0, -1)
  values = lax.dynamic_update_slice_in_dim(cache.values, jnp.moveaxis(v, -3, -2), 0, -2)
  return KVCache(keys, values), _reference(q, k, v)


def _with_cache_rules(fun) -> CustomCausal:
  causal = custom_causal(fun, axis=-3)
  assert isinstance(causal, CustomCausal)
  causal.def_init(_init)
  causal.def_step(_step)
  causal.def_prefill(_prefill)
  return causal


_xla_attention = _with_cache_rules(_reference)


@functools.cache
def _flash_attention(mesh_axes: tuple | None) -> CustomCausal:
  return _with_cache_rules(functools.partial(_flash, mesh_axes=mesh_axes))


def _check(q: jax.Array, k: jax.Array, v: jax.Array, implementation, mesh_axes) -> None:
  if implementation not in IMPLEMENTATIONS:
    raise AttentionArgumentError('implementation', repr(implementation),
                                 f'one of {IMPLEMENTATIONS}')
  shapes = [jnp.shape(x) for x in (q, k, v)]
  if any(len(s) < 3 for s in shapes) or shapes[1] != shapes[2] or (
      shapes[0][:-2] != shapes[1][:-2] or shapes[0][-1] != shapes[1][-1]
      or shapes[0][-2] % shapes[1][-2]):
    raise AttentionArgumentError(
        'q, k, v', f'shapes {shapes[0]}, {shapes[1]}, {shapes[2]}',
        '[batch..., length, heads, features] for q and [batch..., length, kv_heads, '
        'features] for k and v, with kv_heads dividing heads')
  if mesh_axes is not None and (len(mesh_axes) != 4 or mesh_axes[1] or mesh_axes[3]):
    raise AttentionArgumentError(
        'mesh_axes', repr(mesh_axes), 'the mesh axes of [batch, length, heads, features] '
        "with length and features unsharded, e.g. PartitionSpec('data', None, 'model', None)")


def causal_self_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                          implementation: str | None = None,
                          mesh_axes: PartitionSpec | tuple | None = None) -> jax.Array:
  """Causal dot-product attention along the length axis (-3).

  Matches `flax.linen.dot_product_attention` with a causal mask: logits
  scaled by `1/sqrt(features)`, softmax over keys. Keys and values may have
  fewer heads than the queries (grouped-query attention). Under `as_scan` it
  steps with a KV cache of the full length (of the key/value heads). Not for
  bidirectional attention or other masks: use `flax.linen.dot_product_attention`.

  Args:
    q: queries, `[batch..., length, heads, features]`.
    k: keys, `[batch..., length, kv_heads, features]`, `kv_heads` dividing `heads`.
    v: values, shaped like `k`.
    implementation: ``None``: the best form for where this compiles: the flash kernel
      on a TPU target when it takes the shapes and can be placed, the XLA form
      elsewhere (the rule: `choose_attention`, which also says what a call would
      pick); ``'xla'``: the scores as one XLA product (Flax's numbers);
      ``'flash'``: JAX's Pallas flash-attention kernel for TPU (compiles only for
      TPU; on CPU it runs under
      `jax.experimental.pallas.tpu.force_tpu_interpret_mode`), which never holds
      the ``[length, length]`` scores.
    mesh_axes: for the kernel under a mesh, the mesh axes of ``q``'s
      ``[batch, length, heads, features]`` (for example ``nn.logical_to_mesh_axes``
      of its logical names): the kernel then runs on each device's shard. By
      default they come from the logical axis rules in context, for the names
      ``('batch', 'length', 'heads', 'kv')``.

  Returns:
    `[batch..., length, heads, features]`.

  Raises:
    AttentionArgumentError: an unknown ``implementation``, mismatched shapes, or
      ``mesh_axes`` that shard the length or features.

  Examples:
    >>> x = jnp.ones((3, 2, 4))
    >>> causal_self_attention(x, x, x).shape
    (3, 2, 4)
  """
  _check(q, k, v, implementation, mesh_axes)
  choice = choose_attention(q, k, implementation, mesh_axes)
  if choice.implementation == 'flash':
    return _flash_attention(choice.mesh_axes)(q, k, v)
  return _xla_attention(q, k, v)
