"""Lifted vjp, jvp, value_and_grad and custom_vjp: JAX's autodiff on the explicit variables."""
import jax
import jax.numpy as jnp
import pytest

import lift
from lift import errors

from tests.helpers import assert_trees_close, assert_trees_equal, counter, dense
from tests.lift.test_flax_core_parity import check

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
TARGET = jnp.ones((2, 2))


def layer(scope, x):
  return jnp.tanh(dense(scope, x, 2))


def layer_by_hand(params, x):
  return jnp.tanh(x @ params['kernel'] + params['bias'][None])


PARAMS = lift.init(layer)(RNGS, X)[1]['params']
PARAMS_DOT = jax.tree.map(lambda a: 0.5 * jnp.ones_like(a), PARAMS)
VARIABLES = {'params': {'layer': PARAMS}}


def loss(scope, x, target):
  return jnp.sum((layer(scope, x) - target) ** 2)


def _vjp_by_hand(x):
  y, bwd = jax.vjp(layer_by_hand, PARAMS, x)
  params_grad, x_grad = bwd(jnp.ones_like(y))
  return y, {'params': params_grad}, x_grad


ORACLES = {  # the lifted transform (with Flax's or ours) and JAX's on the explicit params
    'vjp': (lambda L: lambda s, x: (lambda y, bwd: (y, *bwd(jnp.ones_like(y))))(
        *L.vjp(layer, s.push('layer'), x)), _vjp_by_hand),
    'value_and_grad': (
        lambda L: lambda s, x: L.value_and_grad(loss, s.push('layer'), x, TARGET),
        lambda x: jax.value_and_grad(lambda x, t: jnp.sum((layer_by_hand(PARAMS, x) - t) ** 2),
                                     argnums=(0, 1))(x, TARGET)),
    'jvp': (lambda L: lambda s, x: L.jvp(layer, s.push('layer'), (x,), (jnp.ones_like(x),),
                                         {'params': PARAMS_DOT}),
            lambda x: jax.jvp(layer_by_hand, (PARAMS, x), (PARAMS_DOT, jnp.ones_like(x)))),
}


@pytest.mark.parametrize('name', sorted(ORACLES))
def test_equals_jax_on_the_explicit_params_and_flax_core(name):
  build, by_hand = ORACLES[name]
  _, ours = check(build, lambda M, fn: M.apply(fn)(VARIABLES, X))
  assert_trees_close(ours, by_hand(X))


def test_vjp_has_aux_and_other_vjp_variables():
  def fn(scope, x):
    return jnp.sum(layer(scope, x) * scope.get_variable('scale', 's')), {'aux': x}
  def model(scope, x):
    y, bwd, aux = lift.vjp(fn, scope.push('layer'), x, has_aux=True, vjp_variables='scale')
    return y, bwd(jnp.float32(1)), aux
  variables = {**VARIABLES, 'scale': {'layer': {'s': jnp.float32(3)}}}
  y, (scale_grad, x_grad), aux = lift.apply(model)(variables, X)
  assert_trees_close(scale_grad['scale']['s'], jnp.sum(layer_by_hand(PARAMS, X)))
  assert_trees_close(x_grad, jax.grad(lambda x: 3 * jnp.sum(layer_by_hand(PARAMS, x)))(X))
  assert_trees_equal(aux['aux'], X)


def test_value_and_grad_has_aux_and_jvp_without_variable_tangents():
  def fn(scope, x):
    y = layer(scope, x)
    return jnp.sum(y), y
  y, aux, (x_grad,) = lift.apply(
      lambda s, x: lift.value_and_grad(fn, s.push('layer'), x, has_aux=True))(VARIABLES, X)
  assert_trees_close(aux, layer_by_hand(PARAMS, X))
  assert_trees_close(x_grad, jax.grad(lambda x: jnp.sum(layer_by_hand(PARAMS, x)))(X))
  y_dot = lift.apply(lambda s, x: lift.jvp(layer, s.push('layer'), [x], [jnp.ones_like(x)], {})[1])(
      VARIABLES, X)
  assert_trees_close(y_dot, jax.jvp(lambda x: layer_by_hand(PARAMS, x), (X,), (jnp.ones_like(X),))[1])


# -- custom_vjp --------------------------------------------------------------------------------

