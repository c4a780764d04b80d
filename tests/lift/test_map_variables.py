"""Lifted map_variables and swap_collection: the hand-written program on mapped variables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift
from lift import errors

from tests.helpers import assert_trees_close, counter
from tests.lift.test_flax_core_parity import check

X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}


def linear(scope, x, features):
  kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  return x @ kernel


def transpose(collections):
  return jax.tree.map(lambda a: a.T, collections)


def tied_autoencoder(scope, x, latents, map_variables=lift.map_variables):
  """The decoder is the encoder's kernel, transposed on the way in (and back out)."""
  codec = scope.push('codec')
  encode = map_variables(linear, 'params', mutable=True)
  decode = map_variables(linear, 'params', transpose, transpose, mutable=True)
  z = jnp.tanh(encode(codec, x, latents))
  return decode(codec, z, x.shape[-1])


def test_tied_autoencoder_equals_the_hand_written_program_and_flax_core():
  _, (y, variables) = check(lambda L: lambda s, x: tied_autoencoder(s, x, 3, L.map_variables),
                            lambda M, fn: M.init(fn)(RNGS, X))
  assert jax.tree.map(jnp.shape, variables) == {'params': {'codec': {'kernel': (4, 3)}}}
  kernel = variables['params']['codec']['kernel']
  assert_trees_close(y, jnp.tanh(X @ kernel) @ kernel.T, depth=1)
  _, plain = lift.init(lambda s, x: linear(s.push('codec'), x, 3))(RNGS, X)
  assert_trees_close(variables, plain)  # no transform changes the initial values
  assert_trees_close(lift.apply(tied_autoencoder)(variables, X, 3), y, depth=1)


def test_tied_autoencoder_gradients_flow_into_the_one_kernel():
  _, variables = lift.init(tied_autoencoder)(RNGS, X, 3)
  loss = lambda p: jnp.sum(lift.apply(tied_autoencoder)({'params': p}, X, 3) ** 2)
  by_hand = lambda k: jnp.sum((jnp.tanh(X @ k) @ k.T) ** 2)
  assert_trees_close(jax.grad(loss)(variables['params'])['codec']['kernel'],
                     jax.grad(by_hand)(variables['params']['codec']['kernel']), depth=3)


def test_init_creates_the_mapped_collection_in_stored_form():
  build = lambda L: L.map_variables(linear, 'params', transpose, transpose, init=True)
  _, (y, variables) = check(build, lambda M, fn: M.init(fn)(RNGS, X, 3))
  assert jax.tree.map(jnp.shape, variables) == {'params': {'kernel': (3, 4)}}
  _, plain = lift.init(linear)(RNGS, X, 3)  # what the view would have been
  np.testing.assert_allclose(variables['params']['kernel'], plain['params']['kernel'].T)
  assert_trees_close(y, X @ variables['params']['kernel'].T, depth=1)
  check(build, lambda M, fn: M.apply(fn)(variables, X, 3))


def test_main_pass_draws_after_the_init_pass_as_flax():
  """Flax's two passes share the counters: the init pass draws first, the main pass next."""
  def noisy(scope, x):
    return linear(scope, x, 3) + jax.random.normal(scope.make_rng('dropout'), (2, 3))
  def by_hand(scope, x):
    scope.make_rng('dropout')  # the init pass's noise; its kernel is the one kept
    return noisy(scope, x)
  _, ours = check(lambda L: L.map_variables(noisy, 'params', init=True),
                  lambda M, fn: M.init(fn)(RNGS, X))
  assert_trees_close(ours, lift.init(by_hand)(RNGS, X), depth=1)


def test_mapped_collection_written_inside_when_mutable():  # read-only otherwise: tests/misuse/
  def bump(scope):
    scope.put_variable('params', 'w', scope.get_variable('params', 'w') + 1)
  variables = {'params': {'w': jnp.ones(2)}}
  double = lambda c: jax.tree.map(lambda a: 2 * a, c)
  halve = lambda c: jax.tree.map(lambda a: a / 2, c)
  _, out = lift.apply(lift.map_variables(bump, 'params', double, halve, mutable=True),
                      mutable=True)(variables)
  np.testing.assert_allclose(out['params']['w'], 1.5)  # (2 * 1 + 1) / 2


