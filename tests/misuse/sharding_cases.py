"""Mistakes laying variables out on a mesh: `nn.variable_shardings`, `nn.init_sharded` and the
specs of `lift.shard_map`."""
import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import lift
import linen_ext as nn
from lift import errors

from tests.misuse import case

KEY = jax.random.key(0)
X = jnp.ones((2, 6))
MESH = AbstractMesh((2, 4), ('data', 'model'))
LOGICAL = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))


def _shardings(kernel_init, rules=None, features=8):
  abstract = jax.eval_shape(nn.Dense(features, kernel_init=kernel_init).init, KEY, X)
  return lambda: nn.variable_shardings(abstract, MESH, rules)


def _stacked_shardings(rules):
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(6, kernel_init=LOGICAL)(x)
  stack = nn.Stacked(Block, 2, metadata_params={nn.PARTITION_NAME: 'layers'})
  return lambda: nn.variable_shardings(jax.eval_shape(stack.init, KEY, X), MESH, rules)


SHARDINGS = [
    case('a logical axis name without a rule', _shardings(LOGICAL, [('embed', None)]),
         errors.LogicalAxisRuleError, 'variable params/kernel', 'logical axis "mlp"',
         '("mlp", None)'),
    case("a stack's layer axis without a rule", _stacked_shardings(
        [('embed', None), ('mlp', 'model')]), errors.LogicalAxisRuleError,
         'variable params/Dense_0/', 'logical axis "layers"'),
    case('a rule naming a mesh axis the mesh lacks', _shardings(
        LOGICAL, [('embed', None), ('mlp', 'tensor')]), errors.MeshAxisError,
         'variable params/kernel', 'mesh axis "tensor"', "('data', 'model')"),
    case('a partitioned variable whose dimension does not divide over its mesh axis', _shardings(
        nn.with_partitioning(nn.initializers.lecun_normal(), ('data', 'model')), features=6),
         errors.ShardingShapeError, 'variable params/kernel', 'shape (6, 6)',
         'dimension 1 (size 6) does not divide into 4 parts (model=4)'),
]



def _dense(scope, x):
  return x @ scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 2))


def _shard_map(mesh, spec):
  return lift.shard_map(_dense, mesh=mesh, in_specs=P(), out_specs=P(),
                        variable_specs={'params': spec}, split_rngs={'params': True})


SHARD_MAP = [
    case('shard_map variable_specs naming a mesh axis the mesh lacks', lambda: _shard_map(
        jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,)), P('model')),
         errors.MeshAxisError, "variable_specs['params']", 'mesh axis "model"', "('data',)"),
    case('shard_map of a variable whose dimension does not divide over its mesh axis',
         lambda: lift.apply(_shard_map(AbstractMesh((2,), ('model',)), P('model')))(
             {'params': {'w': jnp.ones((3, 2))}}, jnp.ones((1, 3))),
         errors.ShardingShapeError, 'variable params/w', 'shape (3, 2)',
         'dimension 0 (size 3) does not divide into 2 parts (model=2)'),
]

CASES = SHARDINGS + SHARD_MAP
