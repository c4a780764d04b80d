"""Lifted vjp, jvp, value_and_grad and custom_vjp: JAX's autodiff on the explicit variables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import apply as flax_apply, lift as flax_lift

import lift
from lift import errors

from tests.helpers import assert_trees_close, counter, dense

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}


def layer(scope, x):
  return jnp.tanh(dense(scope, x, 2))


def layer_by_hand(params, x):
  return jnp.tanh(x @ params['kernel'] + params['bias'][None])


PARAMS = lift.init(layer)(RNGS, X)[1]['params']
VARIABLES = {'params': {'layer': PARAMS}}
SHAPES = {'params': {'layer': {'kernel': (3, 2), 'bias': (2,)}}}


# -- vjp ----------------------------------------------------------------------------

def vjp_model(scope, x, vjp=lift.vjp):
  y, bwd = vjp(layer, scope.push('layer'), x)
  params_grad, x_grad = bwd(jnp.ones_like(y))
  return y, params_grad, x_grad


def test_vjp_equals_jax_vjp_on_the_explicit_params():
  y, params_grad, x_grad = lift.apply(vjp_model)(VARIABLES, X)
  y_jax, bwd = jax.vjp(layer_by_hand, PARAMS, X)
  expected_params_grad, expected_x_grad = bwd(jnp.ones_like(y_jax))
  np.testing.assert_allclose(y, y_jax, rtol=1e-6)
  assert_trees_close(params_grad, {'params': expected_params_grad})
  np.testing.assert_allclose(x_grad, expected_x_grad, rtol=1e-5)
  flax_result = flax_apply(lambda s, x: vjp_model(s, x, flax_lift.vjp))(VARIABLES, X)
  assert_trees_close((y, params_grad, x_grad), flax_result)


def test_vjp_has_aux_and_other_vjp_variables():
  def fn(scope, x):
    scale = scope.get_variable('scale', 's')
    return jnp.sum(layer(scope, x) * scale), {'aux': x}
  def model(scope, x):
    y, bwd, aux = lift.vjp(fn, scope.push('layer'), x, has_aux=True, vjp_variables='scale')
    return y, bwd(jnp.float32(1)), aux
  variables = {**VARIABLES, 'scale': {'layer': {'s': jnp.float32(3)}}}
  y, (scale_grad, x_grad), aux = lift.apply(model)(variables, X)
  np.testing.assert_allclose(scale_grad['scale']['s'], jnp.sum(layer_by_hand(PARAMS, X)), rtol=1e-6)
  np.testing.assert_allclose(x_grad, jax.grad(lambda x: 3 * jnp.sum(layer_by_hand(PARAMS, x)))(X),
                             rtol=1e-5)
  np.testing.assert_array_equal(aux['aux'], X)


def test_vjp_creates_variables_at_init():
  _, variables = lift.init(vjp_model)(RNGS, X)
  assert jax.tree.map(jnp.shape, variables) == SHAPES
  _, plain = lift.init(lambda s, x: layer(s.push('layer'), x))(RNGS, X)
  assert_trees_close(variables, plain)  # the keys of untransformed code


# -- value_and_grad --------------------------------------------------------------------

def loss(scope, x, target):
  return jnp.sum((layer(scope, x) - target) ** 2)


def test_value_and_grad_equals_jax_value_and_grad_on_the_inputs():
  target = jnp.ones((2, 2))
  def model(scope, x, value_and_grad=lift.value_and_grad):
    return value_and_grad(loss, scope.push('layer'), x, target)
  y, grads = lift.apply(model)(VARIABLES, X)
  by_hand = lambda x, t: jnp.sum((layer_by_hand(PARAMS, x) - t) ** 2)
  y_jax, grads_jax = jax.value_and_grad(by_hand, argnums=(0, 1))(X, target)
  np.testing.assert_allclose(y, y_jax, rtol=1e-6)
  assert_trees_close(grads, grads_jax)
  assert_trees_close((y, grads), flax_apply(
      lambda s, x: model(s, x, flax_lift.value_and_grad))(VARIABLES, X))


def test_value_and_grad_has_aux():
  def fn(scope, x):
    y = layer(scope, x)
    return jnp.sum(y), y
  y, aux, (x_grad,) = lift.apply(
      lambda s, x: lift.value_and_grad(fn, s.push('layer'), x, has_aux=True))(VARIABLES, X)
  np.testing.assert_allclose(aux, layer_by_hand(PARAMS, X), rtol=1e-6)
  np.testing.assert_allclose(x_grad, jax.grad(lambda x: jnp.sum(layer_by_hand(PARAMS, x)))(X),
                             rtol=1e-5)


# -- jvp -------------------------------------------------------------------------------------

def jvp_model(scope, x, x_dot, params_dot, jvp=lift.jvp):
  return jvp(layer, scope.push('layer'), (x,), (x_dot,), {'params': params_dot})


def test_jvp_equals_jax_jvp_on_the_explicit_params():
  x_dot = jnp.ones_like(X)
  params_dot = jax.tree.map(lambda a: 0.5 * jnp.ones_like(a), PARAMS)
  y, y_dot = lift.apply(jvp_model)(VARIABLES, X, x_dot, params_dot)
  y_jax, y_dot_jax = jax.jvp(layer_by_hand, (PARAMS, X), (params_dot, x_dot))
  np.testing.assert_allclose(y, y_jax, rtol=1e-6)
  np.testing.assert_allclose(y_dot, y_dot_jax, rtol=1e-5)
  flax_result = flax_apply(lambda s, *a: jvp_model(s, *a, jvp=flax_lift.jvp))(
      VARIABLES, X, x_dot, params_dot)
  assert_trees_close((y, y_dot), flax_result)


def test_jvp_without_variable_tangents():
  y_dot = lift.apply(lambda s, x: lift.jvp(layer, s.push('layer'), [x], [jnp.ones_like(x)], {})[1])(
      VARIABLES, X)
  np.testing.assert_allclose(
      y_dot, jax.jvp(lambda x: layer_by_hand(PARAMS, x), (X,), (jnp.ones_like(X),))[1], rtol=1e-5)


def test_jvp_tangent_for_a_missing_collection_is_rejected():
  with pytest.raises(errors.TransformArgumentError, match="collection 'stats'.*no variables"):
    lift.apply(lambda s, x: lift.jvp(layer, s.push('layer'), (x,), (x,), {'stats': {'m': x}}))(
        VARIABLES, X)


def test_jvp_variable_tangents_must_be_a_dict():
  with pytest.raises(errors.TransformArgumentError, match='must be a dict'):
    lift.apply(lambda s, x: lift.jvp(layer, s, (x,), (x,), [PARAMS]))(VARIABLES, X)


# -- custom_vjp --------------------------------------------------------------------------------

def forward(scope, x):
  y, bwd = lift.vjp(layer, scope, x)
  return y, bwd


def flax_forward(scope, x):
  y, bwd = flax_lift.vjp(layer, scope, x)
  return y, bwd


def sign_backward(bwd, y_cotangent):
  params_t, x_t = bwd(y_cotangent)
  return jax.tree.map(jnp.sign, params_t), x_t


def test_custom_vjp_uses_the_given_backward_rule():
  sign_layer = lift.custom_vjp(layer, forward, sign_backward)
  def total(params, x, fn):
    return jnp.sum(lift.apply(fn)({'params': params}, x))
  y = lift.apply(sign_layer)({'params': PARAMS}, X)
  np.testing.assert_allclose(y, layer_by_hand(PARAMS, X), rtol=1e-6)
  params_grad, x_grad = jax.grad(total, argnums=(0, 1))(PARAMS, X, sign_layer)
  by_hand_params, by_hand_x = jax.grad(lambda p, x: jnp.sum(layer_by_hand(p, x)),
                                       argnums=(0, 1))(PARAMS, X)
  assert_trees_close(params_grad, jax.tree.map(jnp.sign, by_hand_params))
  np.testing.assert_allclose(x_grad, by_hand_x, rtol=1e-5)
  flax_sign_layer = flax_lift.custom_vjp(layer, forward_fn=flax_forward, backward_fn=sign_backward)
  flax_grad = jax.grad(lambda p: jnp.sum(flax_apply(flax_sign_layer)({'params': p}, X)))(PARAMS)
  assert_trees_close(params_grad, flax_grad)


def test_custom_vjp_nondiff_argnums_count_the_scope_as_zero():
  def scaled(scope, x, scale):
    return layer(scope, x) * scale
  def scaled_forward(scope, x, scale):
    y, bwd = lift.vjp(layer, scope, x)
    return y * scale, bwd
  def scaled_backward(scale, bwd, y_cotangent):
    params_t, x_t = bwd(y_cotangent * scale)
    return params_t, 10 * x_t  # a rule JAX would not derive
  fn = lift.custom_vjp(scaled, scaled_forward, scaled_backward, nondiff_argnums=(2,))
  x_grad = jax.grad(lambda x: jnp.sum(lift.apply(fn)({'params': PARAMS}, x, 2.0)))(X)
  expected = 10 * jax.grad(lambda x: jnp.sum(2.0 * layer_by_hand(PARAMS, x)))(X)
  np.testing.assert_allclose(x_grad, expected, rtol=1e-5)


@pytest.mark.parametrize('bad', [0, (1, -2), 'x'])
def test_custom_vjp_bad_nondiff_argnums_rejected_when_built(bad):
  with pytest.raises(errors.ArgnumsError, match='nondiff_argnums'):
    lift.custom_vjp(layer, forward, sign_backward, nondiff_argnums=bad)


def test_custom_vjp_nondiff_argnum_beyond_the_arguments_rejected_when_called():
  fn = lift.custom_vjp(layer, forward, sign_backward, nondiff_argnums=(3,))
  with pytest.raises(errors.ArgnumsError, match='names argument 3'):
    lift.apply(fn)({'params': PARAMS}, X)


@pytest.mark.parametrize('transform', [
    lambda s, x: lift.jvp(layer, s, (x,), (x,), {}),
    lambda s, x: lift.value_and_grad(lambda s, x: jnp.sum(layer(s, x)), s, x),
    lambda s, x: lift.custom_vjp(layer, forward, sign_backward)(s, x)])
def test_variables_created_inside_are_those_of_untransformed_code(transform):
  _, variables = lift.init(lambda s, x: transform(s.push('layer'), x))(RNGS, X)
  assert jax.tree.map(jnp.shape, variables) == SHAPES
  _, plain = lift.init(lambda s, x: layer(s.push('layer'), x))(RNGS, X)
  assert_trees_close(variables, plain)


# -- errors and nothing lost ---------------------------------------------------------------------

@pytest.mark.parametrize('transform', [lift.vjp, lift.value_and_grad])
def test_reduce_axes_is_rejected(transform):
  with pytest.raises(errors.TransformArgumentError, match='reduce_axes'):
    lift.apply(lambda s, x: transform(loss, s, x, x, reduce_axes=('batch',)))({}, X)


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


def test_custom_vjp_counter_survives_under_grad():
  fn = TRANSFORMS['custom_vjp']
  def total(x):
    y, state = lift.apply(fn, mutable='counter')({'counter': {'count': jnp.int32(4)}}, x)
    return y, state
  x_grad, state = jax.grad(total, has_aux=True)(X)
  np.testing.assert_allclose(x_grad, 2 * X, rtol=1e-6)
  assert int(state['counter']['count']) == 5
