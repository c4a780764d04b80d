"""`flax.linen.spmd`: Flax's logical axis names and rules, as `linen_ext` re-exports them.

>>> from linen_ext.spmd import logical_to_mesh_axes
>>> logical_to_mesh_axes(('batch', 'mlp'), [('batch', 'data'), ('mlp', 'model')])
PartitionSpec('data', 'model')
"""
from flax.linen.spmd import (LogicallyPartitioned, RulesFallback, get_logical_axis_rules,
                             logical_to_mesh, logical_to_mesh_axes, logical_to_mesh_sharding,
                             with_logical_constraint, with_logical_partitioning)

__all__ = ['LogicallyPartitioned', 'RulesFallback', 'get_logical_axis_rules', 'logical_to_mesh',
           'logical_to_mesh_axes', 'logical_to_mesh_sharding', 'with_logical_constraint',
           'with_logical_partitioning']
