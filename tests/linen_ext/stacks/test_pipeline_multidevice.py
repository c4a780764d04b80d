"""`Stacked.pipeline` on meshes of 8 simulated CPU devices.

In one child interpreter (JAX fixes the device count when it starts):

* a (stage=4, data=2) mesh, the batch sharded over 'data': for both schedules (gpipe
  without remat and a block whose variables are boxed; circular with remat='nested' and a
  block with plain, unboxed variables), with dropout and a per-example mask argument, the
  loss and gradients equal `fold`'s on one device; the compiled program moves activations
  with collective-permutes to the next stage, gathers nothing, and its only other
  collectives reduce gradients over 'data' (or the loss); each device holds the rows of
  its stage only (compiled shardings), of a variable the pipeline carries too; sown
  values come back per layer and microbatch, equal to fold's on the whole batch;
* a (stage=2, data=2, model=2) mesh with a tensor-parallel block (its hidden features
  over 'model'): equal to one device, each kernel split over 'stage' on its layer axis
  and over 'model' on its features;
* examples/train_lm.py with ``--mesh stage=2,data=2,model=2 --pipeline-stages 2
  --microbatches 4`` trains with the losses of its run on one device.
"""
import functools
import importlib.util
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
X = jnp.linspace(-1.0, 1.0, 16 * FEATURES).reshape(16, FEATURES)  # 4 rows per microbatch
MASK = (jnp.arange(X.size).reshape(X.shape) % 5 > 0).astype(X.dtype)
RNGS = {'dropout': jax.random.key(5)}


class Block(nn.Module):
  """Dropout, a per-example mask argument, a count of calls (a variable the pipeline
  carries per layer) and a sown activation (one it creates per layer and microbatch);
  its Dense's variables boxed or not."""
  boxed: bool = True

  @nn.compact
  def __call__(self, x, mask):
    if self.boxed:
      kernel = nn.with_partitioning(nn.initializers.lecun_normal(), (None, None))
      dense = nn.Dense(FEATURES, kernel_init=kernel,
                       bias_init=nn.with_partitioning(nn.initializers.zeros, (None,)))
    else:
      dense = nn.Dense(FEATURES)
    calls = self.variable('counter', 'calls', lambda: jnp.zeros((), jnp.int32))
    calls.value += 1
    y = nn.Dropout(0.25, deterministic=False)(jnp.tanh(dense(x))) * mask
    self.sow('intermediates', 'y', y)
    return x + y


class TensorParallel(nn.Module):
  """An MLP whose hidden features are split over 'model'."""

  @nn.compact
  def __call__(self, x, mask):
    split = nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model'))
    joined = nn.with_partitioning(nn.initializers.lecun_normal(), ('model', None))
    h = nn.Dense(2 * FEATURES, kernel_init=split)(x)
    h = nn.Dropout(0.25, deterministic=False)(jnp.tanh(h))
    return x + nn.Dense(FEATURES, kernel_init=joined)(h) * mask


WRITTEN = ['counter', 'intermediates']


def _loss_and_grads(stack, written=WRITTEN, **pipeline):
  def loss(params, counter, x):
    variables = {'params': params, **counter}
    if pipeline:
      y, out = stack.apply(variables, x, MASK, rngs=RNGS, method='pipeline',
                           mutable=written, **pipeline)
    else:
      y, out = stack.apply(variables, x, MASK, rngs=RNGS, mutable=written)
    return jnp.mean(y ** 2), out
  return jax.value_and_grad(loss, has_aux=True)


def _check_rows_per_device(sharding, shape, stages=STAGES):
  """Device at stage coordinate s holds rows [s * k, (s + 1) * k) of the layer axis."""
  rows = shape[0] // stages
  stage_of = {d: s for s, devices in enumerate(sharding.mesh.devices) for d in devices.flat}
  for device, index in sharding.devices_indices_map(shape).items():
    start = stage_of[device] * rows
    assert index[0] == slice(start, start + rows), (device, index)


