"""Lifted `vmap`: one batch axis over arguments, variable collections and rng streams."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax.typing import In, Out

from lift.axes import (MappedAxes, check_axis_leaves, check_keyword_arrays, check_size,
                       check_split_rngs, check_variable_axes, infer_axis_size, leaf_axes, mapped_arguments,
                       mapped_variables, split_rng_groups)
from lift import errors
from lift.filters import Filter
from lift.metadata import add_group_axes, remove_group_axes
from lift.pack import pack
from lift.scope import Scope

_SHARED_WRITE = (
    'vmap: collection {collection!r} is shared by every item (variable_axes None), but '
    '{path} was written with a value that differs from item to item: it '
    'depends on the mapped axis{named}, and a shared collection holds one value for all '
    'items. Fix: reduce the value over the mapped axis before writing it, e.g. '
    'jax.lax.pmean(value, {axis_name!r}){given} (a layer that reduces over named axes '
    'must name this axis too: BatchNorm(axis_name=(..., {axis_name!r}))), or give the '
    'collection an axis: variable_axes={{{collection!r}: 0}}{split}.')
_SPLIT_HINT = ("; a variable initialised from a split rng stream differs per item too: "
               "split_rngs={{{stream!r}: False}} shares it")
_KEYWORDS_UNMAPPED = (
    'vmap: no positional argument is mapped, and keyword arguments are never mapped: they '
    'reach every item whole ({keywords}). The size of the mapped axis would come from the '
    'variables alone (at init there are none yet), and every item would compute on the '
    'whole {first!r}, not on its slice. Fix: pass {first!r} positionally to map it along '
    'in_axes, e.g. model.init(key, x) and model.apply(variables, x) for a vmapped module; '
    'if every item should get it whole, say so with axis_size=N.')
_BATCHED_OUTPUT = (
    'vmap: out_axes={out_axes!r} marks an output as the same for every item (None), but it '
    'depends on the mapped axis{named}: on a mapped argument, a per-item variable or a split '
    'rng stream (JAX: {jax}). Fix: give that output an axis (e.g. out_axes=0), or reduce it '
    'over the mapped axis before returning it, e.g. {reduce}.')
# JAX's messages for an output batched where its out axis is None, without and with an axis_name.
_JAX_MISMATCH = ('at vmap out_axes', 'vmap has mapped output')

# -- vmap --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _VmapConfig(MappedAxes):
  rng_filters: tuple[Filter, ...] = ()
  axis_name: Any = None
  spmd_axis_name: Any = None


def _is_none(x: Any) -> bool:
  return x is None


def _mapped_body(fn, scope_fn, repack_fn, kwargs, root_paths, variable_groups, rng_groups,
                 args):
  scope = scope_fn(variable_groups, rng_groups)
  root_paths[:] = _root_paths(scope)
  y = fn(scope, *args, **kwargs)
  return y, repack_fn(scope)


def _root_paths(scope_tree: Any) -> list[tuple[str, ...]]:
  """The paths of the lifted root scopes, in the order of the groups' roots (for messages)."""
  roots: dict[int, tuple[str, ...]] = {}
  for scope in jax.tree.leaves(scope_tree, is_leaf=lambda x: isinstance(x, Scope)):
    roots.setdefault(id(scope.root), scope.root.path)
  return list(roots.values())


def _batched(body, config: _VmapConfig, size: int, out_variable_axes: Any) -> Callable[..., Any]:
  """``jax.vmap`` of ``body(variable_groups, rng_groups, args)``."""
  rng_axes = tuple(0 if split else None for split in config.rng_splits)
  return jax.vmap(
      body, in_axes=(config.variable_axes.in_axes, rng_axes, config.in_axes),
      out_axes=(config.out_axes, out_variable_axes), axis_size=size,
      axis_name=config.axis_name, spmd_axis_name=config.spmd_axis_name)


