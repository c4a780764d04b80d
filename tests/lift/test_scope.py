"""Scope semantics: variables, names, mutability, PRNG parity with Flax, errors."""
import flax.core
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift
from lift import errors

from tests.helpers import dense, mlp


def assert_trees_equal(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_prng_parity_with_flax_core_init():
  x = jnp.ones((2, 3))
  y, ours = lift.init(mlp)(jax.random.key(0), x)
  y_ref, theirs = flax.core.init(mlp)(jax.random.key(0), x)
  assert_trees_equal(ours, flax.core.unfreeze(theirs))
  np.testing.assert_array_equal(y, y_ref)


def draws(scope):
  """Keys drawn from several streams, through children, pushes and reused pushes."""
  keys = [scope.make_rng('params'), scope.make_rng('dropout'), scope.make_rng('params')]
  child = scope.push('block')
  keys += [child.make_rng('dropout'), child.push('inner').make_rng('params')]
  again = scope.push('block', reuse=True)
  keys += [again.make_rng('dropout'), scope.push().make_rng('params')]
  keys += [scope.child(lambda s: s.make_rng('dropout'), 'fn')()]
  keys += [scope.rewound().make_rng('params')]
  return [jax.random.key_data(k) for k in keys]


def test_make_rng_matches_flax_through_children_and_counters():
  rngs = {'params': jax.random.key(1), 'dropout': jax.random.key(2)}
  ours = lift.apply(draws)({}, rngs=rngs)
  theirs = flax.core.apply(draws)({}, rngs=rngs)
  assert_trees_equal(ours, theirs)
  assert len({tuple(np.asarray(k).tolist()) for k in ours}) == len(ours)


def test_raw_uint32_keys_match_flax():
  ours = lift.apply(draws)({}, rngs={'params': jax.random.PRNGKey(3), 'dropout': jax.random.PRNGKey(4)})
  theirs = flax.core.apply(draws)({}, rngs={'params': jax.random.PRNGKey(3), 'dropout': jax.random.PRNGKey(4)})
  assert_trees_equal(ours, theirs)


def test_param_is_created_once_and_reused_in_apply():
  x = jnp.ones((1, 3))
  _, variables = lift.init(dense)(jax.random.key(0), x, 2)
  y = lift.apply(dense)(variables, x, 2)
  np.testing.assert_allclose(y, x @ variables['params']['kernel'] + variables['params']['bias'][None])


def test_apply_with_mutable_returns_only_mutable_collections():
  def counter(scope):
    count = scope.variable('counter', 'count', lambda: jnp.zeros((), jnp.int32))
    count.value += 1
    return scope.param('w', lambda k: jnp.ones(()))

  variables = {'params': {'w': jnp.ones(())}, 'counter': {'count': jnp.array(4)}}
  y, mutated = lift.apply(counter, mutable=['counter'])(variables)
  assert mutated == {'counter': {'count': 5}}
  assert variables['counter']['count'] == 4  # the caller's dict is never written


def test_child_scopes_and_default_names():
  def fn(scope):
    assert scope.default_name('dense_') == 'dense_0'
    scope.push('dense_0')
    assert scope.default_name('dense_') == 'dense_1'
    child = scope.push()
    assert child.path == ('0',) and child.parent is scope
    scope.put_variable('state', 'x', 1)
    grandchild = child.push('g')
    grandchild.put_variable('state', 'y', 2)
    assert child.variables() == {'state': {'g': {'y': 2}}}
    return scope.variables()

  assert lift.apply(fn, mutable=True)({})[0] == {'state': {'x': 1, '0': {'g': {'y': 2}}}}


def test_same_name_allowed_in_different_collections():
  def fn(scope):
    scope.variable('a', 'x', lambda: 1)
    scope.variable('b', 'x', lambda: 2)
    return scope.variables()

  assert lift.init(fn)(jax.random.key(0))[0] == {'a': {'x': 1}, 'b': {'x': 2}}


def test_variable_writes_through_aliases():
  def fn(scope):
    alias = scope.rewound()
    scope.put_variable('state', 'x', 1)
    assert alias.get_variable('state', 'x') == 1
    return alias.push('c').variables()

  lift.apply(fn, mutable=True)({})


def test_bind_and_is_initializing_flag():
  scope = lift.bind({'params': {'w': 1.0}}, rngs=jax.random.key(0))
  assert scope.get_variable('params', 'w') == 1.0 and not scope.get_flag('initializing', False)
  assert scope.has_rng('params') and not scope.is_mutable_collection('params')
  _, variables = lift.init(lambda s: s.put_variable('f', 'init', s.get_flag('initializing')))(
      jax.random.key(0))
  assert variables == {'f': {'init': True}}


def test_make_rng_falls_back_to_params_like_flax():
  fn = lambda s: jax.random.key_data(s.make_rng('dropout'))
  key = jax.random.key(0)
  np.testing.assert_array_equal(lift.apply(fn)({}, rngs=key), flax.core.apply(fn)({}, rngs=key))


# -- errors: each names the path and collection at fault -----------------------


def test_missing_param_error():
  with pytest.raises(errors.MissingParamError, match='"bias".*"/out"'):
    lift.apply(lambda s: s.child(dense, 'out')(jnp.ones((1, 2)), 3))(
        {'params': {'out': {'kernel': jnp.ones((2, 3))}}})


def test_missing_collection_error():
  with pytest.raises(errors.MissingCollectionError, match='from collection "params" in "/layer" but the collection is empty'):
    lift.apply(lambda s: s.child(dense, 'layer')(jnp.ones((1, 2)), 3))({})


def test_missing_variable_error():
  fn = lambda s: s.push('bn').variable('batch_stats', 'mean')
  with pytest.raises(errors.MissingVariableError, match='"mean" for collection "batch_stats" exists in "/bn"'):
    lift.apply(fn)({'batch_stats': {'bn': {'var': 1.0}}})


def test_param_shape_error():
  _, variables = lift.init(dense)(jax.random.key(0), jnp.ones((1, 3)), 2)
  with pytest.raises(errors.ParamShapeError, match=r'"kernel" in "/".*shape \(4, 2\).*shape \(3, 2\)'):
    lift.apply(dense)(variables, jnp.ones((1, 4)), 2)


def test_immutable_collection_error():
  fn = lambda s: s.push('layer').put_variable('params', 'w', 1.0)
  with pytest.raises(errors.ImmutableCollectionError, match='"w" in "/layer".*"params" is immutable'):
    lift.apply(fn)({'params': {}})


def test_unknown_rng_error():
  fn = lambda s: s.push('drop').make_rng('dropout')
  with pytest.raises(errors.UnknownRngError, match='^drop needs PRNG for "dropout": scope "/drop"'):
    lift.apply(fn)({}, rngs={'noise': jax.random.key(0)})


def test_name_in_use_error():
  def fn(scope):
    scope.push('a').param('w', lambda k: 1.0)
    scope.push('a')

  with pytest.raises(errors.NameInUseError, match='"a" is already in use at "/"'):
    lift.init(fn)(jax.random.key(0))


def test_invalid_scope_after_apply():
  captured = []
  lift.apply(lambda s: captured.append(s.push('child')))({})
  with pytest.raises(errors.InvalidScopeError, match='"/child" is no longer valid'):
    captured[0].get_variable('params', 'w')


def test_invalid_variables_and_rngs():
  with pytest.raises(errors.InvalidVariablesError, match='extra params layer'):
    lift.apply(dense)({'params': {'params': {}}}, jnp.ones((1, 2)), 2)
  with pytest.raises(errors.InvalidVariablesError, match="collection 'params'"):
    lift.apply(dense)({'params': 3}, jnp.ones((1, 2)), 2)
  with pytest.raises(errors.InvalidRngsError, match='should be a ``jax.PRNGKey`` or a dictionary'):
    lift.init(dense)(3, jnp.ones((1, 2)), 2)


# -- empty collections: kept as flax.core keeps them -------------------------------------------

def _stats(scope):
  return scope.variable('stats', 'a', lambda: jnp.float32(1)).value


def _nothing(scope):
  return 0


def _child_view(scope):
  child = scope.push('c')
  return sorted(child.variables()), sorted(child.mutable_variables())


EMPTY_CASES = {
    'mutable=True keeps the empty params': (_stats, True, {'params': {}}),
    'an untouched empty mutable collection': (_nothing, 'stats', {'params': {}, 'stats': {}}),
    'empty subtrees stay': (_stats, True, {'params': {}, 'other': {'c': {}}}),
    'a child lists collections holding its path': (
        _child_view, ['x'], {'params': {}, 'x': {'c': {}}, 'y': {'d': {}}, 'z': {}}),
}


@pytest.mark.parametrize('fn,mutable,variables', EMPTY_CASES.values(), ids=list(EMPTY_CASES))
def test_empty_collections_given_to_apply_are_kept_as_flax_core(fn, mutable, variables):
  ours = lift.apply(fn, mutable=mutable)(variables)
  theirs = flax.core.apply(fn, mutable=mutable)(variables)
  assert jax.tree.map(np.asarray, ours) == jax.tree.map(np.asarray, theirs)


def test_init_and_bind_keep_empty_collections_as_flax_core():
  key = jax.random.key(0)
  assert lift.init(_nothing)(key) == flax.core.init(_nothing)(key) == (0, {})
  variables = {'params': {}, 'a': {'x': {}}}
  assert lift.bind(variables).variables() == flax.core.bind(variables).variables() == variables
  assert lift.bind(variables, mutable='a').mutable_variables() == {'a': {'x': {}}}
