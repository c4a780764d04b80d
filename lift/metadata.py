"""A mapped axis on variable groups, with `flax.core.meta.AxisMetadata` boxes kept in step.

A transform that maps over axis ``a`` of a collection (``variable_axes`` of
`vmap` and `scan`) tells every box in it that axis ``a`` is gone on the way in
(``box.remove_axis(a, metadata_params)``) and back on the way out
(``box.add_axis(a, metadata_params)``), so that, for example, a `Partitioned`
box keeps one name per array axis and gains the transform's
``metadata_params[PARTITION_NAME]`` for the new one. A negative axis counts
from the end of the box's array, as it does for the array itself.

Flax's own `NNXMeta` (the box `nnx.bridge` puts around an NNX variable with metadata)
leaves both methods as stubs; here its variable's metadata gains and loses the axis as
NNX's own transforms do it (`flax.nnx.spmd.add_axis`: the partition name in
``out_sharding``, the other ``metadata_params`` in the fields of the same name, the
variable's axis hooks). A box whose ``add_axis`` still leaves its partition spec one
name short of its array is an error, not a spec that silently shards the wrong axes.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors
from flax.core import meta

from lift import errors


def _box_axis(box: meta.AxisMetadata, axis: int) -> int:
  """``axis`` as a non-negative index into the axes of the box's array."""
  leaves = jax.tree.leaves(box)
  if axis >= 0 or not leaves:
    return axis
  return axis % np.ndim(leaves[0])


_NNX_BRIDGE = 'flax.nnx.bridge.variables'


def _is_nnx_meta(box: meta.AxisMetadata) -> bool:
  """Whether ``box`` is Flax's `NNXMeta` (only possible once `flax.nnx` is loaded)."""
  bridge = sys.modules.get(_NNX_BRIDGE)
  return bridge is not None and isinstance(box, bridge.NNXMeta)


def _nnx_meta_axis(box: Any, change: str, axis: int, params: dict[Any, Any]) -> Any:
  """``box`` (an `NNXMeta`) after NNX's own ``add_axis``/``remove_axis`` on its variable."""
  if meta.PARTITION_NAME not in params:
    raise flax_errors.PartitioningUnspecifiedError(box)
  spmd = importlib.import_module('flax.nnx.spmd')
  # Rebuilding the variable must not place its value on a mesh: this runs inside a trace.
  variable = box.var_type(box.value, **{**box.metadata, 'eager_sharding': False})
  variable = getattr(spmd, change)(variable, axis, params)
  metadata = {**variable.get_metadata(), 'eager_sharding': box.metadata.get('eager_sharding')}
  metadata = {k: v for k, v in metadata.items() if k in box.metadata or v}
  return dataclasses.replace(box, value=variable.get_value(), metadata=metadata)


def _spec_length(box: meta.AxisMetadata) -> int | None:
  """How many axes the box's partition spec names, or None when it has no spec."""
  get_spec = getattr(box, 'get_partition_spec', None)
  try:
    return None if get_spec is None else len(get_spec())
  except Exception:  # noqa: BLE001 (a box whose spec needs a mesh or rules: not checked here)
    return None


def _added(box: meta.AxisMetadata, axis: int, params: dict[Any, Any], path: str) -> Any:
  """``box.add_axis``, checked: the spec names every axis of the array, or none."""
  if _is_nnx_meta(box):
    return _nnx_meta_axis(box, 'add_axis', axis, params)
  added = box.add_axis(axis, params)
  if added is not box:  # a box that changed knows its axes (`add_metadata_axis` adds names only)
    return added
  names, leaves = _spec_length(added), jax.tree.leaves(added)
  if names and leaves and names != np.ndim(leaves[0]):
    kind = type(box).__qualname__
    raise errors.AxisMetadataError(
        path, f'its {kind} box names {names} axes of an array with {np.ndim(leaves[0])} after '
        'a transform added an axis, so its partition spec would shard the wrong axes.',
        f'make {kind}.add_axis and remove_axis insert and drop the name at the index they '
        'are given, as flax.core.meta.Partitioned does.')
  return added


