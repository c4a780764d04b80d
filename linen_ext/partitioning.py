"""Flax's legacy logical-axis API (`flax.linen.partitioning`) for this package's modules.

`param_with_axes` and `variable_with_axes` declare a variable, constrain its
sharding by logical axis names, and record the names as an `AxisMetadata`
in the ``<collection>_axes`` collection (``params_axes/kernel_axes``), where
`get_axis_names` turns them into logical `PartitionSpec`s. `scan_with_axes`
and `vmap_with_axes` are `scan` and `vmap` that also add their axis to those
names. The rules and constraints are Flax's own, and so are the other names of
`flax.linen.partitioning` but ``_is_mutable`` and ``_add_axis_to_metadata``, which read and
transform this package's modules.

>>> class Mlp(nn.Module):
...   @nn.compact
...   def __call__(self, x):
...     w = param_with_axes('w', nn.initializers.lecun_normal(), (x.shape[-1], 4),
...                         axes=('embed', 'mlp'))
...     return x @ w
>>> axes = get_axis_names(Mlp().init(key, x)['params_axes'])   # {'w': P('embed', 'mlp')}
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from flax.linen.partitioning import (Array, ArrayPytree, AxisMetadata, CollectionFilter,
                                     InOutAxis, InOutScanAxis, LogicalPartitionSpec,
                                     LogicalPartitionSpecPytree, LogicalRules,
                                     PartitionSpecPytree, PRNGSequenceFilter, RulesFallback,
                                     ScanIn, ScanOut, axis_rules, flatten_dict, freeze,
                                     get_axis_names, get_axis_rules, logical_to_mesh,
                                     logical_to_mesh_axes, set_axis_rules, unflatten_dict,
                                     unfreeze, with_sharding_constraint)
from flax.linen.partitioning import _is_logical_spec as _is_logical_spec
from flax.linen.partitioning import (
    _param_with_axes_sow_reduce_fn as _param_with_axes_sow_reduce_fn)
from flax.linen.partitioning import _tree_map_axes as _tree_map_axes
from flax.linen.partitioning import _with_sharding_constraint as _with_sharding_constraint

from lift.filters import Filter, union_filters
from lift.scope import Variable

from linen_ext import errors

from linen_ext.transforms import module_transforms as transforms
from linen_ext.module.state import context

__all__ = ['Array', 'ArrayPytree', 'AxisMetadata', 'CollectionFilter', 'InOutAxis',
           'InOutScanAxis', 'LogicalPartitionSpec', 'LogicalPartitionSpecPytree', 'LogicalRules',
           'PRNGSequenceFilter', 'PartitionSpecPytree', 'PartitionedVariable', 'RulesFallback',
           'ScanIn', 'ScanOut', 'axis_rules', 'flatten_dict', 'freeze', 'get_axis_names',
           'get_axis_rules', 'logical_to_mesh', 'logical_to_mesh_axes', 'param_with_axes',
           'remat', 'scan_with_axes', 'set_axis_rules', 'unflatten_dict', 'unfreeze',
           'variable_with_axes', 'vmap_with_axes', 'with_sharding_constraint']


def _current_module(module: Any, fn_name: str) -> Any:
  module = context.module_stack[-1] if module is None else module
  if module is None:
    raise errors.NoCurrentModuleError(fn_name)
  return module


def _record_axes(module: Any, collection: str, name: str, axes: tuple[str, ...]) -> None:
  """Sows ``AxisMetadata(axes)`` at ``<collection>_axes/<name>_axes``; a redeclaration must agree."""
  def keep_same(previous: Any, new: AxisMetadata) -> AxisMetadata:
    if isinstance(previous, AxisMetadata) and previous != new:
      raise errors.AxesMismatchError(
          f'"{collection}/{name}" declared again', previous.names, new.names,
          'declare it with the same `axes=` every time.')
    return new
  module.sow(f'{collection}_axes', f'{name}_axes', AxisMetadata(axes), reduce_fn=keep_same)


def param_with_axes(name: str, init_fn: Callable[..., Any], *init_args,
                    axes: tuple[str, ...] | None = None, module: Any = None,
                    **init_kwargs) -> Any:
  """``module.param(name, ...)`` constrained to, and recorded with, logical ``axes``.

  >>> kernel = param_with_axes('kernel', init, (3, 4), axes=('embed', 'mlp'))
  """
  module = _current_module(module, 'param_with_axes')
  value = module.param(name, init_fn, *init_args, **init_kwargs)
  if axes is None:
    return value
  _record_axes(module, 'params', name, axes)
  return with_sharding_constraint(value, jax.sharding.PartitionSpec(*axes))


class PartitionedVariable(Variable):
  """A `Variable` whose value is constrained to its logical ``axes`` when read and written."""

  def __init__(self, variable: Variable, axes: tuple[str, ...] | None,
               fallback: RulesFallback = RulesFallback.AXIS_IS_UNSHARDED):
    super().__init__(variable.scope, variable.collection, variable.name, variable.unbox)
    self.axes, self.fallback = axes, fallback

  def _constrain(self, value: Any) -> Any:
    if self.axes is None:
      return value
    return with_sharding_constraint(value, self.axes, fallback=self.fallback)

  @property
  def value(self) -> Any:
    # mypy types a property read from the class as its getter.
    return self._constrain(Variable.value.fget(self))  # type: ignore[attr-defined]

  @value.setter
  def value(self, value: Any) -> None:
    Variable.value.fset(self, self._constrain(value))  # type: ignore[attr-defined]


def variable_with_axes(collection: str, name: str, init_fn: Callable[..., Any] | None = None,
                       *init_args, axes: tuple[str, ...] | None = None, module: Any = None,
                       fallback: RulesFallback = RulesFallback.AXIS_IS_UNSHARDED,
                       **init_kwargs) -> PartitionedVariable:
  """``module.variable(...)`` whose value is kept constrained to logical ``axes``.

  >>> cache = variable_with_axes('cache', 'k', jnp.zeros, (8, 16), axes=('batch', 'len'))
  """
  module = _current_module(module, 'variable_with_axes')
  if init_fn is not None and axes is not None:  # the initial value is constrained too
    init_fn = lambda *args, f=init_fn, **kwargs: with_sharding_constraint(
        f(*args, **kwargs), axes, fallback=fallback)
  variable = PartitionedVariable(
      module.variable(collection, name, init_fn, *init_args, **init_kwargs), axes, fallback)
  if axes is not None:
    _record_axes(module, collection, name, axes)
  return variable


def _is_mutable(axis_col: str) -> bool:
  """Whether the running module may write ``axis_col`` (True outside any module), as Flax's."""
  module = context.module_stack[-1]
  return module is None or module.is_mutable_collection(axis_col)


