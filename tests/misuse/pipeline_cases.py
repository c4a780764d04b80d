"""Mistakes with `Stacked.pipeline`: a batch, layer count or mesh axis that does not fit
the stages and microbatches, a schedule it does not know, a block that changes its carry
or a variable it carries."""
import jax
import jax.numpy as jnp

import linen_ext as nn
from linen_ext import errors

from tests.misuse import case

KEY = jax.random.key(0)
N = 4
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


class Same(nn.Module):
  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(4)(x))


class Shrink(nn.Module):
  """Same's variables, but the carry loses a feature."""

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(nn.Dense(4)(x))[..., :3]


class Sowing(nn.Module):
  """Same, sowing its activation."""

  @nn.compact
  def __call__(self, x):
    y = Same()(x)
    self.sow('intermediates', 'y', y)
    return y


def _sown_collection_passed_back_in():
  stack = nn.Stacked(Sowing, N)
  variables = stack.init(KEY, X)
  _, sown = stack.apply(variables, X, mutable=['intermediates'])
  return stack.apply({**variables, **sown}, X, stages=2, microbatches=2, method='pipeline',
                     mutable=['intermediates'])


class Masked(nn.Module):
  """Same, times a per-example mask."""

  @nn.compact
  def __call__(self, x, mask):
    return Same()(x) * mask


def _pipeline(block=Same, x=X, args=(), metadata_params=None, **options):
  options = {'stages': 2, 'microbatches': 2, **options}
  variables = nn.Stacked(Same, N).init(KEY, X)
  stack = nn.Stacked(block, N, metadata_params=metadata_params or {})
  return lambda: stack.apply(variables, x, *args, method='pipeline', **options)


STAGE_NAMED = {nn.PARTITION_NAME: 'stage'}


def _on_mesh(size, **options):
  mesh = jax.make_mesh((size,), ('stage',), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:size])

  def mistake():
    with jax.set_mesh(mesh):
      return _pipeline(mesh_axis='stage', metadata_params=STAGE_NAMED, **options)()
  return mistake


CASES = [
    case('pipeline microbatches not dividing the batch', _pipeline(microbatches=3),
         errors.MicrobatchError, 'microbatches=3', 'input x has 2 rows', 'a divisor of 2'),
    case('pipeline array argument without the batch axis', _pipeline(
        Masked, args=(jnp.ones(4),)), errors.MicrobatchError, 'argument args[0] has 4 rows',
         'the batch (x) has 2', 'jnp.broadcast_to(a, (2,)'),
    case('pipeline stages not dividing the layers', _pipeline(stages=3),
         errors.StageCountError, 'stages=3', 'the 4 layers', '[1, 2, 4]'),
    case('pipeline stages times repeats not dividing the layers', _pipeline(
        stages=2, repeats=3, schedule='circular'), errors.StageCountError,
         'stages=2 x repeats=3'),
    case('pipeline repeats under the gpipe schedule', _pipeline(repeats=2),
         errors.StageCountError, 'repeats=2', "schedule='circular'"),
    case('pipeline schedule with an unknown name', _pipeline(schedule='1f1b'),
         errors.StageCountError, "schedule='1f1b'"),
    case('pipeline circular schedule with fewer microbatches than stages', _pipeline(
        x=jnp.ones((1, 4)), microbatches=1, schedule='circular'), errors.MicrobatchError,
         'microbatches=1 is fewer than stages=2'),
    case('pipeline block changing the shape of its carry', _pipeline(Shrink),
         errors.PipelineCarryError, 'float32[1,4]', 'float32[1,3]', 'returns a carry like'),
    case('pipeline init of a block changing the shape of its carry', lambda: nn.Stacked(
        Shrink, N).init(KEY, X, stages=2, microbatches=2, method='pipeline'),
         errors.PipelineCarryError, 'under init', 'float32[2, 4]', 'float32[2, 3]',
         'keep the carry'),
    case('pipeline block sowing into a collection passed back in',
         _sown_collection_passed_back_in, errors.PipelineVariablesError,
         'variable "y" of collection "intermediates"', "('float32[2,4]',)",
         'leave it out of the variables'),
    case('pipeline mesh axis of another size than stages', _on_mesh(1),
         errors.PipelineMeshError, "mesh_axis='stage'", 'size 1, not stages=2'),
    case('pipeline mesh axis without a mesh', _pipeline(
        mesh_axis='stage', metadata_params=STAGE_NAMED), errors.PipelineMeshError,
         "mesh_axis='stage'", 'no mesh is set'),
    case('pipeline mesh axis on a stack without a layer axis name', _pipeline(mesh_axis='stage'),
         errors.PipelineMeshError, "mesh_axis='stage'", 'does not name its layer axis',
         'replicate', "metadata_params={nn.PARTITION_NAME: 'stage'}"),
]
