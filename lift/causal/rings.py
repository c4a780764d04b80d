"""Key caches of attention under `as_scan`: the whole history, or a ring.

A cache holds a stream's elements along its time axis: all of them (zeros
after the current step) or, under a sliding window of `ring` keys, the last
`ring` of them, element `e` in slot `e % ring`. A row read against a ring
has `ring` entries in slot order; `positions` says which key each slot
holds, so that rows of masks and other known values can be gathered to
match.
"""
from __future__ import annotations

from typing import Any, NamedTuple

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


class DotLayout(NamedTuple):
  """How a cache read by a `dot_general` is stored: its operand's axes in the order
  the product reads without a transpose (batch, then free and contracting axes for
  the lhs, contracting and free axes for the rhs), axes of size 1 dropped. Free
  axes keep their order, so the product's result is unchanged. Measured: the
  transposes a cache in the operand's own layout costs at every step take more
  time than the step's matmuls on small models (`examples/benchmarks/decode.py`).

  Attributes:
    order: the operand's axes, in stored order (size-1 axes included).
    shape: the operand's shape in that order.
    time: the time axis of the operand.
    numbers: the product's dimension numbers with the operand in `order`.
  """
  order: tuple[int, ...]
  shape: tuple[int, ...]
  time: int
  numbers: Any

  @classmethod
  def of(cls, aval: Any, time: int, numbers, side: int) -> DotLayout:
    """The layout of operand `side` of a product with dimension `numbers`."""
    (lc, rc), (lb, rb) = numbers
    contracting, batch = (lc, rc)[side], (lb, rb)[side]
    free = [d for d in range(aval.ndim) if d not in contracting and d not in batch]
    order = (*batch, *([*free, *contracting] if side == 0 else [*contracting, *free]))
    place = {axis: i for i, axis in enumerate(order)}
    groups = [list(group) for group in numbers]
    for group in groups:
      group[side] = tuple(place[d] for d in group[side])
    return cls(order, tuple(aval.shape[a] for a in order), time,
               tuple(tuple(group) for group in groups))

  @property
  def axis(self) -> int:
    """The time axis of the stored cache."""
    return self._stored_shape(False).index(-1)

  def _stored_shape(self, frame: bool) -> list[int]:
    """Size-1 axes dropped; the time axis (a ring's size or the length) inferred."""
    shape = []
    for axis, size in zip(self.order, self.shape):
      if axis == self.time and not frame:
        shape.append(-1)
      elif axis != self.time and size != 1:
        shape.append(size)
    return shape

  def store(self, whole: jax.Array) -> jax.Array:
    """A cache in the operand's layout, stored."""
    return jnp.transpose(whole, self.order).reshape(self._stored_shape(False))

  def frame(self, element: jax.Array) -> jax.Array:
    """One element of the operand (time removed), in the stored layout."""
    order = tuple(a - (a > self.time) for a in self.order if a != self.time)
    return jnp.transpose(element, order).reshape(self._stored_shape(True))

  def read(self, cache: jax.Array) -> jax.Array:
    """The stored cache as the product's operand (size-1 axes restored)."""
    return cache.reshape([-1 if axis == self.time else size
                          for axis, size in zip(self.order, self.shape)])
