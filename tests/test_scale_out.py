"""Scaling out on 8 simulated CPU devices: sharded init, the main job on meshes, orbax across
meshes, two processes.

Oracle: the same job on one device. JAX fixes the device count when it starts, so the
checks run in one child interpreter (`run_in_child`) that reports each check's result, and
the processes test starts its own workers. Shapes are tiny: what is checked is layout,
memory per device and equality, not speed.
"""
import contextlib
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import linen_ext as nn
from tests.helpers import assert_trees_close, assert_trees_equal, child_xla_flags, run_in_child
from tests.test_train_lm import EXAMPLE, TINY

RESULT_MARK = 'SCALE_OUT_RESULTS='
MESHES = {'8x1': 'data=8', '4x2': 'data=4,model=2', '2x4': 'data=2,model=4', '1x8': 'model=8'}
STEPS = 5
FAST = TINY + ['--remat', 'none', '--eval-every', '100']


def _load_job():
  sys.path.insert(0, str(EXAMPLE.parent))
  import importlib.util
  spec = importlib.util.spec_from_file_location('train_lm', EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  sys.modules['train_lm'] = module
  spec.loader.exec_module(module)
  return module


def lm_on_meshes(job, results):
  """The job's step on each mesh: shardings as specified, losses as on one device."""
  args = job.parse_args(TINY + ['--remat', 'none'])  # the layout is checked, not remat
  task, model = job.build(args)
  optimizer = job.make_optimizer(args)
  example = jnp.zeros((1, task.length - 1), jnp.int32)
  losses, states, created = {}, {}, None
  for name, text in {'1': 'data=1', **MESHES}.items():
    mesh = job.mesh_lib.make_mesh(job.mesh_lib.parse_mesh(text))
    rules = job.mesh_lib.axis_rules(mesh, args.heads)
    if created is None:  # created sharded once (checked below), then laid out on each mesh
      created, shardings = job.mesh_lib.create_state(model, optimizer, example,
                                                     jax.random.key(args.seed), mesh, rules)
    def boxed(key):
      params = model.init(key, example)['params']
      return {'params': params, 'opt_state': optimizer.init(params)}
    shardings = nn.variable_shardings(jax.eval_shape(boxed, jax.random.key(0)), mesh, rules)
    state = jax.device_put(created, shardings)
    step = job.make_train_step(model, optimizer, task, args.batch,
                               jax.random.key(args.seed + 1), mesh, shardings)
    compiled = step.lower(state, 0).compile()
    for got, expected, leaf in zip(jax.tree.leaves(compiled.output_shardings[0]),
                                   jax.tree.leaves(shardings), jax.tree.leaves(state)):
      assert got.is_equivalent_to(expected, leaf.ndim), (name, got, expected)
    states[name] = (state, mesh, shardings)
    results[f'arguments {name}'] = compiled.memory_analysis().argument_size_in_bytes
    curve = []
    for i in range(STEPS):
      state, loss = step(state, i)
      curve.append(float(loss))
    losses[name] = curve
  for name in MESHES:
    np.testing.assert_allclose(losses[name], losses['1'], rtol=1e-5)
  assert results['arguments 4x2'] <= results['arguments 1'] / 4, results
  results['losses'] = losses
  return states


def orbax_across_meshes(states, results):
  """Saved from 8x1, restored onto 4x2, 1x8 and one device: same bits, the target layout."""
  import orbax.checkpoint as ocp
  state = states['8x1'][0]
  with tempfile.TemporaryDirectory() as directory:
    path = pathlib.Path(directory) / 'state'
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(path, state)
      checkpointer.wait_until_finished()
      for target in ('4x2', '1x8', '1'):
        _, _, shardings = states[target]
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                state, shardings)
        restored = checkpointer.restore(path, abstract)
        assert_trees_equal(jax.device_get(jax.tree.leaves(restored)),
                           jax.device_get(jax.tree.leaves(state)))
        for leaf, sharding in zip(jax.tree.leaves(restored), jax.tree.leaves(shardings)):
          assert leaf.sharding == sharding, (target, leaf.sharding, sharding)
  results['orbax'] = 'ok'


