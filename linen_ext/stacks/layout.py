"""The two layouts of a layer stack's variables, per-layer arguments, and the checks that layers match.

*Stacked* layout: one tree per collection whose every array has a leading
layer axis (what `Stacked`, `nn.scan` and `flax.linen.scan` create).
*Per-layer* layout: ``{'layers_0': tree, 'layers_1': tree, ...}`` per
collection (what a Python list of submodules, `BlockSeq` and `scan_layers`
use). Conversion is exact in both directions, axis-metadata boxes
(``nn.Partitioned``) included.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax.core import meta

from lift.metadata import add_axis, remove_axis

from linen_ext import errors
from linen_ext.module.core import Module

_VARIABLE_MISMATCH = (
    '{what}: layer {index} does not match layer 0: variable {path} is {seen} '
    'in layer {index} but {expected} in layer 0. A stack runs one copy of the '
    "layer's code over all layers, so every layer needs the same variables "
    '(names, shapes, dtypes). Fix: give every layer the same configuration, or '
    'run layers that differ in a Python loop (e.g. BlockSeq([...])).')
_STRUCTURE_MISMATCH = (
    '{what}: layer {index} has the same variable shapes as layer 0 but another '
    'tree structure (for example different axis-metadata boxes, such as '
    'Partitioned names):\n  layer 0: {expected}\n  layer {index}: {seen}\n'
    'Fix: create every layer with the same partitioning.')
_CODE_MISMATCH = (
    '{what}: layer {index} runs other code than layer 0: {detail}. A stack '
    "traces layer 0's code once and runs it for every layer, so all layers "
    'must be instances of one class with equal fields. Fix: make the layers '
    'equal; pass what differs per layer as an argument, per_layer(values) '
    '(row i goes to layer i); or run them in a Python loop (BlockSeq).')
_ROW_LENGTH = (
    '{what}: per_layer argument {argument} has leading axis {size} (shape '
    '{shape}), but the stack has {length} layers. Row i of a per_layer value '
    'goes to layer i. Fix: pass an array with {length} rows, e.g. '
    'per_layer(jnp.arange({length})), or pass the value without per_layer to '
    'give it whole to every layer.')
_NOT_PER_LAYER = (
    'per_layer({value!r:.60}): {reason}. Fix: wrap an array (or a pytree of '
    'arrays) whose leading axis has one row per layer, e.g. '
    'per_layer(jnp.arange(num_layers)).')
_NO_LAYERS = (
    '{what}: the variables hold no {prefix}_<i> entries (collection {collection!r} '
    'has {keys}). Fix: pass the dict of one stack, {{collection: {{"{prefix}_0": '
    '..., "{prefix}_1": ...}}}}, or name the prefix: prefix="blocks".')
_EXTRA_KEYS = (
    '{what}: collection {collection!r} holds {keys} besides the {prefix}_<i> '
    'layers; they have no place in the stacked layout. Fix: pass only the '
    "stack's own variables, e.g. {{'params': {{k: v for k, v in params.items() "
    "if k.startswith('{prefix}_')}}}}.")
_GAPS = (
    '{what}: collection {collection!r} has layers {indices}, not 0..{last} without '
    'gaps. Fix: pass every layer of the stack.')
_LENGTHS = (
    '{what}: the leading (layer) axes disagree: {detail}. Every array of a '
    'stacked tree has one row per layer. Fix: pass the variables of one '
    'Stacked/nn.scan module.')


# -- checks ----------------------------------------------------------------------------


def _leaf_specs(tree: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], Any]]:
  """``{'collection/path': (shape, dtype)}`` for every array of ``{collection: tree}``."""
  specs = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    specs[_path_text(path)] = (tuple(np.shape(leaf)), jnp.result_type(leaf))
  return specs


def _path_text(path: Sequence[Any]) -> str:
  parts = []
  for key in path:
    if isinstance(key, jax.tree_util.DictKey):
      parts.append(str(key.key))
    elif isinstance(key, jax.tree_util.GetAttrKey):
      parts.append(f'.{key.name}')
    else:
      parts.append(str(key))
  return '/'.join(parts).replace('/.', '.')


def _describe(spec: tuple[tuple[int, ...], Any] | None) -> str:
  if spec is None:
    return 'missing'
  shape, dtype = spec
  return f'shape {shape} dtype {dtype}'


def check_same_variables(trees: Sequence[Mapping[str, Any]], what: str) -> None:
  """Raises `LayerMismatchError` unless every ``{collection: tree}`` matches the first.

  The message names the layer index, the variable path and both shapes.
  """
  expected = _leaf_specs(trees[0])
  for index, tree in enumerate(trees[1:], start=1):
    seen = _leaf_specs(tree)
    for path in sorted(expected.keys() | seen.keys()):
      if expected.get(path) != seen.get(path):
        raise errors.LayerMismatchError(_VARIABLE_MISMATCH.format(
            what=what, index=index, path=path, seen=_describe(seen.get(path)),
            expected=_describe(expected.get(path))))
    # jaxlib ships no type stubs: mypy cannot resolve PyTreeDef, nor its comparison.
    if jax.tree.structure(tree) != jax.tree.structure(trees[0]):  # type: ignore[operator]
      raise errors.LayerMismatchError(_STRUCTURE_MISMATCH.format(
          what=what, index=index, expected=jax.tree.structure(trees[0]),
          seen=jax.tree.structure(tree)))


def _same_value(a: Any, b: Any, seen: frozenset = frozenset()) -> bool:
  if a is b or (id(a), id(b)) in seen:
    return True
  if type(a) is not type(b):
    return False
  if isinstance(a, Module):
    return configuration_difference(a, b) is None
  if isinstance(a, (types.FunctionType, functools.partial)):
    return _same_function(a, b, seen | {(id(a), id(b))})
  try:
    return bool(np.all(a == b)) if isinstance(a, (np.ndarray, jax.Array)) else bool(a == b)
  except Exception:  # noqa: BLE001 (values without a usable ==: only identity counts)
    return False


def _same_function(a: Any, b: Any, seen: frozenset) -> bool:
  """Whether two functions compute the same: one code, equal defaults and closed-over values.

  So ``kernel_init=nn.initializers.normal(0.02)``, a fresh closure per layer,
  counts as the same configuration.
  """
  def same_all(xs, ys):
    return len(xs) == len(ys) and all(_same_value(x, y, seen) for x, y in zip(xs, ys))

  def same_dict(x, y):
    return x.keys() == y.keys() and same_all([x[k] for k in x], [y[k] for k in x])

  if isinstance(a, functools.partial):
    return (_same_value(a.func, b.func, seen) and same_all(a.args, b.args)
            and same_dict(a.keywords, b.keywords))
  cells = lambda f: [c.cell_contents for c in f.__closure__ or ()]
  return (a.__code__ is b.__code__ and a.__globals__ is b.__globals__
          and same_all(a.__defaults__ or (), b.__defaults__ or ())
          and same_dict(a.__kwdefaults__ or {}, b.__kwdefaults__ or {})
          and same_all(cells(a), cells(b)))


def configuration_difference(first: Any, other: Any) -> str | None:
  """How Module ``other`` differs from ``first`` (class or a field), or None if equal."""
  if type(other) is not type(first):
    return f'it is a {type(other).__name__}, layer 0 a {type(first).__name__}'
  for field in dataclasses.fields(first):
    if not field.init or field.name in ('parent', 'name'):
      continue
    a, b = getattr(first, field.name), getattr(other, field.name)
    if not _same_value(a, b):
      return f'field {field.name!r} is {b!r:.60} there, {a!r:.60} in layer 0'
  return None


def check_same_code(layers: Sequence[Any], what: str) -> None:
  """Raises `LayerMismatchError` unless every layer has the class and fields of the first."""
  for index, layer in enumerate(layers[1:], start=1):
    detail = configuration_difference(layers[0], layer)
    if detail is not None:
      raise errors.LayerMismatchError(_CODE_MISMATCH.format(what=what, index=index, detail=detail))


# -- per-layer arguments ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PerLayer:
  """An argument of a layer stack whose row i goes to layer i (see `per_layer`)."""
  value: Any


def per_layer(value: Any) -> PerLayer:
  """Marks a stack argument whose leading axis is the layer axis: row i goes to layer i.

  Arguments of `Stacked`, `BlockSeq` and `scan_layers` calls go whole to every
  layer unless wrapped by `per_layer`. Use it for per-layer dynamic
  configuration (a scale, a layer index, a mask per layer); not for options
  every layer shares: pass those unwrapped, or as ``block_kwargs``.

  Examples:
    >>> class Scale(nn.Module):
    ...   def __call__(self, x, s):
    ...     return x * s
    >>> nn.Stacked(Scale, 3).apply({}, jnp.ones(2), nn.per_layer(jnp.array([1.0, 2.0, 3.0])))
    Array([6., 6.], dtype=float32)
  """
  leaves = jax.tree.leaves(value)
  if not leaves:
    raise errors.LayerStackError(_NOT_PER_LAYER.format(value=value, reason='it holds no array'))
  for leaf in leaves:
    if not np.ndim(leaf):
      raise errors.LayerStackError(_NOT_PER_LAYER.format(
          value=value, reason='it holds a scalar, which has no layer axis'))
  return PerLayer(value)


class _Row(NamedTuple):
  """Where the ``index``-th per-layer value goes in a layer's arguments."""
  index: int  # type: ignore[assignment]  # a field may shadow tuple.index


