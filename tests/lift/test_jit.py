"""Lifted jit: no-jit values and rng draws, one trace per structure; and fold_rngs."""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import apply as flax_apply, init as flax_init, lift as flax_lift

import lift
from lift import errors
from lift.jit_keys import static_hash
from lift.rng import fold_in_static

from tests.helpers import assert_trees_close, counter, dense

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
  plain, jitted = Traced(), lift.jit(Traced())
  y, variables = lift.init(twice_in_a_row)(RNGS, X, plain)
  y_jit, variables_jit = lift.init(twice_in_a_row)(RNGS, X, jitted)
  assert_trees_close(variables, variables_jit)
  np.testing.assert_allclose(y, y_jit, rtol=1e-5)
  run = lift.apply(twice_in_a_row, mutable='counter')
  for _ in range(2):  # deterministic across calls, and the counters advance as without jit
    (y, state), (y_jit, state_jit) = (run(variables, X, f, rngs=RNGS) for f in (plain, jitted))
    np.testing.assert_allclose(y, y_jit, rtol=1e-5)
    assert_trees_close(state, state_jit)
  assert int(state_jit['counter']['a']['count']) == 4  # 2 at init, 2 more here


def test_jitted_function_called_twice_in_one_apply_draws_the_keys_of_no_jit():
  def draw(scope):
    return jax.random.key_data(scope.make_rng('dropout'))
  def twice(scope, fn):
    return fn(scope), fn(scope), scope.make_rng('dropout')
  plain = lift.apply(twice)({}, draw, rngs=RNGS)
  jitted = lift.apply(twice)({}, lift.jit(draw), rngs=RNGS)
  np.testing.assert_array_equal(plain[0], jitted[0])
  np.testing.assert_array_equal(plain[1], jitted[1])
  assert not np.array_equal(jitted[0], jitted[1])
  np.testing.assert_array_equal(jax.random.key_data(plain[2]), jax.random.key_data(jitted[2]))


def test_created_variables_shape_tree():
  _, variables = lift.init(lift.jit(Traced()))(RNGS, X)
  assert jax.tree.map(jnp.shape, variables) == {
      'params': {'dense': {'kernel': (4, 3), 'bias': (3,)}}, 'counter': {'count': ()}}


def test_matches_flax_core_jit_without_rngs():
  def fn(scope, x):
    return scope.child(dense, 'dense')(x, 3)
  flax_fn = flax_lift.jit(lambda scope, _, x: fn(scope, x))
  y, variables = lift.init(lift.jit(fn))(RNGS, X)
  y_flax, variables_flax = flax_init(flax_fn)(RNGS, None, X)
  assert_trees_close(variables, dict(variables_flax))
  np.testing.assert_allclose(lift.apply(lift.jit(fn))(variables, X),
                             flax_apply(flax_fn)(variables, None, X), rtol=1e-6)


# -- tracing once per structure -------------------------------------------------------

def test_ten_calls_without_rngs_trace_once():
  fn = Traced(draws=False)
  jitted = lift.jit(fn)
  _, variables = lift.init(fn)(RNGS, X)
  run = lift.apply(jitted, mutable='counter')
  fn.runs = 0
  for _ in range(10):
    _, state = run(variables, X)
    variables = {**variables, **state}
  assert fn.runs == 1
  assert int(variables['counter']['count']) == 11


def test_ten_calls_with_rngs_trace_once():
  fn = Traced()
  jitted = lift.jit(fn)
  _, variables = lift.init(fn)(RNGS, X)
  run = lift.apply(jitted, mutable='counter')
  fn.runs = 0
  outputs = []
  for i in range(10):
    y, state = run(variables, X, rngs={**RNGS, 'dropout': jax.random.key(i)})
    variables = {**variables, **state}
    outputs.append(y)
    assert fn.runs == 1
  assert len({float(y[0, 0]) for y in outputs}) == 10  # fresh keys each call


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
  y, variables = lift.init(jitted)(RNGS, X, features=5)
  y_plain, variables_plain = lift.init(fn)(RNGS, X, features=5)
  assert_trees_close(variables, variables_plain)
  np.testing.assert_allclose(y, y_plain, rtol=1e-6)


@pytest.mark.filterwarnings('ignore:Some donated buffers were not usable')
def test_donate_argnums_runs_and_gives_the_same_values():
  fn = lambda scope, x, y: scope.child(dense, 'dense')(x + y, 2)
  _, variables = lift.init(fn)(RNGS, X, X)
  jitted = lift.jit(fn, donate_argnums=(2,))
  np.testing.assert_allclose(lift.apply(jitted)(variables, X, X + 0.0),
                             lift.apply(fn)(variables, X, X), rtol=1e-6)


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
  y, variables = lift.init(outer)(RNGS, X, False)
  y_jit, variables_jit = lift.init(outer)(RNGS, X, True)
  assert_trees_close(variables, variables_jit)
  np.testing.assert_allclose(y[0], y_jit[0], rtol=1e-5)
  np.testing.assert_allclose(y[1], y_jit[1], rtol=1e-6)
  np.testing.assert_array_equal(jax.random.key_data(y[2]), jax.random.key_data(y_jit[2]))


def test_jit_inside_vmap_with_split_rngs():
  def noisy(scope, x):
    return dense(scope, x, 2) + jax.random.normal(scope.make_rng('dropout'), (1, 2))
  def ensemble(scope, x, fn):
    return lift.vmap(fn, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
                     axis_size=3, in_axes=None)(scope, x)
  y, variables = lift.init(ensemble)(RNGS, X, noisy)
  y_jit, variables_jit = lift.init(ensemble)(RNGS, X, lift.jit(noisy))
  assert_trees_close((y, variables), (y_jit, variables_jit))


