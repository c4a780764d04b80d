"""pack, stage by stage, and the seed's lift_transpose example."""
import inspect

import flax.core
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift
from lift import errors
from lift.pack import PackSpec, commit, dedup_scopes, filter_groups, reconstruct, repack

from tests.helpers import assert_trees_equal, counter, dense


def test_pack_stages_are_named_functions():
  assert all(map(inspect.isfunction, (dedup_scopes, filter_groups, reconstruct, repack, commit)))


def lift_transpose(fn, target='params', variables=True, rngs=True, lib=lift):
  """The seed example: transposes every 2-D param of `target`, passes the rest through."""
  def wrapper(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    target, rest = variable_groups
    def trans(x):
      if x.ndim == 2:
        return x.T
      return x
    target = jax.tree_util.tree_map(trans, target)
    variable_groups = (target, rest)
    scope = scope_fn(variable_groups, rng_groups)
    y = fn(scope, *args)
    out_variables = repack_fn(scope)
    return y, out_variables
  return lib.pack(
      wrapper,
      in_variable_filters=(target, variables),
      out_variable_filters=(variables,),
      rng_filters=(rngs,))


def passthrough(fn, in_filters=(True,), out_filters=(True,), rng_filters=(True,), name='identity'):
  def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    scope = scope_fn(variable_groups, rng_groups)
    return fn(scope, *args), repack_fn(scope)
  return lift.pack(inner, in_filters, out_filters, rng_filters, name=name)


def test_lift_transpose_seed_example():
  x = jnp.ones((3, 2))
  y, variables = lift.init(lift_transpose(dense))(jax.random.key(0), x, 4)
  kernel = variables['params']['kernel']
  assert kernel.shape == (2, 4)
  # Applying with a (4, 2) kernel works because the transform transposes it on the way in.
  transposed = {'params': {'kernel': kernel.T, 'bias': variables['params']['bias']}}
  y2 = lift.apply(lift_transpose(dense))(transposed, x, 4)
  np.testing.assert_allclose(y2, y, rtol=1e-6)
  flax_transpose = lift_transpose(dense, lib=flax.core.lift)
  assert_trees_equal((y, variables), flax.core.init(flax_transpose)(jax.random.key(0), x, 4))
  assert_trees_equal(y2, flax.core.apply(flax_transpose)(transposed, x, 4))


def test_untransformed_values_unchanged_through_pack():
  x = jnp.ones((1, 3))
  plain = lift.init(dense)(jax.random.key(0), x, 2)
  packed = lift.init(passthrough(dense))(jax.random.key(0), x, 2)
  jax.tree_util.tree_map(np.testing.assert_array_equal, plain, packed)


def test_dedup_lifts_a_scope_and_its_child_once():
  def fn(scope):
    child = scope.push('child')
    child.put_variable('state', 'x', 1)
    lifted = dedup_scopes((scope, child))
    assert lifted.roots == (scope,) and lifted.paths == ((0, ()), (0, ('child',)))
    seen = {}

    def inner(scope_fn, repack_fn, variable_groups, rng_groups):
      assert len(variable_groups[0]) == 1  # one root: the child's variables are not lifted twice
      root, inner_child = scope_fn(variable_groups, rng_groups)
      assert (root.path, inner_child.path) == ((), ('child',))
      seen['parent_is_root'] = inner_child.parent is root
      inner_child.put_variable('state', 'x', 2)
      return None, repack_fn((root, inner_child))

    lift.pack(inner, (True,), (True,), (True,))((scope, child))
    return seen['parent_is_root'], child.get_variable('state', 'x')

  assert lift.apply(fn, mutable=True)({})[0] == (True, 2)


def test_dedup_keeps_two_siblings_as_two_roots():
  def fn(scope):
    a, b = scope.push('a'), scope.push('b')
    lifted = dedup_scopes({'a': a, 'b': b})
    return [s.path for s in lifted.roots]

  assert lift.apply(fn)({}) == [('a',), ('b',)]


def test_filter_groups_first_match_wins_and_rngs_keep_suffix():
  def fn(scope):
    child = scope.push('block')
    spec = PackSpec(('params', True), (True,), ('dropout',), None)
    variable_groups, rng_groups = filter_groups((child,), spec)
    return variable_groups, rng_groups

  variables = {'params': {'block': {'w': 1.0}}, 'stats': {'block': {'m': 2.0}}}
  (params, rest), (rngs,) = lift.apply(fn)(
      variables, rngs={'params': jax.random.key(0), 'dropout': jax.random.key(1)})
  assert params == ({'params': {'w': 1.0}},) and rest == ({'stats': {'m': 2.0}},)
  assert list(rngs[0]) == ['dropout'] and rngs[0]['dropout'].suffix == ('block',)


def test_repack_never_returns_immutable_collections():
  def fn(scope):
    spec = PackSpec((True,), (True,), (True,), None)
    lifted = dedup_scopes(scope)
    inner = lift.Scope({'params': {'w': 1.0}, 'counter': {'n': 1}}, mutable=['counter'])
    inner = reconstruct(lifted, spec, [], *filter_groups(lifted.roots, spec))
    return repack(lifted, spec, inner)

  out = lift.apply(fn, mutable=['counter'])({'params': {'w': 1.0}, 'counter': {'n': 1}})[0]
  assert out == (({'counter': {'n': 1}},),)


@pytest.mark.parametrize('in_filters', [('params',), (True,)])
def test_mutable_collection_matched_by_no_out_filter_raises(in_filters):
  def make_stats(scope):
    scope.variable('batch_stats', 'mean', jnp.zeros, ())

  lifted = passthrough(make_stats, in_filters=in_filters, out_filters=('params',), name='my_transform')
  with pytest.raises(errors.UnmappedCollectionError,
                     match=r'"batch_stats" is immutable inside the lifted `my_transform`'):
    lift.init(lambda s: lifted(s.push('layer')))(jax.random.key(0))


def test_commit_makes_mutations_visible_in_scope_and_aliases():
  def fn(scope):
    alias = scope.rewound()
    child = scope.push('c')
    passthrough(counter)(child, 0)
    passthrough(counter)(scope.push('c', reuse=True), 0)
    return alias.push('c', reuse=True).get_variable('counter', 'count')

  assert lift.init(fn)(jax.random.key(0))[0] == 2


def test_commit_writes_out_groups_into_original_scopes():
  def fn(scope):
    commit((scope,), (({'state': {'x': 3}},),))
    return scope.get_variable('state', 'x')

  assert lift.apply(fn, mutable=True)({})[0] == 3


def test_rng_stream_not_matched_is_unavailable_inside():
  def draw(scope):
    return scope.make_rng('noise')

  lifted = passthrough(draw, rng_filters=('params',))
  with pytest.raises(errors.UnknownRngError, match='needs PRNG for "noise": scope "identity\\(/\\)"'):
    lift.apply(lifted)({}, rngs={'noise': jax.random.key(0)})


def test_rngs_continue_counters_through_pack():
  def twice(scope, transform):
    first = transform(lambda s: s.make_rng('params'))(scope)
    return [jax.random.key_data(first), jax.random.key_data(scope.make_rng('params'))]

  plain = lift.apply(twice)({}, lambda f: f, rngs=jax.random.key(7))
  packed = lift.apply(twice)({}, passthrough, rngs=jax.random.key(7))
  np.testing.assert_array_equal(plain, packed)


def test_immutable_in_only_collection_cannot_be_written_inside():
  lifted = passthrough(counter, in_filters=(True,), out_filters=('params',))
  with pytest.raises(errors.ImmutableCollectionError, match='"count" in "identity\\(/\\)"'):
    lift.apply(lifted, mutable=['counter'])({'counter': {'count': 0}}, 0)


def test_scope_and_variable_captured_inside_are_invalid_after_return():
  captured = {}

  def grab(scope):
    captured['scope'] = scope.push('inner')
    captured['var'] = scope.variable('state', 'x', lambda: 1)

  lift.apply(lambda s: passthrough(grab)(s.push('outer')), mutable=True)({})
  with pytest.raises(errors.InvalidScopeError, match='"identity\\(/outer/inner\\)" is no longer valid'):
    captured['scope'].get_variable('state', 'x')
  with pytest.raises(errors.InvalidScopeError, match='"identity\\(/outer\\)" is no longer valid'):
    captured['var'].value


def test_enable_kwargs_false_rejects_keyword_arguments_naming_them():
  packed = lift.pack(lambda scope_fn, repack_fn, vg, rg, *a, **k: (None, repack_fn(scope_fn(vg, rg))),
                     (True,), (True,), (True,), name='identity', enable_kwargs=False)
  with pytest.raises(errors.TransformArgumentError, match=r"identity: keyword arguments \['x'\]"):
    lift.apply(packed)({}, x=1.0)


def test_pack_validates_filters_when_built():
  with pytest.raises(errors.InvalidFilterError):
    lift.pack(lambda *a: None, (3,), (True,), (True,))


def _custom_pack(body, in_filters=('params', True)):
  return lift.pack(body, in_filters, (True,), (True,), name='custom')


def test_scope_fn_given_fewer_groups_than_in_filters_raises():
  def drop_second(scope_fn, repack_fn, variable_groups, rng_groups, x):
    scope = scope_fn(variable_groups[:1], rng_groups)  # 'rest' would be lost
    return dense(scope, x, 2), repack_fn(scope)
  with pytest.raises(errors.PackProtocolError,
                     match=r'`custom`: the variable_groups given to scope_fn.*in_variable_filters` \(2\)'):
    lift.init(lambda s, x: _custom_pack(drop_second)(s, x))(jax.random.key(0), jnp.ones((2, 3)))


def test_packed_function_must_return_y_and_out_groups():
  def only_y(scope_fn, repack_fn, variable_groups, rng_groups, x):
    return dense(scope_fn(variable_groups, rng_groups), x, 2)
  with pytest.raises(errors.PackProtocolError, match=r'`custom` returned.*\(y, out_groups\)'):
    lift.init(lambda s, x: _custom_pack(only_y)(s, x))(jax.random.key(0), jnp.ones((2, 3)))


def test_out_groups_must_match_out_filters():
  def extra_group(scope_fn, repack_fn, variable_groups, rng_groups, x):
    scope = scope_fn(variable_groups, rng_groups)
    return dense(scope, x, 2), repack_fn(scope) + (({},),)
  with pytest.raises(errors.PackProtocolError, match=r'out_groups it returns.*out_variable_filters` \(1\)'):
    lift.init(lambda s, x: _custom_pack(extra_group)(s, x))(jax.random.key(0), jnp.ones((2, 3)))