def forward(scope, x):
  return lift.vjp(layer, scope, x)


def sign_backward(bwd, y_cotangent):
  params_t, x_t = bwd(y_cotangent)
  return jax.tree.map(jnp.sign, params_t), x_t


def test_custom_vjp_uses_the_given_backward_rule_as_flax_core():
  build = lambda L: L.custom_vjp(layer, lambda s, x: L.vjp(layer, s, x), sign_backward)
  assert_trees_close(lift.apply(build(lift))({'params': PARAMS}, X), layer_by_hand(PARAMS, X))
  _, (params_grad, x_grad) = check(build, lambda M, fn: jax.grad(
      lambda p, x: jnp.sum(M.apply(fn)({'params': p}, x)), argnums=(0, 1))(PARAMS, X))
  by_hand_params, by_hand_x = jax.grad(lambda p, x: jnp.sum(layer_by_hand(p, x)), argnums=(0, 1))(PARAMS, X)
  assert_trees_close(params_grad, jax.tree.map(jnp.sign, by_hand_params))
  assert_trees_close(x_grad, by_hand_x)


def test_custom_vjp_nondiff_argnums_count_the_scope_as_zero():
  def scaled_forward(scope, x, scale):
    y, bwd = lift.vjp(layer, scope, x)
    return y * scale, bwd
  def scaled_backward(scale, bwd, y_cotangent):
    params_t, x_t = bwd(y_cotangent * scale)
    return params_t, 10 * x_t  # a rule JAX would not derive
  fn = lift.custom_vjp(lambda s, x, scale: layer(s, x) * scale, scaled_forward, scaled_backward,
                       nondiff_argnums=(2,))
  x_grad = jax.grad(lambda x: jnp.sum(lift.apply(fn)({'params': PARAMS}, x, 2.0)))(X)
  assert_trees_close(x_grad, 10 * jax.grad(lambda x: jnp.sum(2.0 * layer_by_hand(PARAMS, x)))(X))


@pytest.mark.parametrize('transform', [
    lambda s, x: lift.vjp(layer, s, x)[0],
    lambda s, x: lift.jvp(layer, s, (x,), (x,), {}),
    lambda s, x: lift.value_and_grad(lambda s, x: jnp.sum(layer(s, x)), s, x),
    lambda s, x: lift.custom_vjp(layer, forward, sign_backward)(s, x)])
def test_variables_created_inside_are_those_of_untransformed_code(transform):
  _, variables = lift.init(lambda s, x: transform(s.push('layer'), x))(RNGS, X)
  assert jax.tree.map(jnp.shape, variables) == {'params': {'layer': {'kernel': (3, 2), 'bias': (2,)}}}
  assert_trees_close(variables, lift.init(lambda s, x: layer(s.push('layer'), x))(RNGS, X)[1])


# -- nothing lost -------------------------------------------------------------------------


def counting_loss(scope, x):
  counter(scope, x)
  return jnp.sum(x ** 2)


TRANSFORMS = {
    'vjp': lambda s, x: lift.vjp(counting_loss, s, x)[0],
    'jvp': lambda s, x: lift.jvp(counting_loss, s, (x,), (x,), {})[0],
    'value_and_grad': lambda s, x: lift.value_and_grad(counting_loss, s, x)[0],
    'custom_vjp': lambda s, x: lift.custom_vjp(
        counting_loss, lambda s, x: (counting_loss(s, x), x), lambda x, t: ({}, 2 * x * t))(s, x),
}


@pytest.mark.parametrize('name', sorted(TRANSFORMS))
def test_counter_survives_and_immutable_counter_is_rejected(name):
  fn = TRANSFORMS[name]
  _, state = lift.apply(fn, mutable='counter')({'counter': {'count': jnp.int32(4)}}, X)
  assert int(state['counter']['count']) == 5
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(fn)({'counter': {'count': jnp.int32(4)}}, X)
  if name == 'custom_vjp':  # and under jax.grad
    x_grad, state = jax.grad(lambda x: lift.apply(fn, mutable='counter')(
        {'counter': {'count': jnp.int32(4)}}, x), has_aux=True)(X)
    assert_trees_close(x_grad, 2 * X)
    assert int(state['counter']['count']) == 5