def test_swap_collection():
  def step(scope):
    a = scope.get_variable('a', 'x')
    scope.put_variable('b', 'x', a + 10)
    return a
  variables = {'a': {'x': jnp.float32(1)}, 'b': {'x': jnp.float32(2)}}
  _, (y, out) = check(lambda L: L.swap_collection(step, 'a', 'b'),
                      lambda M, fn: M.apply(fn, mutable=True)(variables))
  assert float(y) == 2  # 'a' inside is 'b' outside
  assert float(out['a']['x']) == 12 and float(out['b']['x']) == 2


@pytest.mark.parametrize('transform', [
    lambda f: lift.map_variables(f, 'params', transpose),
    lambda f: lift.map_variables(f, 'params', transpose, transpose, mutable=True),
    lambda f: lift.swap_collection(f, 'a', 'b')])
def test_counter_survives_and_immutable_counter_is_rejected(transform):
  fn = transform(counter)
  variables = {'counter': {'count': jnp.int32(4)}, 'params': {'w': jnp.ones((2, 2))}}
  _, state = lift.apply(fn, mutable='counter')(variables, X)
  assert int(state['counter']['count']) == 5
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(fn)(variables, X)


def _running_mean(scope, x):
  y = linear(scope, x, 3)
  mean = scope.variable('stats', 'mean', lambda: jnp.zeros(3))
  mean.value = 0.9 * mean.value + y.mean(0)
  return y


def test_init_pass_keeps_the_immutable_mapped_collections():
  """Flax's init pass keeps only the mutable mapped collections, so 'params' goes missing."""
  double = lambda c: jax.tree.map(lambda a: 2 * a, c)
  halve = lambda c: jax.tree.map(lambda a: a / 2, c)
  seen = []
  def map_out(c):
    seen.append(sorted(c))
    return halve(c)
  _, variables = lift.init(lift.map_variables(_running_mean, ['params', 'stats'], double, halve,
                                              init=True, mutable=True))(RNGS, X)
  # With everything mutable, ours is Flax's (whose map_out_fn we cannot watch: it is halve).
  _, (y_all, all_mutable) = check(
      lambda L: L.map_variables(_running_mean, ['params', 'stats'], double,
                                map_out if L is lift else halve, init=True, mutable=True),
      lambda M, fn: M.apply(fn, mutable=True)(variables, X))
  seen.clear()
  mapped = lift.map_variables(_running_mean, ['params', 'stats'], double, map_out, init=True, mutable=True)
  y, stats_only = lift.apply(mapped, mutable='stats')(variables, X)
  assert seen[0] == ['params', 'stats']  # map_out_fn sees every mapped collection
  assert sorted(stats_only) == ['stats']
  assert_trees_close((y, stats_only['stats']), (y_all, all_mutable['stats']))


def test_counters_after_an_init_pass_count_its_draws_as_flax():
  """The init pass draws the parameter's key; later draws at that scope must not repeat it."""
  def build(L):
    return lambda s, x: (L.map_variables(linear, 'params', init=True)(s, x, 3),
                         jax.random.key_data(s.make_rng('params')))
  check(build, lambda M, fn: M.init(fn)(RNGS, X))


def test_map_variables_with_init_inside_scan_as_flax():
  def build(L):
    def step(scope, c, x):
      return jnp.tanh(L.map_variables(linear, 'params', init=True)(scope.push('dense'), c + x, 4)), None
    body = L.scan(step, variable_axes={'params': 0}, split_rngs={'params': True})
    return lambda scope, xs: body(scope, xs[0], xs)[0]
  check(build, lambda M, fn: M.init(fn)(RNGS, jnp.stack([X, X, X])), depth=4)
