"""`WeightNorm` and `SpectralNorm` around native and ready-made layers, against flax.linen."""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn
from tests.helpers import assert_trees_equal as assert_same
from tests.helpers import check_linen_parity

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)


def weight_norm_model(lib, **options):
  class Inner(lib.Module):
    @lib.compact
    def __call__(self, x):
      return lib.Dense(2)(lib.tanh(lib.Dense(3, use_bias=False)(x)))

  class Model(lib.Module):
    @lib.compact
    def __call__(self, x):
      x = lib.WeightNorm(lib.Dense(3))(x)
      x = lib.WeightNorm(Inner(), **options)(x)
      return lib.WeightNorm(lib.Dense(4), use_scale=False, feature_axes=None)(x)
  return Model()


@pytest.mark.parametrize('options', [{}, {'variable_filter': {'kernel', 'bias'}},
                                     {'feature_axes': 0, 'epsilon': 1e-3}])
def test_weight_norm_as_flax(options):
  def build(lib):
    model = weight_norm_model(lib, **options)
    variables = model.init(KEY, X)
    return variables, model.apply(variables, X), jax.grad(lambda v: model.apply(v, X).sum())(
        variables)
  check_linen_parity(build)


def spectral_model(lib, n_steps):
  class Model(lib.Module):
    @lib.compact
    def __call__(self, x, update_stats):
      x = lib.SpectralNorm(lib.Dense(5), n_steps=n_steps)(x, update_stats=update_stats)
      conv = lib.Conv(2, (2,))
      return lib.SpectralNorm(conv)(x[..., None], update_stats=update_stats)
  return Model()


@pytest.mark.parametrize('n_steps', [1, 3])
def test_spectral_norm_and_its_power_iteration_state_as_flax(n_steps):
  ours, theirs = spectral_model(nn, n_steps), spectral_model(flax_nn, n_steps)
  variables = ours.init(KEY, X, True)
  assert_same(variables, theirs.init(KEY, X, True))
  assert set(variables['batch_stats']['SpectralNorm_0']) == {'Dense_0/kernel/u',
                                                            'Dense_0/kernel/sigma'}
  for _ in range(2):  # the stored u and sigma move on with each update
    y, updates = ours.apply(variables, X, True, mutable=['batch_stats'])
    y_flax, updates_flax = theirs.apply(variables, X, True, mutable=['batch_stats'])
    assert_same((y, updates), (y_flax, updates_flax))
    variables = {**variables, **updates}
  assert_same(ours.apply(variables, X, False), theirs.apply(variables, X, False))


def test_inside_vmap_and_scan_as_flax():
  def make(lib):
    class Block(lib.Module):
      @lib.compact
      def __call__(self, c, x):
        h = lib.WeightNorm(lib.Dense(3))(c + x)
        return lib.SpectralNorm(lib.Dense(3))(h, update_stats=True), h

    class Model(lib.Module):
      @lib.compact
      def __call__(self, xs):
        scan = lib.scan(Block, variable_axes={'params': 0, 'batch_stats': 0},
                        split_rngs={'params': True}, length=xs.shape[0])
        ensemble = lib.vmap(scan, variable_axes={'params': 0, 'batch_stats': 0},
                            split_rngs={'params': True}, in_axes=(None, 0))
        return ensemble()(xs[0], jnp.stack([xs, xs]))
    return Model()

  xs = X.reshape(4, 1, 3)

  def build(lib):
    variables = make(lib).init(KEY, xs)
    return variables, make(lib).apply(variables, xs, mutable=['batch_stats'])
  check_linen_parity(build)
