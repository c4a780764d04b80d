"""Lifted `checkpoint` (alias `remat`): ``jax.checkpoint`` over a scope function.

Also the argument-index checks shared by the transforms that take
``static_argnums``-like arguments (`checkpoint`, `jit`, `custom_vjp`).
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

from lift import errors
from lift.filters import Filter
from lift.pack import pack

_BAD_ARGNUM = (
    '{transform}: {argument}={value!r} holds {item!r}, which is not a '
    'non-negative int. {counting} Fix: e.g. {argument}=({example},).')
_ARGNUM_OUT_OF_RANGE = (
    '{transform}: {argument} names argument {index}, but the call passed only '
    '{count} positional argument(s) {counting_short}. Fix: pass that argument '
    'positionally, or remove {index} from {argument}.')
_BAD_ARGNAME = (
    '{transform}: {argument}={value!r} holds {item!r}, which is not a string. '
    'Fix: name keyword arguments, e.g. {argument}=("features",).')
_CONCRETE = (
    'checkpoint: concrete=True is not supported (JAX removed it). Fix: pass the '
    'arguments that Python control flow depends on as static_argnums.')
_CHECKPOINT_COUNTING = '(checkpoint counts the first argument after the scope as 0.)'
_ARRAY_STATIC = (
    'checkpoint: the static argument {which} of {fn} is an array of shape {shape}, but static '
    'arguments are hashable Python values that the body\'s control flow reads (sizes, '
    'flags); an array cannot be one. checkpoint counts the first argument after the scope '
    'as 0; a Module method counts self as 0. Fix: mark the argument the body needs concrete, '
    'e.g. static_argnums=(1,) for fn(scope, x, n), and pass arrays as dynamic arguments.')


def as_tuple(value: Any) -> tuple[Any, ...]:
  """An int or str becomes a 1-tuple; any other iterable becomes a tuple."""
  if isinstance(value, (int, str)) or not isinstance(value, Iterable):
    return (value,)
  return tuple(value)


def check_argnums(transform: str, argument: str, value: Any, counting: str,
                  example: int = 1) -> tuple[int, ...]:
  """Validates an ``*_argnums`` argument; returns it as a tuple of ints."""
  items = as_tuple(value)
  for item in items:
    if not isinstance(item, int) or isinstance(item, bool) or item < 0:
      raise errors.ArgnumsError(_BAD_ARGNUM.format(
          transform=transform, argument=argument, value=value, item=item,
          counting=counting, example=example))
  return items


def check_argnames(transform: str, argument: str, value: Any) -> tuple[str, ...]:
  items = as_tuple(value)
  for item in items:
    if not isinstance(item, str):
      raise errors.ArgnumsError(_BAD_ARGNAME.format(
          transform=transform, argument=argument, value=value, item=item))
  return items


def check_in_range(transform: str, argument: str, argnums: Iterable[int],
                   count: int, counting_short: str):
  """Raises if an index in ``argnums`` is not below ``count`` (the positional arguments passed)."""
  for index in argnums:
    if index >= count:
      raise errors.ArgnumsError(_ARGNUM_OUT_OF_RANGE.format(
          transform=transform, argument=argument, index=index, count=count,
          counting_short=counting_short))


def _rematted_body(fn, scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
  scope = scope_fn(variable_groups, rng_groups)
  y = fn(scope, *args, **kwargs)
  return y, repack_fn(scope)


def _checkpoint_groups(fn, static_argnums, static_argnames, prevent_cse, policy, scope_fn,
                       repack_fn, variable_groups, rng_groups, *args, **kwargs):
  check_in_range('checkpoint', 'static_argnums', static_argnums, len(args), 'after the scope')
  named = _named_positions(fn, static_argnames)
  static_argnums = tuple(sorted(set(static_argnums) | {i for i in named if i < len(args)}))
  _check_static_values(fn, static_argnums, args)
  # jax.checkpoint has no static_argnames: static keyword arguments are closed over.
  static = {k: v for k, v in kwargs.items() if k in static_argnames}
  rematted = jax.checkpoint(
      functools.partial(_rematted_body, fn, scope_fn, repack_fn, **static),
      prevent_cse=prevent_cse, policy=policy,
      static_argnums=tuple(i + 2 for i in static_argnums))
  dynamic = {k: v for k, v in kwargs.items() if k not in static_argnames}
  return rematted(variable_groups, rng_groups, *args, **dynamic)


def _check_static_values(fn: Callable[..., Any], static_argnums: tuple[int, ...], args) -> None:
  for index in static_argnums:
    if isinstance(args[index], (jax.Array, np.ndarray)):
      try:
        which = repr(list(inspect.signature(fn).parameters)[index + 1])
      except (TypeError, ValueError, IndexError):
        which = f'at position {index}'
      raise errors.TransformArgumentError(_ARRAY_STATIC.format(
          which=which, fn=getattr(fn, '__qualname__', fn), shape=np.shape(args[index])))


def _named_positions(fn: Callable[..., Any], names: frozenset[str]) -> tuple[int, ...]:
  """Positions (first argument after the scope = 0) of ``fn``'s parameters called ``names``."""
  try:
    parameters = list(inspect.signature(fn).parameters.values())[1:]
  except (TypeError, ValueError):
    return ()
  kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  return tuple(i for i, p in enumerate(parameters) if p.kind in kinds and p.name in names)


