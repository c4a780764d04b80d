"""Parity with flax.linen: each model is written once, as a function of the ``nn`` namespace.

For every model: the same variable tree (paths, shapes, dtypes) and the same
outputs when both libraries apply the same variables, bit for bit; for models
without jit, also the same initial values for the same key.
"""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

import linen_ext
from tests.helpers import assert_trees_equal

KEY = jax.random.key(0)
RNGS = {'params': KEY, 'dropout': jax.random.key(1)}


def cnn(nn):
  class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.Conv(4, (3, 3))(x))
      x = nn.max_pool(x, (2, 2), strides=(1, 1), padding='SAME')
      x = nn.relu(nn.Conv(8, (3, 3), padding='VALID')(x))
      x = nn.max_pool(x, (2, 2), strides=(2, 2))
      return nn.Dense(3)(x.reshape(x.shape[0], -1))
  return CNN(), (jnp.linspace(-1, 1, 2 * 10 * 10).reshape(2, 10, 10, 1),), {}


def lstm(nn):
  class LSTM(nn.Module):
    @nn.compact
    def __call__(self, xs):
      cell = nn.scan(nn.LSTMCell, variable_broadcast='params', split_rngs={'params': False},
                     in_axes=1, out_axes=1)(features=5)
      carry = cell.initialize_carry(jax.random.key(2), xs[:, 0].shape)
      _, ys = cell(carry, xs)
      return ys
  return LSTM(), (jnp.linspace(-1, 1, 2 * 6 * 3).reshape(2, 6, 3),), {}


def transformer_block(nn):
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, train):
      h = nn.LayerNorm()(x)
      h = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8,
                                             deterministic=not train)(h)
      x = x + nn.Dropout(0.1)(h, deterministic=not train)
      h = nn.Dense(16)(nn.LayerNorm()(x))
      h = nn.Dense(8)(nn.gelu(h))
      return x + nn.Dropout(0.1)(h, deterministic=not train)
  return Block(), (jnp.linspace(-1, 1, 2 * 5 * 8).reshape(2, 5, 8), True), {}


def batchnorm_dropout(nn):
  class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train):
      x = nn.Dense(6)(x)
      x = nn.BatchNorm(use_running_average=not train, momentum=0.8)(x)
      x = nn.Dropout(0.5)(x, deterministic=not train)
      return nn.Dense(2)(nn.relu(x))
  return Net(), (jnp.linspace(-1, 1, 20).reshape(5, 4), True), {}


def scanned_layers(nn):
  class Layer(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      return nn.tanh(nn.Dense(4)(x)), None

  class Stack(nn.Module):
    @nn.compact
    def __call__(self, x):
      layers = nn.scan(Layer, variable_axes={'params': 0}, split_rngs={'params': True},
                       length=3)
      x, _ = layers(name='layers')(x, None)
      return x
  return Stack(), (jnp.linspace(-1, 1, 8).reshape(2, 4),), {}


def scan_traced_once(nn):
  """check_constancy_invariants=False: Flax traces the step once, so other keys are drawn."""
  class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, x):
      h = nn.Dense(4)(c) + nn.Dense(4, name='inp')(x)
      return nn.Dropout(0.5, deterministic=False)(h), h

  class Rnn(nn.Module):
    @nn.compact
    def __call__(self, c, xs):
      cells = nn.scan(Cell, variable_axes={'params': 0}, split_rngs={'params': True,
                      'dropout': True}, check_constancy_invariants=False)
      c, ys = cells(name='cells')(nn.Dropout(0.3, deterministic=False)(c), xs)
      return nn.Dropout(0.3, deterministic=False)(c), ys
  return Rnn(), (jnp.ones((2, 4)), jnp.linspace(-1, 1, 24).reshape(3, 2, 4)), {}


def remat_block(nn):
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(4)(nn.gelu(nn.Dense(8)(x)))

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.remat(Block)()(x)
      return nn.checkpoint(Block, prevent_cse=False)(name='second')(x)
  return Net(), (jnp.linspace(-1, 1, 8).reshape(2, 4),), {}


def jitted_block(nn):
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(4)(x)

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      block = nn.jit(Block)()
      return block(block(x)) + nn.jit(Block)(name='other')(x)
  return Net(), (jnp.linspace(-1, 1, 8).reshape(2, 4),), {}


def tied_autoencoder(nn):
  def transpose(variables):
    return jax.tree_util.tree_map(lambda a: a.T if a.ndim == 2 else a, variables)

  class AutoEncoder(nn.Module):
    def setup(self):
      self.encoder = nn.Dense(3, use_bias=False)
      self.decoder = nn.map_variables(nn.Dense, 'params', transpose, transpose, init=True)(
          4, use_bias=False)

    def __call__(self, x):
      z = self.encoder(x)
      return self.decoder(z)
  return AutoEncoder(), (jnp.linspace(-1, 1, 8).reshape(2, 4),), {}


def setup_submodules(nn):
  class Model(nn.Module):
    vocab: int = 7

    def setup(self):
      self.embed = nn.Embed(self.vocab, 4)
      self.blocks = [nn.Dense(4), nn.Dense(4)]
      self.norm = nn.RMSNorm()

    def __call__(self, tokens):
      x = self.embed(tokens)
      for block in self.blocks:
        x = x + nn.relu(block(x))
      return self.embed.attend(self.norm(x))
  return Model(), (jnp.array([[1, 2, 3], [4, 5, 6]]),), {}


def nested_transforms(nn):
  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      return nn.tanh(nn.LayerNorm()(nn.Dense(4)(x))), None

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      stack = nn.scan(nn.remat(Block, prevent_cse=False), variable_axes={'params': 0},
                      split_rngs={'params': True}, length=3)
      x, _ = stack(name='stack')(x, None)
      heads = nn.vmap(nn.jit(Block), variable_axes={'params': 0}, split_rngs={'params': True},
                      in_axes=(None, None), axis_size=2)
      return heads(name='heads')(x, None)[0]
  return Net(), (jnp.linspace(-1, 1, 8).reshape(2, 4),), {}


# A plain MLP, an unrolled GRU and a vmapped ensemble: see tests/linen_ext/module/test_module.py
# (names and transforms) and tests/linen_ext/layers/test_layers.py (recurrent cells).
MODELS = [cnn, lstm, transformer_block, batchnorm_dropout, scanned_layers, scan_traced_once,
          remat_block, jitted_block, tied_autoencoder, setup_submodules, nested_transforms]
JITTED = {jitted_block, nested_transforms}  # our jit draws the un-jitted keys, Flax's forks them


@pytest.mark.parametrize('make', MODELS, ids=lambda m: m.__name__)
def test_same_variables_and_outputs_as_flax(make):
  (model, args, kwargs), (flax_model, _, _) = make(linen_ext), make(flax_nn)
  ours, variables = model.init(RNGS, *args, **kwargs), flax_model.init(RNGS, *args, **kwargs)
  if make in JITTED:
    assert jax.tree.map(lambda a: (a.shape, a.dtype), ours) == jax.tree.map(
        lambda a: (a.shape, a.dtype), variables)
  else:
    assert_trees_equal(ours, variables)
  mutable = ['batch_stats'] if 'batch_stats' in variables else False
  assert_trees_equal(model.apply(variables, *args, rngs=RNGS, mutable=mutable, **kwargs),
                     flax_model.apply(variables, *args, rngs=RNGS, mutable=mutable, **kwargs))