def _vmap_groups(fn, config: _VmapConfig, scope_fn, repack_fn, variable_groups,
                 rng_groups, *args, **kwargs):
  in_axes, out_axes = config.variable_axes.in_axes, config.variable_axes.out_axes
  groups = remove_group_axes(variable_groups, in_axes, config.metadata_params)
  axes = leaf_axes('vmap', 'in_axes', config.in_axes, args, _is_none, 'positional arguments')
  arguments = mapped_arguments(fn, args, axes)
  check_keyword_arrays(kwargs, arguments, config.size, _KEYWORDS_UNMAPPED)
  size = infer_axis_size('vmap', 'axis_size', arguments + mapped_variables(groups, in_axes),
                         config.size)
  operands = (groups, split_rng_groups(rng_groups, config.rng_splits, size), args)
  root_paths: list[tuple[str, ...]] = []
  mapped = functools.partial(_batched, functools.partial(
      _mapped_body, fn, scope_fn, repack_fn, kwargs, root_paths), config, size)
  try:
    y, out_groups = mapped(out_axes)(*operands)
  except ValueError as error:
    if not str(error).startswith(_JAX_MISMATCH):
      raise
    _raise_shared_write(mapped, config, operands, root_paths)
    raise _batched_output(config, error) from error
  return y, add_group_axes(out_groups, out_axes, config.metadata_params)


def _batched_output(config: _VmapConfig, error: ValueError) -> errors.InvalidAxisError:
  """The result refused by JAX once no shared variable is to blame: an output marked None."""
  name = config.axis_name
  return errors.InvalidAxisError(_BATCHED_OUTPUT.format(
      out_axes=config.out_axes, jax=error, named='' if name is None else f' {name!r}',
      reduce=(f'jax.lax.pmean(y, {name!r})' if name is not None
              else "jax.lax.pmean(y, 'batch') with axis_name='batch'")))


# -- which shared variable was written per item ----------------------------------------------

def _refused(mapped: Callable[..., Any], operands: tuple) -> bool:
  """Whether JAX refuses the out axes of ``mapped`` (traced for shapes only)."""
  try:
    jax.eval_shape(mapped, *operands)
  except ValueError as error:
    if str(error).startswith(_JAX_MISMATCH):
      return True
    raise
  return False


def _first_unmapped(shapes: tuple, out_axes: tuple, count: int) -> tuple:
  """Out axes of the variable groups: the shared groups' first ``count`` leaves None, the
  rest 0; the other groups their axis."""
  result, seen = [], 0
  for group, axis in zip(shapes, out_axes):
    if axis is None:
      leaves, treedef = jax.tree.flatten(group)
      marks = [None if seen + i < count else 0 for i in range(len(leaves))]
      group, seen = jax.tree.unflatten(treedef, marks), seen + len(leaves)
    result.append(axis if axis is not None else group)
  return tuple(result)


def _first_shared_written(mapped: Callable[[Any], Callable[..., Any]], out_axes: tuple,
                          operands: tuple) -> Any:
  """The path (root, collection, names) of the first variable of a shared collection that
  the body writes per item, or None.

  JAX names the leaf only without an ``axis_name``, so the body is traced again (shapes
  only) with the out axes of a growing prefix of the shared variables None, to find the
  first that JAX refuses (a bisection: a few traces, on the error path only). None when
  the mismatch is in the result's ``out_axes`` or the search itself fails.
  """
  try:
    shapes = jax.eval_shape(mapped(tuple(0 if a is None else a for a in out_axes)),
                            *operands)[1]
    shared = [path for group, axis in zip(shapes, out_axes) if axis is None
              for path, _ in jax.tree_util.tree_flatten_with_path(group)[0]]
    fails = lambda n: _refused(mapped(_first_unmapped(shapes, out_axes, n)), operands)
    if not shared or not fails(len(shared)):
      return None
    low, high = 1, len(shared)  # the least n with fails(n)
    while low < high:
      middle = (low + high) // 2
      low, high = (low, middle) if fails(middle) else (middle + 1, high)
  except Exception:  # noqa: BLE001 (the search must not replace the error it explains)
    return None
  return shared[low - 1]


