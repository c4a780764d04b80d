"""`pack`: the one mechanism that lifts scopes through any JAX transform.

``pack`` runs six stages, each a function below:

1. :func:`dedup_scopes`: of the scopes passed in, only roots (no ancestor in the
   set) are lifted; the others are re-derived from their root by path.
2. :func:`filter_groups`: variables and rng streams are split into groups by
   the in-filters and rng filters; a stream keeps its raw key and suffix.
3. the transform-specific ``fn`` receives the groups and runs the JAX transform;
4. :func:`reconstruct` (given to ``fn`` as ``scope_fn``) builds fresh inner
   scopes from the (transformed) groups;
5. :func:`repack` (``repack_fn``) collects the mutable inner variables back into
   groups by the out-filters; immutable collections are never returned;
6. :func:`commit` writes the returned groups into the original scopes.
"""
from __future__ import annotations

import difflib
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from lift import errors
from lift.filters import (DenyList, Filter, group_collections, in_filter, intersect_filters,
                          subtract_filters, union_filters, validate_filter)
from lift.scope import Scope, copy_structure

VariableGroups = tuple[tuple[dict[str, Any], ...], ...]  # [filter][root] -> {col: tree}
RngGroups = tuple[tuple[dict[str, Any], ...], ...]  # [filter][root] -> {stream: RngStream}

_NO_KWARGS = (
    '{name}: keyword arguments {names} were passed, but this transform was '
    'packed with enable_kwargs=False. Fix: pass them positionally, or pack with '
    'enable_kwargs=True.')

_NOT_A_PAIR = (
    'Packed function `{name}` returned a value of type {got}; it must return `(y, out_groups)`, '
    'with `out_groups = repack_fn(scope)`. Fix: return the pair, e.g. '
    '`return fn(scope, *args), repack_fn(scope)`.')


class LiftedScopes(NamedTuple):
  """The result of :func:`dedup_scopes`."""
  roots: tuple[Scope, ...]
  # For every scope passed in: (index of its root in ``roots``, names below that root).
  paths: tuple[tuple[int, tuple[str, ...]], ...]
  treedef: Any


class PackSpec(NamedTuple):
  """What a lifted transform declares about variables and rngs."""
  in_filters: tuple[Filter, ...]
  out_filters: tuple[Filter, ...]
  rng_filters: tuple[Filter, ...]
  name: str | None


def dedup_scopes(scope_tree: Any, name: str | None = None) -> LiftedScopes:
  """Stage 1: keeps only root scopes; every other scope is a path below one of them.

  ``name`` (the transform's) is for the error when ``scope_tree`` holds a non-scope.
  """
  scopes, treedef = jax.tree_util.tree_flatten(
      scope_tree, is_leaf=lambda x: isinstance(x, Scope))
  for scope in scopes:
    if not isinstance(scope, Scope):
      raise errors.NotAScopeError(name, scope)
    scope._check_valid()
  lifted = {s.identity for s in scopes}
  roots: list[Scope]
  roots, root_index, paths = [], {}, []
  for scope in scopes:
    root, below = _highest_lifted_ancestor(scope, lifted)
    if root.identity not in root_index:
      root_index[root.identity] = len(roots)
      roots.append(root)
    paths.append((root_index[root.identity], below))
  return LiftedScopes(tuple(roots), tuple(paths), treedef)


def _highest_lifted_ancestor(scope: Scope, lifted: set) -> tuple[Scope, tuple[str, ...]]:
  below: tuple[str, ...]
  best, below, names = scope, (), []
  node = scope
  while node.parent is not None:
    assert node.name is not None, 'a child scope has a name'
    names.append(node.name)
    node = node.parent
    if node.identity in lifted:
      best, below = node, tuple(reversed(names))
  return best, below


def filter_groups(roots: Sequence[Scope], spec: PackSpec) -> tuple[VariableGroups, RngGroups]:
  """Stage 2: splits each root's variables and rng streams into groups by filter."""
  variable_groups = [group_collections(_own_collections(r), spec.in_filters) for r in roots]
  rng_groups = [group_collections(r.rngs, spec.rng_filters) for r in roots]
  return _transpose(variable_groups, spec.in_filters), _transpose(rng_groups, spec.rng_filters)


