"""Lifted `shard_map`: ``fn(scope, *args)`` runs once per shard of a device mesh.

Variables are lifted per collection with one ``PartitionSpec`` each
(``variable_specs``), used both ways like ``jax.shard_map``'s ``in_specs`` and
``out_specs``: a collection with ``P('model')`` is seen as its local shard
inside, and what a shard writes (variables created at init included) is
concatenated along ``'model'``; with ``P()`` it is replicated, and writes to it
must be the same on every shard (e.g. reduced with ``lax.pmean``). A split rng
stream gives shard ``i`` (row-major over the split mesh axes) the raw key
``split(key, n)[i]``, as `vmap` gives item ``i``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from lift import errors
from lift.filters import Filter, validate_filter
from lift.pack import pack
from lift.rng import RngStream
from lift.sharding import check_mesh_axes, check_spec

_NOT_A_MESH = (
    'shard_map: mesh={mesh!r} is not a jax.sharding.Mesh. Fix: e.g. '
    "mesh=jax.make_mesh((4,), ('model',)).")
_BAD_SPECS = (
    'shard_map: variable_specs must be a dict {{collection filter: '
    "PartitionSpec}}, got {value!r}. Fix: e.g. variable_specs={{'params': "
    "P('model'), 'batch_stats': P()}}.")
_BAD_SPEC = (
    'shard_map: variable_specs[{key!r}] = {value!r} is not a PartitionSpec. One '
    'spec applies to every variable of the matched collections (use separate '
    "collections for different layouts). Fix: e.g. variable_specs={{{key!r}: P('model')}}.")
_BAD_SPLIT_RNGS = (
    'shard_map: split_rngs must be a dict {{stream filter: True | False | axis | '
    "(axes...)}}, got {value!r}. Fix: e.g. split_rngs={{'params': True}}.")
_BAD_SPLIT = (
    'shard_map: split_rngs[{key!r}] = {value!r} is not a bool, a mesh axis name or '
    'a tuple of them. The mesh has axes {axes}. Fix: e.g. split_rngs={{{key!r}: '
    'True}} (a key per shard) or {{{key!r}: {example!r}}} (a key per shard along '
    'that axis).')


@dataclasses.dataclass(frozen=True)
class _ShardConfig:
  mesh: Any
  variable_specs: tuple[PartitionSpec, ...]
  rng_axes: tuple[tuple[str, ...], ...]  # mesh axes each rng group is split over
  in_specs: Any
  out_specs: Any
  axis_names: frozenset
  check_vma: bool


def _check_specs(variable_specs: Any,
                 mesh: Any) -> tuple[tuple[Filter, ...], tuple[PartitionSpec, ...]]:
  if not isinstance(variable_specs, Mapping):
    raise errors.InvalidAxisError(_BAD_SPECS.format(value=variable_specs))
  for key, spec in variable_specs.items():
    validate_filter(key, 'the keys of `variable_specs` of shard_map')
    if not isinstance(spec, PartitionSpec):
      raise errors.InvalidAxisError(_BAD_SPEC.format(key=key, value=spec))
    check_mesh_axes(f'shard_map: variable_specs[{key!r}] = {spec}', spec, mesh)
  return tuple(variable_specs), tuple(variable_specs.values())


def _check_variable_shapes(variable_groups, specs: tuple[PartitionSpec, ...], mesh: Any) -> None:
  """Every variable given to the shards divides over the mesh axes of its group's spec."""
  for group, spec in zip(variable_groups, specs):
    for path, leaf in jax.tree_util.tree_leaves_with_path(group):
      if hasattr(leaf, 'shape'):
        keys = '/'.join(str(k.key) for k in path if hasattr(k, 'key'))  # collection/path
        check_spec(f'shard_map: variable {keys} (variable_specs {spec})', leaf.shape, spec, mesh)


def _split_axes(key: Filter, value: Any, manual: Sequence[str]) -> tuple[str, ...]:
  """The mesh axes a stream is split over: all manual axes for True, none for False."""
  if value is True or value is False:
    return tuple(manual) if value else ()
  names = (value,) if isinstance(value, str) else value
  if not (isinstance(names, tuple) and names and all(n in manual for n in names)):
    raise errors.InvalidAxisError(_BAD_SPLIT.format(
        key=key, value=value, axes=tuple(manual), example=manual[0] if manual else 'model'))
  return names


def _check_split_rngs(split_rngs: Any, manual: Sequence[str]):
  if not isinstance(split_rngs, Mapping):
    raise errors.InvalidAxisError(_BAD_SPLIT_RNGS.format(value=split_rngs))
  for key in split_rngs:
    validate_filter(key, 'the keys of `split_rngs` of shard_map')
  axes = tuple(_split_axes(k, v, manual) for k, v in split_rngs.items())
  return tuple(split_rngs), axes


def _is_explicit(mesh: Any, axes: Sequence[str]) -> bool:
  types = dict(zip(mesh.axis_names, mesh.axis_types))
  return all(types[a] == jax.sharding.AxisType.Explicit for a in axes)


