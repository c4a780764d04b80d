"""`flax.linen.spmd`: Flax's logical axis names and rules, as `linen_ext` re-exports them
(its private helpers too: ``_logical_to_mesh_axes``, ``_with_sharding_constraint``, ...).

>>> from linen_ext.spmd import logical_to_mesh_axes
>>> logical_to_mesh_axes(('batch', 'mlp'), [('batch', 'data'), ('mlp', 'model')])
PartitionSpec('data', 'model')
"""
from flax.linen.spmd import (Array, ArrayPytree, LogicalNames, LogicallyPartitioned,
                             LogicalPartitionSpec, LogicalPartitionSpecPytree, LogicalRules,
                             RulesFallback, get_logical_axis_rules, logical_to_mesh,
                             logical_to_mesh_axes, logical_to_mesh_sharding,
                             with_logical_constraint, with_logical_partitioning)
from flax.linen.spmd import _is_axis_spec as _is_axis_spec
from flax.linen.spmd import _is_logical_spec as _is_logical_spec
from flax.linen.spmd import _logical_to_mesh_axes as _logical_to_mesh_axes
from flax.linen.spmd import _mesh_assignment_free as _mesh_assignment_free
from flax.linen.spmd import _unassigned_axis as _unassigned_axis
from flax.linen.spmd import _UnassignedAxis as _UnassignedAxis
from flax.linen.spmd import _with_sharding_constraint as _with_sharding_constraint
from flax.linen.spmd import (
    _with_sharding_constraint_one_fallback as _with_sharding_constraint_one_fallback)

__all__ = ['Array', 'ArrayPytree', 'LogicalNames', 'LogicalPartitionSpec',
           'LogicalPartitionSpecPytree', 'LogicalRules', 'LogicallyPartitioned', 'RulesFallback',
           'get_logical_axis_rules', 'logical_to_mesh', 'logical_to_mesh_axes',
           'logical_to_mesh_sharding', 'with_logical_constraint', 'with_logical_partitioning']