class LayerArgs(NamedTuple):
  """A stack call's arguments: templates with `_Row` slots, and the per-layer values."""
  args: tuple
  kwargs: dict
  rows: tuple  # the per_layer values, each with a leading layer axis

  def for_layer(self, rows: tuple) -> tuple[tuple, dict]:
    """The arguments of one layer, given its rows (``self.rows`` sliced)."""
    fill = lambda v: rows[v.index] if isinstance(v, _Row) else v
    return tuple(fill(v) for v in self.args), {k: fill(v) for k, v in self.kwargs.items()}


def is_row_slot(value: Any) -> bool:
  """Whether ``value`` is the slot of a `per_layer` value in `LayerArgs`' templates."""
  return isinstance(value, _Row)


def split_layer_args(args: tuple, kwargs: Mapping[str, Any]) -> LayerArgs:
  """Takes the `per_layer` values (top-level positional or keyword) out of a call."""
  rows: list[Any] = []

  def slot(value):
    if not isinstance(value, PerLayer):
      return value
    rows.append(value.value)
    return _Row(len(rows) - 1)

  return LayerArgs(tuple(slot(v) for v in args), {k: slot(v) for k, v in kwargs.items()},
                   tuple(rows))


def check_rows(layer_args: LayerArgs, length: int, what: str) -> None:
  """Every per-layer value has ``length`` rows."""
  names = [f'{i}' for i, v in enumerate(layer_args.args) if isinstance(v, _Row)]
  names += [repr(k) for k, v in layer_args.kwargs.items() if isinstance(v, _Row)]
  for name, value in zip(names, layer_args.rows):
    for leaf in jax.tree.leaves(value):
      if np.shape(leaf)[0] != length:
        raise errors.LayerStackError(_ROW_LENGTH.format(
            what=what, argument=name, size=np.shape(leaf)[0], shape=np.shape(leaf),
            length=length))


