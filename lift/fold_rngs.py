"""Lifted `fold_rngs`: inside, every lifted stream forgets its suffix (the path to the scope).

A draw inside then depends on the raw key, the names below the lifted scope and
the counter, not on where the scope sits in the tree; counters continue the
outer scope's. This is ``flax.core.lift.fold_rngs``, which gives the keys
``flax.core.lift.jit`` draws (our `jit` keeps the suffix and so draws the keys of
the un-jitted program instead).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from lift.filters import Filter
from lift.pack import pack


def _without_suffix(rng_groups: Any) -> tuple[Any, ...]:
  # dataclasses.replace keeps the stream's type (a `jit` stream stays one).
  return tuple(tuple({name: dataclasses.replace(stream, suffix=())
                      for name, stream in streams.items()} for streams in group)
               for group in rng_groups)


def _fold_groups(fn, scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
  scope = scope_fn(variable_groups, _without_suffix(rng_groups))
  y = fn(scope, *args, **kwargs)
  return y, repack_fn(scope)


def fold_rngs(fn: Callable[..., Any], variables: Filter = True,
              rngs: Filter = True) -> Callable[..., Any]:
  """Lifted ``fn(scope, *args)`` whose rng streams drop the scope's path from their suffix.

  The n-th draw of stream ``s`` in a child ``c`` of the lifted scope is
  ``fold_in_static(raw_key, (c, counter))`` instead of ``fold_in_static(raw_key,
  (*path, c, counter))``; counters continue the outer scope's.

  Args:
    fn: the scope function.
    variables: the collections lifted in and out (default: all).
    rngs: the rng streams available inside (default: all).

  Only needed to reproduce ``flax.core.lift.fold_rngs``/``jit`` keys.

  Examples:
    >>> def noise(scope):
    ...   return jax.random.normal(scope.make_rng('noise'))
    >>> y = lift.apply(fold_rngs(noise))({}, rngs={'noise': jax.random.key(0)})
    >>> y.shape, y.dtype
    ((), dtype('float32'))
  """
  inner = functools.partial(_fold_groups, fn)
  functools.update_wrapper(inner, fn)
  return pack(inner, (variables,), (variables,), (rngs,), name='fold_rngs')


__all__ = ['fold_rngs']