def _removed(box: Any, axis: int, params: dict[Any, Any], path: str) -> Any:
  if not _is_nnx_meta(box):
    return box.remove_axis(axis, params)
  sharding = box.metadata.get('out_sharding')
  if sharding and len(sharding) == np.ndim(box.value) - 1:
    return box  # made by Flax's transforms, whose NNXMeta never gained the axis
  try:
    return _nnx_meta_axis(box, 'remove_axis', axis, params)
  except ValueError as e:  # NNX's check that the name it drops is the transform's
    raise errors.AxisMetadataError(
        path, f'the transform maps axis {axis} named {params.get(meta.PARTITION_NAME)!r}, '
        f'but the variable\'s sharding is {box.metadata.get("out_sharding")} ({e}).',
        'give the transform the metadata_params and variable axis the variables were '
        'created with (metadata_params={nn.PARTITION_NAME: ...}, variable_axes).') from None


def _map_boxes(fn, tree: Any) -> Any:
  """``fn(box, path)`` on every box of ``tree``, naming the variable whose box cannot name
  its axis."""
  def one(path, leaf):
    if not isinstance(leaf, meta.AxisMetadata):
      return leaf
    try:
      return fn(leaf, _path_text(path))
    except flax_errors.PartitioningUnspecifiedError:
      names = getattr(leaf, 'names', None)
      if _is_nnx_meta(leaf):
        names = leaf.metadata.get('out_sharding')  # type: ignore[attr-defined]
      raise errors.PartitionNameError(_path_text(path), names) from None
  return jax.tree_util.tree_map_with_path(
      one, tree, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))


def _path_text(path) -> str:
  """``collection/name/...`` (a group may hold one tree per lifted scope: indices are left out)."""
  return '/'.join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def remove_axis(tree: Any, axis: int, metadata_params: Mapping[Any, Any]) -> Any:
  """Tells every box in ``tree`` that ``axis`` of its array is mapped away; arrays are unchanged.

  >>> box = meta.Partitioned(jnp.zeros((3, 2)), names=('layers', None))
  >>> remove_axis({'w': box}, 0, {meta.PARTITION_NAME: 'layers'})['w'].names
  (None,)
  """
  params = dict(metadata_params)
  return _map_boxes(lambda box, path: _removed(box, _box_axis(box, axis), params, path), tree)


def add_axis(tree: Any, axis: int, metadata_params: Mapping[Any, Any]) -> Any:
  """Tells every box in ``tree`` that its array gained ``axis``; arrays are unchanged.

  >>> box = meta.Partitioned(jnp.zeros((3, 2)), names=(None,))
  >>> add_axis({'w': box}, 0, {meta.PARTITION_NAME: 'layers'})['w'].names
  ('layers', None)
  """
  params = dict(metadata_params)
  return _map_boxes(lambda box, path: _added(box, _box_axis(box, axis), params, path), tree)


def remove_group_axes(groups: Sequence[Any], axes: Sequence[int | None],
                      metadata_params: Mapping[Any, Any]) -> tuple[Any, ...]:
  """:func:`remove_axis` on each group whose axis is not None."""
  return tuple(group if axis is None else remove_axis(group, axis, metadata_params)
               for group, axis in zip(groups, axes))


def add_group_axes(groups: Sequence[Any], axes: Sequence[int | None],
                   metadata_params: Mapping[Any, Any]) -> tuple[Any, ...]:
  """:func:`add_axis` on each group whose axis is not None."""
  return tuple(group if axis is None else add_axis(group, axis, metadata_params)
               for group, axis in zip(groups, axes))


def move_axis(tree: Any, source: int, destination: int) -> Any:
  """``jnp.moveaxis`` on every array of ``tree`` (box metadata is left as it is).

  >>> move_axis({'w': jnp.zeros((2, 3))}, 1, 0)['w'].shape
  (3, 2)
  """
  if source == destination:
    return tree
  return jax.tree.map(lambda x: jnp.moveaxis(x, source, destination), tree)


__all__ = ['add_axis', 'remove_axis', 'add_group_axes', 'remove_group_axes', 'move_axis']