def _add_axis_to_metadata(target: Any, axis_pos: Any, axis_name: str,
                          axis_col: str = 'params_axes') -> Any:
  """Shows ``target`` the ``axis_col`` names without the transform's axis ``axis_name`` at
  ``axis_pos`` (an int, or ``ScanIn``/``ScanOut`` marking one), and adds it back to what leaves.
  """
  position = getattr(axis_pos, 'axis', axis_pos)

  def edit(tree: Any, edit_names: Callable[[list], None]) -> Any:
    def leaf(meta: Any) -> Any:
      if not isinstance(meta, AxisMetadata):
        return meta
      def one(names: Any) -> Any:
        if names is None:
          return None
        names = list(names)
        edit_names(names)
        return tuple(names)
      # flax.struct.dataclass adds `replace`; flax's annotations do not declare it.
      return meta.replace(names=jax.tree.map(  # type: ignore[attr-defined]
          one, meta.names, is_leaf=lambda x: x is None or isinstance(x, tuple)))
    return jax.tree.map(leaf, tree, is_leaf=lambda x: isinstance(x, AxisMetadata))

  def remove(names: list) -> None:
    if names[position] != axis_name:
      raise errors.AxesMismatchError(
          f'"{axis_col}" entering a transform over axis "{axis_name}" at position '
          f'{position}', f'"{axis_name}" at position {position}', tuple(names),
          'give the transform the variables it created (the same axis name and position).')
    names.pop(position)

  return transforms.map_variables(
      target, axis_col, mutable=_is_mutable(axis_col),
      trans_in_fn=lambda tree: edit(tree, remove),
      trans_out_fn=lambda tree: edit(tree, lambda names: names.insert(position, axis_name)))


