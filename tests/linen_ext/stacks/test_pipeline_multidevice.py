"""`Stacked.pipeline` on a (stage=4, data=2) mesh of 8 simulated CPU devices.

In one child interpreter (JAX fixes the device count when it starts): for both schedules
(gpipe without remat, circular with), with dropout, the loss and gradients of the pipeline with its stage axis sharded over
'stage' equal `fold`'s on one device; the compiled program moves activations with
collective-permutes to the next stage and gathers nothing (no stage's variables); each
device holds the rows of its stage only (compiled shardings).
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import linen_ext as nn
from tests.helpers import assert_trees_close, run_in_child

MARK = 'PIPELINE_ON_8_DEVICES_OK'
STAGES, LAYERS, FEATURES = 4, 8, 6
X = jnp.linspace(-1.0, 1.0, 12 * FEATURES).reshape(12, FEATURES)
RNGS = {'dropout': jax.random.key(5)}


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    kernel = nn.with_partitioning(nn.initializers.lecun_normal(), (None, None))
    bias = nn.with_partitioning(nn.initializers.zeros, (None,))
    y = nn.Dense(FEATURES, kernel_init=kernel, bias_init=bias)(x)
    return x + nn.Dropout(0.25, deterministic=False)(jnp.tanh(y))


def _loss_and_grads(stack, **pipeline):
  def loss(params):
    if pipeline:
      y = stack.apply({'params': params}, X, rngs=RNGS, method='pipeline', **pipeline)
    else:
      y = stack.apply({'params': params}, X, rngs=RNGS)
    return jnp.mean(y ** 2)
  return jax.value_and_grad(loss)


def _check_rows_per_device(sharding, shape):
  """Device at stage coordinate s holds rows [s * k, (s + 1) * k) of the layer axis."""
  rows = shape[0] // STAGES
  stage_of = {d: s for s, devices in enumerate(sharding.mesh.devices) for d in devices}
  for device, index in sharding.devices_indices_map(shape).items():
    start = stage_of[device] * rows
    assert index[0] == slice(start, start + rows), (device, index)


def _check_schedule(mesh, stack, boxed, schedule, **options):
  params = nn.unbox(boxed)['params']
  if schedule == 'circular':
    params = nn.stacked_to_circular(params, stages=STAGES, repeats=options['repeats'])
  specs = nn.get_partition_spec(boxed)['params']
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
  fn = jax.jit(_loss_and_grads(stack, stages=STAGES, microbatches=4, schedule=schedule,
                               mesh_axis='stage', **options),
               in_shardings=(shardings,), out_shardings=(None, shardings))
  with jax.set_mesh(mesh):
    compiled = fn.lower(params).compile()
    loss, grads = compiled(jax.device_put(params, shardings))
  hlo = compiled.as_text()
  # the shift: each device sends its microbatch (f32[1,3,6]) to the next stage's devices
  # (mesh (stage, data): device d to d + 2, the last stage to the first)
  shift = r'f32\[1,3,6\]\S* collective-permute\(.*source_target_pairs=\{\{0,2\},\{1,3\}'
  assert re.search(shift, hlo), schedule
  assert 'all-gather(' not in hlo, (schedule, re.findall(r'\S+ all-gather\(', hlo))
  for spec, sharding in zip(jax.tree.leaves(specs), jax.tree.leaves(compiled.input_shardings[0])):
    assert spec[0] == 'stage' and sharding.spec[0] == 'stage', (spec, sharding)
  for leaf in jax.tree.leaves(params):
    _check_rows_per_device(NamedSharding(mesh, P('stage')), leaf.shape)
  for leaf in jax.tree.leaves(grads):
    assert leaf.sharding.spec[0] == 'stage'
    _check_rows_per_device(leaf.sharding, leaf.shape)
  if schedule == 'circular':
    grads = nn.circular_to_stacked(grads, stages=STAGES, repeats=options['repeats'])
  return loss, grads


def run_check():
  """In the child: both schedules sharded over 'stage' equal fold on one device."""
  assert jax.device_count() == 8
  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh((STAGES, 2), ('stage', 'data'), axis_types=(auto, auto))
  stack = nn.Stacked(Block, LAYERS, metadata_params={nn.PARTITION_NAME: 'stage'})
  boxed = stack.init(jax.random.key(0), X)
  expected = jax.jit(_loss_and_grads(stack))(nn.unbox(boxed)['params'])
  for schedule, options, remat in (('gpipe', {}, False), ('circular', {'repeats': 2}, True)):
    piped = nn.Stacked(Block, LAYERS, remat=remat, metadata_params={nn.PARTITION_NAME: 'stage'})
    got = _check_schedule(mesh, piped, boxed, schedule, **options)
    assert_trees_close(got, expected, depth=LAYERS)
  print(MARK)


def test_pipeline_sharded_over_stages_equals_fold():
  proc = run_in_child('linen_ext.stacks.test_pipeline_multidevice.run_check')
  assert MARK in proc.stdout, f'rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}'
