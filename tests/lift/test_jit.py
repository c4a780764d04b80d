"""Lifted jit: no-jit values and rng draws, one trace per structure; and fold_rngs."""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift
from lift import errors
from lift.jit_keys import static_hash
from lift.rng import fold_in_static

from tests.helpers import assert_trees_close, assert_trees_equal, counter, dense
from tests.lift.test_flax_core_parity import check

X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}


class Traced:
  """A scope function that counts how often its Python body runs."""

  def __init__(self, draws=True):
    self.runs, self.draws = 0, draws

  def __call__(self, scope, x, features=3):
    self.runs += 1
    y = scope.child(dense, 'dense')(x, features)
    counter(scope, x)
    if self.draws:
      y = y + jax.random.normal(scope.make_rng('dropout'), y.shape)
    return y


def twice_in_a_row(scope, x, fn):
  """Calls `fn` on two children and twice on the same child: counters must continue."""
  a = fn(scope.push('a'), x)
  b = fn(scope.push('b'), x)
  return a + b + fn(scope.push('a', reuse=True), x)


# -- jit equals no jit --------------------------------------------------------------

def test_jit_equals_no_jit_values_created_variables_and_rng_draws():
  assert jax.tree.map(jnp.shape, lift.init(lift.jit(Traced()))(RNGS, X)[1]) == {
      'params': {'dense': {'kernel': (4, 3), 'bias': (3,)}}, 'counter': {'count': ()}}
  plain, jitted = Traced(), lift.jit(Traced())
  y, variables = lift.init(twice_in_a_row)(RNGS, X, plain)
  y_jit, variables_jit = lift.init(twice_in_a_row)(RNGS, X, jitted)
  assert_trees_close((y, variables), (y_jit, variables_jit))
  run = lift.apply(twice_in_a_row, mutable='counter')
  for _ in range(2):  # deterministic across calls, and the counters advance as without jit
    (y, state), (y_jit, state_jit) = (run(variables, X, f, rngs=RNGS) for f in (plain, jitted))
    assert_trees_close((y, state), (y_jit, state_jit))
  assert int(state_jit['counter']['a']['count']) == 4  # 2 at init, 2 more here


def test_jitted_function_called_twice_in_one_apply_draws_the_keys_of_no_jit():
  def draw(scope):
    return jax.random.key_data(scope.make_rng('dropout'))
  def twice(scope, fn):
    return fn(scope), fn(scope), scope.make_rng('dropout')
  jitted = lift.apply(twice)({}, lift.jit(draw), rngs=RNGS)
  assert_trees_equal(jitted, lift.apply(twice)({}, draw, rngs=RNGS))
  assert not np.array_equal(jitted[0], jitted[1])


# -- tracing once per structure -------------------------------------------------------

@pytest.mark.parametrize('draws', [False, True])
def test_ten_calls_trace_once(draws):
  fn = Traced(draws)
  _, variables = lift.init(fn)(RNGS, X)
  run = lift.apply(lift.jit(fn), mutable='counter')
  fn.runs = 0
  outputs = []
  for i in range(10):
    y, state = run(variables, X, rngs={**RNGS, 'dropout': jax.random.key(i)})
    variables = {**variables, **state}
    outputs.append(float(y[0, 0]))
    assert fn.runs == 1
  assert int(variables['counter']['count']) == 11
  assert len(set(outputs)) == (10 if draws else 1)  # fresh keys each call


def test_new_shape_static_argument_or_mutability_traces_again():
  fn = Traced(draws=False)
  jitted = lift.jit(fn, static_argnums=2)
  _, variables = lift.init(fn)(RNGS, X)
  _, variables5 = lift.init(fn)(RNGS, X, 5)
  _, wide = lift.init(fn)(RNGS, jnp.ones((2, 6)))
  fn.runs = 0
  lift.apply(jitted, mutable='counter')(variables, X)
  lift.apply(jitted, mutable='counter')(variables, X)
  assert fn.runs == 1
  lift.apply(jitted, mutable='counter')(variables5, X, 5)  # static argument
  assert fn.runs == 2
  lift.apply(jitted, mutable='counter')(wide, jnp.ones((2, 6)))  # shapes
  assert fn.runs == 3
  lift.apply(jitted, mutable=True)(variables, X)  # mutability
  assert fn.runs == 4


def test_many_draws_and_a_forgotten_draw_record_still_give_the_keys_of_no_jit():
  def many(scope, n):
    return jnp.stack([jax.random.key_data(scope.make_rng('dropout')) for _ in range(n)])
  def model(scope, n, fn):
    return fn(scope.push('a'), n), fn(scope.push('a', reuse=True), n)
  for n in (3, 20):  # 20 draws overflow the first hash array: one retrace with a larger one
    plain = lift.apply(model)({}, n, many, rngs=RNGS)
    assert_trees_close(lift.apply(model)({}, n, lift.jit(many, static_argnums=1), rngs=RNGS), plain)
  sys.modules['lift.jit']._RECORDED.clear()  # JAX still holds the traces: records anew
  assert_trees_close(lift.apply(model)({}, 20, lift.jit(many, static_argnums=1), rngs=RNGS), plain)


def test_rewrapping_the_same_function_and_other_scopes_do_not_retrace():
  fn = Traced(draws=False)
  _, variables = lift.init(twice_in_a_row)(RNGS, X, fn)
  fn.runs = 0
  for _ in range(3):
    lift.apply(twice_in_a_row, mutable='counter')(variables, X, lift.jit(fn))
    lift.apply(twice_in_a_row, mutable='counter')(variables, X, lambda s, x: lift.jit(fn)(s, x))
  assert fn.runs == 1


