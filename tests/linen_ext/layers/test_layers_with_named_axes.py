"""`linen_ext.experimental.layers_with_named_axes`: Flax's layers with logical axis names
(``Dense``, ``Embed``, ``LayerNorm``) as this package's layers.

Oracle: the same model built from ``flax.linen.experimental.layers_with_named_axes``:
variables (their ``params_axes`` metadata included), outputs and ``attend`` bitwise.
"""
import importlib

import jax
import jax.numpy as jnp

from tests.helpers import check_both_raise, check_linen_parity

KEY = jax.random.key(0)
X = jnp.linspace(-1, 1, 6).reshape(2, 3)
TOKENS = jnp.array([[1, 4], [0, 2]])


def layers(nn):
  return importlib.import_module(f'{nn.__name__}.experimental.layers_with_named_axes')


def model(nn):
  """Each layer once, in a compact method (automatic names); the embedding attends too."""
  named = layers(nn)

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x, tokens):
      h = named.Dense(4, kernel_axes=('embed', 'mlp'))(x)
      h = named.LayerNorm(use_bias=False, use_scale=False)(h)
      embed = named.Embed(5, 4)
      return h, embed(tokens), embed.attend(h)

  variables = Model().init(KEY, X, TOKENS)
  return variables, Model().apply(variables, X, TOKENS)


def test_layers_as_flax():
  variables, _ = check_linen_parity(model)[0]
  assert set(variables['params_axes']['Dense_0']) == {'kernel_axes', 'bias_axes'}
  assert variables['params_axes']['Embed_0']['embedding_axes'].names == ('vocab', 'embed')


def test_layer_norm_with_a_scale_fails_as_flax():
  """Flax's code calls ``mdl.param_with_axes``, a method no module has (see the module)."""
  check_both_raise(lambda nn: layers(nn).LayerNorm().init(KEY, X), AttributeError,
                   AttributeError)
