"""Key caches of attention under `as_scan`: the whole history, or a ring.

A cache holds a stream's elements along its time axis: all of them (zeros
after the current step) or, under a sliding window of `ring` keys, the last
`ring` of them, element `e` in slot `e % ring`. A row read against a ring
has `ring` entries in slot order; `positions` says which key each slot
holds, so that rows of masks and other known values can be gathered to
match.
"""
from __future__ import annotations

from typing import Any

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from lift import _compat
from lift.causal import frames


def from_prefix(aval: Any, prefix: jax.Array, axis: int, length: int,
                ring: int | None) -> jax.Array:
  """The cache after the first `length` elements (`prefix`, along `axis`)."""
  if ring is None:
    cache = jnp.zeros(aval.shape, aval.dtype)
    return lax.dynamic_update_slice_in_dim(cache, prefix, 0, axis)
  return jnp.moveaxis(frames.delay_prefill(prefix, axis, length - ring, ring), 0, axis)


def write(cache: jax.Array, frame: jax.Array, index: jax.Array, axis: int,
          ring: int | None) -> jax.Array:
  """Stores element `index` of the stream."""
  slot = index if ring is None else jnp.remainder(index, ring)
  return lax.dynamic_update_index_in_dim(cache, frame, slot, axis)


def positions(index: jax.Array, ring: int) -> jax.Array:
  """The key each slot of a ring holds at query `index`. Slots not written
  yet read as the key after the query (a key the masks hide)."""
  slots = jnp.arange(ring, dtype=jnp.int32)
  held = index - jnp.remainder(index - slots, ring)
  return jnp.where(held < 0, index + 1, held)


def key_row(value: jax.Array, axis: int, index: jax.Array, ring: int | None):
  """`value`'s entries along key axis `axis` in the ring's slot order."""
  if ring is None or value.shape[axis] == 1:
    return value
  return jnp.take(value, positions(index, ring), axis=axis)


def compact(value: Any) -> Any:
  """A concrete array with its broadcast axes (every slice alike) cut to
  size 1, so a step closes over a mask's `[T, T]`, not `[batch, heads, T, T]`;
  None for other values."""
  if value is None or isinstance(value, _compat.Tracer) or not np.ndim(value):
    return None
  array = np.asarray(value)
  for axis in range(array.ndim):
    first = array.take([0], axis)
    if array.shape[axis] > 1 and np.array_equal(array, np.broadcast_to(first, array.shape)):
      array = first
  return array


def resized(shape, axis: int, ring: int | None) -> tuple:
  """`shape` with the key axis `axis` holding `ring` entries."""
  shape = list(shape)
  if ring is not None:
    shape[axis] = ring
  return tuple(shape)