def _collectives(hlo):
  """(kind, operand shapes, replica groups) of every collective in the compiled program."""
  found = []
  for line in hlo.splitlines():
    match = re.search(r'= (\(?[^=]*?\)?) (all-reduce|all-gather|reduce-scatter|all-to-all|'
                      r'collective-permute|collective-broadcast)\(', line)
    if match:
      groups = re.search(r'replica_groups=(\S+)', line)
      found.append((match.group(2), match.group(1), groups.group(1) if groups else ''))
  return found


def _run_sharded(mesh, stack, boxed, schedule, written=WRITTEN, **options):
  """The pipeline's (loss, written, grads) and compiled program, the batch over 'data'."""
  variables = nn.unbox(boxed)
  params, counter = variables['params'], {c: variables[c] for c in written if c in variables}
  if schedule == 'circular':
    params = nn.stacked_to_circular(params, stages=options['stages'], repeats=options['repeats'])
    counter = nn.stacked_to_circular(counter, stages=options['stages'],
                                     repeats=options['repeats'])
  shardings = nn.variable_shardings(boxed, mesh)
  counter_shardings = {c: shardings[c] for c in counter}
  by_data = NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  fn = cheap_jit(_loss_and_grads(stack, written, schedule=schedule, mesh_axis='stage',
                                 **options),
                 in_shardings=(shardings['params'], counter_shardings, by_data),
                 out_shardings=((None, None), shardings['params']))
  with jax.set_mesh(mesh):
    compiled = fn.lower(params, counter, X).compile()
    (loss, out), grads = compiled(jax.device_put(params, shardings['params']),
                                  jax.device_put(counter, counter_shardings),
                                  jax.device_put(X, by_data))
  return loss, out, grads, compiled


def _check_schedule(mesh, stack, boxed, schedule, **options):
  """Returns (loss, written collections, grads), in Stacked's layer order."""
  loss, written, grads, compiled = _run_sharded(mesh, stack, boxed, schedule, stages=STAGES,
                                                microbatches=4, **options)
  to_stacked = lambda tree: tree  # noqa: E731
  if schedule == 'circular':
    to_stacked = functools.partial(nn.circular_to_stacked, stages=STAGES,
                                   repeats=options['repeats'])
  kinds = [kind for kind, _, _ in _collectives(compiled.as_text())]
  assert 'collective-permute' in kinds, kinds  # the hand-over to the next stage
  assert not {'all-gather', 'all-to-all', 'reduce-scatter'} & set(kinds), (schedule, kinds)
  compiled_in = jax.tree.leaves(compiled.input_shardings[0][0])
  specs = jax.tree.leaves(nn.get_partition_spec(boxed)['params'])
  for spec, sharding, leaf in zip(specs, compiled_in, jax.tree.leaves(nn.unbox(boxed)['params'])):
    assert spec[0] == 'stage' and sharding.spec[0] == 'stage', (spec, sharding)
    _check_rows_per_device(sharding, leaf.shape)
  # the carried counter stays on its stage's devices; the sown values are per layer
  for leaf in jax.tree.leaves(grads) + [written['counter']['calls']]:
    assert leaf.sharding.spec[0] == 'stage', leaf.sharding
    _check_rows_per_device(leaf.sharding, leaf.shape)
  return loss, to_stacked(written), to_stacked(grads)


EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / 'examples' / 'train_lm.py'
JOB_FLAGS = ['--digits', '1', '--depth', '4', '--width', '16', '--heads', '2', '--batch', '16',
             '--steps', '8', '--warmup', '2', '--remat', 'none', '--microbatches', '4']


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
  losses = []
  for i in range(2):
    state, loss = step(state, i)
    losses.append(float(loss))
  return losses, state


