"""Axis checks and rng splitting shared by every axis-adding transform (vmap, scan, remat_scan).

Axis-size inference comes with errors that name each argument and variable, and rng
splitting gives item ``i`` of a split stream the raw key ``split(key, n)[i]`` with the
same suffix, so its draws are those of `flax.core.lift.vmap` for the same key.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax.core import meta
from flax.typing import In, Out

from lift import errors
from lift.filters import Filter, validate_filter
from lift.rng import RngStream

_NOT_A_MAPPING = (
    '{transform}: {argument} must be a dict {{collection filter: {values}}}, got '
    '{value!r}. Fix: e.g. {argument}={example}.')
_BAD_VARIABLE_AXIS = (
    '{transform}: variable_axes[{key!r}] = {value!r} is not {allowed}. The value '
    'says along which axis the variables of the matched collections are '
    'mapped. Fix: e.g. variable_axes={{{key!r}: 0}}{hint}.')
_BAD_SPLIT = (
    '{transform}: split_rngs[{key!r}] = {value!r} is not a bool (or 0/1). True gives each '
    'item its own key, False gives every item the same key. Fix: e.g. '
    'split_rngs={{{key!r}: True}}.')
_BAD_AXIS_LEAF = (
    '{transform}: {argument}={axes!r} holds {leaf!r}, which is not {allowed}. '
    'Fix: give an int axis for each mapped value and {unmapped} for the others.')
_BAD_PREFIX = (
    '{transform}: {argument}={axes!r} does not fit the {what}: {error}. It must '
    'be one axis for all of them or a tree prefix of their structure (a tuple '
    'with one entry per positional argument). Fix: e.g. {argument}=0, or '
    '{argument}=(0, None) for two arguments.')
_AXIS_OUT_OF_RANGE = (
    '{transform}: {what} has shape {shape}, which has no axis {axis} (valid '
    'axes: {valid}). Fix: pass a valid axis for it in {argument}, or leave it '
    'unmapped.')
_SIZES_DISAGREE = (
    '{transform}: the mapped axis has more than one size{given}:\n{detail}\n'
    'Every mapped argument and every variable of a mapped collection must have '
    'the same size along its mapped axis. Fix: map values of one size (leave '
    'the others unmapped), or pass {size_argument}=N for the size you mean.')
_NO_SIZE = (
    '{transform}: cannot tell the size of the mapped axis: no argument is mapped '
    'and no collection in variable_axes has variables yet (as during init). '
    'Fix: pass {size_argument}=N, e.g. {size_argument}=4.')
_BAD_SIZE = (
    '{transform}: {size_argument}={value!r} is not a non-negative int. Fix: '
    'e.g. {size_argument}=4, or None to infer it from the mapped values.')


# -- argument checks, at build time -------------------------------------------

def _is_axis(value: Any) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class VariableAxes(NamedTuple):
  """``variable_axes`` split into the collections lifted in and those lifted out.

  A plain axis lifts a collection both ways; ``In(axis)`` (Flax's
  `flax.typing.In`) only into the transform, ``Out(axis)`` only out of it.
  """
  in_filters: tuple[Filter, ...]
  in_axes: tuple[int | None, ...]
  out_filters: tuple[Filter, ...]
  out_axes: tuple[int | None, ...]


class _Broadcast:
  """The `in_axes`/`out_axes` marker of values that every step shares.

  Not for variables: collections every step shares go in ``variable_broadcast``.

  Examples:
    >>> step = lambda scope, c, x, w: (c + x * w, None)
    >>> c, _ = lift.apply(lift.scan(step, in_axes=(0, lift.broadcast)))({}, 0.0, jnp.arange(3.0), 2.0)
    >>> float(c)
    6.0
  """

  def __repr__(self):
    return 'lift.broadcast'


broadcast = _Broadcast()


def is_unmapped(axis: Any) -> bool:
  """None, `broadcast` or Flax's own marker: a value every step (item) gets whole."""
  return axis is None or axis is broadcast or _is_flax_broadcast(axis)


def _is_flax_broadcast(axis: Any) -> bool:
  """Flax's own marker (``flax.linen.broadcast``), recognised without importing Flax's lifting."""
  flax_scan = sys.modules.get('flax.core.axes_scan')
  return flax_scan is not None and axis is getattr(flax_scan, 'broadcast', None)


@dataclasses.dataclass(frozen=True)
class MappedAxes:
  """What an axis-adding transform maps, checked when it is built: variable groups,
  rng splits, argument and result axes, the axis size (None: inferred) and the
  axis-metadata parameters of the new axis."""
  variable_axes: VariableAxes
  rng_splits: tuple[bool, ...]
  in_axes: Any
  out_axes: Any
  size: int | None
  metadata_params: Mapping[Any, Any]


