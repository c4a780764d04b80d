"""The main job (examples/train_lm.py) with tiny flags: its result line, plot, checkpoints, resume."""
import contextlib
import importlib.util
import io
import json
import os
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
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


def run(train_lm, out, *flags):
  """Runs the job; returns what it printed and the loss/accuracy history it wrote."""
  printed = io.StringIO()
  # optax's schedules mix Python floats with int32 counts: standard promotion for the job,
  # where the rest of the suite runs with strict promotion.
  with contextlib.redirect_stdout(printed), jax.numpy_dtype_promotion('standard'):
    train_lm.main(TINY + ['--out', str(out), *flags])
  return printed.getvalue(), json.loads((out / 'history.json').read_text())


@pytest.fixture(scope='module')
def whole_run(train_lm, tmp_path_factory):
  """The whole job, its ``--out`` given relative to the working directory."""
  return run(train_lm, pathlib.Path(os.path.relpath(tmp_path_factory.mktemp('whole'))))


def test_result_line_plot_and_checkpoints(whole_run):
  printed, history = whole_run
  assert 'Total Parameters' in printed  # the nn.tabulate summary
  match = RESULT.search(printed)
  assert match, printed[-2000:]
  accuracy, matches, checkpoint, png = match.groups()
  # Both paths in one form: absolute, under --out (given relative), whatever the directory.
  assert pathlib.Path(checkpoint).is_absolute() and pathlib.Path(png).is_absolute()
  assert pathlib.Path(checkpoint).parent == pathlib.Path(png).parent, (checkpoint, png)
  assert 0.0 <= float(accuracy) <= 1.0
  assert matches == 'True'
  assert pathlib.Path(png).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  steps = sorted(p.name for p in pathlib.Path(checkpoint).iterdir() if p.name.isdigit())
  assert steps == ['4', '8']
  assert len(history['loss']) == 8 and all(np.isfinite(history['loss']))
  assert [step for step, _ in history['accuracy']] == [4, 8]


def test_resume_continues_the_same_loss_curve(train_lm, whole_run, tmp_path):
  _, whole = whole_run
  _, first_half = run(train_lm, tmp_path, '--stop-after', '4')
  assert len(first_half['loss']) == 4
  printed, resumed = run(train_lm, tmp_path, '--resume')
  assert 'resumed from step 4' in printed
  # The same compiled step on the same restored state and data: equal, not close.
  assert resumed['loss'] == whole['loss']
  assert resumed['accuracy'] == whole['accuracy']


def test_warmup_must_fit_in_the_steps(train_lm, capsys):
  with pytest.raises(SystemExit):
    train_lm.main(TINY + ['--warmup', '8'])
  assert '--warmup 8 must be at least 0 and below --steps 8' in capsys.readouterr().err


def test_the_task_is_addition_with_the_sum_reversed(train_lm):
  task = train_lm.Addition(3)
  row = task.encode(np.array([724]), np.array([892]))[0]
  assert row.tolist() == [7, 2, 4, 10, 8, 9, 2, 11, 6, 1, 6, 1]  # 724+892=1616, reversed

  def operands(rows):
    return [rows[:, start:start + 3] @ np.array([100, 10, 1]) for start in (0, 4)]

  # Evaluation draws only problems that training never sees.
  assert task.held_out(*operands(task.eval_problems(64))).all()
  assert not task.held_out(*operands(np.asarray(task.train_batch(jax.random.key(0), 4096)))).any()


def _equations(jaxpr):
  """Every equation of a jaxpr and of the jaxprs inside it (loops, remat, calls)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for inner in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(inner, 'jaxpr', inner)
        if hasattr(inner, 'eqns'):
          yield from _equations(inner)


def test_bfloat16_computes_in_bfloat16_with_float32_variables_and_loss(train_lm):
  """--dtype bfloat16 through nn.Stacked with remat='nested', the pipeline and decoding."""
  import linen_ext as nn
  args = train_lm.parse_args(TINY + ['--dtype', 'bfloat16', '--pipeline-stages', '2',
                                     '--microbatches', '2'])
  task, model = train_lm.build(args)
  tokens = task.train_batch(jax.random.key(0), 4)
  mesh = train_lm.mesh_lib.make_mesh(train_lm.mesh_lib.parse_mesh('data=1'))
  piped = train_lm.pipelined(model, args, mesh)
  with jax.numpy_dtype_promotion('standard'):
    params = nn.unbox(model.init(jax.random.key(0), tokens[:, :-1]))['params']
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    closed = jax.make_jaxpr(lambda p: piped.apply({'params': p}, tokens[:, :-1]))(params)
    products = [e for e in _equations(closed.jaxpr) if e.primitive.name == 'dot_general']
    assert products and {e.outvars[0].aval.dtype for e in products} == {
        jnp.dtype(jnp.bfloat16)}, {e.outvars[0].aval.dtype for e in products}
    assert closed.out_avals[0].dtype == jnp.bfloat16  # the logits
    loss = train_lm.answer_loss(params, piped, tokens, task)
    assert loss.dtype == jnp.float32
    _, matches = train_lm.evaluate(model, params, task.eval_problems(8), task, check=8)
  assert matches  # the derived bfloat16 decoder gives recomputation's tokens