def row(tree: Any, index: int) -> Any:
  """Row ``index`` of every array in ``tree``."""
  return jax.tree.map(lambda leaf: leaf[index], tree)


# -- layouts ------------------------------------------------------------------------------


def name_layer_axis(tree: Any, name: str) -> Any:
  """Every array of ``tree`` with a layer axis that is not in an axis-metadata box, boxed
  as ``Partitioned`` with ``name`` on that axis (axis 0): the stack's variables all carry
  the layer axis's name, so `nn.variable_shardings` puts each layer's rows where that
  name maps, whether or not the block named its own axes."""
  def box(leaf):
    if isinstance(leaf, meta.AxisMetadata) or not hasattr(leaf, 'ndim') or leaf.ndim == 0:
      return leaf
    return meta.Partitioned(leaf, names=(name,) + (None,) * (leaf.ndim - 1))
  return jax.tree.map(box, tree, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))


def layer_name(prefix: str, index: int) -> str:
  return f'{prefix}_{index}'


def stack_trees(trees: Sequence[Any]) -> Any:
  """The arrays of equal-structured trees stacked along a new leading axis (boxes kept)."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _stack_length(variables: Mapping[str, Any], what: str) -> int:
  sizes: dict[int, list[str]] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(variables):
    sizes.setdefault(np.shape(leaf)[0] if np.ndim(leaf) else 0, []).append(_path_text(path))
  if len(sizes) != 1:
    detail = '; '.join(f'{size} for {", ".join(paths[:3])}' for size, paths in sizes.items())
    raise errors.LayerStackError(_LENGTHS.format(what=what, detail=detail or 'no arrays'))
  return next(iter(sizes))


def stacked_to_layers(variables: Mapping[str, Any], *, prefix: str = 'layers',
                      metadata_params: Mapping[Any, Any] = {}) -> dict[str, Any]:  # noqa: B006
  """Stacked layout to per-layer layout: ``{col: tree[N, ...]}`` to ``{col: {'layers_i': tree[i]}}``.

  ``metadata_params`` are those the stack was built with (e.g.
  ``{nn.PARTITION_NAME: 'layers'}``): boxes lose the layer axis's name. For
  moving checkpoints between `Stacked` and `BlockSeq` / `scan_layers`; not
  needed to run a stack.

  Examples:
    >>> stack = nn.Stacked(nn.Dense, 4, block_kwargs={'features': 3})
    >>> layers = nn.stacked_to_layers(stack.init(jax.random.key(0), jnp.ones((1, 3))))
    >>> list(layers['params']), layers['params']['layers_2']['kernel'].shape
    (['layers_0', 'layers_1', 'layers_2', 'layers_3'], (3, 3))
  """
  out = {}
  for col, tree in variables.items():
    length = _stack_length({col: tree}, 'stacked_to_layers')
    tree = remove_axis(tree, 0, metadata_params)
    out[col] = {layer_name(prefix, i): row(tree, i) for i in range(length)}
  return out


def _layer_indices(col: str, tree: Mapping[str, Any], prefix: str) -> list[int]:
  pattern = re.compile(rf'{re.escape(prefix)}_(\d+)')
  matches = {key: pattern.fullmatch(key) for key in tree}
  extra = sorted(key for key, match in matches.items() if match is None)
  if not any(matches.values()):
    raise errors.LayerStackError(_NO_LAYERS.format(
        what='layers_to_stacked', prefix=prefix, collection=col, keys=sorted(tree)))
  if extra:
    raise errors.LayerStackError(_EXTRA_KEYS.format(
        what='layers_to_stacked', collection=col, keys=extra, prefix=prefix))
  indices = sorted(int(match.group(1)) for match in matches.values()
                   if match is not None)  # all are: `extra` is empty
  if indices != list(range(len(indices))):
    raise errors.LayerStackError(_GAPS.format(
        what='layers_to_stacked', collection=col, indices=indices, last=len(indices) - 1))
  return indices


def layers_to_stacked(variables: Mapping[str, Any], *, prefix: str = 'layers',
                      metadata_params: Mapping[Any, Any] = {}) -> dict[str, Any]:  # noqa: B006
  """Per-layer layout to stacked layout, the inverse of `stacked_to_layers`.

  For moving checkpoints from `BlockSeq` / `scan_layers` to `Stacked`; not
  needed to run a stack.

  Raises:
    LayerMismatchError: two layers differ in variable names, shapes or dtypes
      (the message names the layer, the path and both shapes).

  Examples:
    >>> layers = {'params': {'layers_0': {'w': jnp.zeros(2)}, 'layers_1': {'w': jnp.ones(2)}}}
    >>> nn.layers_to_stacked(layers)['params']['w']
    Array([[0., 0.],
           [1., 1.]], dtype=float32)
  """
  out = {}
  for col, tree in variables.items():
    indices = _layer_indices(col, tree, prefix)
    layers = [tree[layer_name(prefix, i)] for i in indices]
    check_same_variables([{col: layer} for layer in layers], 'layers_to_stacked')
    out[col] = add_axis(stack_trees(layers), 0, metadata_params)
  return out


__all__ = ['PerLayer', 'per_layer', 'stacked_to_layers', 'layers_to_stacked',
           'check_same_variables', 'check_same_code', 'split_layer_args', 'LayerArgs']
