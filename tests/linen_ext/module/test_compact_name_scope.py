"""`compact_name_scope`: a method whose inline submodules sit below its name, as Flax's."""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn
from tests.helpers import assert_trees_equal as assert_same
from tests.helpers import check_linen_parity

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


def make(lib, call_kind):
  class Model(lib.Module):
    width: int = 4

    def setup(self):
      self.shared = lib.Dense(self.width)

    @lib.compact_name_scope
    def up(self, x):
      return self.shared(lib.Dense(self.width)(x))

    @lib.compact_name_scope
    def down(self, x):
      return lib.Dense(3)(self.up(x))  # nested: 'up' stays at the top level

    def plain(self, x):
      return self.down(x) + self.up(x).sum()

    @lib.compact
    def compact(self, x):
      return self.down(x) + lib.Dense(3)(x)

  model = Model()
  method = {'plain': Model.plain, 'compact': Model.compact}[call_kind]
  return model, method


@pytest.mark.parametrize('call_kind', ['plain', 'compact'])
def test_variables_and_outputs_as_flax(call_kind):
  def build(lib):
    model, method = make(lib, call_kind)
    variables = model.init(KEY, X, method=method)
    return (variables, model.apply(variables, X, method=method),
            [model.apply(variables, X, method=name) for name in ('up', 'down')])  # on their own
  variables = check_linen_parity(build)[0][0]
  assert {'up', 'down', 'shared'} <= set(variables['params'])
  assert type(make(nn, call_kind)[0])._compact_name_scope_methods == ('down', 'up')


@pytest.mark.parametrize('transform', ['jit', 'remat', 'vmap'])
def test_inside_lifted_transforms_as_flax(transform):
  def wrap(lib, cls):
    if transform == 'vmap':
      return lib.vmap(cls, variable_axes={'params': 0}, split_rngs={'params': True},
                      methods=['plain'])
    return getattr(lib, transform)(cls, methods=['plain'])

  def build(lib):
    model, _ = make(lib, 'plain')
    return wrap(lib, type(model))()

  xs = jnp.stack([X, X]) if transform == 'vmap' else X
  v_ours = build(nn).init(KEY, xs, method='plain')
  v_theirs = build(flax_nn).init(KEY, xs, method='plain')
  if transform == 'jit':  # by design our jit draws the un-jitted keys, Flax's forks them
    assert jax.tree.map(jnp.shape, v_ours) == jax.tree.map(jnp.shape, v_theirs)
    v_ours = v_theirs
  assert_same(v_ours, v_theirs)
  assert_same(build(nn).apply(v_ours, xs, method='plain'),
              build(flax_nn).apply(v_theirs, xs, method='plain'))
