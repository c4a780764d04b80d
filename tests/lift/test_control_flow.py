"""Lifted cond, switch and while_loop: lax control flow on the explicit variables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import apply as flax_apply, init as flax_init, lift as flax_lift
from jax import lax

import lift
from lift import errors
from lift.rng import fold_in_static

from tests.helpers import assert_trees_close, counter, dense

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}


def count_in(scope, name):
  var = scope.variable('state', name, lambda: jnp.zeros((), jnp.int32))
  var.value = var.value + 1


def positive(scope, x):
  count_in(scope, 'true_count')
  return scope.child(dense, 'dense')(x, 2)


def negative(scope, x):
  count_in(scope, 'false_count')
  return -scope.child(dense, 'dense')(x, 2)


def doubled(scope, x):
  count_in(scope, 'third_count')
  return 2 * scope.child(dense, 'dense')(x, 2)


def with_state(scope, names):
  for name in names:
    scope.variable('state', name, lambda: jnp.zeros((), jnp.int32))


def cond_model(scope, x, pred, cond=lift.cond):
  with_state(scope, ['true_count', 'false_count'])
  return cond(pred, positive, negative, scope, x)


def switch_model(scope, x, index, switch=lift.switch):
  with_state(scope, ['true_count', 'false_count', 'third_count'])
  return switch(index, [positive, negative, doubled], scope, x)


def zero_state(variables):
  return {**variables, 'state': jax.tree.map(jnp.zeros_like, variables['state'])}


def dense_by_hand(params, x):
  return x @ params['dense']['kernel'] + params['dense']['bias'][None]


# -- cond ---------------------------------------------------------------------------

def test_cond_equals_lax_cond_on_the_same_params():
  variables = zero_state(lift.init(cond_model)(RNGS, X, True)[1])
  apply = jax.jit(lift.apply(cond_model, mutable='state'))
  flax_cond = jax.jit(flax_apply(lambda s, x, p: cond_model(s, x, p, flax_lift.cond),
                                 mutable='state'))
  for pred in (True, False):
    y, state = apply(variables, X, jnp.asarray(pred))
    expected = lax.cond(pred, dense_by_hand, lambda p, x: -dense_by_hand(p, x),
                        variables['params'], X)
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    assert int(state['state']['true_count']) == int(pred)  # the taken branch's update survives
    assert int(state['state']['false_count']) == int(not pred)
    y_flax, state_flax = flax_cond(variables, X, jnp.asarray(pred))
    np.testing.assert_allclose(y, y_flax, rtol=1e-6)
    assert_trees_close(state, dict(state_flax))


@pytest.mark.parametrize('pred', [True, False])
def test_cond_init_creates_every_branch_variable_with_untransformed_values(pred):
  y, variables = lift.init(cond_model)(RNGS, X, pred)
  assert jax.tree.map(jnp.shape, variables) == {
      'params': {'dense': {'kernel': (3, 2), 'bias': (2,)}},
      'state': {'true_count': (), 'false_count': ()}}
  y_plain, plain = lift.init(positive if pred else negative)(RNGS, X)
  # Each branch draws the keys it draws untransformed.
  assert_trees_close(variables['params'], plain['params'])
  np.testing.assert_allclose(y, y_plain, rtol=1e-6)


def test_cond_init_matches_flax_core():
  y, variables = lift.init(cond_model)(RNGS, X, True)
  y_flax, variables_flax = flax_init(lambda s, x: cond_model(s, x, True, flax_lift.cond))(RNGS, X)
  assert_trees_close(variables, dict(variables_flax))
  np.testing.assert_allclose(y, y_flax, rtol=1e-6)


def test_cond_rng_counters_hold_the_maximum_over_branches():
  def draws(n):
    def branch(scope):
      return sum(jax.random.uniform(scope.make_rng('dropout')) for _ in range(n))
    return branch
  def model(scope, pred):
    y = lift.cond(pred, draws(3), draws(1), scope)  # the branch traced last draws fewer
    return y, jax.random.key_data(scope.make_rng('dropout'))
  def by_hand(scope, pred):
    y = draws(3)(scope) if pred else draws(1)(scope)
    for _ in range(0 if pred else 2):  # the true branch drew 3 keys
      scope.make_rng('dropout')
    return y, jax.random.key_data(scope.make_rng('dropout'))
  for pred in (True, False):
    y, after = lift.apply(model)({}, pred, rngs=RNGS)
    y_hand, after_hand = lift.apply(by_hand)({}, pred, rngs=RNGS)
    np.testing.assert_allclose(y, y_hand, rtol=1e-6)
    np.testing.assert_array_equal(after, after_hand)  # the 4th draw, after the cond


def test_cond_branches_that_create_different_variables_are_rejected():
  def other(scope, x):
    return scope.child(dense, 'other')(x, 2)
  with pytest.raises(errors.BranchVariablesError,
                     match=r'(?s)branch 1 creates.*only in branch 0: params/dense/kernel'
                           r'.*only in branch 1: params/other/kernel'):
    lift.init(lambda s, x: lift.cond(True, positive, other, s, x))(RNGS, X)


def test_cond_rejects_a_branch_that_is_not_callable():
  with pytest.raises(errors.TransformArgumentError, match='false_fun'):
    lift.apply(lambda s: lift.cond(True, positive, None, s, X))({})


# -- switch ---------------------------------------------------------------------------

def test_switch_equals_lax_switch_on_the_same_params():
  variables = zero_state(lift.init(switch_model)(RNGS, X, 0)[1])
  apply = jax.jit(lift.apply(switch_model, mutable='state'))
  flax_switch = jax.jit(flax_apply(lambda s, x, i: switch_model(s, x, i, flax_lift.switch),
                                   mutable='state'))
  branches = [dense_by_hand, lambda p, x: -dense_by_hand(p, x),
              lambda p, x: 2 * dense_by_hand(p, x)]
  for index in (0, 1, 2, 7):
    y, state = apply(variables, X, jnp.asarray(index))
    np.testing.assert_allclose(y, lax.switch(index, branches, variables['params'], X), rtol=1e-6)
    counts = [int(state['state'][k]) for k in ('true_count', 'false_count', 'third_count')]
    assert counts == [int(min(index, 2) == i) for i in range(3)]  # index clamped, as lax
    np.testing.assert_allclose(y, flax_switch(variables, X, jnp.asarray(index))[0], rtol=1e-6)


def test_switch_init_shape_tree():
  _, variables = lift.init(switch_model)(RNGS, X, 2)
  assert jax.tree.map(jnp.shape, variables)['params'] == {'dense': {'kernel': (3, 2), 'bias': (2,)}}


def test_switch_rejects_bad_branches():
  with pytest.raises(errors.TransformArgumentError, match='non-empty sequence'):
    lift.apply(lambda s: lift.switch(0, [], s, X))({})
  with pytest.raises(errors.TransformArgumentError, match=r'branches\[1\]'):
    lift.apply(lambda s: lift.switch(0, [positive, 3], s, X))({})


def test_switch_branches_with_different_shapes_are_rejected():
  wide = lambda s, x: s.child(dense, 'dense')(x, 5)
  with pytest.raises(errors.BranchVariablesError,
                     match=r'params/dense/kernel: float32\[3, 2\] in branch 0, float32\[3, 5\]'):
    lift.init(lambda s, x: lift.switch(1, [positive, wide], s, x)[:, :2])(RNGS, X)


# -- while_loop -------------------------------------------------------------------------------

def loop_model(scope, x, while_loop=lift.while_loop):
  scope.variable('state', 'steps', lambda: jnp.zeros((), jnp.int32))
  scope.child(dense, 'dense')(x, 3)  # create the broadcast params before the loop
  def cond_fn(scope, carry):
    return scope.get_variable('state', 'steps') < 4
  def body_fn(scope, carry):
    scope.put_variable('state', 'steps', scope.get_variable('state', 'steps') + 1)
    return jnp.tanh(scope.child(dense, 'dense')(carry, 3))
  return while_loop(cond_fn, body_fn, scope, x, carry_variables='state')


def test_while_loop_equals_a_python_loop():
  variables = zero_state(lift.init(loop_model)(RNGS, X)[1])
  y, state = lift.apply(loop_model, mutable='state')(variables, X)
  carry = X
  for _ in range(4):
    carry = jnp.tanh(dense_by_hand(variables['params'], carry))
  np.testing.assert_allclose(y, carry, rtol=1e-5)
  assert int(state['state']['steps']) == 4
  y_flax, state_flax = flax_apply(lambda s, x: loop_model(s, x, flax_lift.while_loop),
                                  mutable='state')(variables, X)
  np.testing.assert_allclose(y, y_flax, rtol=1e-6)
  assert_trees_close(state, dict(state_flax))


def test_while_loop_init_shape_tree():
  _, variables = lift.init(loop_model)(RNGS, X)
  assert jax.tree.map(jnp.shape, variables) == {
      'params': {'dense': {'kernel': (3, 3), 'bias': (3,)}}, 'state': {'steps': ()}}


def noise_loop(scope, split, while_loop=lift.while_loop):
  def body_fn(scope, carry):
    i, acc = carry
    return i + 1, acc + jax.random.uniform(scope.make_rng('dropout'), (2,))
  return while_loop(lambda s, c: c[0] < 3, body_fn, scope, (0, jnp.zeros(2)),
                    split_rngs={'dropout': split})


@pytest.mark.parametrize('split', [True, False])
def test_while_loop_split_rngs_fold_in_the_iteration_as_flax_core(split):
  _, y = lift.apply(noise_loop)({}, split, rngs=RNGS)
  _, y_flax = flax_apply(lambda s: noise_loop(s, split, flax_lift.while_loop))({}, rngs=RNGS)
  np.testing.assert_allclose(y, y_flax, rtol=1e-6)
  key = RNGS['dropout']
  draws = [jax.random.uniform(fold_in_static(jax.random.fold_in(key, i) if split else key, (1,)),
                              (2,)) for i in range(3)]
  np.testing.assert_allclose(y, sum(draws), rtol=1e-6)


def test_while_loop_body_creating_carry_variables_is_rejected():
  def body_fn(scope, carry):
    count_in(scope, 'steps')
    return carry + 1
  with pytest.raises(errors.LoopVariablesError, match='created: state/steps int32'):
    lift.init(lambda s: lift.while_loop(lambda s, c: c < 3, body_fn, s, 0,
                                        carry_variables='state'))(RNGS)


def test_while_loop_body_changing_a_carry_dtype_is_rejected():
  def body_fn(scope, carry):
    scope.put_variable('state', 'steps', jnp.float32(1))
    return carry + 1
  loop = lambda s: lift.while_loop(lambda s, c: c < 3, body_fn, s, 0, carry_variables='state')
  with pytest.raises(errors.LoopVariablesError,
                     match=r'state/steps: int32\[\] before, float32\[\]'):
    lift.apply(loop, mutable='state')({'state': {'steps': jnp.int32(0)}})


def test_while_loop_broadcast_variables_are_read_only():
  def body_fn(scope, carry):
    scope.put_variable('params', 'w', carry)
    return carry
  with pytest.raises(errors.ImmutableCollectionError, match='params'):
    lift.apply(lambda s, x: lift.while_loop(lambda s, c: False, body_fn, s, x),
               mutable=True)({'params': {'w': X}}, X)


def test_while_loop_rejects_bad_arguments():
  with pytest.raises(errors.InvalidAxisError, match='split_rngs'):
    lift.apply(lambda s: lift.while_loop(lambda s, c: False, lambda s, c: c, s, 0,
                                         split_rngs=True))({})
  with pytest.raises(errors.TransformArgumentError, match='body_fn'):
    lift.apply(lambda s: lift.while_loop(lambda s, c: False, 'body', s, 0))({})


# -- nothing lost --------------------------------------------------------------------------------

TRANSFORMS = {
    'cond': lambda f: lambda s, x: lift.cond(True, f, f, s, x),
    'switch': lambda f: lambda s, x: lift.switch(1, [f, f], s, x),
    'while_loop': lambda f: lambda s, x: lift.while_loop(
        lambda s, c: c[1] < 1, lambda s, c: (f(s, c[0]), c[1] + 1), s, (x, 0),
        carry_variables='counter')[0],
}


@pytest.mark.parametrize('name', sorted(TRANSFORMS))
def test_counter_survives_and_immutable_counter_is_rejected(name):
  fn = TRANSFORMS[name](counter)
  _, state = lift.apply(fn, mutable='counter')({'counter': {'count': jnp.int32(4)}}, X)
  assert int(state['counter']['count']) == 5
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(fn)({'counter': {'count': jnp.int32(4)}}, X)
