"""pack, stage by stage, and the seed's lift_transpose example."""
import inspect

import flax.core
import jax
import jax.numpy as jnp

import lift
from lift.pack import PackSpec, commit, dedup_scopes, filter_groups, reconstruct, repack

from tests.helpers import assert_trees_equal, counter, dense

KEY = jax.random.key(0)


def test_pack_stages_are_named_functions():
  assert all(map(inspect.isfunction, (dedup_scopes, filter_groups, reconstruct, repack, commit)))


def lift_transpose(fn, target='params', variables=True, rngs=True, lib=lift):
  """The seed example: transposes every 2-D param of `target`, passes the rest through."""
  def wrapper(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    target, rest = variable_groups
    target = jax.tree_util.tree_map(lambda x: x.T if x.ndim == 2 else x, target)
    scope = scope_fn((target, rest), rng_groups)
    y = fn(scope, *args)
    return y, repack_fn(scope)
  return lib.pack(wrapper, in_variable_filters=(target, variables), out_variable_filters=(variables,),
                  rng_filters=(rngs,))


def passthrough(fn, in_filters=(True,), out_filters=(True,), rng_filters=(True,), name='identity'):
  def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    scope = scope_fn(variable_groups, rng_groups)
    return fn(scope, *args), repack_fn(scope)
  return lift.pack(inner, in_filters, out_filters, rng_filters, name=name)


def test_lift_transpose_seed_example():
  x = jnp.ones((3, 2))
  y, variables = lift.init(lift_transpose(dense))(KEY, x, 4)
  kernel = variables['params']['kernel']
  assert kernel.shape == (2, 4)
  # Applying with a (4, 2) kernel works because the transform transposes it on the way in.
  transposed = {'params': {'kernel': kernel.T, 'bias': variables['params']['bias']}}
  y2 = lift.apply(lift_transpose(dense))(transposed, x, 4)
  assert_trees_equal(y2, y)
  flax_transpose = lift_transpose(dense, lib=flax.core.lift)
  assert_trees_equal((y, variables), flax.core.init(flax_transpose)(KEY, x, 4))
  assert_trees_equal(y2, flax.core.apply(flax_transpose)(transposed, x, 4))


def test_untransformed_values_unchanged_through_pack():
  x = jnp.ones((1, 3))
  assert_trees_equal(lift.init(passthrough(dense))(KEY, x, 2), lift.init(dense)(KEY, x, 2))


def test_dedup_lifts_a_scope_and_its_child_once_and_two_siblings_as_two_roots():
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
    siblings = [s.path for s in dedup_scopes({'a': scope.push('a'), 'b': scope.push('b')}).roots]
    return seen['parent_is_root'], child.get_variable('state', 'x'), siblings
  assert lift.apply(fn, mutable=True)({})[0] == (True, 2, [('a',), ('b',)])


def test_filter_groups_first_match_wins_and_rngs_keep_suffix():
  def fn(scope):
    return filter_groups((scope.push('block'),), PackSpec(('params', True), (True,), ('dropout',), None))
  variables = {'params': {'block': {'w': 1.0}}, 'stats': {'block': {'m': 2.0}}}
  (params, rest), (rngs,) = lift.apply(fn)(variables, rngs={'params': KEY, 'dropout': jax.random.key(1)})
  assert params == ({'params': {'w': 1.0}},) and rest == ({'stats': {'m': 2.0}},)
  assert list(rngs[0]) == ['dropout'] and rngs[0]['dropout'].suffix == ('block',)


def test_repack_never_returns_immutable_collections():
  def fn(scope):
    spec, lifted = PackSpec((True,), (True,), (True,), None), dedup_scopes(scope)
    return repack(lifted, spec, reconstruct(lifted, spec, [], *filter_groups(lifted.roots, spec)))
  out = lift.apply(fn, mutable=['counter'])({'params': {'w': 1.0}, 'counter': {'n': 1}})[0]
  assert out == (({'counter': {'n': 1}},),)


def test_commit_makes_mutations_visible_in_scope_and_aliases_and_writes_out_groups():
  def fn(scope):
    alias = scope.rewound()
    passthrough(counter)(scope.push('c'), 0)
    passthrough(counter)(scope.push('c', reuse=True), 0)
    return alias.push('c', reuse=True).get_variable('counter', 'count')
  assert lift.init(fn)(KEY)[0] == 2
  def write(scope):
    commit((scope,), (({'state': {'x': 3}},),))
    return scope.get_variable('state', 'x')
  assert lift.apply(write, mutable=True)({})[0] == 3


def test_rngs_continue_counters_through_pack():
  def twice(scope, transform):
    first = transform(lambda s: s.make_rng('params'))(scope)
    return [jax.random.key_data(first), jax.random.key_data(scope.make_rng('params'))]
  assert_trees_equal(lift.apply(twice)({}, passthrough, rngs=jax.random.key(7)),
                     lift.apply(twice)({}, lambda f: f, rngs=jax.random.key(7)))
