"""Keys that draw, for one microbatch, the rows of what the whole batch would draw.

A pipeline runs each layer on microbatches of ``b`` rows, but dropout in `Stacked` on the
whole batch draws ``bernoulli(key, p, (M * b, ...))`` once per layer. A *microbatch key*
carries the layer's key plus the microbatch index ``m``; its bits for a shape
``(b, ...)`` are rows ``m``, ``m + M``, ..., ``m + (b - 1) * M`` of the bits the plain key
gives for ``(M * b, ...)``: the rows of microbatch m. Splitting and folding act on the plain key and keep ``m``, so every key a
block derives (``make_rng``, ``fold_in``, ``split``) stays a microbatch key. Draws of a
scalar shape are the plain key's. The cost: each microbatch computes the bits of the
whole batch and keeps its rows (M times the bits of an unpipelined draw).

>>> key = jax.random.key(0)
>>> full = jax.random.bernoulli(key, 0.5, (4, 3))
>>> parts = [jax.random.bernoulli(microbatch_keys(key, m, 2), 0.5, (2, 3)) for m in (0, 1)]
>>> bool((jnp.stack(parts, axis=1).reshape(4, 3) == full).all())  # rows m, m + 2
True
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import random as jax_random


def _plain(data: jax.Array, base: str) -> jax.Array:
  return jax.random.wrap_key_data(data[:-1], impl=base)


@functools.cache
def _impl(count: int, base: str, width: int) -> Any:
  """The key implementation for ``count`` microbatches over plain keys of ``base``."""

  def seed(_):
    raise TypeError('microbatch keys are made from a key with microbatch_keys, not seeded')

  def split(data, shape):
    keys = jax.random.key_data(jax.random.split(_plain(data, base), shape))
    return jnp.concatenate([keys, jnp.broadcast_to(data[-1:], (*shape, 1))], axis=-1)

  def fold_in(data, value):
    key = jax.random.key_data(jax.random.fold_in(_plain(data, base), value))
    return jnp.concatenate([key, data[-1:]])

  def random_bits(data, bit_width, shape):
    dtype = jnp.dtype(f'uint{bit_width}')
    if not shape:
      return jax.random.bits(_plain(data, base), shape, dtype)
    rows = shape[0]
    whole = jax.random.bits(_plain(data, base), (rows, count, *shape[1:]), dtype)
    return lax.dynamic_index_in_dim(whole, data[-1], axis=1, keepdims=False)

  return jax_random.define_prng_impl(
      key_shape=(width + 1,), seed=seed, split=split, random_bits=random_bits,
      fold_in=fold_in, name=f'microbatch{count}_{base}')


def microbatch_keys(keys: jax.Array, microbatch: Any, count: int) -> jax.Array:
  """``keys`` (typed, or raw ``uint32[..., 2]``) as keys of microbatch ``microbatch``.

  ``count`` is the number of microbatches the batch was split into.
  """
  if not jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
    keys = jax.random.wrap_key_data(keys)
  base = str(jax.random.key_impl(keys))
  data = jax.random.key_data(keys)
  index = jnp.broadcast_to(jnp.asarray(microbatch, jnp.uint32), (*data.shape[:-1], 1))
  impl = _impl(count, base, data.shape[-1])
  return jax.random.wrap_key_data(jnp.concatenate([data, index], axis=-1), impl=impl)


__all__ = ['microbatch_keys']
