"""Lifted cond, switch and while_loop: lax control flow on the explicit variables."""
import jax
import jax.numpy as jnp
import pytest
from jax import lax

import lift
from lift import errors
from lift.rng import fold_in_static

from tests.helpers import assert_trees_close, counter, dense
from tests.lift.test_flax_core_parity import check

X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
COUNTS = ('true_count', 'false_count', 'third_count')
SCALES = (1, -1, 2)


def count_in(scope, name):
  var = scope.variable('state', name, lambda: jnp.zeros((), jnp.int32))
  var.value = var.value + 1


def branch(name, scale):
  def fn(scope, x):
    count_in(scope, name)
    return scale * scope.child(dense, 'dense')(x, 2)
  return fn


BRANCHES = [branch(name, scale) for name, scale in zip(COUNTS, SCALES)]
positive = BRANCHES[0]


def model(name):
  """cond over the first two branches, or switch over all three; every count made first."""
  def build(L):
    def fn(scope, x, index):
      for count in COUNTS[:2 if name == 'cond' else 3]:
        scope.variable('state', count, lambda: jnp.zeros((), jnp.int32))
      if name == 'cond':
        return L.cond(index, BRANCHES[0], BRANCHES[1], scope, x)
      return L.switch(index, BRANCHES, scope, x)
    return fn
  return build


def taken(name, index):
  return (0 if index else 1) if name == 'cond' else min(index, 2)  # switch clamps, as lax


def dense_by_hand(params, x, scale=1):
  return scale * (x @ params['dense']['kernel'] + params['dense']['bias'][None])


@pytest.mark.parametrize('name, indices', [('cond', (True, False)), ('switch', (0, 1, 2, 7))])
def test_equals_lax_on_the_same_params_and_flax_core(name, indices):
  build = model(name)
  variables = lift.init(build(lift))(RNGS, X, indices[0])[1]
  variables = {**variables, 'state': jax.tree.map(jnp.zeros_like, variables['state'])}
  apply = jax.jit(lift.apply(build(lift), mutable='state'))
  by_hand = [lambda p, x, s=s: dense_by_hand(p, x, s) for s in SCALES[:2 if name == 'cond' else 3]]
  for index in indices:
    y, state = apply(variables, X, jnp.asarray(index))
    lax_fn = (lambda i, *a: lax.cond(i, *by_hand, *a)) if name == 'cond' else (
        lambda i, *a: lax.switch(i, by_hand, *a))
    assert_trees_close(y, lax_fn(index, variables['params'], X))
    # Only the taken branch's update survives.
    assert [int(v) for v in state['state'].values()] == [
        int(taken(name, index) == COUNTS.index(k)) for k in state['state']]
    check(build, lambda M, fn: M.apply(fn, mutable='state')(variables, X, jnp.asarray(index)))


@pytest.mark.parametrize('name, index', [('cond', True), ('cond', False), ('switch', 0), ('switch', 2)])
def test_init_creates_every_branch_variable_with_untransformed_values(name, index):
  y, variables = lift.init(model(name)(lift))(RNGS, X, index)
  assert jax.tree.map(jnp.shape, variables) == {
      'params': {'dense': {'kernel': (3, 2), 'bias': (2,)}},
      'state': {k: () for k in COUNTS[:2 if name == 'cond' else 3]}}
  # The taken branch runs, drawing the keys it draws untransformed.
  y_plain, plain = lift.init(BRANCHES[taken(name, index)])(RNGS, X)
  assert_trees_close((y, variables['params']), (y_plain, plain['params']))
  if taken(name, index) == 0:  # Flax inits with the first branch whatever the index
    check(model(name), lambda M, fn: M.init(fn)(RNGS, X, index))


def test_cond_rng_counters_hold_the_maximum_over_branches():
  def draws(n):
    return lambda scope: sum(jax.random.uniform(scope.make_rng('dropout')) for _ in range(n))
  def model(scope, pred):
    y = lift.cond(pred, draws(3), draws(1), scope)  # the branch traced last draws fewer
    return y, jax.random.key_data(scope.make_rng('dropout'))
  def by_hand(scope, pred):
    y = draws(3)(scope) if pred else draws(1)(scope)
    for _ in range(0 if pred else 2):  # the true branch drew 3 keys
      scope.make_rng('dropout')
    return y, jax.random.key_data(scope.make_rng('dropout'))
  for pred in (True, False):  # the 4th draw, after the cond, is the same
    assert_trees_close(lift.apply(model)({}, pred, rngs=RNGS), lift.apply(by_hand)({}, pred, rngs=RNGS))


# -- while_loop -------------------------------------------------------------------------------

def loop_model(L):
  def fn(scope, x):
    scope.variable('state', 'steps', lambda: jnp.zeros((), jnp.int32))
    scope.child(dense, 'dense')(x, 3)  # create the broadcast params before the loop
    def body_fn(scope, carry):
      scope.put_variable('state', 'steps', scope.get_variable('state', 'steps') + 1)
      return jnp.tanh(scope.child(dense, 'dense')(carry, 3))
    return L.while_loop(lambda s, c: s.get_variable('state', 'steps') < 4, body_fn, scope, x,
                        carry_variables='state')
  return fn


def test_while_loop_equals_a_python_loop_and_flax_core():
  _, variables = lift.init(loop_model(lift))(RNGS, X)
  assert jax.tree.map(jnp.shape, variables) == {
      'params': {'dense': {'kernel': (3, 3), 'bias': (3,)}}, 'state': {'steps': ()}}
  variables = {**variables, 'state': {'steps': jnp.int32(0)}}
  y, state = lift.apply(loop_model(lift), mutable='state')(variables, X)
  carry = X
  for _ in range(4):
    carry = jnp.tanh(dense_by_hand(variables['params'], carry))
  assert_trees_close(y, carry)
  assert int(state['state']['steps']) == 4
  check(loop_model, lambda M, fn: M.apply(fn, mutable='state')(variables, X))


@pytest.mark.parametrize('split', [True, False])
def test_while_loop_split_rngs_fold_in_the_iteration_as_flax_core(split):
  def build(L):
    def body_fn(scope, carry):
      return carry[0] + 1, carry[1] + jax.random.uniform(scope.make_rng('dropout'), (2,))
    return lambda s: L.while_loop(lambda s, c: c[0] < 3, body_fn, s, (0, jnp.zeros(2)),
                                  split_rngs={'dropout': split})
  _, (_, y) = check(build, lambda M, fn: M.apply(fn)({}, rngs=RNGS))
  key = RNGS['dropout']
  draws = [jax.random.uniform(fold_in_static(jax.random.fold_in(key, i) if split else key, (1,)), (2,))
           for i in range(3)]
  assert_trees_close(y, sum(draws))


# -- nothing lost --------------------------------------------------------------------------------

TRANSFORMS = {
    'cond': lambda f: lambda s, x: lift.cond(True, f, f, s, x),
    'switch': lambda f: lambda s, x: lift.switch(1, [f, f], s, x),
    'while_loop': lambda f: lambda s, x: lift.while_loop(
        lambda s, c: c[1] < 1, lambda s, c: (f(s, c[0]), c[1] + 1), s, (x, 0), carry_variables='counter')[0],
}


@pytest.mark.parametrize('name', sorted(TRANSFORMS))
def test_counter_survives_and_immutable_counter_is_rejected(name):
  fn = TRANSFORMS[name](counter)
  _, state = lift.apply(fn, mutable='counter')({'counter': {'count': jnp.int32(4)}}, X)
  assert int(state['counter']['count']) == 5
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(fn)({'counter': {'count': jnp.int32(4)}}, X)