def test_static_argnames_and_keyword_arguments():
  fn = Traced(draws=False)
  jitted = lift.jit(fn, static_argnames='features')
  assert_trees_close(lift.init(jitted)(RNGS, X, features=5), lift.init(fn)(RNGS, X, features=5))


@pytest.mark.filterwarnings('ignore:Some donated buffers were not usable')
def test_donate_argnums_runs_and_gives_the_same_values():
  fn = lambda scope, x, y: scope.child(dense, 'dense')(x + y, 2)
  _, variables = lift.init(fn)(RNGS, X, X)
  jitted = lift.jit(fn, donate_argnums=(2,))
  assert_trees_close(lift.apply(jitted)(variables, X, X + 0.0), lift.apply(fn)(variables, X, X))


# -- composition -----------------------------------------------------------------------------

def test_jit_inside_jit_checkpoint_and_split_while_loop_draw_the_keys_of_no_jit():
  def body(scope, c):
    return c + jax.random.uniform(scope.make_rng('dropout'))
  def inner(scope, x):
    h = lift.checkpoint(Traced())(scope.push('remat'), x)
    looped = lift.while_loop(lambda s, c: c[1] < 3, lambda s, c: (body(s, c[0]), c[1] + 1),
                             scope, (0.0, 0), split_rngs={'dropout': True})
    return h, looped[0], lift.fold_rngs(lambda s: s.make_rng('dropout'))(scope.push('f'))
  def outer(scope, x, jit):
    wrap = lift.jit if jit else (lambda f: f)
    return wrap(lambda s, x: wrap(inner)(s.push('in'), x))(scope, x)
  assert_trees_close(lift.init(outer)(RNGS, X, False), lift.init(outer)(RNGS, X, True))


SPLIT = dict(variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True})


def _noisy(scope, x):
  return dense(scope, x, 4) + jax.random.normal(scope.make_rng('dropout'), (1, 4))


@pytest.mark.parametrize('name, build', [
    ('jit inside vmap', lambda wrap: lift.vmap(wrap(_noisy), **SPLIT, axis_size=3, in_axes=None)),
    ('jit around vmap', lambda wrap: wrap(lift.vmap(_noisy, **SPLIT, axis_size=3, in_axes=None))),
    ('jit around scan', lambda wrap: wrap(lambda s, x: lift.scan(
        lambda s, c, _: (_noisy(s, c), ()), **SPLIT, length=3)(s, x, None)[0]))])
def test_jit_and_vmap_or_scan_with_split_rngs_draw_the_keys_of_no_jit(name, build):
  assert_trees_close(lift.init(build(lambda f: f))(RNGS, X), lift.init(build(lift.jit))(RNGS, X))


def test_jit_under_jax_grad_and_jax_jit():
  fn = lambda scope, x: jnp.sum(scope.child(dense, 'dense')(x, 2) ** 2)
  _, variables = lift.init(fn)(RNGS, X)
  loss = lambda p, f: lift.apply(f)({'params': p}, X)
  grads = jax.grad(loss)(variables['params'], fn)
  grads_jit = jax.jit(jax.grad(loss), static_argnums=1)(variables['params'], lift.jit(fn))
  assert_trees_close(grads, grads_jit)


# -- nothing lost, and misuse ---------------------------------------------------------------

@pytest.mark.parametrize('transform', [lift.jit, lift.fold_rngs])
def test_counter_survives_and_immutable_counter_is_rejected(transform):
  fn = transform(counter)
  _, state = lift.apply(fn, mutable='counter')({'counter': {'count': jnp.int32(4)}}, X)
  assert int(state['counter']['count']) == 5
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(fn)({'counter': {'count': jnp.int32(4)}}, X)


def test_compiled_function_traced_outside_a_call_is_rejected():
  jit_module = sys.modules['lift.jit']
  with pytest.raises(errors.LiftError, match='traced outside a call'):
    jit_module._jit_body(None, (), (), jnp.zeros(0, jnp.uint32), {})


def test_static_hash_is_the_value_fold_in_static_folds_in():
  key = jax.random.key(3)
  for data in [('a', 1), ('dense', 'kernel', 300), (2**40,)]:
    np.testing.assert_array_equal(
        jax.random.key_data(jax.random.fold_in(key, jnp.uint32(static_hash(data)))),
        jax.random.key_data(fold_in_static(key, data)))


# -- fold_rngs -------------------------------------------------------------------------------------

def test_fold_rngs_drops_the_path_from_the_suffix_as_flax_core():
  def draws(scope, x):
    return scope.child(dense, 'dense')(x, 2), jax.random.key_data(scope.make_rng('dropout'))
  def build(L):
    fold = L.fold_rngs(draws) if L is lift else (
        lambda s, x: L.fold_rngs(lambda s, _, x: draws(s, x))(s, None, x))
    def model(scope, x):
      first = draws(scope.push('sub'), x)  # the counters at 'sub' continue inside
      return first, fold(scope.push('sub', reuse=True), x)
    return model
  (y, _), _ = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  # Inside, the second 'dropout' draw at 'sub' hashes no path: fold_in_static(key, (2,)).
  np.testing.assert_array_equal(y[1][1], jax.random.key_data(fold_in_static(RNGS['dropout'], (2,))))