def _own_collections(scope: Scope) -> dict[str, Any]:
  return {col: copy_structure(tree) for col, tree in scope.variables().items()}


def _transpose(per_root: list[tuple[dict, ...]], filters) -> tuple[tuple[dict, ...], ...]:
  return tuple(tuple(groups[i] for groups in per_root) for i in range(len(filters)))


def inner_mutability(outer: Scope, spec: PackSpec, mutable_filter: Filter = True) -> Filter:
  """What is mutable inside: the outer-mutable collections that the transform returns.

  Others are immutable inside, as in Flax (`sow` skips them); a write to one
  that is mutable outside raises `UnliftedCollectionError` (see `reconstruct`).
  """
  return intersect_filters(_returned(outer, spec), mutable_filter)


def _returned(outer: Scope, spec: PackSpec) -> Filter:
  return intersect_filters(outer.mutable, _union(spec.out_filters))


def _union(filters: Sequence[Filter]) -> Filter:
  nothing: Filter = False
  return functools.reduce(union_filters, filters, nothing)


_BAD_GROUPS = (
    'Packed function `{name}`: {what} must hold one group per entry of '
    '`{filters}` ({expected}), each a sequence with one dict per lifted root scope '
    '({roots}); got {got}. Fix: pass on the groups `pack` gave the function, '
    'transformed but in the same structure.')


def _check_groups(what: str, groups: Any, filters: str, expected: int, spec: PackSpec,
                  roots: int):
  """Raises `PackProtocolError` unless ``groups`` holds ``expected`` groups of ``roots`` dicts."""
  if (isinstance(groups, Sequence) and len(groups) == expected
      and all(isinstance(g, Sequence) and len(g) == roots for g in groups)):
    return
  got = type(groups).__name__
  if isinstance(groups, Sequence):
    sizes = [len(g) if isinstance(g, Sequence) else type(g).__name__ for g in groups]
    got = f'{len(groups)} groups of sizes {sizes}'
  raise errors.PackProtocolError(_BAD_GROUPS.format(
      name=spec.name or 'pack', what=what, filters=filters, expected=expected, roots=roots,
      got=got))


def _debug_path(outer: tuple[str, ...], transform: str | None) -> tuple[str, ...]:
  """A lifted root's debug path: the transform's name around the last name, as Flax's."""
  if transform is None:
    return outer
  return outer[:-1] + (f'{transform}({outer[-1]})',) if outer else (f'{transform}()',)


def reconstruct(lifted: LiftedScopes, spec: PackSpec, created: list[weakref.ref[Scope]],
                variable_groups: VariableGroups, rng_groups: RngGroups,
                mutable_filter: Filter = True) -> Any:
  """Stage 4 (``scope_fn``): fresh inner scopes from groups, in the caller's scope tree shape."""
  roots = len(lifted.roots)
  _check_groups('the variable_groups given to scope_fn', variable_groups,
                'in_variable_filters', len(spec.in_filters), spec, roots)
  _check_groups('the rng_groups given to scope_fn', rng_groups, 'rng_filters',
                len(spec.rng_filters), spec, roots)
  inner_roots = []
  for i, outer in enumerate(lifted.roots):
    variables = {col: copy_structure(tree)
                 for group in variable_groups for col, tree in group[i].items()}
    rngs = {k: s for group in rng_groups for k, s in group[i].items()}
    inner = Scope(variables, rngs, outer.name, inner_mutability(outer, spec, mutable_filter),
                  path=outer.path, flags=outer.flags, rng_counters=outer.rng_counters)
    inner._debug_name = spec.name
    inner._root_debug_path = _debug_path(outer.debug_path, spec.name)
    inner._unlifted = union_filters(outer.root._unlifted,
                                    subtract_filters(outer.mutable, _returned(outer, spec)))
    inner_roots.append(inner)
  created.extend(weakref.ref(inner) for inner in inner_roots)
  scopes = []
  for index, below in lifted.paths:
    scope = inner_roots[index]
    for name in below:
      scope = scope.push(name, reuse=True)
    scopes.append(scope)
  return lifted.treedef.unflatten(scopes)


