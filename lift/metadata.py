"""A mapped axis on variable groups, with `flax.core.meta.AxisMetadata` boxes kept in step.

A transform that maps over axis ``a`` of a collection (``variable_axes`` of
`vmap` and `scan`) tells every box in it that axis ``a`` is gone on the way in
(``box.remove_axis(a, metadata_params)``) and back on the way out
(``box.add_axis(a, metadata_params)``), so that, for example, a `Partitioned`
box keeps one name per array axis and gains the transform's
``metadata_params[PARTITION_NAME]`` for the new one. A negative axis counts
from the end of the box's array, as it does for the array itself.
"""
from __future__ import annotations

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


def _map_boxes(fn, tree: Any) -> Any:
  """``meta.map_axis_meta(fn, tree)``, naming the variable whose box cannot name its axis."""
  def one(path, leaf):
    if not isinstance(leaf, meta.AxisMetadata):
      return leaf
    try:
      return fn(leaf)
    except flax_errors.PartitioningUnspecifiedError:
      names = getattr(leaf, 'names', None)
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
  return _map_boxes(lambda box: box.remove_axis(_box_axis(box, axis), params), tree)


def add_axis(tree: Any, axis: int, metadata_params: Mapping[Any, Any]) -> Any:
  """Tells every box in ``tree`` that its array gained ``axis``; arrays are unchanged.

  >>> box = meta.Partitioned(jnp.zeros((3, 2)), names=(None,))
  >>> add_axis({'w': box}, 0, {meta.PARTITION_NAME: 'layers'})['w'].names
  ('layers', None)
  """
  params = dict(metadata_params)
  return _map_boxes(lambda box: box.add_axis(_box_axis(box, axis), params), tree)


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