def checkpoint(fn: Callable[..., Any], variables: Filter = True, rngs: Filter = True,
               concrete: bool = False, prevent_cse: bool = True,
               static_argnums: int | Iterable[int] = (),
               policy: Callable[..., bool] | None = None,
               static_argnames: str | Iterable[str] = ()) -> Callable[..., Any]:
  """Lifted ``jax.checkpoint`` (alias ``remat``) of ``fn(scope, *args)``.

  Values, created variables, rng draws and gradients are those of ``fn``
  itself; only the intermediates are recomputed in the backward pass instead
  of being stored.

  Args:
    fn: the scope function to rematerialise.
    variables: the collections lifted in and out (default: all).
    rngs: the rng streams available inside (default: all).
    concrete: kept in Flax's position so that calls port; only False, as in
      JAX, which removed it (Python control flow on an argument: make the
      argument static with ``static_argnums``).
    prevent_cse: as ``jax.checkpoint``; False is fine (and faster) inside a scan.
    static_argnums: positions of hashable arguments to treat as static,
      counting the first argument after the scope as 0 (as
      ``flax.core.lift.checkpoint``).
    policy: a ``jax.checkpoint_policies`` policy saying what may be saved.
    static_argnames: names of arguments to treat as static, passed by keyword
      or (where ``fn``'s signature names them) by position.

  Not needed around a whole model under ``jax.grad`` with memory to spare:
  recomputation costs time.

  Examples:
    >>> def dense(scope, x):
    ...   w = scope.param('w', jax.nn.initializers.lecun_normal(), (x.shape[-1], 2))
    ...   return jnp.tanh(x @ w)
    >>> y, variables = lift.init(checkpoint(dense))(jax.random.key(0), jnp.ones((1, 3)))
    >>> jax.tree.map(jnp.shape, variables)
    {'params': {'w': (3, 2)}}
  """
  if concrete:
    raise errors.TransformArgumentError(_CONCRETE)
  argnums = check_argnums('checkpoint', 'static_argnums', static_argnums,
                          _CHECKPOINT_COUNTING, example=0)
  names = frozenset(check_argnames('checkpoint', 'static_argnames', static_argnames))
  inner = functools.partial(_checkpoint_groups, fn, argnums, names, prevent_cse, policy)
  functools.update_wrapper(inner, fn)
  # 'remat', as flax.core.lift names it: a scope's debug_path reads remat(name).
  return pack(inner, (variables,), (variables,), (rngs,), name='remat')


remat = checkpoint

__all__ = ['checkpoint', 'remat']