def test_jit_around_vmap_and_scan_with_split_rngs_draws_the_keys_of_no_jit():
  def noisy(scope, x):
    return dense(scope, x, 4) + jax.random.normal(scope.make_rng('dropout'), (1, 4))
  ensemble = lambda scope, x: lift.vmap(
      noisy, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
      axis_size=3, in_axes=None)(scope, x)
  def step(scope, carry, _):
    return noisy(scope, carry), ()
  layers = lambda scope, x: lift.scan(
      step, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
      length=3)(scope, x, None)[0]
  for fn in (ensemble, layers):
    plain = lift.init(fn)(RNGS, X)
    jitted = lift.init(lift.jit(fn))(RNGS, X)
    assert_trees_close(plain, jitted)


def test_jit_under_jax_grad_and_jax_jit():
  fn = lambda scope, x: jnp.sum(scope.child(dense, 'dense')(x, 2) ** 2)
  _, variables = lift.init(fn)(RNGS, X)
  loss = lambda p, f: lift.apply(f)({'params': p}, X)
  grads = jax.grad(loss)(variables['params'], fn)
  grads_jit = jax.jit(jax.grad(loss), static_argnums=1)(variables['params'], lift.jit(fn))
  assert_trees_close(grads, grads_jit)


# -- nothing lost -----------------------------------------------------------------------------

def test_counter_survives_and_immutable_counter_is_rejected():
  fn = lift.jit(counter)
  _, state = lift.apply(fn, mutable='counter')({'counter': {'count': jnp.int32(4)}}, X)
  assert int(state['counter']['count']) == 5
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(fn)({'counter': {'count': jnp.int32(4)}}, X)


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize('argument, bad', [('static_argnums', 'x'), ('static_argnums', -1),
                                           ('donate_argnums', 1.0), ('static_argnames', 3)])
def test_bad_argnums_rejected_when_built(argument, bad):
  with pytest.raises(errors.ArgnumsError, match=argument):
    lift.jit(dense, **{argument: bad})


def test_donating_a_static_argument_is_rejected():
  with pytest.raises(errors.ArgnumsError, match='argument 2 is in both'):
    lift.jit(dense, static_argnums=2, donate_argnums=2)
  with pytest.raises(errors.ArgnumsError, match='argument 2 is in both'):
    lift.jit(dense, static_argnames='features', donate_argnums=2)


def test_donating_a_missing_argument_is_rejected_when_called():
  with pytest.raises(errors.ArgnumsError, match='donate_argnums names argument 3'):
    lift.init(lift.jit(dense, donate_argnums=3))(RNGS, X, 2)


def test_non_array_argument_must_be_static():
  with pytest.raises(errors.JitArgumentError, match=r'positional arguments\[1\].*static_argnums'):
    lift.init(lift.jit(lambda scope, x, name: x))(RNGS, X, 'relu')
  with pytest.raises(errors.JitArgumentError,
                     match=r"keyword arguments\['name'\].*static_argnames"):
    lift.init(lift.jit(lambda scope, x, *, name: x))(RNGS, X, name='relu')


def test_unhashable_static_argument_is_rejected():
  fn = lift.jit(lambda scope, x, sizes: x, static_argnums=2)
  with pytest.raises(errors.JitArgumentError, match="static argument 'sizes' of .* not hashable"):
    lift.init(fn)(RNGS, X, [1, 2])
  with pytest.raises(errors.JitArgumentError, match="static argument 'x' of dense is Array"):
    lift.init(lift.jit(dense, static_argnums=1))(RNGS, X, 2)  # 0 is the scope: 1 is x


def test_draws_that_change_between_traces_are_rejected():
  calls = []
  def moody(scope, x):
    calls.append(1)
    for _ in range(len(calls)):  # draws once in the first trace, twice in the second
      x = x + jax.random.normal(scope.make_rng('dropout'))
    return x
  jitted = lift.jit(moody)
  lift.init(jitted)(RNGS, X)
  jax.clear_caches()  # JAX traces the same structure again, and now it draws twice
  with pytest.raises(errors.RngReplayError, match='draw 1 was no draw'):
    lift.init(jitted)(RNGS, X)


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
    h = scope.child(dense, 'dense')(x, 2)
    return h, jax.random.key_data(scope.make_rng('dropout'))
  def model(scope, x, fold):
    first = draws(scope.push('sub'), x)  # the counters at 'sub' continue inside
    return first, fold(scope.push('sub', reuse=True), x)
  y, variables = lift.init(model)(RNGS, X, lift.fold_rngs(draws))
  y_flax, variables_flax = flax_init(model)(
      RNGS, X, lambda s, x: flax_lift.fold_rngs(lambda s, _, x: draws(s, x))(s, None, x))
  assert_trees_close(y, y_flax)
  # Inside, the second 'dropout' draw at 'sub' hashes no path: fold_in_static(key, (2,)).
  np.testing.assert_array_equal(
      y[1][1], jax.random.key_data(fold_in_static(RNGS['dropout'], (2,))))
  assert jax.tree.map(jnp.shape, variables) == jax.tree.map(jnp.shape, dict(variables_flax))


def test_fold_rngs_keeps_counter_in_mutable_collection():
  fn = lift.fold_rngs(counter)
  _, state = lift.apply(fn, mutable='counter')({'counter': {'count': jnp.int32(1)}}, X)
  assert int(state['counter']['count']) == 2
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(fn)({'counter': {'count': jnp.int32(1)}}, X)
