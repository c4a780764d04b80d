"""Threads: init, apply and lifted transforms run from 8 threads at once give the results of
serial runs. Module state, name counters, rng counters, jit caches and the summary's
interceptors are per call or per thread, never shared mutable state of a definition."""
import concurrent.futures

import jax
import jax.numpy as jnp
import pytest

import lift
import linen_ext as nn
from tests.helpers import assert_trees_equal, dense

X = jnp.linspace(-1.0, 1.0, 24).reshape(4, 2, 3)


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, train=True):
    x = nn.Dense(3)(x)
    x = nn.BatchNorm(use_running_average=not train, axis_name=None)(x)
    return x + nn.Dropout(0.5, deterministic=not train)(x)


class Model(nn.Module):
  @nn.compact
  def __call__(self, xs):
    ys = nn.vmap(Block, variable_axes={'params': 0, 'batch_stats': 0},
                 split_rngs={'params': True, 'dropout': True})()(xs)
    ys = nn.jit(Block)()(ys)
    return nn.Stacked(Block, 2, remat='nested')(ys)


def run_module(seed):
  key = jax.random.key(seed)
  rngs = {'params': key, 'dropout': jax.random.fold_in(key, 1)}
  variables = Model().init(rngs, X)
  return variables, Model().apply(variables, X, rngs=rngs, mutable=['batch_stats'])


def run_scope(seed):
  stack = lift.scan(lambda s, c, x: (jnp.tanh(dense(s, c, 3)), None),
                    variable_axes={'params': 0}, split_rngs={'params': True}, length=3)
  ensemble = lift.vmap(lift.checkpoint(lambda s, x: dense(s, x, 3)),
                       variable_axes={'params': 0}, split_rngs={'params': True})
  def fn(scope, x):
    return stack(scope.push('stack'), x, None)[0] + ensemble(scope.push('ens'), X).sum(0)
  return lift.init(lift.jit(fn))(jax.random.key(seed), X[0])


@pytest.mark.parametrize('run', [run_module, run_scope])
def test_eight_threads_give_the_serial_results(run):
  seeds = list(range(4)) * 2  # 8 runs at once, each seed twice
  serial = [run(seed) for seed in seeds[:4]]
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    threaded = list(pool.map(run, seeds))
  for i, result in enumerate(threaded):
    assert_trees_equal(result, serial[i % 4])
