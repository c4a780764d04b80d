"""No traced value outlives its trace: modules, scopes and caches hold none of them.

Python frees reference cycles only at its next garbage collection, so values
reachable from a cycle (a child module pointing back to its parent, a scope
storing modules that point back to it) or from a cache (`nn.jit`'s key) stay
alive after `init`/`apply` returns. Like Flax's own leak test, these run with
`gc.collect` disabled inside `jax.checking_leaks()`, which raises on any
tracer still reachable when its trace ends.
"""
import functools
import gc
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _=None):
    return nn.Dense(4)(x), None


class Model(nn.Module):
  inner: nn.Module  # built outside any module: adopted (and cached) by the root scope
  kind: str

  @nn.compact
  def __call__(self, x):
    if self.kind == 'jit':
      x = nn.jit(Block)()(x)[0]
    elif self.kind == 'remat':
      x = nn.remat(Block)()(x)[0]
    elif self.kind == 'scan':
      x = nn.scan(Block, variable_axes={'params': 0}, split_rngs={'params': True},
                  length=2)()(x, None)[0]
    elif self.kind == 'vmap':
      x = nn.vmap(Block, variable_axes={'params': 0}, split_rngs={'params': True})()(
          jnp.stack([x, x]))[0][0]
    elif self.kind == 'stacked':
      x = nn.Stacked(Block, 2).scan(x)[0]
    elif self.kind == 'sequential':
      x = nn.Sequential([nn.Dense(4), nn.relu])(x)
    return self.inner(x)


@pytest.mark.parametrize('kind', ['sequential', 'jit', 'remat', 'scan', 'vmap', 'stacked'])
def test_init_and_apply_under_jit_and_vmap_leak_no_tracers(kind):
  model = Model(nn.Dense(4), kind)

  @jax.jit
  @functools.partial(jax.vmap, in_axes=(0, None))
  def sample(key, x):
    variables = model.init(key, x)
    return model.apply(variables, x)

  with mock.patch.object(gc, 'collect', return_value=0), jax.checking_leaks():
    for _ in range(2):  # the second call also meets the caches the first one filled
      keys = jax.random.split(jax.random.key(0), 3)
      sample(keys, np.ones((2, 4), np.float32)).block_until_ready()


def test_a_child_keeps_working_after_its_parent_is_gone():
  """Parents are held weakly (as in Flax): a submodule taken from a bound model still runs."""
  class Outer(nn.Module):
    def setup(self):
      self.dense = nn.Dense(3)

    def __call__(self, x):
      return self.dense(x)

  x = jnp.ones((1, 2))
  variables = Outer().init(jax.random.key(0), x)
  dense = Outer().bind(variables).dense
  gc.collect()
  np.testing.assert_allclose(dense(x), Outer().apply(variables, x))