def check_variable_axes(transform: str, variable_axes: Any, allow_none: bool,
                        hint: str = '') -> VariableAxes:
  """Validates ``{filter: axis | In(axis) | Out(axis)}``; returns the filters and axes, in order."""
  if not isinstance(variable_axes, Mapping):
    raise errors.InvalidAxisError(_NOT_A_MAPPING.format(
        transform=transform, argument='variable_axes', values='axis',
        value=variable_axes, example="{'params': 0}"))
  allowed = 'an int or None' if allow_none else 'an int'
  unpack = lambda value: value.axis if isinstance(value, (In, Out)) else value
  for key, value in variable_axes.items():
    validate_filter(key, f'the keys of `variable_axes` of {transform}')
    if not (_is_axis(unpack(value)) or (allow_none and unpack(value) is None)):
      raise errors.InvalidAxisError(_BAD_VARIABLE_AXIS.format(
          transform=transform, key=key, value=value, allowed=allowed + ' (or In/Out of one)',
          hint=hint))
  ins = [(k, unpack(v)) for k, v in variable_axes.items() if not isinstance(v, Out)]
  outs = [(k, unpack(v)) for k, v in variable_axes.items() if not isinstance(v, In)]
  return VariableAxes(tuple(k for k, _ in ins), tuple(a for _, a in ins),
                      tuple(k for k, _ in outs), tuple(a for _, a in outs))


def check_split_rngs(transform: str, split_rngs: Any) -> tuple[tuple[Filter, ...], tuple[bool, ...]]:
  """Validates ``{filter: bool}``; returns the filters and the flags, in order."""
  if not isinstance(split_rngs, Mapping):
    raise errors.InvalidAxisError(_NOT_A_MAPPING.format(
        transform=transform, argument='split_rngs', values='bool',
        value=split_rngs, example="{'params': True}"))
  flags = []
  for key, value in split_rngs.items():
    validate_filter(key, f'the keys of `split_rngs` of {transform}')
    # 0 and 1 are accepted as Flax accepts them (it tests the value's truth)
    if not isinstance(value, (bool, np.bool_, int, np.integer)) or value not in (0, 1):
      raise errors.InvalidAxisError(_BAD_SPLIT.format(transform=transform, key=key, value=value))
    flags.append(bool(value))
  return tuple(split_rngs), tuple(flags)


def check_axis_leaves(transform: str, argument: str, axes: Any,
                      is_unmapped: Callable[[Any], bool], unmapped: str) -> Any:
  """Validates every leaf of an ``in_axes``/``out_axes`` tree; a top-level list becomes a tuple."""
  if isinstance(axes, list):
    axes = tuple(axes)
  for leaf in jax.tree.leaves(axes, is_leaf=is_unmapped):
    if not (_is_axis(leaf) or is_unmapped(leaf)):
      raise errors.InvalidAxisError(_BAD_AXIS_LEAF.format(
          transform=transform, argument=argument, axes=axes, leaf=leaf,
          allowed=f'an int or {unmapped}', unmapped=unmapped))
  return axes


def check_size(transform: str, size_argument: str, value: Any) -> int | None:
  if value is not None and not (_is_axis(value) and value >= 0):
    raise errors.AxisSizeError(_BAD_SIZE.format(
        transform=transform, size_argument=size_argument, value=value))
  return value


# -- axis sizes -------------------------------------------------------------------

class MappedLeaf(NamedTuple):
  """One array that a transform maps over: what to call it in errors, its shape and axis."""
  label: str
  shape: tuple[int, ...]
  axis: int


def leaf_axes(transform: str, argument: str, axes: Any, tree: Any,
              is_unmapped: Callable[[Any], bool], what: str) -> list[Any]:
  """The axis of every leaf of ``tree``, from the tree prefix ``axes``."""
  per_leaf: list[Any] = []
  extend = lambda axis, subtree: per_leaf.extend([axis] * len(jax.tree.leaves(subtree)))
  try:
    jax.tree.map(extend, axes, tree, is_leaf=is_unmapped)
  except ValueError as error:
    raise errors.InvalidAxisError(_BAD_PREFIX.format(
        transform=transform, argument=argument, axes=axes, what=what, error=error)) from None
  return per_leaf


def path_text(path: Sequence[Any]) -> str:
  """``/a/b`` for dict keys, ``[i]`` for sequence indices."""
  parts = []
  for key in path:
    if isinstance(key, jax.tree_util.DictKey):
      parts.append(f'/{key.key}')
    elif isinstance(key, jax.tree_util.SequenceKey):
      parts.append(f'[{key.idx}]')
    else:
      parts.append(str(key))
  return ''.join(parts)


def _argument_names(fn: Callable[..., Any], skip: int) -> list[str]:
  """Names of ``fn``'s positional parameters after the first ``skip``, where it has them."""
  try:
    parameters = list(inspect.signature(fn).parameters.values())[skip:]
  except (TypeError, ValueError):
    return []
  positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  return [p.name for p in parameters if p.kind in positional]


def mapped_arguments(fn: Callable[..., Any], args: tuple, axes: Sequence[Any],
                     skip: int = 1) -> list[MappedLeaf]:
  """The mapped leaves of ``args``, labelled with ``fn``'s parameter names (after ``skip``)."""
  names = _argument_names(fn, skip)
  leaves = []
  for (path, leaf), axis in zip(jax.tree_util.tree_flatten_with_path(args)[0], axes):
    if axis is None:
      continue
    index = path[0].idx
    name = f'argument {names[index]!r}' if index < len(names) else f'args[{index}]'
    label = f'{name}{path_text(path[1:])}' if len(path) > 1 else name
    leaves.append(MappedLeaf(label, np.shape(leaf), int(axis)))
  return leaves


