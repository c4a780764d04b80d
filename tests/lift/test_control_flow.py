"""Lifted cond, switch and while_loop: lax control flow on the explicit variables."""
import jax
import jax.numpy as jnp
import pytest

import lift
from lift import errors

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