def sharded_init_fits_the_budget(job, results):
  """Params 3x a device's budget, created sharded: no device holds a sharded one whole."""
  model = job.TransformerLM(job.VOCAB, 16, d_model=128, heads=8, depth=4, remat=False)
  mesh = job.mesh_lib.make_mesh({'data': 4, 'model': 2})
  rules = job.mesh_lib.axis_rules(mesh, 8)
  key, example = jax.random.key(0), jnp.zeros((1, 16), jnp.int32)
  abstract = jax.eval_shape(model.init, key, example)
  whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
  budget = whole // 3
  shardings = nn.variable_shardings(abstract, mesh, rules)
  create = jax.jit(lambda k: nn.sharding.strip_boxes(model.init(k, example)),
                   out_shardings=shardings)
  compiled = create.lower(key).compile()
  memory = compiled.memory_analysis()
  per_device = memory.output_size_in_bytes + memory.temp_size_in_bytes
  assert per_device <= budget, (per_device, budget, whole)
  variables = compiled(key)
  for path, leaf in jax.tree_util.tree_leaves_with_path(variables):
    if not leaf.sharding.is_fully_replicated:
      whole_shape = tuple(leaf.shape)
      assert all(s.data.shape != whole_shape for s in leaf.addressable_shards), path
  assert_trees_close(jax.device_get(variables), jax.jit(lambda k: nn.unbox(model.init(k, example)))(key),
                     depth=1)
  results['init'] = {'whole': whole, 'per_device': per_device, 'budget': budget}


def job_resumes_on_another_mesh(job, results):
  """--mesh 4x2 for 4 steps, then --resume on 1x8: the one-device loss curve."""
  with tempfile.TemporaryDirectory() as directory, contextlib.redirect_stdout(io.StringIO()) as out, \
      jax.numpy_dtype_promotion('standard'):
    job.main(FAST + ['--out', directory, '--mesh', 'data=4,model=2', '--stop-after', '4'])
    job.main(FAST + ['--out', directory, '--mesh', 'model=8', '--resume'])
    history = json.loads((pathlib.Path(directory) / 'history.json').read_text())
  printed = out.getvalue()
  assert 'resumed from step 4' in printed and 'per-device memory' in printed, printed[-2000:]
  results['resumed losses'] = history['loss']
  results['memory line'] = [l for l in printed.splitlines() if 'per-device memory' in l][0]


def scan_rewrites_on_sharded_batch(results):
  """A recurrent training step rewritten whole (`push_out_dot1` in its backward loop) on a
  batch sharded over `data`: the unsharded step's values."""
  import lift
  from tests.lift.scan_rewrites.programs import RNN_ARGS, rnn
  w_x, w_h, w_o, xs = RNN_ARGS
  xs = jnp.concatenate([xs] * 4, axis=1)  # 8 rows, one per device
  step = jax.value_and_grad(lambda w, xs: jnp.sum(jnp.sin(rnn(*w, xs)[0])))
  assert 'push_out_dot1' in lift.explain_scans(step, (w_x, w_h, w_o), xs).applied
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  sharded = jax.device_put(xs, jax.NamedSharding(mesh, jax.P(None, 'data')))
  value, grads = jax.jit(lift.optimize_scans(step))((w_x, w_h, w_o), sharded)
  assert_trees_close((value, grads), jax.jit(step)((w_x, w_h, w_o), xs), depth=8)