def _raise_shared_write(mapped: Callable[[Any], Callable[..., Any]], config: _VmapConfig,
                        operands: tuple, root_paths: list[tuple[str, ...]]):
  """Raises `InvalidAxisError` naming the shared variable written per item, if there is one."""
  path = _first_shared_written(mapped, config.variable_axes.out_axes, operands)
  if path is None:
    return
  root, collection, names = path[0].idx, path[1].key, path[2:]
  at_root = ''.join(f'[{name!r}]' for name in root_paths[root]) if root_paths else ''
  split = next((f for f, s in zip(config.rng_filters, config.rng_splits) if s), None)
  raise errors.InvalidAxisError(_SHARED_WRITE.format(
      collection=collection,
      path=f'variables[{collection!r}]{at_root}{jax.tree_util.keystr(tuple(names))}',
      named='' if config.axis_name is None else f' (axis_name={config.axis_name!r})',
      axis_name=config.axis_name or 'batch',
      given='' if config.axis_name else " with axis_name='batch' given to vmap",
      split='' if split is None else _SPLIT_HINT.format(stream=split))) from None


# Private parameter: _name, what the map is in messages and scope paths (nn.Stacked(Block)).
def vmap(fn: Callable[..., Any], variable_axes: Mapping[Filter, int | None],
         split_rngs: Mapping[Filter, bool], in_axes: Any = 0, out_axes: Any = 0,
         axis_size: int | None = None, axis_name: Any = None,
         spmd_axis_name: Any = None,
         metadata_params: Mapping[Any, Any] = {},  # noqa: B006 (Flax's default)
         _name: str = 'vmap') -> Callable[..., Any]:
  """Lifted ``jax.vmap`` of ``fn(scope, *args)``.

  Args:
    fn: the scope function to map.
    variable_axes: ``{collection filter: axis or None}``. A collection with an
      axis has one slice per item (variables created inside get that axis); with
      None it is shared by every item (writes to it must be the same for every
      item, e.g. reduced with ``lax.pmean(x, axis_name)``). ``In(axis)``
      lifts a collection in only (writes inside are an error), ``Out(axis)``
      out only (it starts empty inside, e.g. for ``sow``), as in Flax.
    split_rngs: ``{stream filter: bool}``; item ``i`` of a split stream draws
      from ``split(key, n)[i]``, an unsplit stream is the same for every item.
      Streams matched by no filter are not available inside.
    in_axes: as ``jax.vmap``, for the positional arguments after the scope.
      Keyword arguments reach every item unmapped; a call whose arrays all
      come by keyword needs ``axis_size`` to say so (else `AxisSizeError`).
    out_axes: as ``jax.vmap``, for the result.
    axis_size: the mapped size; inferred from the mapped arguments and
      variables when None.
    axis_name: as ``jax.vmap``.
    spmd_axis_name: as ``jax.vmap``.
    metadata_params: passed to ``add_axis``/``remove_axis`` of the
      ``flax.core.meta.AxisMetadata`` boxes of mapped collections.

  Not for sharing weights across positions of one input: that is plain
  broadcasting, no transform needed.

  Examples:
    >>> def dense(scope, x):
    ...   w = scope.param('w', jax.nn.initializers.lecun_normal(), (x.shape[-1], 2))
    ...   return x @ w
    >>> ensemble = vmap(dense, variable_axes={'params': 0}, split_rngs={'params': True})
    >>> y, variables = lift.init(ensemble)(jax.random.key(0), jnp.ones((3, 4)))
    >>> variables['params']['w'].shape
    (3, 4, 2)
  """
  axes = check_variable_axes('vmap', variable_axes, allow_none=True)
  rng_filters, splits = check_split_rngs('vmap', split_rngs)
  config = _VmapConfig(
      variable_axes=axes, rng_splits=splits, rng_filters=rng_filters,
      in_axes=check_axis_leaves('vmap', 'in_axes', in_axes, _is_none, 'None'),
      out_axes=check_axis_leaves('vmap', 'out_axes', out_axes, _is_none, 'None'),
      size=check_size('vmap', 'axis_size', axis_size), metadata_params=dict(metadata_params),
      axis_name=axis_name, spmd_axis_name=spmd_axis_name)
  inner = functools.partial(_vmap_groups, fn, config)
  functools.update_wrapper(inner, fn)
  return pack(inner, axes.in_filters, axes.out_filters, rng_filters, name=_name)


__all__ = ['vmap', 'In', 'Out']
