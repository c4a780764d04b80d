"""Entry points that turn a scope function into a pure function: `init`, `apply`, `bind`."""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from flax import config as flax_config
from flax.core import freeze

from lift import errors
from lift.filters import Filter, in_filter, validate_filter
from lift.rng import is_prng_key
from lift.scope import Scope, copy_structure

_BAD_VARIABLES = (
    'Variables must be a dict {{collection: {{name: value}}}} with string keys; '
    'got {what}. Fix: pass the dict returned by `init` (or its mutated '
    'collections merged back in).')
_NESTED_PARAMS = (
    'Expected the variables passed to apply() to be a dict with the structure '
    '{"params": ...}, but got a dict with an extra params layer, i.e. '
    '{"params": {"params": ...}}: you probably passed `{"params": variables}` '
    'where `variables` already is `{"params": ...}`. Fix: pass `variables` itself.')
_BAD_RNGS = (  # Flax's sentence for init or apply, then ours
    '{lead} should be a ``jax.PRNGKey`` or a dictionary mapping strings to '
    '``jax.PRNGKey``; got {what}. Fix: pass one key (it feeds the "params" '
    'stream), or a dict of them, e.g. `{{"params": key, "dropout": key2}}`.')
_RNGS_LEAD = {'init': 'First argument passed to an init function',
              'apply': 'The ``rngs`` argument passed to an apply function'}


def _check_variables(variables: Any):
  if not isinstance(variables, Mapping):
    raise errors.InvalidVariablesError(_BAD_VARIABLES.format(what=type(variables).__name__))
  for col, tree in variables.items():
    if not isinstance(col, str) or not isinstance(tree, Mapping):
      raise errors.InvalidVariablesError(
          _BAD_VARIABLES.format(what=f'collection {col!r} of type {type(tree).__name__}'))
  params = variables.get('params')
  if isinstance(params, Mapping) and 'params' in params:
    raise errors.InvalidVariablesError(_NESTED_PARAMS)


def _normalise_rngs(rngs: Any, entry: str = 'apply') -> dict[str, Any] | None:
  if rngs is None:
    return None
  if is_prng_key(rngs):
    return {'params': rngs}
  if isinstance(rngs, Mapping) and all(
      isinstance(k, str) and is_prng_key(v) for k, v in rngs.items()):
    return dict(rngs)
  raise errors.InvalidRngsError(_BAD_RNGS.format(lead=_RNGS_LEAD[entry], what=repr(rngs)[:200]))


def bind(variables: Mapping[str, Any], rngs: Any = None, mutable: Filter = False,
         flags: Mapping[str, Any] | None = None) -> Scope:
  """A root scope over ``variables``; mutable collections are copied, never written in place.

  For interactive use and tests; the scope stays valid until
  ``scope.invalidate()``. Not for library code: `apply` invalidates its scope
  when the function returns, so a kept scope fails loudly.

  Examples:
    >>> scope = lift.bind({'params': {'w': 1.0}})
    >>> scope.get_variable('params', 'w')
    1.0
  """
  _check_variables(variables)
  mutable = validate_filter(mutable, 'the `mutable` argument')
  owned = {col: copy_structure(tree) if in_filter(mutable, col) else tree
           for col, tree in variables.items()}
  return Scope(owned, rngs=_normalise_rngs(rngs), mutable=mutable, flags=flags)


def apply(fn: Callable[..., Any], mutable: Filter = False,
          flags: Mapping[str, Any] | None = None) -> Callable[..., Any]:
  """Turns ``fn(scope, *args)`` into ``apply_fn(variables, *args, rngs=None)``.

  Returns ``y``, or ``(y, mutated_variables)`` when ``mutable`` is not False.
  Not for creating parameters: use `init`, whose 'params' are mutable.

  Examples:
    >>> double = lift.apply(lambda scope: scope.get_variable('params', 'w') * 2)
    >>> double({'params': {'w': 1.0}})
    2.0
  """

  @functools.wraps(fn)
  def apply_fn(variables, *args, rngs=None, **kwargs):
    root = bind(variables, rngs=rngs, mutable=mutable, flags=flags)
    try:
      y = fn(root, *args, **kwargs)
      mutated: Mapping[str, Any] | None = (
          root.mutable_variables() if mutable is not False else None)
      if mutated is not None and flax_config.flax_return_frozendict:  # Flax's legacy output
        mutated = freeze(mutated)
    finally:
      root.invalidate()
    return y if mutable is False else (y, mutated)

  return apply_fn


def init(fn: Callable[..., Any], mutable: Filter = True,
         flags: Mapping[str, Any] | None = None) -> Callable[..., Any]:
  """Turns ``fn(scope, *args)`` into ``init_fn(rngs, *args) -> (y, variables)``.

  A single key as ``rngs`` means ``{'params': key}``. Every collection is
  mutable by default. Not for running a model whose variables exist: use
  `apply`, which does not create missing parameters silently.

  Examples:
    >>> init_fn = lift.init(lambda scope: scope.param('w', lambda key: 1.0))
    >>> init_fn(jax.random.key(0))
    (1.0, {'params': {'w': 1.0}})
  """

  @functools.wraps(fn)
  def init_fn(rngs, *args, **kwargs):
    if _normalise_rngs(rngs, 'init') is None:
      raise errors.InvalidRngsError(_BAD_RNGS.format(lead=_RNGS_LEAD['init'], what='None'))
    init_flags = {**(flags or {}), 'initializing': True}
    return apply(fn, mutable=mutable, flags=init_flags)({}, *args, rngs=rngs, **kwargs)

  return init_fn