def mapped_variables(groups: Sequence[Any], axes: Sequence[int | None]) -> list[MappedLeaf]:
  """The arrays of the variable groups that have an axis, labelled ``variable col/path``.

  Boxes are looked into, not unboxed: ``Partitioned.unbox`` would add a
  sharding constraint just to read a shape.
  """
  leaves: list[MappedLeaf] = []
  for group, axis in zip(groups, axes):
    if axis is None:
      continue
    boxed = jax.tree_util.tree_flatten_with_path(group, is_leaf=meta.is_axis_metadata)[0]
    for path, value in boxed:
      label = f'variable {path_text(path[1:])[1:]}'
      leaves.extend(MappedLeaf(label, np.shape(leaf), axis) for leaf in jax.tree.leaves(value))
  return leaves


def leaf_axis_size(transform: str, argument: str, leaf: MappedLeaf) -> int:
  """The size of ``leaf`` along its axis; `InvalidAxisError` if it has no such axis."""
  ndim = len(leaf.shape)
  if not -ndim <= leaf.axis < ndim:
    raise errors.InvalidAxisError(_AXIS_OUT_OF_RANGE.format(
        transform=transform, what=leaf.label, shape=leaf.shape, axis=leaf.axis,
        valid=f'-{ndim} to {ndim - 1}' if ndim else 'none, it is a scalar',
        argument=argument))
  return leaf.shape[leaf.axis]


def _sizes_detail(by_size: dict[int, list[str]], limit: int = 8) -> str:
  lines = []
  for size, labels in by_size.items():
    shown = ', '.join(labels[:limit]) + (f' and {len(labels) - limit} more' if len(labels) > limit else '')
    lines.append(f'  * size {size}: {shown}')
  return '\n'.join(lines)


def check_keyword_arrays(kwargs: dict, arguments: list[MappedLeaf], size: int | None,
                         message: str, **names: str) -> None:
  """Keyword arrays while no positional argument is mapped and no size is given: a mapping
  meant, though keyword arguments reach every item whole (`AxisSizeError` with ``message``)."""
  if arguments or size is not None:
    return
  flat = jax.tree_util.tree_flatten_with_path(kwargs)[0]
  arrays = [(path, leaf) for path, leaf in flat if np.ndim(leaf) >= 1]
  if arrays:
    keywords = ', '.join(f'keyword argument {path[0].key}{jax.tree_util.keystr(path[1:])} '
                         f'of shape {np.shape(leaf)}' for path, leaf in arrays)
    raise errors.AxisSizeError(message.format(keywords=keywords, first=arrays[0][0][0].key,
                                              **names))


def infer_axis_size(transform: str, size_argument: str, leaves: Sequence[MappedLeaf],
                    given: int | None, axis_argument: str = 'in_axes') -> int:
  """The one size of every mapped leaf's axis (and of ``given``, if not None)."""
  by_size: dict[int, list[str]] = {}
  for leaf in leaves:
    size = leaf_axis_size(transform, axis_argument, leaf)
    by_size.setdefault(size, []).append(f'axis {leaf.axis} of {leaf.label} {leaf.shape}')
  if given is not None and set(by_size) <= {given}:
    return given
  if len(by_size) == 1 and given is None:
    return next(iter(by_size))
  if not by_size:
    raise errors.AxisSizeError(_NO_SIZE.format(transform=transform, size_argument=size_argument))
  params = any(leaf.label.startswith('variable params/') for leaf in leaves)
  raise (errors.ParamAxisSizeError if params else errors.AxisSizeError)(_SIZES_DISAGREE.format(
      transform=transform, size_argument=size_argument, detail=_sizes_detail(by_size),
      given='' if given is None else f' ({size_argument}={given} was given)'))


# -- rngs ----------------------------------------------------------------------------

def _split_stream(stream: RngStream, count: int) -> RngStream:
  return dataclasses.replace(stream, key=jax.random.split(stream.key, count))


def split_rng_groups(rng_groups: Sequence[Any], splits: Sequence[bool], count: int) -> tuple[Any, ...]:
  """Each stream of a split group becomes ``count`` raw keys (``split(key, count)``), same suffix."""
  is_stream = lambda x: isinstance(x, RngStream)
  return tuple(
      jax.tree.map(lambda s: _split_stream(s, count), group, is_leaf=is_stream) if split else group
      for group, split in zip(rng_groups, splits))
__all__ = ['broadcast', 'is_unmapped', 'VariableAxes', 'MappedAxes', 'MappedLeaf', 'check_variable_axes', 'check_split_rngs', 'check_axis_leaves',
           'check_size', 'leaf_axes', 'path_text', 'mapped_arguments', 'mapped_variables',
           'leaf_axis_size', 'infer_axis_size', 'split_rng_groups']
