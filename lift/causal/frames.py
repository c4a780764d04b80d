"""Elements of values along the scan axis: step slices, prefixes, delays.

A delay line holds the last `delay` elements of a stream in a ring: element
`e` lives in slot `e % delay`, so one step reads element `e` and writes
element `e + delay` into the same slot, touching one frame only.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from lift import _compat


class PositionReads:
  """Whether a step read a value by its position along time (a full-length cache, a
  table of the example's length): such a step is right only below that length."""

  def __init__(self):
    self.bounded = False


_watching = threading.local()


@contextlib.contextmanager
def watching_positions() -> Iterator[PositionReads]:
  """Records, while a step runs, whether it reads anything by position."""
  outer = getattr(_watching, "reads", None)
  _watching.reads = reads = PositionReads()
  try:
    yield reads
  finally:
    _watching.reads = outer


def read_by_position() -> None:
  """Called by rules whose step reads or writes a full-length value at the step's
  position: the step is then bounded by the example's length."""
  reads = getattr(_watching, "reads", None)
  if reads is not None:
    reads.bounded = True


def step_slice(value: Any, axis: int, index: jax.Array, *,
               unused_past_end: bool = False) -> jax.Array:
  """Element `index` of an unscanned `value` along `axis`.

  A size-1 axis broadcasts: its only element serves every step. With
  `unused_past_end` the caller discards the element at indices past the value's
  end, so the step is not bounded by it.
  """
  if np.shape(value)[axis] == 1 or _uniform_along(value, axis):
    return lax.index_in_dim(value, 0, axis, keepdims=False)
  if not unused_past_end:
    read_by_position()
  return lax.dynamic_index_in_dim(value, index, axis, keepdims=False)


# Larger concrete values are not read back to the host to look for uniform axes.
_UNIFORM_CHECK_SIZE = 1 << 22


def _uniform_along(value: Any, axis: int) -> bool:
  """Whether a concrete `value` (a hoisted constant: zeros, a broadcast table) has every
  element along `axis` alike, so that any step may read the first."""
  if (isinstance(value, _compat.Tracer) or not isinstance(value, (np.ndarray, jax.Array))
      or np.size(value) > _UNIFORM_CHECK_SIZE
      or not getattr(value, 'is_fully_addressable', True)):  # parts on other processes
    return False
  array = np.asarray(value)
  return bool(np.all(array == np.take(array, [0], axis)))


def prefix_slice(value: Any, axis: int, length: int) -> jax.Array:
  """Elements `[0, length)` of an unscanned `value` along `axis`."""
  if np.shape(value)[axis] == 1:
    return value
  return lax.slice_in_dim(value, 0, length, axis=axis)


def empty_prefix(aval: Any, axis: int) -> np.ndarray:
  """A prefix of no elements: `aval`'s shape with length 0 along `axis`."""
  shape = list(aval.shape)
  shape[axis] = 0
  return np.zeros(shape, aval.dtype)


def window(prefix: Any, axis: int, start: int, count: int) -> jax.Array:
  """Elements `[start, start + count)` of a prefix, stacked on axis 0.

  Elements before 0 (padding before the sequence) are zeros.
  """
  frames = jnp.moveaxis(prefix, axis, 0)
  kept = frames[max(start, 0):start + count]
  missing = count - kept.shape[0]
  if missing:
    zeros = jnp.zeros((missing, *frames.shape[1:]), frames.dtype)
    kept = jnp.concatenate([zeros, kept])
  return kept


def delay_prefill(prefix: Any, axis: int, start: int, delay: int):
  """A delay line holding elements `[start, start + delay)` of a stream."""
  return jnp.roll(window(prefix, axis, start, delay), start % delay, axis=0)


def delay_step(buffer: jax.Array, index: jax.Array, frame: jax.Array):
  """Reads element `index` and stores `frame`, element `index + delay`."""
  slot = jnp.remainder(index, buffer.shape[0])
  out = lax.dynamic_index_in_dim(buffer, slot, 0, keepdims=False)
  return lax.dynamic_update_index_in_dim(buffer, frame, slot, 0), out


def shift_in(buffer: jax.Array, frame: jax.Array) -> jax.Array:
  """`buffer` (oldest element first) followed by `frame`, one longer."""
  return jnp.concatenate([buffer, frame[None]], axis=0)
