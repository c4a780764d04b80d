"""Checks that a `PartitionSpec` fits a mesh and a shape, shared by `shard_map` and the
sharding helpers of `linen_ext`: every mesh axis it names exists, and every dimension it
shards is a multiple of the product of its mesh axes' sizes.

>>> mesh = jax.make_mesh((1,), ('model',), axis_types=(jax.sharding.AxisType.Auto,))
>>> check_spec('params/w', (4, 2), jax.sharding.PartitionSpec('model'), mesh)
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jax.sharding import PartitionSpec

from lift import errors


def spec_axes(entry: Any) -> tuple[str, ...]:
  """The mesh axes of one entry of a spec: ``None`` -> (), ``'a'`` -> ('a',), a tuple as is."""
  if entry is None or entry is PartitionSpec.UNCONSTRAINED:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def check_mesh_axes(where: str, spec: PartitionSpec, mesh: Any) -> None:
  """Raises `MeshAxisError` if ``spec`` names an axis that ``mesh`` lacks."""
  for entry in spec:
    for axis in spec_axes(entry):
      if axis not in mesh.axis_names:
        raise errors.MeshAxisError(where, axis, mesh.axis_names)


def check_spec(where: str, shape: Sequence[int], spec: PartitionSpec, mesh: Any) -> None:
  """Raises unless ``spec`` names axes of ``mesh`` and divides ``shape`` evenly.

  Args:
    where: what the spec is for, in messages (``'variable params/w'``).
    shape: the global shape of the value.
    spec: its partition spec (mesh axis names).
    mesh: a `Mesh` or `AbstractMesh`.
  """
  check_mesh_axes(where, spec, mesh)
  if len(spec) > len(shape):
    raise errors.ShardingShapeError(
        where, shape, spec, f'the spec has {len(spec)} entries for {len(shape)} dimensions')
  for dim, entry in enumerate(spec):
    axes = spec_axes(entry)
    parts = math.prod(mesh.shape[axis] for axis in axes)
    if shape[dim] % parts:
      sizes = ' x '.join(f'{axis}={mesh.shape[axis]}' for axis in axes)
      raise errors.ShardingShapeError(
          where, shape, spec,
          f'dimension {dim} (size {shape[dim]}) does not divide into {parts} parts ({sizes})')