def _split_keys(stream: RngStream, axes: tuple[str, ...], mesh: Any) -> RngStream:
  keys = jax.random.split(stream.key, math.prod(mesh.shape[a] for a in axes))
  if _is_explicit(mesh, axes):
    # On explicit axes shard_map checks that inputs already have the in_spec's sharding.
    keys = jax.sharding.reshard(keys, jax.sharding.NamedSharding(mesh, PartitionSpec(axes)))
  return dataclasses.replace(stream, key=keys)


def _split_group(group: Any, axes: tuple[str, ...], mesh: Any) -> Any:
  """Each stream of ``group`` as ``n`` raw keys, one per shard along ``axes``."""
  if not axes:
    return group
  split = lambda s: _split_keys(s, axes, mesh)
  return jax.tree.map(split, group, is_leaf=lambda x: isinstance(x, RngStream))


def _local_key(group: Any, axes: tuple[str, ...]) -> Any:
  """Inside a shard: its one key, out of the length-1 slice of the split keys."""
  if not axes:
    return group
  local = lambda s: dataclasses.replace(s, key=s.key[0])
  return jax.tree.map(local, group, is_leaf=lambda x: isinstance(x, RngStream))


def _sharded_body(fn, scope_fn, repack_fn, kwargs, rng_axes, variable_groups, rng_groups, args):
  rng_groups = tuple(_local_key(g, axes) for g, axes in zip(rng_groups, rng_axes))
  scope = scope_fn(variable_groups, rng_groups)
  y = fn(scope, *args, **kwargs)
  return y, repack_fn(scope)


def _shard_groups(fn, config: _ShardConfig, scope_fn, repack_fn, variable_groups,
                  rng_groups, *args, **kwargs):
  _check_variable_shapes(variable_groups, config.variable_specs, config.mesh)
  rng_groups = tuple(_split_group(g, axes, config.mesh)
                     for g, axes in zip(rng_groups, config.rng_axes))
  rng_specs = tuple(PartitionSpec(axes) if axes else PartitionSpec() for axes in config.rng_axes)
  body = functools.partial(_sharded_body, fn, scope_fn, repack_fn, kwargs, config.rng_axes)
  return jax.shard_map(
      body, mesh=config.mesh, axis_names=config.axis_names, check_vma=config.check_vma,
      in_specs=(config.variable_specs, rng_specs, config.in_specs),
      out_specs=(config.out_specs, config.variable_specs),
  )(variable_groups, rng_groups, args)


def shard_map(fn: Callable[..., Any], *, mesh: jax.sharding.Mesh, in_specs: Any,
              out_specs: Any, variable_specs: Mapping[Filter, PartitionSpec] = {},  # noqa: B006
              split_rngs: Mapping[Filter, bool | str | tuple[str, ...]] = {},  # noqa: B006
              axis_names: frozenset = frozenset(), check_vma: bool = True) -> Callable[..., Any]:
  """Lifted ``jax.shard_map`` of ``fn(scope, *args)`` over ``mesh``.

  Args:
    fn: the scope function; it sees local shards and may use collectives over
      the mesh axes.
    mesh: the device mesh.
    in_specs: as ``jax.shard_map``, for the positional arguments after the
      scope. Keyword arguments are replicated.
    out_specs: as ``jax.shard_map``, for the result.
    variable_specs: ``{collection filter: PartitionSpec}``, the layout of every
      variable of the matched collections, inside and out. Collections matched
      by no filter are not available inside.
    split_rngs: ``{stream filter: True | False | axis | (axes...)}``: True
      splits over all manual mesh axes, an axis name (or tuple) over those
      only; other shards along unsplit axes share the key. Streams matched by
      no filter are not available inside.
    axis_names: as ``jax.shard_map``.
    check_vma: as ``jax.shard_map``.

  Not needed for plain data parallelism under ``jax.jit``: sharded inputs and
  ``Partitioned`` variables already give that.

  Examples:
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = jax.make_mesh((1,), ('model',), axis_types=(jax.sharding.AxisType.Auto,))
    >>> def dense(scope, x):
    ...   w = scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 2))
    ...   return jax.lax.psum(x @ w, 'model')
    >>> sharded = shard_map(dense, mesh=mesh, in_specs=P(None, 'model'), out_specs=P(),
    ...                     variable_specs={'params': P('model')}, split_rngs={'params': True})
    >>> y, variables = lift.init(sharded)(jax.random.key(0), jnp.ones((3, 4)))
    >>> y.shape, variables['params']['w'].shape
    ((3, 2), (4, 2))
  """
  if not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
    raise errors.InvalidAxisError(_NOT_A_MESH.format(mesh=mesh))
  filters, specs = _check_specs(variable_specs, mesh)
  manual = [a for a in mesh.axis_names if not axis_names or a in axis_names]
  rng_filters, rng_axes = _check_split_rngs(split_rngs, manual)
  config = _ShardConfig(mesh, specs, rng_axes, in_specs, out_specs,
                        frozenset(axis_names), check_vma)
  inner = functools.partial(_shard_groups, fn, config)
  functools.update_wrapper(inner, fn)
  return pack(inner, filters, filters, rng_filters, name='shard_map')


__all__ = ['shard_map']
