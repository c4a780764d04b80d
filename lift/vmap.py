"""Lifted `vmap`: one batch axis over arguments, variable collections and rng streams."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax.typing import In, Out

from lift.axes import (MappedAxes, check_axis_leaves, check_size, check_split_rngs,
                       check_variable_axes, infer_axis_size, leaf_axes, mapped_arguments,
                       mapped_variables, split_rng_groups)
from lift import errors
from lift.filters import Filter
from lift.metadata import add_group_axes, remove_group_axes
from lift.pack import pack

_SHARED_WRITE = (
    'vmap: a collection shared by every item (variable_axes None) was written '
    'with a value that differs from item to item; JAX reports: {detail}. (In '
    "that path, out_axes[1][group][root] is followed by the collection and the "
    'variable names.) Fix: reduce the value over the mapped axis first, e.g. '
    "jax.lax.pmean(value, axis_name) with axis_name='batch' given to vmap, or "
    "give the collection an axis: variable_axes={{'collection': 0}}.")

# -- vmap --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _VmapConfig(MappedAxes):
  axis_name: Any = None
  spmd_axis_name: Any = None


def _is_none(x: Any) -> bool:
  return x is None


def _mapped_body(fn, scope_fn, repack_fn, kwargs, variable_groups, rng_groups, args):
  scope = scope_fn(variable_groups, rng_groups)
  y = fn(scope, *args, **kwargs)
  return y, repack_fn(scope)


def _vmap_groups(fn, config: _VmapConfig, scope_fn, repack_fn, variable_groups,
                 rng_groups, *args, **kwargs):
  in_axes, out_axes = config.variable_axes.in_axes, config.variable_axes.out_axes
  groups = remove_group_axes(variable_groups, in_axes, config.metadata_params)
  axes = leaf_axes('vmap', 'in_axes', config.in_axes, args, _is_none, 'positional arguments')
  mapped = mapped_arguments(fn, args, axes) + mapped_variables(groups, in_axes)
  size = infer_axis_size('vmap', 'axis_size', mapped, config.size)
  rng_groups = split_rng_groups(rng_groups, config.rng_splits, size)
  rng_axes = tuple(0 if split else None for split in config.rng_splits)
  body = functools.partial(_mapped_body, fn, scope_fn, repack_fn, kwargs)
  mapped_body = jax.vmap(
      body, in_axes=(in_axes, rng_axes, config.in_axes),
      out_axes=(config.out_axes, out_axes), axis_size=size,
      axis_name=config.axis_name, spmd_axis_name=config.spmd_axis_name)
  try:
    y, out_groups = mapped_body(groups, rng_groups, args)
  except ValueError as error:
    # JAX's message for a batched value under out_axes None; [1] is our variables slot.
    if str(error).startswith('at vmap out_axes[1]'):
      raise errors.InvalidAxisError(_SHARED_WRITE.format(detail=error)) from None
    raise
  return y, add_group_axes(out_groups, out_axes, config.metadata_params)


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
      Keyword arguments reach every item unmapped.
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
      variable_axes=axes, rng_splits=splits,
      in_axes=check_axis_leaves('vmap', 'in_axes', in_axes, _is_none, 'None'),
      out_axes=check_axis_leaves('vmap', 'out_axes', out_axes, _is_none, 'None'),
      size=check_size('vmap', 'axis_size', axis_size), metadata_params=dict(metadata_params),
      axis_name=axis_name, spmd_axis_name=spmd_axis_name)
  inner = functools.partial(_vmap_groups, fn, config)
  functools.update_wrapper(inner, fn)
  return pack(inner, axes.in_filters, axes.out_filters, rng_filters, name=_name)


__all__ = ['vmap', 'In', 'Out']
