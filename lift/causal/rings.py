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
  if ring is None:
    frames.read_by_position()
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
  frames.read_by_position()
  return jnp.take(value, positions(index, ring), axis=axis)


def by_distance(array: np.ndarray, query: int, key: int, ring: int) -> np.ndarray | None:
  """A known mask's row entries by distance `query - key`, in `[-1, ring)`, when they
  depend on that distance alone (a band mask), so rows past the array's length are known
  too; None otherwise. The query axis is removed, the key axis holds the `ring + 1`
  distances (-1: a key after the query, how slots not written yet read)."""
  moved = np.moveaxis(array, (query, key), (0, 1))
  if min(moved.shape[:2]) <= ring:
    return None
  table = []
  for distance in range(-1, ring):
    diagonal = np.diagonal(moved, -distance, 0, 1)
    if not np.all(diagonal == diagonal[..., :1]):
      return None
    table.append(diagonal[..., 0])
  return np.moveaxis(np.stack(table, axis=-1), -1, key - (key > query))


def distance_row(table: np.ndarray, axis: int, index: jax.Array, ring: int) -> jax.Array:
  """The row at query `index` of a mask given `by_distance`, in the ring's slot order."""
  return jnp.take(table, index - positions(index, ring) + 1, axis=axis)


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
