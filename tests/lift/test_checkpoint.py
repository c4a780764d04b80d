"""Lifted checkpoint/remat: the values, variables, rng draws and gradients of no remat."""

import flax.core
import jax
import jax.numpy as jnp
import pytest
from flax.core import lift as flax_lift

import lift
import linen_ext as nn
from lift import errors

from tests.helpers import assert_trees_close, check_linen_parity, counter, dense, mlp
from tests.lift.test_flax_core_parity import check

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
KEY = jax.random.key(0)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}


def noisy_mlp(scope, x, remat):
  wrap = lift.checkpoint if remat else (lambda f, **kw: f)
  h = wrap(mlp)(scope.push('body'), x)
  noise = wrap(lambda s, h: h + jax.random.normal(s.make_rng('dropout'), h.shape))(scope, h)
  return jnp.sum(noise ** 2)


def test_remat_equals_no_remat_values_variables_rngs_and_gradients():
  assert_trees_close(lift.init(noisy_mlp)(RNGS, X, False), lift.init(noisy_mlp)(RNGS, X, True))
  _, variables = lift.init(noisy_mlp)(RNGS, X, False)
  loss = lambda params, x, remat: lift.apply(noisy_mlp)({'params': params}, x, remat, rngs=RNGS)
  assert_trees_close(jax.grad(loss, argnums=(0, 1))(variables['params'], X, False),
                     jax.grad(loss, argnums=(0, 1))(variables['params'], X, True))
  names = lambda remat: {e.primitive.name for e in jax.make_jaxpr(
      lambda p: loss(p, X, remat))(variables['params']).jaxpr.eqns}
  assert 'remat2' in names(True) or 'checkpoint' in names(True)  # the jaxpr has a checkpoint
  assert not {'remat2', 'checkpoint'} & names(False)


def test_remat_is_checkpoint_and_matches_flax_core():
  assert lift.remat is lift.checkpoint
  _, (_, variables) = check(lambda L: L.remat(lambda scope, x: scope.child(mlp, 'm')(x)),
                            lambda M, fn: M.init(fn)(RNGS, X))
  assert jax.tree.map(jnp.shape, variables) == {'params': {'m': {
      'hidden': {'kernel': (3, 4), 'bias': (4,)},
      'mid': {'dense_0': {'kernel': (4, 4), 'bias': (4,)}},
      'out': {'kernel': (4, 2), 'bias': (2,)}}}}


def test_static_argnums_count_from_the_first_argument_after_the_scope():
  _, ours = check(lambda L: L.remat(dense, static_argnums=(1,)), lambda M, fn: M.init(fn)(RNGS, X, 5))
  assert_trees_close(ours, lift.init(dense)(RNGS, X, 5))


def test_counter_survives_and_immutable_counter_is_rejected():
  fn = lift.checkpoint(counter)
  _, state = lift.apply(fn, mutable='counter')({'counter': {'count': jnp.int32(4)}}, X)
  assert int(state['counter']['count']) == 5
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(fn)({'counter': {'count': jnp.int32(4)}}, X)




def test_linen_remat_static_argnames():
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, train):
      y = nn.Dense(3)(x)
      return y * 2 if train else y
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      block = nn.remat(Block, static_argnames=('train',))()
      return block(x, train=True) + block(x, True)
  x = jnp.ones((2, 3))
  variables = Model().init(KEY, x)
  loss = lambda v: jnp.sum(Model().apply(v, x))
  assert jnp.isfinite(jax.grad(loss)(variables)['params']['CheckpointBlock_0']['Dense_0']['kernel']).all()
  dense = variables['params']['CheckpointBlock_0']['Dense_0']
  expected = 4 * (x @ dense['kernel'] + dense['bias'][None])
  assert_trees_close(Model().apply(variables, x), expected, depth=1)


def test_debug_paths_name_the_transform_as_flax_core():
  """A checkpointed scope's debug_path reads ``remat(name)``, as flax.core.lift's."""
  def probe(L, seen):
    def leaf(scope, x):
      seen.append(scope.push('inner').debug_path)
      return x
    return lambda scope, x: scope.child(L.checkpoint(L.checkpoint(leaf)), 'block')(x)
  seen = {}
  for L, M in ((flax_lift, flax.core), (lift, lift)):
    M.init(probe(L, seen.setdefault(M.__name__, [])))(RNGS, X)
  assert seen['lift'] == seen['flax.core'] == [('remat(remat(block))', 'inner')]


def test_module_paths_and_debug_paths_under_nested_remat_match_flax():
  def build(nn):
    seen = []

    class Leaf(nn.Module):
      def setup(self):
        seen.append((self.path, self.scope.debug_path))

      def __call__(self, x):
        return x

    class Top(nn.Module):
      def setup(self):
        self.leaf = nn.remat(nn.remat(Leaf))()

      def __call__(self, x):
        return self.leaf(x)

    Top().init(KEY, X)
    # Flax also runs setup on a copy at path () (its check before the transform), and again.
    return sorted({entry for entry in seen if entry[0]})
  ours, _ = check_linen_parity(build)
  assert ours == [(('leaf',), ('remat(remat(leaf))',))]
