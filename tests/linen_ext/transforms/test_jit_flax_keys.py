"""Code that hashes its own rng keys inside `nn.jit`: wrapped flax layers and `scan_layers`.

Flax derives a key from the stream's path and draw count in Python, and
`scan_layers` hashes each layer's draws on the host; inside `lift.jit`'s
first trace neither is known. `lift.jit` then compiles that structure for its
concrete paths and counts. Oracle: the same model without `nn.jit` (same
module names), whose keys equal flax.linen's.
"""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn
from tests.helpers import assert_trees_close

RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
DROP = {'dropout': jax.random.key(2)}
X = jnp.linspace(-1.0, 1.0, 12).reshape(2, 6)
TRACES = []


class FlaxBlock(nn.Module):
  """Wrapped flax layers that draw: params at init, flax's own dropout in training."""

  @nn.compact
  def __call__(self, x, train: bool = True):
    TRACES.append(self.scope.path)
    x = nn.Dense(6)(x)
    x = nn.from_flax(flax_nn.Dropout(0.5))(x, deterministic=not train)
    x = nn.LayerNorm()(x)
    return nn.MultiHeadDotProductAttention(num_heads=2, dropout_rate=0.5)(
        x[:, None], deterministic=not train)[:, 0]


def model(jit: bool, calls: int = 2, cls=FlaxBlock):
  """One block called ``calls`` times, and a second one, jitted or not."""
  block = nn.jit(cls, static_argnums=(2,)) if jit else cls

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
      first = block(name='first')
      for _ in range(calls):
        x = first(x, train)
      return block(name='second')(x, train)
  return Model()


def test_wrapped_flax_layers_under_jit_draw_the_keys_of_no_jit():
  variables = model(jit=False).init(RNGS, X)
  assert_trees_close(model(jit=True).init(RNGS, X), variables)
  eager = model(jit=False).apply(variables, X, rngs=DROP)
  assert_trees_close(model(jit=True).apply(variables, X, rngs=DROP), eager)
  # Not a vacuous comparison: dropout is on, and the two calls of 'first' differ.
  assert not np.allclose(eager, model(jit=False).apply(variables, X, train=False))
  assert_trees_close(model(jit=True).apply(variables, X, False), model(jit=False).apply(variables, X, False))


def test_jitted_flax_block_compiles_once_per_paths_and_counts():
  variables = model(jit=False).init(RNGS, X)
  class Fresh(FlaxBlock):  # compiled by no other test
    pass

  jitted = model(jit=True, calls=3, cls=Fresh)
  TRACES.clear()
  jitted.apply(variables, X, False)  # flax draws nothing: one compilation for all calls
  assert len(TRACES) == 1
  TRACES.clear()
  jitted.apply(variables, X, rngs=DROP)
  first = len(TRACES)
  assert 0 < first <= 2 * 4  # each call's (count, path) once, plus a first trace each
  jitted.apply(variables, X, rngs={'dropout': jax.random.key(7)})
  assert len(TRACES) == first  # a later step of the same model reuses every compilation


def test_nested_jit_and_jit_around_vmap_draw_the_keys_of_no_jit():
  def make(jit):
    wrap = nn.jit if jit else (lambda c: c)

    class Inner(nn.Module):
      @nn.compact
      def __call__(self, x):
        return wrap(FlaxBlock)(name='block')(x)

    class Outer(nn.Module):
      @nn.compact
      def __call__(self, x):
        ensemble = nn.vmap(Inner, variable_axes={'params': 0}, split_rngs={'params': True,
                                                                           'dropout': True},
                           in_axes=None, axis_size=2)
        return wrap(Inner)(name='inner')(x) + ensemble(name='ensemble')(x).sum(0)

    class Top(nn.Module):
      @nn.compact
      def __call__(self, x):
        return wrap(Outer)(name='outer')(x)
    return Top()

  variables = make(False).init(RNGS, X)
  assert_trees_close(make(True).init(RNGS, X), variables)
  assert_trees_close(make(True).apply(variables, X, rngs=DROP), make(False).apply(variables, X, rngs=DROP))


class Layer(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.Dropout(0.5, deterministic=False)(jnp.tanh(nn.Dense(6)(x)))


class Stack(nn.Module):
  use_scan: bool

  def setup(self):
    self.layers = [Layer() for _ in range(3)]

  def __call__(self, x):
    if self.use_scan:
      return nn.scan_layers(self.layers, x)
    for layer in self.layers:
      x = layer(x)
    return x


@pytest.mark.parametrize('calls', [1, 2])
def test_scan_layers_drawing_inside_nn_jit_draws_the_keys_of_the_loop(calls):
  def make(use_scan, jit):
    stack = nn.jit(Stack) if jit else Stack

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        layers = stack(use_scan, name='stack')
        for _ in range(calls):
          x = layers(x)
        return x
    return Model()

  variables = make(False, False).init(RNGS, X)
  assert_trees_close(make(True, True).init(RNGS, X), variables)
  loop = make(False, False).apply(variables, X, rngs=DROP)
  assert_trees_close(make(True, True).apply(variables, X, rngs=DROP), loop)
  grad = lambda use_scan, jit: jax.grad(lambda v: make(use_scan, jit).apply(
      v, X, rngs=DROP).sum())(variables)
  assert_trees_close(grad(True, True), grad(False, False))
