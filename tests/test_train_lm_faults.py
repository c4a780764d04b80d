"""The main job under faults: SIGTERM and SIGKILL at chosen moments, then ``--resume``.

Each job runs in its own process with the tiny flags of tests/test_train_lm.py (8 steps,
a checkpoint every 4) and a hidden pause after a chosen step, in which the test signals
it. The oracle is the uninterrupted run's history: after the fault and ``--resume``, the
losses and accuracies are equal (the same compiled step on the same state and data).
A NaN loss is made with a learning rate no optimizer survives.
"""
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import pytest

from tests.test_train_lm import EXAMPLE, TINY, run, train_lm, whole_run  # noqa: F401 (fixtures)

ROOT = EXAMPLE.parents[1]


def start(out, *flags) -> subprocess.Popen:
  env = {**os.environ, 'PYTHONPATH': str(ROOT)}
  return subprocess.Popen([sys.executable, str(EXAMPLE), *TINY, '--out', str(out), *flags],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def wait_for(job: subprocess.Popen, text: str, timeout: float = 120) -> str:
  """Reads the job's output until a line containing ``text``; returns what it read."""
  read, deadline = [], time.monotonic() + timeout
  while time.monotonic() < deadline:
    line = job.stdout.readline()
    if not line and job.poll() is not None:
      break
    read.append(line)
    if text in line:
      return ''.join(read)
  job.kill()
  raise AssertionError(f'no {text!r} in:\n{"".join(read)[-3000:]}\n{job.stderr.read()[-3000:]}')


def complete_steps(out) -> list[int]:
  directory = pathlib.Path(out) / 'checkpoints'
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if (
      directory.exists()) else []


def test_sigterm_saves_the_step_under_way_and_exits_0(train_lm, whole_run, tmp_path):  # noqa: F811
  job = start(tmp_path, '--pause-after-step', '6')
  wait_for(job, 'paused after step 6')
  job.send_signal(signal.SIGTERM)
  stdout, stderr = job.communicate(timeout=120)
  assert job.returncode == 0, stderr[-3000:]
  assert 'stopped after step 6 (SIGTERM)' in stdout and '--resume' in stdout, stdout[-2000:]
  assert complete_steps(tmp_path) == [4, 6]  # the periodic one, and the signal's step
  printed, resumed = run(train_lm, tmp_path, '--resume')
  assert 'resumed from step 6' in printed
  assert resumed == whole_run[1]


def test_sigkill_before_the_first_complete_checkpoint(train_lm, whole_run, tmp_path):  # noqa: F811
  job = start(tmp_path, '--pause-after-step', '2')
  wait_for(job, 'paused after step 2')
  job.kill()
  job.communicate(timeout=60)
  printed, resumed = run(train_lm, tmp_path, '--resume')  # as a scheduler restarts it
  assert 'no complete checkpoint' in printed and 'starting at step 0' in printed, printed
  assert resumed == whole_run[1]


def test_sigkill_during_a_checkpoint_write(train_lm, whole_run, tmp_path):  # noqa: F811
  """Killed as soon as step 4's checkpoint is handed to orbax's background writer: a
  checkpoint left half-written (a temporary directory) is never read."""
  job = start(tmp_path, '--pause-after-step', '4', '--pause-seconds', '0')
  wait_for(job, 'paused after step 4')
  job.kill()
  job.communicate(timeout=60)
  half_written = [p.name for p in (tmp_path / 'checkpoints').iterdir() if 'tmp' in p.name]
  printed, resumed = run(train_lm, tmp_path, '--resume')
  if half_written:
    assert 'starting at step 0' in printed, (half_written, printed)
  assert resumed == whole_run[1]


def test_sigkill_between_checkpoints(train_lm, whole_run, tmp_path):  # noqa: F811
  job = start(tmp_path, '--pause-after-step', '6')
  wait_for(job, 'paused after step 6')
  deadline = time.monotonic() + 60
  while complete_steps(tmp_path) != [4] and time.monotonic() < deadline:  # written by now
    time.sleep(0.05)
  job.kill()
  job.communicate(timeout=60)
  printed, resumed = run(train_lm, tmp_path, '--resume')
  assert 'resumed from step 4' in printed, printed
  assert resumed == whole_run[1]


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(train_lm, tmp_path):  # noqa: F811
  with pytest.raises(SystemExit, match=r'the loss is nan') as stopped:
    run(train_lm, tmp_path, '--learning-rate', '1e30')
  step = int(str(stopped.value).split(':')[0].split()[-1])  # 'step N: the loss is nan ...'
  assert all(kept < step for kept in complete_steps(tmp_path)), (step, complete_steps(tmp_path))
  assert f'step {max(complete_steps(tmp_path), default=None)} in' in str(stopped.value)


def test_a_second_signal_exits_at_once():
  """The first signal is noted (the job saves and stops after its step); a second one, while
  the job is still at work, ends the process at once, as the default handler would."""
  code = ('import os, signal, time\n'
          'import train_lm_checkpoints as checkpoints\n'
          'preemption = checkpoints.Preemption()\n'
          'with preemption.installed():\n'
          '  os.kill(os.getpid(), signal.SIGTERM)\n'
          '  print("noted", preemption.received == signal.SIGTERM, flush=True)\n'
          '  os.kill(os.getpid(), signal.SIGTERM)\n'
          '  time.sleep(30)\n')
  proc = subprocess.run([sys.executable, '-c', code], cwd=EXAMPLE.parent, capture_output=True,
                        text=True, timeout=60)
  assert proc.stdout == 'noted True\n', proc.stdout + proc.stderr
  assert proc.returncode == 128 + signal.SIGTERM


def test_a_checkpoint_holds_the_history_of_its_step(tmp_path):
  """Orbax writes in the background while the loop appends to the history: the checkpoint
  keeps the history as it was at its step."""
  sys.path.insert(0, str(EXAMPLE.parent))
  import train_lm_checkpoints as checkpoints
  manager = checkpoints.checkpoint_manager(tmp_path, 1)
  state = {'w': jax.numpy.zeros(3)}
  history = {'loss': [1.0, 2.0], 'accuracy': []}
  checkpoints.save(manager, 2, state, history)
  history['loss'].append(3.0)  # the next step's loss, at once
  manager.wait_until_finished()
  step, _, restored = checkpoints.restore(manager, state)
  assert (step, restored['loss']) == (2, [1.0, 2.0])