def repack(lifted: LiftedScopes, spec: PackSpec, inner_tree: Any) -> VariableGroups:
  """Stage 5 (``repack_fn``): mutable inner variables, grouped by the out-filters."""
  inner_scopes = lifted.treedef.flatten_up_to(inner_tree)
  first = {index: k for k, (index, _) in reversed(list(enumerate(lifted.paths)))}
  per_root = []
  for index in range(len(lifted.roots)):
    inner = inner_scopes[first[index]].root
    if inner.invalid:
      raise errors.RepackedScopeError(spec.name, inner.path_text)
    mutable = {col: tree for col, tree in inner.variables().items()
               if inner.is_mutable_collection(col)}
    *groups, rest = group_collections(mutable, spec.out_filters + (True,))
    if rest:
      raise errors.UnmappedCollectionError(rest, spec.name, inner.path_text)
    inner.invalidate()
    per_root.append(tuple(groups))
  return _transpose(per_root, spec.out_filters)


def commit(roots: Sequence[Scope], out_groups: VariableGroups):
  """Stage 6: writes the repacked variables into the original scopes."""
  for group in out_groups:
    for root, collections in zip(roots, group):
      for col, tree in collections.items():
        for name, value in tree.items():
          root.put_variable(col, name, value)


def _invalidate_alive(created: list[weakref.ref[Scope]]) -> None:
  """Invalidates the scopes ``scope_fn`` made that are still referenced.

  They are held weakly: a scope made in a trace that ends before the transform
  returns (a while_loop's condition, never repacked) must not keep that trace's
  values alive.
  """
  for ref in created:
    inner = ref()
    if inner is not None:
      inner.invalidate()


def _named(filters: Sequence[Filter]) -> set[str]:
  """The names written in finite filters (not in True or a DenyList)."""
  names: set[str] = set()
  for f in filters:
    if isinstance(f, str):
      names.add(f)
    elif not isinstance(f, (bool, DenyList)):
      names.update(f)
  return names


def _near(transform: str | None, filters: Sequence[Filter], meant: str,
          present: set[str]) -> errors.NearName:
  """Which name of ``filters`` that matches nothing ``present`` is near ``meant``, if any."""
  unmatched = sorted(_named(filters) - present)
  near = difflib.get_close_matches(meant, unmatched, n=1)
  return errors.NearName(transform, near[0] if near else None, tuple(sorted(present)))


def _explain_left_out(error: errors.UnliftedCollectionError | errors.UnknownRngError,
                     roots: Sequence[Scope], spec: PackSpec) -> errors.LiftError | None:
  """The error again, saying that this transform's filters left out the collection or
  stream (and which name in them is a near miss), when they did; else None.

  A scope only sees what its transform passed in, so the error raised inside knows
  neither what was given outside nor the filters; the innermost transform that left the
  name out explains, and the transforms around it pass its error on.
  """
  if isinstance(error, errors.UnknownRngError):
    given = {name for root in roots for name in root.rngs}
    if (error.left_out is not None or error.rng_name not in given
        or in_filter(_union(spec.rng_filters), error.rng_name)):
      return None
    return errors.UnknownRngError(
        error.rng_name, error.path, error.available, error.scope_name,
        left_out=_near(spec.name, spec.rng_filters, error.rng_name, given))
  present = {col for root in roots for col in root.variables()} | {error.collection}
  near = _near(spec.name, spec.in_filters + spec.out_filters, error.collection, present)
  if (error.near is not None or near.written is None
      or in_filter(_union(spec.out_filters), error.collection)):
    return None
  return errors.UnliftedCollectionError(error.collection, error.name, error.path,
                                        error.transform_name, near=near)


