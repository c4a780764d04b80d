"""`Stacked.pipeline` on a (stage=4, data=2) mesh of 8 simulated CPU devices.

In one child interpreter (JAX fixes the device count when it starts): for both schedules
(gpipe without remat, circular with remat='nested'), with dropout and a per-example mask
argument, the loss and gradients
of the pipeline with its stage axis sharded over 'stage' equal `fold`'s on one device; the
compiled program moves activations with collective-permutes to the next stage and gathers
nothing (no stage's variables); each device holds the rows of its stage only (compiled
shardings), of a variable the pipeline carries too; sown values come back per layer and
microbatch, equal to fold's on the whole batch. With ``LIFT_SLOW_CHECKS=1`` (not in CI: it
compiles two Transformer training steps) also: examples/train_lm.py with ``--mesh stage=4,data=2 --pipeline-stages 4
--microbatches 8`` trains with the losses of its unpipelined run on one device, its
blocks' rows on their stage's devices.
"""
import functools
import importlib.util
import os
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

import linen_ext as nn
from tests.helpers import assert_trees_close, cheap_jit, run_in_child

MARK = 'PIPELINE_ON_8_DEVICES_OK'
STAGES, LAYERS, FEATURES = 4, 8, 6
X = jnp.linspace(-1.0, 1.0, 12 * FEATURES).reshape(12, FEATURES)
MASK = (jnp.arange(X.size).reshape(X.shape) % 5 > 0).astype(X.dtype)
RNGS = {'dropout': jax.random.key(5)}


class Block(nn.Module):
  """Dropout, a per-example mask argument, a count of calls (a variable the pipeline
  carries per layer) and a sown activation (one it creates per layer and microbatch)."""

  @nn.compact
  def __call__(self, x, mask):
    kernel = nn.with_partitioning(nn.initializers.lecun_normal(), (None, None))
    bias = nn.with_partitioning(nn.initializers.zeros, (None,))
    y = nn.Dense(FEATURES, kernel_init=kernel, bias_init=bias)(x)
    calls = self.variable('counter', 'calls', lambda: jnp.zeros((), jnp.int32))
    calls.value += 1
    y = nn.Dropout(0.25, deterministic=False)(jnp.tanh(y)) * mask
    self.sow('intermediates', 'y', y)
    return x + y


WRITTEN = ['counter', 'intermediates']


def _loss_and_grads(stack, **pipeline):
  def loss(params, counter):
    variables = {'params': params, 'counter': counter}
    if pipeline:
      y, written = stack.apply(variables, X, MASK, rngs=RNGS, method='pipeline',
                               mutable=WRITTEN, **pipeline)
    else:
      y, written = stack.apply(variables, X, MASK, rngs=RNGS, mutable=WRITTEN)
    return jnp.mean(y ** 2), written
  return jax.value_and_grad(loss, has_aux=True)


def _check_rows_per_device(sharding, shape):
  """Device at stage coordinate s holds rows [s * k, (s + 1) * k) of the layer axis."""
  rows = shape[0] // STAGES
  stage_of = {d: s for s, devices in enumerate(sharding.mesh.devices) for d in devices.flat}
  for device, index in sharding.devices_indices_map(shape).items():
    start = stage_of[device] * rows
    assert index[0] == slice(start, start + rows), (device, index)


def _check_schedule(mesh, stack, boxed, schedule, **options):
  """Returns (loss, written collections, grads), in Stacked's layer order."""
  params, counter = nn.unbox(boxed)['params'], boxed['counter']
  to_stacked = lambda tree: tree  # noqa: E731
  if schedule == 'circular':
    params = nn.stacked_to_circular(params, stages=STAGES, repeats=options['repeats'])
    to_stacked = functools.partial(nn.circular_to_stacked, stages=STAGES,
                                   repeats=options['repeats'])
  specs = nn.get_partition_spec(boxed)['params']
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
  by_stage = NamedSharding(mesh, jax.sharding.PartitionSpec('stage'))
  fn = cheap_jit(_loss_and_grads(stack, stages=STAGES, microbatches=4, schedule=schedule,
                                mesh_axis='stage', **options),
                 in_shardings=(shardings, by_stage), out_shardings=((None, None), shardings))
  with jax.set_mesh(mesh):
    compiled = fn.lower(params, counter).compile()
    (loss, written), grads = compiled(jax.device_put(params, shardings),
                                      jax.device_put(counter, by_stage))
  hlo = compiled.as_text()
  # the shift: each device sends its microbatch (f32[1,3,6]) to the next stage's devices
  # (mesh (stage, data): device d to d + 2, the last stage to the first)
  shift = r'f32\[1,3,6\]\S* collective-permute\(.*source_target_pairs=\{\{0,2\},\{1,3\}'
  assert re.search(shift, hlo), schedule
  assert 'all-gather(' not in hlo, (schedule, re.findall(r'\S+ all-gather\(', hlo))
  compiled_in = jax.tree.leaves(compiled.input_shardings[0])
  for spec, sharding, leaf in zip(jax.tree.leaves(specs), compiled_in, jax.tree.leaves(params)):
    assert spec[0] == 'stage' and sharding.spec[0] == 'stage', (spec, sharding)
    _check_rows_per_device(sharding, leaf.shape)
  # the carried counter stays on its stage's devices; the sown values are per layer
  for leaf in jax.tree.leaves(grads) + [written['counter']['calls']]:
    assert leaf.sharding.spec[0] == 'stage', leaf.sharding
    _check_rows_per_device(leaf.sharding, leaf.shape)
  return loss, to_stacked(written), to_stacked(grads)


EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / 'examples' / 'train_lm.py'
JOB_FLAGS = ['--digits', '1', '--depth', '4', '--width', '16', '--heads', '2', '--batch', '16',
             '--steps', '8', '--warmup', '2', '--remat', 'none', '--microbatches', '8']


def _load_job():
  sys.path.insert(0, str(EXAMPLE.parent))
  spec = importlib.util.spec_from_file_location('train_lm', EXAMPLE)
  job = importlib.util.module_from_spec(spec)
  sys.modules['train_lm'] = job  # dataclasses look their module up
  spec.loader.exec_module(job)
  return job


def _job_losses(job, mesh_text, stages):
  """Two training steps of examples/train_lm.py's model (pipelined if ``stages`` > 1)."""
  args = job.parse_args(JOB_FLAGS + ['--pipeline-stages', str(stages)])
  task, model = job.build(args)
  mesh = job.mesh_lib.make_mesh(job.mesh_lib.parse_mesh(mesh_text))
  optimizer = job.make_optimizer(args)
  example = jnp.zeros((1, task.length - 1), jnp.int32)
  state, shardings = job.mesh_lib.create_state(
      model, optimizer, example, jax.random.key(0), mesh, job.mesh_lib.axis_rules(mesh, 2))
  step = job.make_train_step(job.pipelined(model, args, mesh), optimizer, task, args.batch,
                             jax.random.key(1), mesh, shardings)
  hlo = step.lower(state, 0).compile().as_text()
  losses = []
  for i in range(2):
    state, loss = step(state, i)
    losses.append(float(loss))
  return losses, hlo, state


def _check_train_lm():
  """The job with --mesh stage=4,data=2 --pipeline-stages 4: the one-device losses."""
  job = _load_job()
  with jax.numpy_dtype_promotion('standard'):  # optax's schedules mix floats and ints
    expected, _, _ = _job_losses(job, 'data=1', 1)
    losses, hlo, state = _job_losses(job, 'stage=4,data=2', 4)
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  assert 'collective-permute' in hlo
  kernel = state['params']['blocks']['Dense_0']['kernel']
  assert kernel.sharding.spec[0] == 'stage', kernel.sharding.spec
  _check_rows_per_device(kernel.sharding, kernel.shape)


def run_check():
  """In the child: both schedules sharded over 'stage' equal fold on one device."""
  assert jax.device_count() == 8
  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh((STAGES, 2), ('stage', 'data'), axis_types=(auto, auto))
  stack = nn.Stacked(Block, LAYERS, metadata_params={nn.PARTITION_NAME: 'stage'})
  boxed = stack.init(jax.random.key(0), X, MASK)
  (loss, written), grads = cheap_jit(_loss_and_grads(stack))(nn.unbox(boxed)['params'],
                                                           boxed['counter'])
  for schedule, options, remat in (('gpipe', {}, False), ('circular', {'repeats': 2}, 'nested')):
    piped = nn.Stacked(Block, LAYERS, remat=remat, metadata_params={nn.PARTITION_NAME: 'stage'})
    got_loss, got_written, got_grads = _check_schedule(mesh, piped, boxed, schedule, **options)
    assert_trees_close((got_loss, got_grads), (loss, grads), depth=LAYERS)
    # each layer counted init and the 4 microbatches; fold counted init and the batch
    assert got_written['counter']['calls'].tolist() == [5] * LAYERS
    assert written['counter']['calls'].tolist() == [2] * LAYERS
    (sown,), (expected,) = got_written['intermediates']['y'], written['intermediates']['y']
    assert sown.shape == (LAYERS, 4, 3, FEATURES)  # [layers, microbatches, rows, features]
    assert_trees_close(sown.reshape(expected.shape), expected, depth=LAYERS)
  if os.environ.get('LIFT_SLOW_CHECKS') == '1':  # two Transformer steps compiled: ~15 s
    _check_train_lm()
  print(MARK)


def test_pipeline_sharded_over_stages_equals_fold():
  proc = run_in_child('linen_ext.stacks.test_pipeline_multidevice.run_check')
  assert MARK in proc.stdout, f'rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}'
