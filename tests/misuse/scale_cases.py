"""Mistakes compiling for a TPU topology and planning (`nn.tpu_topology`,
`nn.compile_train_step`, `nn.plan`), and in asking for an attention kernel: each is
refused before anything compiles."""
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import AbstractMesh

import lift
import linen_ext as nn
from lift import errors
from linen_ext import errors as nn_errors

from tests.misuse import case

RULES = [('batch', 'data')]


# The mistakes are refused before any topology is loaded: no libtpu needed.
CHIPS = [object()] * 4


def _mesh(shape):
  return lambda: nn.scale.make_mesh(CHIPS, shape)


def _odd_batch():
  mesh = AbstractMesh((1, 4, 1), ('stage', 'data', 'model'))
  return nn.scale.batch_sharding({'inputs': jnp.zeros((6, 8), jnp.int32)}, mesh, RULES)


def _plan_without_remat():
  return nn.plan(nn.Dense(4), {'inputs': jnp.zeros((4, 2))}, jax.devices(), rules=RULES,
                 memory_limit=2 ** 30)


def _plan_nnx_remat():
  return nn.plan(nnx.Linear(2, 4, rngs=nnx.Rngs(0)), {'inputs': jnp.zeros((4, 2))},
                 jax.devices(), rules=RULES, memory_limit=2 ** 30)


class _WithDropout(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.linear = nnx.Linear(2, 4, rngs=rngs)
    self.dropout = nnx.Dropout(0.1, rngs=rngs)

  def __call__(self, x):
    return self.dropout(self.linear(x))


def _nnx_with_rng_state():
  return nn.compile_train_step(_WithDropout(nnx.Rngs(0)), {'inputs': jnp.zeros((4, 2))},
                               mesh=nn.scale.make_mesh(jax.devices()[:1], {}), rules=RULES,
                               optimizer=optax.sgd(0.1))


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    kernel = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
    return nn.Dense(2, kernel_init=kernel)(x)


class _Stack(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Stacked(_Block, 3, metadata_params={nn.PARTITION_NAME: 'layers'})(x)


def _offloaded_clipping_optimizer():
  clipped = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
  return nn.compile_train_step(
      _Stack(), {'inputs': jnp.zeros((4, 2))}, mesh=nn.scale.make_mesh(jax.devices()[:1], {}),
      rules=RULES + [('embed', None), ('mlp', None), ('layers', None)], optimizer=clipped,
      offload_optimizer=True, loss_fn=lambda params, model, batch: 0.0)


def _attention(**kwargs):
  x = jnp.ones((2, 8, 4, 16))
  return lambda: lift.causal_self_attention(x, x, x, **kwargs)


CASES = [
    case('an unknown TPU topology name', lambda: nn.tpu_topology('v5e-3'),
         nn_errors.TopologyError, "unknown TPU topology 'v5e-3'", 'Known: v5e-4, v5e-8'),
    case('a mesh whose sizes do not multiply to the chips', _mesh({'data': 3}),
         nn_errors.MeshShapeError, "mesh {'data': 3} does not fit 4 chips", "{'data': 4}"),
    case('a mesh axis other than stage, data and model', _mesh({'fsdp': 4}),
         nn_errors.MeshShapeError, "unknown axis 'fsdp'", "('stage', 'data', 'model')"),
    case('a batch that does not divide over the data axes', _odd_batch,
         nn_errors.BatchShardingError, "batch['inputs']: its 6 examples",
         "data axes ('data',) (4 ways)"),
    case('nn.plan of a model without a remat field', _plan_without_remat,
         nn_errors.PlanError, "fields ['remat'], which Dense does not have"),
    case('nn.plan varying the remat of an NNX model', _plan_nnx_remat, nn_errors.PlanError,
         "['remat'], and Linear, an NNX model, is built once", 'remat=None'),
    case('an NNX model holding variables other than nnx.Param', _nnx_with_rng_state,
         nn_errors.ModelStateError, 'other than nnx.Param, dropout/rngs/count (RngCount)',
         'deterministic=True'),
    case('an optimizer state in host memory with clip_by_global_norm in the optimizer',
         _offloaded_clipping_optimizer, nn_errors.OptimizerStreamError,
         'couples parameters across layers', 'clip_norm='),
    case('causal_self_attention given an unknown implementation',
         _attention(implementation='splash'), errors.AttentionArgumentError,
         "implementation is 'splash'", "(None, 'xla', 'flash')"),
    case('flash attention given mesh axes that shard the length',
         _attention(implementation='flash', mesh_axes=('data', 'seq', None, None)),
         errors.AttentionArgumentError, 'length and features unsharded'),
]