def _validated(filters: Sequence[Filter], kind: str, name: str | None) -> tuple[Filter, ...]:
  where = f'the {kind} of the lifted `{name or "pack"}`'
  return tuple(validate_filter(f, where) for f in filters)


def _run(fn: Callable[..., Any], lifted: LiftedScopes, spec: PackSpec, args, kwargs) -> Any:
  """``fn`` on the groups of ``lifted``; a collection or stream its filters leave out is
  explained, and the scopes it made are invalid after it returns."""
  variable_groups, rng_groups = filter_groups(lifted.roots, spec)
  created: list[weakref.ref[Scope]] = []
  scope_fn = functools.partial(reconstruct, lifted, spec, created)
  repack_fn = functools.partial(repack, lifted, spec)
  try:
    return fn(scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs)
  except (errors.UnliftedCollectionError, errors.UnknownRngError) as error:
    explained = _explain_left_out(error, lifted.roots, spec)
    if explained is None:
      raise
    raise explained.with_traceback(error.__traceback__) from None  # keeps the user's line
  finally:
    _invalidate_alive(created)


def pack(fn: Callable[..., Any], in_variable_filters: Sequence[Filter],
         out_variable_filters: Sequence[Filter], rng_filters: Sequence[Filter],
         name: str | None = None, enable_kwargs: bool = True) -> Callable[..., Any]:
  """Lifts ``fn(scope_fn, repack_fn, variable_groups, rng_groups, *args) -> (y, out_groups)``.

  Returns ``wrapper(scope_tree, *args, **kwargs) -> y``; keyword arguments
  reach ``fn`` (with ``enable_kwargs=False`` they are an error; Flax's default
  warns and drops them). ``variable_groups[i][r]``
  is the dict of collections of root scope ``r`` matched by in-filter ``i``;
  ``rng_groups`` likewise for rng streams. ``scope_fn(variable_groups,
  rng_groups)`` rebuilds the scopes; ``repack_fn(scope_tree)`` returns the
  mutable variables as ``out_groups``, one group per out-filter.

  ``repack_fn`` returns variables in the view ``fn`` saw: a transform that
  maps them on the way in must map ``out_groups`` back, or its ``apply`` reads
  another view than ``init`` stored (`lift.map_variables` with ``init=True``).

  Use it to write a new lifted transform; not needed to use the ones `lift`
  ships (`vmap`, `scan`, `checkpoint`, ... are each a client of `pack`).

  Examples:
    >>> def lift_identity(fn):
    ...   def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    ...     scope = scope_fn(variable_groups, rng_groups)
    ...     return fn(scope, *args), repack_fn(scope)
    ...   return pack(inner, (True,), (True,), (True,), name='identity')
    >>> def dense(scope, x):
    ...   return x @ scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 2))
    >>> y, variables = lift.init(lift_identity(dense))(jax.random.key(0), jnp.ones((1, 3)))
    >>> y
    Array([[3., 3.]], dtype=float32)
  """
  spec = PackSpec(_validated(in_variable_filters, 'variable filters', name),
                  _validated(out_variable_filters, 'variable filters', name),
                  _validated(rng_filters, 'rng filters', name), name)

  @functools.wraps(fn)
  def wrapper(scope_tree, *args, **kwargs):
    if kwargs and not enable_kwargs:
      raise errors.TransformArgumentError(_NO_KWARGS.format(name=name, names=sorted(kwargs)))
    lifted = dedup_scopes(scope_tree, name)
    result = _run(fn, lifted, spec, args, kwargs)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
      raise errors.PackProtocolError(_NOT_A_PAIR.format(name=name or 'pack',
                                                        got=type(result).__name__))
    y, out_groups = result
    _check_groups('the out_groups it returns', out_groups, 'out_variable_filters',
                  len(spec.out_filters), spec, len(lifted.roots))
    commit(lifted.roots, out_groups)
    return y

  return wrapper


__all__ = ['pack', 'dedup_scopes', 'filter_groups', 'reconstruct', 'repack',
           'commit', 'LiftedScopes', 'PackSpec', 'inner_mutability']