def scan_with_axes(target: Any, variable_axes: Mapping[Filter, Any] = {},  # noqa: B006
                   variable_broadcast: Filter = False, variable_carry: Filter = False,
                   split_rngs: Mapping[Filter, bool] = {}, in_axes: Any = 0,  # noqa: B006
                   out_axes: Any = 0, length: int | None = None, reverse: bool = False,
                   unroll: int = 1, axis_name: str = 'layers',
                   axes_collections: tuple[str, ...] = ('params',),
                   data_transform: Callable[..., Any] | None = None, methods: Any = None) -> Any:
  """`scan` that also puts ``axis_name`` into the logical axis names of the scanned variables.

  >>> Layers = scan_with_axes(Block, variable_axes={'params': 0}, split_rngs={'params': True},
  ...                         length=4, axis_name='layers')
  """
  broadcast = union_filters(variable_broadcast, tuple(f'{c}_axes' for c in axes_collections))
  scanned = transforms.scan(
      target, variable_axes=variable_axes, variable_broadcast=broadcast,
      variable_carry=variable_carry, split_rngs=split_rngs, in_axes=in_axes, out_axes=out_axes,
      length=length, reverse=reverse, unroll=unroll, data_transform=data_transform,
      methods=methods)
  for collection in axes_collections:
    if collection in variable_axes:
      scanned = _add_axis_to_metadata(scanned, variable_axes[collection], axis_name,
                                      f'{collection}_axes')
  return scanned


def vmap_with_axes(target: Any, variable_axes: Mapping[Filter, Any],
                   split_rngs: Mapping[Filter, bool] = {}, in_axes: Any = 0,  # noqa: B006
                   out_axes: Any = 0, axis_size: int | None = None, axis_name: str | None = None,
                   partitioning_axis_names: Mapping[str, str] = {},  # noqa: B006
                   spmd_axis_name: str | None = None, methods: Any = None) -> Any:
  """`vmap` that adds ``partitioning_axis_names[collection]`` to that collection's axis names.

  >>> Heads = vmap_with_axes(Head, variable_axes={'params': 0}, split_rngs={'params': True},
  ...                        partitioning_axis_names={'params': 'heads'})
  """
  variable_axes = dict(variable_axes)
  for collection in partitioning_axis_names:
    variable_axes[f'{collection}_axes'] = None
  vmapped = transforms.vmap(
      target, variable_axes=variable_axes, split_rngs=split_rngs, in_axes=in_axes,
      out_axes=out_axes, axis_size=axis_size, axis_name=axis_name,
      spmd_axis_name=spmd_axis_name, methods=methods)
  for collection, name in partitioning_axis_names.items():
    if collection in variable_axes:
      vmapped = _add_axis_to_metadata(vmapped, variable_axes[collection], name,
                                      f'{collection}_axes')
  return vmapped


def remat(target: Any, variables: Filter = True, rngs: Filter = True, concrete: bool = False,
          prevent_cse: bool = True, static_argnums: tuple[int, ...] = (),
          policy: Callable[..., bool] | None = None, methods: Any = None) -> Any:
  """Flax's `partitioning.remat`: `checkpoint` whose ``static_argnums`` do not count ``self``,
  and whose classes are named as Flax names them (``Core_remat_staticBlock_0``).

  >>> RematBlock = remat(Block, static_argnums=(1,))   # def __call__(self, x, train)
  """
  return transforms.apply_spec(_REMAT_STATIC, target, dict(
      variables=variables, rngs=rngs, concrete=concrete, prevent_cse=prevent_cse,
      static_argnums=tuple(i + 1 for i in static_argnums), policy=policy,
      static_argnames=()), methods)


_REMAT_STATIC = transforms.CHECKPOINT._replace(class_prefix='Core_remat_static')