def _check_train_lm():
  """The job with --mesh stage=2,data=2,model=2 --pipeline-stages 2: the one-device losses,
  each block's MLP kernel split over 'stage' (layers) and 'model' (features)."""
  job = _load_job()
  with jax.numpy_dtype_promotion('standard'):  # optax's schedules mix floats and ints
    expected, _ = _job_losses(job, 'data=1', 1)
    losses, state = _job_losses(job, 'stage=2,data=2,model=2', 2)
  np.testing.assert_allclose(losses, expected, rtol=1e-5)
  kernel = state['params']['blocks']['Dense_0']['kernel']  # [layers, embed, mlp]
  assert kernel.sharding.spec[0] == 'stage' and 'model' in kernel.sharding.spec, kernel.sharding
  _check_rows_per_device(kernel.sharding, kernel.shape, stages=2)


def _check_tensor_parallel():
  """stage=2, data=2, model=2: a tensor-parallel block's pipeline equals one device."""
  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh((2, 2, 2), ('stage', 'data', 'model'), axis_types=(auto,) * 3)
  stack = nn.Stacked(TensorParallel, LAYERS, remat=True,
                     metadata_params={nn.PARTITION_NAME: 'stage'})
  boxed = stack.init(jax.random.key(0), X, MASK)
  (loss, _), grads = cheap_jit(_loss_and_grads(stack, []))(
      nn.unbox(boxed)['params'], {}, X)
  got_loss, _, got_grads, compiled = _run_sharded(mesh, stack, boxed, 'gpipe', [], stages=2,
                                                  microbatches=2)
  assert_trees_close((got_loss, got_grads), (loss, grads), depth=LAYERS)
  for name, axis in (('Dense_0', 2), ('Dense_1', 1)):  # [layers, in, out]: hidden on 'model'
    sharding = compiled.input_shardings[0][0][name]['kernel']
    assert sharding.spec[0] == 'stage' and sharding.spec[axis] == 'model', (name, sharding)
    _check_rows_per_device(sharding, boxed['params'][name]['kernel'].value.shape, stages=2)


def run_check():
  """In the child: the pipelines on 8 devices equal fold on one device."""
  assert jax.device_count() == 8
  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh((STAGES, 2), ('stage', 'data'), axis_types=(auto, auto))
  for schedule, options, remat, boxed_block in (('gpipe', {}, False, True),
                                                ('circular', {'repeats': 2}, 'nested', False)):
    stack = nn.Stacked(Block, LAYERS, metadata_params={nn.PARTITION_NAME: 'stage'},
                       block_kwargs={'boxed': boxed_block})
    boxed = stack.init(jax.random.key(0), X, MASK)
    variables = nn.unbox(boxed)
    (loss, written), grads = cheap_jit(_loss_and_grads(stack))(
        variables['params'], {'counter': variables['counter']}, X)
    piped = stack.clone(remat=remat)
    got_loss, got_written, got_grads = _check_schedule(mesh, piped, boxed, schedule, **options)
    assert_trees_close((got_loss, got_grads), (loss, grads), depth=LAYERS)
    # each layer counted init and the 4 microbatches; fold counted init and the batch
    assert got_written['counter']['calls'].tolist() == [5] * LAYERS
    assert written['counter']['calls'].tolist() == [2] * LAYERS
    (sown,), (expected,) = got_written['intermediates']['y'], written['intermediates']['y']
    assert sown.shape == (LAYERS, 4, 4, FEATURES)  # [layers, microbatches, rows, features]
    # microbatch m holds rows m, m + 4, m + 8, m + 12 of the batch
    assert_trees_close(jnp.swapaxes(sown, 1, 2).reshape(expected.shape), expected,
                       depth=LAYERS)
  _check_tensor_parallel()
  _check_train_lm()
  print(MARK)


def test_pipelines_on_8_devices_equal_fold():
  proc = run_in_child('linen_ext.stacks.test_pipeline_multidevice.run_check')
  assert MARK in proc.stdout, f'rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}'