def run_checks():
  """Child entry point: every check, then the results as one JSON line."""
  assert jax.device_count() == 8, jax.devices()
  job = _load_job()
  results = {}
  checks = [('lm_on_meshes', lambda: results.setdefault('states', lm_on_meshes(job, results))),
            ('orbax', lambda: orbax_across_meshes(results['states'], results)),
            ('sharded_init', lambda: sharded_init_fits_the_budget(job, results)),
            ('resume', lambda: job_resumes_on_another_mesh(job, results)),
            ('scan_rewrites', lambda: scan_rewrites_on_sharded_batch(results))]
  for name, check in checks:
    started = time.perf_counter()
    try:
      with jax.numpy_dtype_promotion('standard'):  # optax's schedules mix floats and ints
        check()
      results[name] = 'ok'
    except Exception:  # noqa: BLE001 (reported to the parent test)
      results[name] = traceback.format_exc()
    results[f'{name} seconds'] = round(time.perf_counter() - started, 1)
  results.pop('states', None)
  print(RESULT_MARK + json.dumps(results))


def test_on_8_devices_and_over_two_processes(tmp_path):
  """The child's checks, then the job over 2 processes against the child's one-device
  losses. One test, so one child per run (pytest-xdist would start one per worker for a
  module fixture shared by several tests)."""
  proc = run_in_child('test_scale_out.run_checks', timeout=400)
  lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_MARK)]
  assert lines, f'child failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}'
  results = json.loads(lines[-1][len(RESULT_MARK):])
  failed = {name: results[name] for name in ('lm_on_meshes', 'orbax', 'sharded_init', 'resume',
                                             'scan_rewrites')
            if results[name] != 'ok'}
  assert not failed, '\n\n'.join(f'{name}:\n{why}' for name, why in failed.items())
  one_device = results['losses']['1']
  # resumed on another mesh: the one-device curve continues
  np.testing.assert_allclose(results['resumed losses'][:STEPS], one_device, rtol=1e-4)
  _check_two_processes_train_as_one_device(tmp_path, one_device)


def _processes_command(out, *flags):
  root = pathlib.Path(__file__).resolve().parents[1]
  env = {**os.environ,
         'XLA_FLAGS': child_xla_flags(4),  # as the child's one-device losses it is compared with
         'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': str(root)}
  command = [sys.executable, str(EXAMPLE), *FAST, '--out', str(out), '--mesh', 'data=4,model=2',
             '--processes', '2', '--process-timeout', '10', '--checkpoint-every', '100', *flags]
  return command, root, env


def _run_processes(out, *flags, timeout=120):
  """The job with ``--processes 2``, 4 simulated devices each; returns the launcher's result."""
  command, root, env = _processes_command(out, *flags)
  started = time.perf_counter()
  proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                        timeout=timeout)
  return proc, time.perf_counter() - started


def _stop_one_worker_with_sigterm(out, step: int) -> str:
  """Runs the 2-process job, sends SIGTERM to its last worker after ``step``; returns the
  launcher's output once every process has ended."""
  command, root, env = _processes_command(out, '--pause-after-step', str(step))
  job = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
  printed = []
  for line in job.stdout:
    printed.append(line)
    if f'paused after step {step} (pid ' in line:
      os.kill(int(line.split('(pid ')[1].rstrip(')\n')), signal.SIGTERM)
      break
  stdout, stderr = job.communicate(timeout=120)
  assert job.returncode == 0, ''.join(printed) + stdout + stderr[-3000:]
  return ''.join(printed) + stdout


def _check_two_processes_train_as_one_device(tmp_path, one_device):
  """SIGTERM to one of the two processes after step 2: both save step 2 and exit 0; the
  job restarted with --resume trains on as one device does."""
  printed = _stop_one_worker_with_sigterm(tmp_path, 2)
  assert printed.count('over 2 process(es)') == 2, printed[-2000:]
  assert 'stopped after step 2 (SIGTERM)' in printed, printed[-2000:]
  assert 'stopped after step 2 (another process was asked to stop)' in printed, printed[-2000:]
  steps = [p.name for p in (tmp_path / 'checkpoints').iterdir() if p.name.isdigit()]
  assert steps == ['2'], steps
  proc, _ = _run_processes(tmp_path, '--resume')
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count('resumed from step 2') == 2, proc.stdout[-2000:]
  losses = json.loads((tmp_path / 'history.json').read_text())['loss']
  np.testing.assert_allclose(losses[:STEPS], one_device, rtol=1e-5)
