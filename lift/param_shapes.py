"""The shapes a parameter's initializer makes, computed once per initializer and arguments.

`Scope.param` checks an existing parameter against the shapes its ``init_fn``
would make. Running the initializer abstractly (`jax.eval_shape`) costs a trace
per parameter per `apply`, most of the trace time of a model made of small
layers; the answer depends only on the initializer and its arguments, so it is
kept in a cache keyed by them.

Only keys built from plain values are cached: a function's code with the values
it closes over and its defaults, or a `functools.partial`, where every value is
a number, string, dtype, class, ``None`` or a tuple or list of those (a shape
given as a list, as `LayerNorm` gives it). Anything else (an
array argument, a bound method, an object with state) is traced every time, as
before, so a cached answer can never be stale.
"""
from __future__ import annotations

import functools
import types
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np
from flax.core import meta
from flax.core import spmd

_CACHE_SIZE = 4096
_MAX_DEPTH = 8
_PLAIN_SCALARS = (bool, int, float, complex, str, bytes, type(None), np.dtype, np.generic)


class _NotPlain(Exception):
  """A value that cannot be part of a cache key."""


def _plain(value: Any, depth: int = 0) -> Hashable:
  """``value`` as part of a cache key, with its type (so 1 and 1.0 differ)."""
  if depth > _MAX_DEPTH:  # e.g. a function that closes over itself
    raise _NotPlain
  if isinstance(value, _PLAIN_SCALARS):
    return type(value), value
  if isinstance(value, type):  # a dtype given as its scalar type: jnp.float32, float
    return type, value
  if isinstance(value, (tuple, list)):  # a list is read now, as the initializer reads it
    return type(value), tuple(_plain(v, depth + 1) for v in value)
  if isinstance(value, (types.FunctionType, functools.partial)):
    return _function_key(value, depth + 1)
  raise _NotPlain


def _function_key(fn: Any, depth: int = 0) -> Hashable:
  if isinstance(fn, functools.partial):
    return (functools.partial, _function_key(fn.func, depth + 1), _plain(fn.args, depth),
            _plain(tuple(sorted(fn.keywords.items())), depth))
  if not isinstance(fn, types.FunctionType):
    raise _NotPlain
  try:
    cells = tuple(cell.cell_contents for cell in fn.__closure__ or ())
  except ValueError:  # a cell not assigned yet
    raise _NotPlain from None
  return (fn.__code__, id(fn.__globals__), _plain(cells, depth),
          _plain(fn.__defaults__ or (), depth),
          _plain(tuple(sorted((fn.__kwdefaults__ or {}).items())), depth))


def _key(init_fn: Callable, init_args: tuple, init_kwargs: dict) -> Hashable | None:
  try:
    return (jax.config.read("jax_enable_x64"), _function_key(init_fn), _plain(init_args),
            _plain(tuple(sorted(init_kwargs.items()))))
  except _NotPlain:
    return None


def _trace(init_fn: Callable, init_args: tuple, init_kwargs: dict) -> Any:
  # Without axis rules: a box's sharding constraint does not change its shape, and Flax's
  # DenseGeneral boxes its flat kernel with the names of the reshaped one.
  with spmd.logical_axis_rules(()):
    shapes = jax.eval_shape(lambda: init_fn(jax.random.key(0), *init_args, **init_kwargs))
  return meta.unbox(shapes)


_cache: dict[Hashable, Any] = {}


def expected_shapes(init_fn: Callable, init_args: tuple, init_kwargs: dict) -> Any:
  """The `jax.ShapeDtypeStruct` tree ``init_fn(key, *init_args, **init_kwargs)`` makes,
  without axis-metadata boxes.

  Examples:
    >>> import jax.numpy as jnp
    >>> expected_shapes(jax.nn.initializers.lecun_normal(), ((3, 4),), {})
    ShapeDtypeStruct(shape=(3, 4), dtype=float32)
  """
  key = _key(init_fn, init_args, init_kwargs)
  if key is None:
    return _trace(init_fn, init_args, init_kwargs)
  found = _cache.get(key)
  if found is None:
    found = _trace(init_fn, init_args, init_kwargs)
    if len(_cache) >= _CACHE_SIZE:
      _cache.clear()
    _cache[key] = found
  return found
