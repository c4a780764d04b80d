"""`Stacked.pipeline`: the same values, gradients and dropout draws as `fold` on the whole
batch, on one device (tests/linen_ext/stacks/test_pipeline_multidevice.py: 8 devices, and
remat='nested' there), and the schedule's bubble."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn
from linen_ext.stacks import pipeline as pipe
from tests.helpers import assert_trees_close, assert_trees_equal, cheap_jit

LAYERS = 4


class Block(nn.Module):
  """A residual layer with dropout: the pipeline must draw the masks `fold` draws."""

  @nn.compact
  def __call__(self, x):
    return x + nn.Dropout(0.5, deterministic=False)(jnp.tanh(nn.Dense(3)(x)))


X = jax.random.normal(jax.random.key(1), (8, 3))
RNGS = {'dropout': jax.random.key(5)}


@functools.cache
def fold_loss_and_grads():
  """`fold`'s loss and gradients on the whole batch (remat changes neither)."""
  stack = nn.Stacked(Block, LAYERS)
  variables = init(stack)
  return variables, loss_and_grads(stack, variables)


def loss_and_grads(stack, variables, **pipeline):
  @cheap_jit
  def run(variables):
    def loss(variables):
      if pipeline:
        y = stack.apply(variables, X, rngs=RNGS, method='pipeline', **pipeline)
      else:
        y = stack.apply(variables, X, rngs=RNGS)
      return jnp.sum(y ** 2)
    return jax.value_and_grad(loss)(variables)
  return run(variables)


def init(stack, **pipeline):
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(2)}
  if pipeline:
    return stack.init(rngs, X, method='pipeline', **pipeline)
  return stack.init(rngs, X)


def test_gpipe_equals_fold_with_dropout():
  stack = nn.Stacked(Block, LAYERS)
  variables, expected = fold_loss_and_grads()
  # init through the pipeline makes Stacked's variables: a checkpoint moves unchanged
  assert_trees_equal(init(stack, stages=2, microbatches=4), variables)
  assert_trees_close(loss_and_grads(stack, variables, stages=2, microbatches=4), expected,
                     depth=LAYERS)


def test_circular_with_remat_equals_fold_in_stacked_order():
  stack = nn.Stacked(Block, LAYERS, remat=True)
  variables, (expected_loss, expected_grads) = fold_loss_and_grads()
  options = dict(stages=2, microbatches=2, schedule='circular', repeats=2)
  stored = init(stack, **options)
  assert_trees_equal(stored, pipe.stacked_to_circular(variables, stages=2, repeats=2))
  assert_trees_equal(pipe.circular_to_stacked(stored, stages=2, repeats=2), variables)
  loss, grads = loss_and_grads(stack, stored, **options)
  assert_trees_close(loss, expected_loss, depth=LAYERS)
  assert_trees_close(pipe.circular_to_stacked(grads, stages=2, repeats=2), expected_grads,
                     depth=LAYERS)


@pytest.mark.parametrize('stages,microbatches,repeats', [
    (2, 4, 1), (4, 4, 1), (4, 8, 1), (3, 5, 1), (2, 4, 2), (4, 4, 3)])
def test_bubble_is_idle_ticks(stages, microbatches, repeats):
  table = pipe.schedule_table(stages, microbatches, repeats)
  ticks = microbatches * repeats + stages - 1
  assert table.shape == (ticks, stages, 2)
  assert pipe.bubble_fraction(table) == pytest.approx((stages - 1) / ticks)
  # every stage runs every (microbatch, group) once, microbatch m of group r at r * M + m + s
  for stage in range(stages):
    busy = table[:, stage][table[:, stage, 0] >= 0]
    assert sorted(map(tuple, busy)) == [(m, r) for m in range(microbatches)
                                        for r in range(repeats)]
    ticks_busy = np.flatnonzero(table[:, stage, 0] >= 0)
    np.testing.assert_array_equal(ticks_busy - stage, busy[:, 1] * microbatches + busy[:, 0])


class Gated(nn.Module):
  """Takes a per-example mask, a per-layer scale and a Python flag, as fold passes them."""

  @nn.compact
  def __call__(self, x, mask, scale, *, negate: bool):
    y = jnp.tanh(nn.Dense(3)(x)) * mask * scale
    return x - y if negate else x + y


@pytest.mark.parametrize('schedule', ['gpipe', 'circular'])
def test_arguments_are_fold_s_per_example_rows_and_per_layer_rows(schedule):
  stack = nn.Stacked(Gated, LAYERS)
  mask = (jnp.arange(X.size).reshape(X.shape) % 3 > 0).astype(X.dtype)
  scale = nn.per_layer(jnp.array([1.0, -2.0, 0.5, 3.0]))
  variables = stack.init(jax.random.key(0), X, mask, scale, negate=True)
  options = dict(stages=2, microbatches=4, schedule=schedule,
                 repeats=2 if schedule == 'circular' else 1)
  stored, to_stacked = variables, lambda tree: tree  # noqa: E731
  if schedule == 'circular':
    stored = pipe.stacked_to_circular(variables, stages=2, repeats=2)
    to_stacked = functools.partial(pipe.circular_to_stacked, stages=2, repeats=2)
    # per_layer rows are in Stacked's layer order, whatever the storage order
    assert_trees_equal(stack.init(jax.random.key(0), X, mask, scale, negate=True,
                                  method='pipeline', **options), stored)

  def loss(variables, **pipeline):
    method = 'pipeline' if pipeline else None
    y = stack.apply(variables, X, mask, scale, negate=True, method=method, **pipeline)
    return jnp.sum(y ** 2)
  got = cheap_jit(jax.value_and_grad(lambda v: loss(v, **options)))(stored)
  expected = cheap_jit(jax.value_and_grad(loss))(variables)
  assert_trees_close((got[0], to_stacked(got[1])), expected, depth=LAYERS)
