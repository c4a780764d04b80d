"""Lifted `map_variables` and `swap_collection`: a function of the variables on the way in and out.

``map_in_fn`` turns the stored collections into the view ``fn`` sees (a tied
autoencoder's decoder sees the encoder kernel transposed); ``map_out_fn`` turns
an updated view back into the stored form.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from lift.filters import (Filter, intersect_filters, is_filter_empty, subtract_filters,
                          validate_filter)
from lift.pack import pack
from lift.scope import Scope


def _identity(x: Any) -> Any:
  return x


class _MapConfig(NamedTuple):
  mapped_collections: Filter
  map_in_fn: Callable[[Any], Any]
  map_out_fn: Callable[[Any], Any]
  init: bool
  mutable: bool


def _mapped_mutable(scope_tree: Any, mapped: Filter) -> bool:
  """Whether a mapped collection is mutable inside, so that an init pass can create it."""
  scopes = jax.tree.leaves(scope_tree, is_leaf=lambda x: isinstance(x, Scope))
  return any(not is_filter_empty(intersect_filters(s.mutable, mapped)) for s in scopes)


def _init_pass(fn, config: _MapConfig, scope_fn, repack_fn, groups, rng_groups, args, kwargs):
  """Runs ``fn`` once on the stored form so it can create mapped variables.

  ``map_out_fn`` sees every mapped collection: the mutable ones as the pass left
  them, the immutable ones as stored (Flax drops those, so the second pass misses them).
  """
  scope_tree = scope_fn(groups, rng_groups)
  if not _mapped_mutable(scope_tree, config.mapped_collections):
    return groups[0]
  fn(scope_tree, *args, **kwargs)
  target, _ = repack_fn(scope_tree)
  return tuple(config.map_out_fn({**stored, **created})
               for stored, created in zip(groups[0], target))


def _map_groups(fn, config: _MapConfig, scope_fn, repack_fn, variable_groups, rng_groups,
                *args, **kwargs):
  # The main pass continues the counters where the init pass left them, as in Flax: what
  # it creates again (variables of collections not mapped) gets keys drawn after the pass's.
  target, rest = variable_groups
  if config.init:
    target = _init_pass(fn, config, scope_fn, repack_fn, variable_groups, rng_groups, args, kwargs)
  target = tuple(config.map_in_fn(x) for x in target)
  target_out = config.init or config.mutable
  inner_mutable = True if target_out else subtract_filters(True, config.mapped_collections)
  scope_tree = scope_fn((target, rest), rng_groups, mutable_filter=inner_mutable)
  y = fn(scope_tree, *args, **kwargs)
  out_target, out_rest = repack_fn(scope_tree)
  if target_out:
    out_target = tuple(config.map_out_fn(x) for x in out_target)
  return y, (out_target, out_rest)


def map_variables(fn: Callable[..., Any], mapped_collections: Filter,
                  map_in_fn: Callable[[Any], Any] = _identity,
                  map_out_fn: Callable[[Any], Any] = _identity, init: bool = False,
                  mutable: bool = False, rngs: Filter = True,
                  variables: Filter = True) -> Callable[..., Any]:
  """Lifted ``fn(scope, *args)`` that sees ``map_in_fn`` of the mapped collections.

  Args:
    fn: the scope function.
    mapped_collections: the collections to map.
    map_in_fn: ``{collection: tree} -> {collection: tree}``, the stored form to
      the view ``fn`` sees.
    map_out_fn: the inverse, applied to the (updated) view on the way out.
    init: run ``fn`` once on the stored form first so that it can create the
      mapped variables (``map_out_fn`` is applied to what it creates).
    mutable: let ``fn`` update the mapped collections through the view.
    rngs: the rng streams available inside (default: all).
    variables: the other collections lifted in and out (default: all).

  Not for changing a variable's structure per call: a mapping must be
  invertible when ``mutable`` or ``init`` is set.

  Examples:
    >>> def dense(scope, x):
    ...   w = scope.param('w', jax.nn.initializers.lecun_normal(), (x.shape[-1], 2))
    ...   return x @ w
    >>> transpose = lambda c: jax.tree.map(lambda a: a.T, c)
    >>> decoder = map_variables(dense, 'params', transpose, transpose, init=True)
    >>> y, variables = lift.init(decoder)(jax.random.key(0), jnp.ones((1, 3)))
    >>> variables['params']['w'].shape
    (2, 3)
  """
  mapped_collections = validate_filter(mapped_collections,
                                       'the `mapped_collections` of map_variables')
  config = _MapConfig(mapped_collections, map_in_fn, map_out_fn, init, mutable)
  in_filters = (mapped_collections, variables)
  out_filters = (in_filters if init or mutable
                 else (False, subtract_filters(variables, mapped_collections)))
  inner = functools.partial(_map_groups, fn, config)
  functools.update_wrapper(inner, fn)
  return pack(inner, in_filters, out_filters, (rngs,), name='map_variables')


def _swap(col_a: str, col_b: str, target: dict[str, Any]) -> dict[str, Any]:
  swapped = dict(target)
  swapped[col_a], swapped[col_b] = target.get(col_b, {}), target.get(col_a, {})
  return swapped


def swap_collection(fn: Callable[..., Any], col_a: str, col_b: str) -> Callable[..., Any]:
  """Lifted ``fn`` that sees collection ``col_a`` as ``col_b`` and vice versa.

  Not for renaming one collection for good: rename the keys of the variables
  dict; a swap is for code written against the other name.

  Examples:
    >>> def read(scope):
    ...   return scope.get_variable('a', 'x')
    >>> lift.apply(swap_collection(read, 'a', 'b'))({'a': {'x': 1}, 'b': {'x': 2}})
    2
  """
  swap = functools.partial(_swap, col_a, col_b)
  return map_variables(fn, (col_a, col_b), swap, swap, mutable=True)


__all__ = ['map_variables', 'swap_collection']
