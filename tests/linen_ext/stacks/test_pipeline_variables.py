"""`Stacked.pipeline`'s mutable collections, against `fold` called on the microbatches in
turn: a variable the stack holds (batch statistics, a counter) is carried through each
layer's microbatches; one the block creates (``sow``) comes back per layer and microbatch.
(A sown collection passed back in is a misuse case: tests/misuse/pipeline_cases.py.)"""
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn
from linen_ext.stacks import pipeline as pipe
from tests.helpers import assert_trees_close, cheap_jit

LAYERS, MICROBATCHES = 4, 4
X = jax.random.normal(jax.random.key(1), (16, 3))
WRITTEN = ['batch_stats', 'counter', 'intermediates']


class Block(nn.Module):
  """Batch statistics in training mode, a count of calls, a sown activation and scalar."""

  @nn.compact
  def __call__(self, x):
    h = jnp.tanh(nn.Dense(3)(x))
    calls = self.variable('counter', 'calls', lambda: jnp.zeros((), jnp.int32))
    calls.value += 1
    self.sow('intermediates', 'h', h)
    self.sow('intermediates', 'h_sum', jnp.sum(h))
    scaled = h * calls.value.astype(h.dtype)
    return x + nn.BatchNorm(use_running_average=False, momentum=0.5)(scaled)


def _held(variables):
  return {col: variables[col] for col in ('params', 'batch_stats', 'counter')}


def _sequential_folds(stack, variables):
  """The oracle: fold on microbatch 0 (rows 0, M, 2M, ...), then on 1, ... (carrying the
  held collections); returns the joined outputs and (the held collections after the
  last, each microbatch's sown values stacked on axis 1, after the layer axis)."""
  held, outs, sown = variables, [], []
  for m in range(MICROBATCHES):
    y, written = stack.apply(held, X[m::MICROBATCHES], mutable=WRITTEN)
    held = {**held, 'batch_stats': written['batch_stats'], 'counter': written['counter']}
    outs.append(y)
    sown.append(written['intermediates'])
  sown = jax.tree.map(lambda *a: jnp.stack(a, axis=1), *sown)
  return jnp.stack(outs, axis=1).reshape(X.shape), (held, sown)


def _loss_grads_and_writes(run, variables):
  """Gradients of sum(y ** 2) over params, with everything written."""
  def loss(params):
    y, written = run({**variables, 'params': params})
    return jnp.sum(y ** 2), (y, written)
  (_, (y, written)), grads = cheap_jit(jax.value_and_grad(loss, has_aux=True))(
      variables['params'])
  return y, written, grads


@pytest.mark.parametrize('schedule,remat', [('gpipe', False), ('circular', 'nested')])
def test_written_collections_equal_fold_on_each_microbatch_in_turn(schedule, remat):
  stack = nn.Stacked(Block, LAYERS, remat=remat)
  stacked = _held(stack.init(jax.random.key(0), X))
  options = dict(stages=2, microbatches=MICROBATCHES, schedule=schedule,
                 repeats=2 if schedule == 'circular' else 1)
  stored = stacked
  if schedule == 'circular':
    stored = pipe.stacked_to_circular(stacked, stages=2, repeats=2)
    to_stacked = lambda t: pipe.circular_to_stacked(t, stages=2, repeats=2)  # noqa: E731
  else:
    to_stacked = lambda t: t  # noqa: E731
  y, written, grads = _loss_grads_and_writes(lambda v: stack.apply(
      v, X, method='pipeline', mutable=WRITTEN, **options), stored)
  expected_y, (held, sown), expected_grads = _loss_grads_and_writes(
      lambda v: _sequential_folds(stack, v), stacked)
  assert_trees_close(y, expected_y, depth=LAYERS)
  assert_trees_close(to_stacked(grads), expected_grads, depth=LAYERS)
  # carried per layer: each layer counted init and every microbatch once
  assert to_stacked(written['counter'])['calls'].tolist() == [1 + MICROBATCHES] * LAYERS
  assert_trees_close(to_stacked(written['counter']), held['counter'], depth=0)
  assert_trees_close(to_stacked(written['batch_stats']), held['batch_stats'], depth=LAYERS)
  # created per layer and microbatch: [layers, microbatches, ...]
  assert written['intermediates']['h'][0].shape == (LAYERS, MICROBATCHES, 4, 3)
  assert_trees_close(to_stacked(written['intermediates']), sown, depth=LAYERS)
