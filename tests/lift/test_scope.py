"""Scope semantics: variables, names, mutability, PRNG derivation and parity with Flax."""
import functools
import hashlib
import inspect

import flax.core
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import lift as flax_lift, meta

import lift
import linen_ext
from lift import errors

from tests.helpers import assert_trees_equal, dense, mlp

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
RNGS = {'params': jax.random.key(1), 'dropout': jax.random.key(2)}
kd = jax.random.key_data


def check(run):
  """``run(M)`` with ``M = flax.core`` and ``M = lift``: bitwise-equal results."""
  theirs, ours = run(flax.core), run(lift)
  assert_trees_equal(ours, theirs)
  return ours


def hand_key(key, suffix, counter):
  """The derivation: fold_in(key, u32(first 4 bytes BE of SHA-1(suffix items, counter)))."""
  h = hashlib.sha1()
  for item in list(suffix) + [counter]:
    h.update(item.encode() if isinstance(item, str) else
             int(item).to_bytes(max(1, (int(item).bit_length() + 7) // 8), 'big'))
  return kd(jax.random.fold_in(key, jnp.uint32(int.from_bytes(h.digest()[:4], 'big'))))


# -- PRNG derivation ----------------------------------------------------------------------------

def draws(scope, many_draws=300):
  """Keys drawn from several streams, through children, pushes, rewinds and many draws
  (300: counters past one byte)."""
  keys = [scope.make_rng('params'), scope.make_rng('dropout'), scope.make_rng('params')]
  child = scope.push('block')
  keys += [child.make_rng('dropout'), child.push('inner').make_rng('params')]
  keys += [scope.push('block', reuse=True).make_rng('dropout'), scope.push().make_rng('params')]
  twice = scope.child(lambda s: s.make_rng('dropout'), 'fn')
  keys += [twice(), twice(), scope.rewound().make_rng('params')]
  keys += [scope.make_rng('missing'), scope.push('ä层').make_rng('dropout')]  # 'missing': params
  many = scope.push('many')
  keys += [[many.make_rng('dropout') for _ in range(many_draws)][-1]]
  keys += [scope.rewound(rewind_rngs=True).make_rng('params')]  # repeats keys[0]
  flags = [scope.has_rng('params'), scope.has_rng('nope'), child.has_rng('dropout')]
  return [kd(k) for k in keys], flags


@pytest.mark.parametrize('rngs, many_draws', [  # eager draws cost: the other key kinds draw less
    (RNGS, 300), ({'params': jax.random.PRNGKey(3), 'dropout': jax.random.PRNGKey(4)}, 3),
    ({'params': jax.random.key(1, impl='rbg'), 'dropout': jax.random.key(2, impl='rbg')}, 3)])
def test_make_rng_matches_flax_through_children_and_counters(rngs, many_draws):
  keys, flags = check(lambda M: M.apply(functools.partial(draws, many_draws=many_draws))(
      {}, rngs=rngs))
  assert flags == [True, False, True]
  assert len({tuple(np.asarray(k).ravel().tolist()) for k in keys[:-1]}) == len(keys) - 1
  np.testing.assert_array_equal(keys[-1], keys[0])


def test_prng_formula_by_hand():
  def f(scope):
    many = scope.push('many')
    return [kd(k) for k in (scope.make_rng('params'), scope.make_rng('params'),
                            scope.push('child').make_rng('params'),
                            scope.push('x').push('y').make_rng('dropout'),
                            [many.make_rng('params') for _ in range(300)][-1])]
  expected = [hand_key(KEY, [], 1), hand_key(KEY, [], 2), hand_key(KEY, ['child'], 1),
              hand_key(jax.random.key(1), ['x', 'y'], 1), hand_key(KEY, ['many'], 300)]
  assert_trees_equal(lift.init(f)({'params': KEY, 'dropout': jax.random.key(1)})[0], expected)


def test_param_draws_a_key_only_on_creation_and_init_matches_flax():
  check(lambda M: M.init(mlp)(KEY, X))
  def f(scope):
    scope.param('w', lambda r: jax.random.normal(r, ()))
    return kd(scope.make_rng('params'))
  y, v = check(lambda M: M.init(f)(KEY))
  np.testing.assert_array_equal(y, hand_key(KEY, [], 2))
  np.testing.assert_array_equal(lift.apply(f)(v, rngs=KEY), hand_key(KEY, [], 1))


def test_vmap_split_key_formula():
  def f(L):
    return lambda s, x: kd(L.vmap(lambda s, x: s.make_rng('params'), variable_axes={},
                                  split_rngs={'params': True})(s.push('a'), x))
  keys = check(lambda M: M.init(f(flax_lift if M is flax.core else lift))(KEY, jnp.ones((3, 2)))[0])
  assert_trees_equal(list(keys), [hand_key(k, ['a'], 1) for k in jax.random.split(KEY, 3)])


@pytest.mark.parametrize('name', ['checkpoint', 'jit', 'map_variables'])
def test_inner_scopes_continue_outer_counters(name):
  wrap = {'checkpoint': lift.checkpoint, 'jit': lift.jit,
          'map_variables': lambda f: lift.map_variables(f, 'params')}[name]
  def outer(scope):
    return [kd(k) for k in (scope.make_rng('params'), wrap(lambda s: s.make_rng('params'))(scope),
                            scope.make_rng('params'))]
  assert_trees_equal(lift.init(outer)(KEY)[0], [hand_key(KEY, [], i) for i in (1, 2, 3)])


def test_single_key_means_params_and_unknown_streams_fall_back_to_it():
  def f(scope):
    return (kd(scope.make_rng('params')), kd(scope.push('c').make_rng()),
            kd(scope.make_rng('dropout')), scope.has_rng('params'), scope.has_rng('dropout'))
  ours = lift.apply(f)({}, rngs=KEY)
  assert ours[3:] == (True, False)
  assert_trees_equal(ours, flax.core.apply(f)({}, rngs=KEY))
  assert_trees_equal(ours, lift.apply(f)({}, rngs={'params': KEY}))
  bound = check(lambda M: kd(M.bind({'params': {'w': 1.0}}, rngs={'params': KEY}).push('c').make_rng('params')))
  np.testing.assert_array_equal(bound, ours[1])
  def model(nn):
    class M(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(2)(x) + jax.random.normal(self.make_rng('params'), (1, 2))
    return M()
  v = model(flax_nn).init(KEY, X)
  assert_trees_equal(model(linen_ext).apply(v, X, rngs=KEY), model(flax_nn).apply(v, X, rngs={'params': KEY}))


# -- variables, names, mutability ---------------------------------------------------------------

def test_param_is_created_once_and_reused_in_apply():
  _, variables = lift.init(dense)(KEY, X, 2)
  np.testing.assert_array_equal(lift.apply(dense)(variables, X, 2),
                                X @ variables['params']['kernel'] + variables['params']['bias'][None])


INIT_CALLS = []


def counting_normal(scale):
  """A fresh initializer per call, as `nn.initializers.normal(0.1)` inside a method."""
  def init(key, shape, dtype=jnp.float32):
    INIT_CALLS.append(shape)
    return scale * jax.random.normal(key, shape, dtype)
  return init


@pytest.mark.parametrize('arg, shape_type, traced_per_apply', [
    (0.5, tuple, 0),               # plain arguments: the shapes are computed once, then cached
    (0.5, list, 0),                # a shape given as a list (as LayerNorm gives it), too
    (jnp.float32(0.5), tuple, 1),  # an array argument: traced on every apply
])
def test_param_shape_check_runs_the_initializer_once_per_initializer_and_arguments(
    arg, shape_type, traced_per_apply):
  def model(scope, x, scale):
    kernel = scope.param('kernel', counting_normal(scale), shape_type((x.shape[-1], 3)))
    return x @ kernel
  _, variables = lift.init(model)(KEY, X, arg)
  lift.apply(model)(variables, X, arg)
  INIT_CALLS.clear()
  for _ in range(3):
    lift.apply(model)(variables, X, arg)
  assert len(INIT_CALLS) == 3 * traced_per_apply
  bad = {'params': {'kernel': variables['params']['kernel'][:-1]}}
  with pytest.raises(errors.ParamShapeError, match=r'shape \(3, 3\).*has shape \(2, 3\)'):
    lift.apply(model)(bad, X, arg)  # a cached check still compares


def test_param_shape_cache_keys_tell_initializers_apart():
  from lift.param_shapes import expected_shapes
  normal = lambda scale: jax.nn.initializers.normal(scale)
  shapes = [expected_shapes(normal(1.0), ((2,),), {}), expected_shapes(normal(1.0), ((3,),), {}),
            expected_shapes(jax.nn.initializers.zeros, ((2,),), {'dtype': jnp.int8}),
            expected_shapes(jax.nn.initializers.zeros, ((2,),), {'dtype': jnp.float16}),
            expected_shapes(lambda key, n: {'a': jnp.ones(n)}, (2,), {}),
            expected_shapes(lambda key, n: jnp.ones((n, n)), (2,), {})]
  assert [getattr(s, 'shape', None) for s in shapes] == [(2,), (3,), (2,), (2,), None, (2, 2)]
  assert [getattr(s, 'dtype', None) for s in shapes[2:4]] == [jnp.int8, jnp.float16]
  assert shapes[4]['a'].shape == (2,)


def _methods(scope):
  out = {'push': scope.push().name, 'px0': scope.push(prefix='x').name,
         'px1': scope.push(prefix='x').name, 'default': scope.default_name('x')}
  scope.reserve('y0')
  out['default_y'] = scope.default_name('y')
  out['reuse'] = scope.push('x0', reuse=True).name
  scope.param('p', jax.nn.initializers.normal(), (2,))
  out['default_p'] = scope.default_name('p')
  d = scope.child(dense)
  out['d'] = d(X, 3), d(X, 3)  # the same child twice: one set of variables
  out['D'] = scope.child(dense, prefix='D')(X, 3), scope.child(lambda s, x: dense(s, x, 2))(X)
  out['deep'] = scope.push('deep').push('er').path, scope.path
  v = scope.variable('state', 'count', lambda: jnp.zeros(()))
  v.value = v.value + 1
  out['get'] = (scope.put_variable('col', 'x', 3), scope.get_variable('col', 'x'),
                scope.get_variable('col', 'nope', 'dflt'))
  out['has'] = (scope.has_variable('col', 'x'), scope.has_variable('col', 'y'),
                scope.is_mutable_collection('col'), scope.is_mutable_collection('other'))
  out['keys'] = sorted(scope.variables()), sorted(scope.mutable_variables())
  out['rewound'] = scope.rewound().default_name('dense_')
  return out


def test_scope_methods_names_and_variable_tree_match_flax():
  _, variables = check(lambda M: M.init(_methods, mutable=['state', 'col', 'params'])(KEY))
  assert sorted(variables['params']) == ['<lambda>_0', 'D0', 'dense_0', 'p']


def test_debug_path_names_the_lifted_transforms_as_flax():
  def top(L, seen):
    def leaf(s, x):
      seen.append(s.push('inner').debug_path)
      return x

    def mid(s, x):
      return L.vmap(lambda s, x: s.child(leaf, 'leaf')(x), variable_axes={}, split_rngs={})(s, x)

    def body(s, c, x):
      seen.append(s.debug_path)
      return c, s.child(mid, 'block')(x)

    return lambda s, x: (seen.append(s.debug_path),
                         L.scan(body, variable_axes={}, split_rngs={})(s, 0.0, x))
  seen = {}
  for L, M in ((flax_lift, flax.core), (lift, lift)):
    M.init(top(L, seen.setdefault(M.__name__, [])))(KEY, jnp.ones((2, 3, 4)))
  expected = {(), ('scan()',), ('scan()', 'vmap(block)', 'leaf', 'inner')}
  assert set(seen['lift']) == set(seen['flax.core']) == expected  # Flax traces the body more often


def test_name_reservation_errors_match_flax():
  def probe(scope):
    scope.param('x', lambda k: 1.0)
    attempts = [lambda: scope.variable('st', 'x', lambda: 2), lambda: scope.push('x'),
                lambda: scope.param('x', lambda k: 1.0), lambda: scope.variable('st', 'x'),
                lambda: scope.reserve('x', 'params'), lambda: scope.child(dense, 'x'),
                lambda: (scope.reserve('zz'), scope.reserve('zz', 'params')),
                lambda: (scope.reserve('yy', 'params'), scope.reserve('yy'))]
    results = []
    for attempt in attempts:
      try:
        attempt()
        results.append('ok')
      except ValueError:
        results.append('ValueError')
    return results
  assert check(lambda M: M.init(probe)(KEY)[0]) == ['ok'] + ['ValueError'] * 7


def test_child_scopes_default_names_same_names_in_different_collections_and_aliases():
  def fn(scope):
    assert scope.default_name('dense_') == 'dense_0'
    scope.push('dense_0')
    assert scope.default_name('dense_') == 'dense_1'
    child = scope.push()
    assert child.path == ('0',) and child.parent is scope
    scope.put_variable('state', 'x', 1)
    child.push('g').put_variable('state', 'y', 2)
    assert child.variables() == {'state': {'g': {'y': 2}}}
    return scope.variables()
  assert lift.apply(fn, mutable=True)({})[0] == {'state': {'x': 1, '0': {'g': {'y': 2}}}}
  def same_names(scope):  # the same name in different collections; writes show through aliases
    scope.variable('a', 'x', lambda: 1)
    scope.variable('b', 'x', lambda: 2)
    alias = scope.rewound()
    scope.put_variable('state', 'x', 1)
    assert alias.get_variable('state', 'x') == 1
    return scope.variables()
  assert lift.init(same_names)(KEY)[0] == {'a': {'x': 1}, 'b': {'x': 2}, 'state': {'x': 1}}


def test_param_and_variable_boxes_match_flax():
  init_p = meta.with_partitioning(lambda k, s: jnp.ones(s), ('a',))
  def fn(s):
    v1, v2 = s.param('w', init_p, (2,)), s.rewound().param('w', init_p, (2,), unbox=False)
    var = s.variable('st', 'b', lambda: meta.Partitioned(jnp.zeros(2), ('a',)))
    kinds = (type(v1).__name__, type(v2).__name__, type(var.value).__name__, var.is_mutable())
    var.value = var.value + 1
    raw = s.rewound().variable('st', 'b', unbox=False)
    return kinds, type(raw.value).__name__, s.param('h', jax.nn.initializers.normal(), (2,), dtype=jnp.float16)
  check(lambda M: M.init(fn)(KEY))


@pytest.mark.parametrize('mutable', [True, ['stats', 'other'], 'stats', 'DENY', [], False])
def test_apply_return_for_every_mutable_filter_matches_flax(mutable):
  def fn(s):
    if s.is_mutable_collection('stats'):
      s.variable('stats', 'x', lambda: jnp.float32(3)).value += 1
    return s.is_mutable_collection('params'), s.is_mutable_collection('stats')
  variables = {'params': {'a': jnp.float32(1)}, 'c': {'z': jnp.float32(2)}, 'stats': {'x': jnp.float32(4)}}
  out = check(lambda M: M.apply(fn, mutable=M.DenyList('params') if mutable == 'DENY' else mutable)(variables))
  assert variables['stats']['x'] == 4  # the caller's dict is never written
  if mutable not in ([], False):
    assert out[1]['stats'] == {'x': 5}


def test_bind_is_initializing_flag_and_temporary_scope():
  scope = lift.bind({'params': {'w': 1.0}}, rngs=KEY)
  assert scope.get_variable('params', 'w') == 1.0 and not scope.get_flag('initializing', False)
  assert scope.has_rng('params') and not scope.is_mutable_collection('params')
  _, variables = lift.init(lambda s: s.put_variable('f', 'init', s.get_flag('initializing')))(KEY)
  assert variables == {'f': {'init': True}}
  with lift.bind({'params': {'w': 1.0}}).temporary() as scope:  # invalid after: the catalogue
    assert scope.variables() == {'params': {'w': 1.0}}


# -- errors (each mistake and its message: tests/misuse/) -----------------------

def test_errors_are_lift_errors_importable_from_lift():
  assert (lift.LiftError, lift.InvalidScopeError, lift.ScanConversionError) == (
      errors.LiftError, errors.InvalidScopeError, errors.ScanConversionError)
  assert issubclass(lift.InvalidScopeError, lift.LiftError)
  assert issubclass(lift.ScanConversionError, lift.LiftError)


# -- empty collections: kept as flax.core keeps them -------------------------------------------

def _stats(scope):
  return scope.variable('stats', 'a', lambda: jnp.float32(1)).value


def _child_view(scope):
  child = scope.push('c')
  return sorted(child.variables()), sorted(child.mutable_variables())


def _views(s):
  s.param('a', lambda k: jnp.float32(1))
  s.variable('st', 'b', lambda: jnp.float32(2))
  c = s.push('c')
  c.param('w', lambda k: jnp.float32(5))
  return s.variables(), s.mutable_variables(), c.variables(), c.mutable_variables()


VIEWS = {'params': {'a': jnp.float32(1), 'c': {'w': jnp.float32(5)}}, 'other': {'q': jnp.float32(0)}}
EMPTY_CASES = {
    'mutable=True keeps the empty params': (_stats, True, {'params': {}}),
    'an untouched empty mutable collection': (lambda s: 0, 'stats', {'params': {}, 'stats': {}}),
    'empty subtrees stay': (_stats, True, {'params': {}, 'other': {'c': {}}}),
    'a child lists collections holding its path': (
        _child_view, ['x'], {'params': {}, 'x': {'c': {}}, 'y': {'d': {}}, 'z': {}}),
    'variables views, one mutable': (_views, 'st', VIEWS),
    'variables views, all mutable': (_views, True, VIEWS),
}


@pytest.mark.parametrize('fn,mutable,variables', EMPTY_CASES.values(), ids=list(EMPTY_CASES))
def test_empty_collections_and_variable_views_as_flax_core(fn, mutable, variables):
  check(lambda M: M.apply(fn, mutable=mutable)(variables))


def test_init_and_bind_keep_empty_collections_as_flax_core():
  assert lift.init(lambda s: 0)(KEY) == flax.core.init(lambda s: 0)(KEY) == (0, {})
  variables = {'params': {}, 'a': {'x': {}}}
  assert lift.bind(variables).variables() == flax.core.bind(variables).variables() == variables
  assert lift.bind(variables, mutable='a').mutable_variables() == {'a': {'x': {}}}


# -- signatures: Flax's parameter names, order and defaults (extras allowed) ---------------------

LIFT_NAMES = ['vmap', 'scan', 'checkpoint', 'remat', 'jit', 'map_variables', 'swap_collection',
              'cond', 'switch', 'while_loop', 'vjp', 'jvp', 'value_and_grad', 'custom_vjp',
              'remat_scan', 'fold_rngs', 'init', 'apply', 'bind', 'pack']
SCOPE_METHODS = ['param', 'variable', 'make_rng', 'has_rng', 'push', 'child', 'reserve',
                 'default_name', 'get_variable', 'put_variable', 'has_variable',
                 'is_mutable_collection', 'variables', 'mutable_variables', 'rewound', 'invalidate']


@pytest.mark.parametrize('name', LIFT_NAMES + [f'Scope.{m}' for m in SCOPE_METHODS])
def test_signature_takes_flax_parameters_in_flax_order_with_flax_defaults(name):
  get = lambda root: getattr(root.Scope, name[6:]) if '.' in name else getattr(root, name)
  ours = inspect.signature(get(lift)).parameters
  theirs = inspect.signature(get(flax.core.scope) if '.' in name else
                             getattr(flax_lift, name, None) or get(flax.core)).parameters
  assert [p for p in theirs if p not in ours] == []
  assert [p for p in ours if p in theirs] == list(theirs)  # positional calls port
  for p in theirs.values():
    default, mine = p.default, ours[p.name].default
    if default is inspect.Parameter.empty or (callable(default) and not isinstance(default, type)):
      continue  # identity lambdas
    if isinstance(default, flax.core.DenyList):
      assert all(lift.in_filter(mine, c) == flax.core.scope.in_filter(default, c)
                 for c in ('params', 'cache', 'intermediates')), p.name
    elif (name, p.name) != ('pack', 'enable_kwargs'):
      assert (dict(mine) == dict(default)) if hasattr(default, 'keys') else mine == default, p.name
  if name == 'pack':
    assert list(ours)[:5] == ['fn', 'in_variable_filters', 'out_variable_filters', 'rng_filters', 'name']
    assert ours['name'].default is None
