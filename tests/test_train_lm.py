"""The main job (examples/train_lm.py) with tiny flags: its result line, plot, checkpoints, resume."""
import importlib.util
import json
import pathlib
import re
import sys

import jax
import numpy as np
import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / 'examples' / 'train_lm.py'
TINY = ['--digits', '1', '--depth', '2', '--width', '16', '--heads', '2', '--batch', '16',
        '--steps', '8', '--warmup', '2', '--eval-every', '4', '--checkpoint-every', '4',
        '--eval-problems', '8']
RESULT = re.compile(r'^result: accuracy=(\S+) decode_matches_recompute=(True|False) '
                    r'checkpoint=(\S+) plot=(\S+)$', re.M)


@pytest.fixture(scope='module')
def train_lm():
  spec = importlib.util.spec_from_file_location('train_lm', EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  sys.modules['train_lm'] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def main(train_lm, *flags):
  # optax's schedules mix Python floats with int32 counts: standard promotion for the job,
  # whose own code runs under the suite's strict setting everywhere else.
  with jax.numpy_dtype_promotion('standard'):
    return train_lm.main(TINY + list(flags))


def run(train_lm, capsys, out, *flags):
  main(train_lm, '--out', str(out), *flags)
  printed = capsys.readouterr().out
  match = RESULT.search(printed)
  assert match, printed[-2000:]
  return match, json.loads((out / 'history.json').read_text())


def test_result_line_plot_and_checkpoints(train_lm, capsys, tmp_path):
  match, history = run(train_lm, capsys, tmp_path)
  accuracy, matches, checkpoint, png = match.groups()
  assert 0.0 <= float(accuracy) <= 1.0
  assert matches == 'True'
  assert pathlib.Path(png).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert sorted(p.name for p in pathlib.Path(checkpoint).iterdir() if p.name.isdigit()) == ['4', '8']
  assert len(history['loss']) == 8 and all(np.isfinite(history['loss']))
  assert [step for step, _ in history['accuracy']] == [4, 8]


def test_resume_continues_the_same_loss_curve(train_lm, capsys, tmp_path):
  _, whole = run(train_lm, capsys, tmp_path / 'whole')
  main(train_lm, '--out', str(tmp_path / 'split'), '--stop-after', '4')
  capsys.readouterr()
  _, resumed = run(train_lm, capsys, tmp_path / 'split', '--resume')
  assert len(resumed['loss']) == 8
  # The same compiled step on the same restored state and data: equal, not close.
  assert resumed['loss'] == whole['loss']
  assert resumed['accuracy'] == whole['accuracy']


def test_resume_without_a_checkpoint_says_so(train_lm, tmp_path):
  with pytest.raises(SystemExit, match='no checkpoint'):
    main(train_lm, '--out', str(tmp_path), '--resume')


def test_the_task_is_addition_with_the_sum_reversed(train_lm):
  task = train_lm.Addition(3)
  row = task.encode(np.array([724]), np.array([892]))[0]
  assert row.tolist() == [7, 2, 4, 10, 8, 9, 2, 11, 6, 1, 6, 1]  # 724+892=1616, reversed
  problems = task.eval_problems(64)
  a = problems[:, 0] * 100 + problems[:, 1] * 10 + problems[:, 2]
  b = problems[:, 4] * 100 + problems[:, 5] * 10 + problems[:, 6]
  assert task.held_out(a, b).all()  # evaluation draws only problems training never sees
  trained = np.asarray(task.train_batch(jax.random.key(0), 4096))
  a = trained[:, 0] * 100 + trained[:, 1] * 10 + trained[:, 2]
  b = trained[:, 4] * 100 + trained[:, 5] * 10 + trained[:, 6]
  assert not task.held_out(a, b).any()
