"""Audit: the functional core (`lift`) against `flax.core` on cases the other tests leave out.

Every test builds the same scope function twice, once with `flax.core.lift` /
`flax.core.scope` and once with `lift`, runs both with the same keys and
compares variable trees (names, shapes, axis-metadata names), values, outputs
and mutated collections. Tests of known differences are marked
``xfail(strict=True)`` so that they flip when fixed.
"""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import flax.linen as flax_nn
from flax.core import axes_scan, lift as flax_lift, meta, scope as flax_scope
from flax.typing import In, Out

import lift

KEY = jax.random.key(0)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(5)}
X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
XB = jnp.linspace(-1.0, 1.0, 12).reshape(2, 2, 3)  # a leading batch/step axis of 2
XS = jnp.linspace(-1.0, 1.0, 24).reshape(4, 2, 3)  # 4 steps

# (entry-point module, lifted-transform module) pairs
FLAX = (flax_scope, flax_lift)
OURS = (lift, lift)


# -- helpers -----------------------------------------------------------------------------

def plain(tree):
  """FrozenDicts to dicts, all the way down (boxes are kept)."""
  if hasattr(tree, 'unfreeze'):
    tree = tree.unfreeze()
  if isinstance(tree, dict):
    return {k: plain(v) for k, v in tree.items()}
  if isinstance(tree, (tuple, list)):
    return type(tree)(plain(v) for v in tree)
  return tree


def _leaf(x):
  if hasattr(x, 'dtype') and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    return np.asarray(jax.random.key_data(x))
  return np.asarray(x)


def box_names(tree):
  boxes = [b for b in jax.tree.leaves(tree, is_leaf=meta.is_axis_metadata)
           if meta.is_axis_metadata(b)]
  return [(type(b).__name__, getattr(b, 'names', None)) for b in boxes]


def assert_same(flax_out, our_out, rtol=1e-5, atol=1e-6):
  """Same tree (incl. axis-metadata names), same shapes, values close."""
  a, b = plain(flax_out), plain(our_out)
  assert box_names(a) == box_names(b)
  assert jax.tree.structure(a) == jax.tree.structure(b), (
      jax.tree.map(np.shape, a), jax.tree.map(np.shape, b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if isinstance(x, (str, bool)) or isinstance(y, (str, bool)):
      assert x == y
      continue
    x, y = _leaf(x), _leaf(y)
    assert x.shape == y.shape
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def both(build, run):
  """``run(M, build(L))`` for Flax's modules and ours; returns (flax result, our result)."""
  return tuple(run(M, build(L)) for M, L in (FLAX, OURS))


def check(build, run):
  f, o = both(build, run)
  assert_same(f, o)
  return f, o


def bias_add(y, b):
  return y + b.reshape((1,) * (y.ndim - 1) + (-1,))


def dense(scope, x, features=3):
  k = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  b = scope.param('bias', jax.nn.initializers.normal(0.1), (features,))
  return bias_add(x @ k, b)


def noisy_dense(scope, x):
  h = scope.child(dense, 'd')(x)
  n = scope.variable('stats', 'n', lambda: jnp.zeros((), jnp.int32))
  n.value = n.value + 1
  return h + jax.random.normal(scope.make_rng('dropout'), h.shape)


def key_data(k):
  return jax.random.key_data(k)


def broadcast_marker(L):
  return axes_scan.broadcast if L is flax_lift else lift.broadcast


def flax_style_jit(L, fn, **kwargs):
  """flax.core.lift.jit passes a module hash key after the scope; ours does not."""
  if L is lift:
    return lift.jit(fn, **kwargs)
  jitted = flax_lift.jit(lambda s, _, *a, **k: fn(s, *a, **k), **kwargs)
  return lambda s, *a, **k: jitted(s, None, *a, **k)


# -- Scope: names, reservations, rngs ----------------------------------------------------------

def _naming(scope):
  out = {'push': scope.push().name, 'px0': scope.push(prefix='x').name,
         'px1': scope.push(prefix='x').name, 'default': scope.default_name('x')}
  scope.reserve('y0')
  out['default_y'] = scope.default_name('y')
  out['reuse'] = scope.push('x0', reuse=True).name
  scope.param('p', jax.nn.initializers.normal(), (2,))
  out['default_p'] = scope.default_name('p')
  d = scope.child(dense)
  d(X), d(X)  # the same child twice: one set of variables
  scope.child(dense, prefix='D')(X)
  scope.child(lambda s, x: dense(s, x, 2))(X)
  out['deep'] = scope.push('deep').push('er').path
  return out


def test_scope_automatic_names_and_variable_tree_match_flax():
  f, o = check(lambda L: _naming, lambda M, fn: M.init(fn)(KEY))
  assert sorted(o[1]['params']) == ['<lambda>_0', 'D0', 'dense_0', 'p']


def test_scope_name_reservation_errors_match_flax():
  def probe(scope):
    results = []
    scope.param('x', lambda k: 1.0)
    attempts = [lambda: scope.variable('st', 'x', lambda: 2), lambda: scope.push('x'),
                lambda: scope.param('x', lambda k: 1.0), lambda: scope.variable('st', 'x'),
                lambda: scope.reserve('x', 'params'),
                lambda: (scope.reserve('zz'), scope.reserve('zz', 'params')),
                lambda: (scope.reserve('yy', 'params'), scope.reserve('yy'))]
    for attempt in attempts:
      try:
        attempt()
        results.append('ok')
      except ValueError:
        results.append('ValueError')
    return results
  f, o = both(lambda L: probe, lambda M, fn: M.init(fn)(KEY)[0])
  assert f == o == ['ok'] + ['ValueError'] * 6


def _draws(scope):
  a, b = scope.make_rng('params'), scope.make_rng('params')
  c = scope.make_rng('dropout')
  child = scope.push('a').push('b')
  d, e, g = child.make_rng('params'), child.make_rng('dropout'), child.make_rng('params')
  h = scope.rewound().make_rng('params')
  i = scope.rewound(rewind_rngs=True).make_rng('params')
  j = scope.push('a', reuse=True).make_rng('params')
  k = scope.make_rng('missing')  # falls back to 'params'
  m = scope.push('m')
  many = [m.make_rng('dropout') for _ in range(3)][-1]
  uni = scope.push('ä层').make_rng('dropout')
  flags = [scope.has_rng('params'), scope.has_rng('nope'), child.has_rng('dropout')]
  return [key_data(z) for z in (a, b, c, d, e, g, h, i, j, k, many, uni)], flags


@pytest.mark.parametrize('rngs', [RNGS, {'params': jax.random.PRNGKey(1), 'dropout': jax.random.PRNGKey(2)},
                                  {'params': jax.random.key(1, impl='rbg'),
                                   'dropout': jax.random.key(2, impl='rbg')}])
def test_make_rng_at_nested_paths_after_several_draws_matches_flax(rngs):
  check(lambda L: _draws, lambda M, fn: M.apply(fn)({}, rngs=rngs))


def test_three_hundred_draws_match_flax():
  def many(scope):
    for _ in range(299):
      scope.make_rng('dropout')
    return key_data(scope.make_rng('dropout'))
  check(lambda L: many, lambda M, fn: M.apply(fn)({}, rngs=RNGS))


def test_child_called_twice_continues_its_counter_as_flax():
  def twice(scope):
    f = scope.child(lambda s: key_data(s.make_rng('params')), name='c')
    return f(), f()
  f, o = check(lambda L: twice, lambda M, fn: M.apply(fn)({}, rngs=RNGS))
  assert not np.array_equal(o[0], o[1])


def test_bind_and_single_key_apply_match_flax():
  def run(M, _):
    bound = M.bind({'params': {'w': jnp.ones(2)}}, rngs={'params': jax.random.key(1)})
    single = M.apply(lambda s: key_data(s.push('c').make_rng()))({}, rngs={'params': jax.random.key(1)})
    return key_data(bound.push('c').make_rng('params')), single, bound.get_variable('params', 'w')
  check(lambda L: None, run)


def test_variable_without_init_fn_and_immutable_writes_fail_like_flax():
  cases = [
      (lambda M: M.init(lambda s: s.variable('state', 'x').value)(KEY)),
      (lambda M: M.apply(lambda s: s.variable('state', 'y').value, mutable=True)({'state': {'x': 1}})),
      (lambda M: M.apply(lambda s: s.put_variable('state', 'x', 2))({'state': {'x': 1}})),
      (lambda M: M.apply(lambda s: s.put_variable('new', 'x', 2))({'state': {'x': 1}})),
      (lambda M: M.apply(lambda s: s.param('w', jax.nn.initializers.zeros, (3,)))({'params': {'w': jnp.zeros(2)}})),
  ]
  for case in cases:
    for M in (flax_scope, lift):
      with pytest.raises(Exception):
        case(M)
  f, o = both(lambda L: None, lambda M, _: M.apply(lambda s: s.variable('state', 'x').value)({'state': {'x': 1}}))
  assert f == o == 1


def test_param_and_variable_boxes_match_flax():
  init_p = meta.with_partitioning(lambda k, s: jnp.ones(s), ('a',))
  def fn(s):
    v1 = s.param('w', init_p, (2,))
    v2 = s.rewound().param('w', init_p, (2,), unbox=False)
    var = s.variable('st', 'b', lambda: meta.Partitioned(jnp.zeros(2), ('a',)))
    kinds = (type(v1).__name__, type(v2).__name__, type(var.value).__name__, var.is_mutable())
    var.value = var.value + 1
    raw = s.rewound().variable('st', 'b', unbox=False)
    return kinds, type(raw.value).__name__, s.param('h', jax.nn.initializers.normal(), (2,), dtype=jnp.float16)
  f, o = check(lambda L: fn, lambda M, fn: M.init(fn)(KEY))
  assert f[0][:2] == o[0][:2]


@pytest.mark.parametrize('mutable', [True, ['stats', 'other'], 'stats', lift.DenyList('params'), [], False])
def test_apply_return_shape_for_every_mutable_filter_matches_flax(mutable):
  flax_mutable = flax_scope.DenyList('params') if isinstance(mutable, lift.DenyList) else mutable
  def fn(s):
    s.variable('stats', 'x', lambda: jnp.float32(3)) if s.is_mutable_collection('stats') else None
    return s.is_mutable_collection('params'), s.is_mutable_collection('stats')
  variables = {'params': {'a': jnp.float32(1)}, 'c': {'z': jnp.float32(2)}}
  f = flax_scope.apply(fn, mutable=flax_mutable)(variables)
  o = lift.apply(fn, mutable=mutable)(variables)
  assert_same(f, o)


def test_variables_and_mutable_variables_on_root_and_child_match_flax():
  def fn(s):
    s.param('a', lambda k: jnp.float32(1))
    s.variable('st', 'b', lambda: jnp.float32(2))
    c = s.push('c')
    c.param('w', lambda k: jnp.float32(5))
    return s.variables(), s.mutable_variables(), c.variables(), c.mutable_variables()
  variables = {'params': {'a': jnp.float32(1), 'c': {'w': jnp.float32(5)}}, 'other': {'q': jnp.float32(0)}}
  for mutable in ['st', True]:
    check(lambda L: fn, lambda M, fn: M.apply(fn, mutable=mutable)(variables))


def test_empty_collections_are_kept_as_flax():
  fn = lambda s: s.variable('stats', 'a', lambda: jnp.float32(1)).value
  check(lambda L: fn, lambda M, fn: M.apply(fn, mutable=True)({'params': {}}))



def test_scope_has_temporary_like_flax():
  with lift.bind({}).temporary() as scope:
    assert scope.variables() == {}


# -- filters ----------------------------------------------------------------------------------

def _filters(M):
  D = M.DenyList
  return [True, False, 'a', ['a', 'b'], ('b', 'c'), {'c'}, [], D('a'), D(['a', 'b']),
          D(True), D(False)]


@pytest.mark.parametrize('op', ['union_filters', 'intersect_filters', 'subtract_filters'])
def test_filter_algebra_denotes_the_same_sets_as_flax(op):
  names = ['a', 'b', 'c', 'd']
  for fa, la in zip(_filters(flax_scope), _filters(lift)):
    for fb, lb in zip(_filters(flax_scope), _filters(lift)):
      rf, rl = getattr(flax_scope, op)(fa, fb), getattr(lift, op)(la, lb)
      assert [flax_scope.in_filter(rf, n) for n in names] == [lift.in_filter(rl, n) for n in names]
  for fa, la in zip(_filters(flax_scope), _filters(lift)):
    assert flax_scope.is_filter_empty(fa) == lift.is_filter_empty(la)


def test_group_collections_order_and_first_match_match_flax():
  xs = {'b': 1, 'a': 2, 'c': 3, 'd': 4}
  for filters in [('a', True), (True, 'a'), (['c', 'a'], 'DENY_c'), (False, 'b', ['b', 'c'])]:
    f = flax_scope.group_collections(xs, [flax_scope.DenyList('c') if x == 'DENY_c' else x for x in filters])
    o = lift.group_collections(xs, [lift.DenyList('c') if x == 'DENY_c' else x for x in filters])
    assert [list(g.items()) for g in f] == [list(g.items()) for g in o]


# -- vmap -------------------------------------------------------------------------------------

def _vmap_body(scope, x):
  y = dense(scope, x)
  st = scope.variable('stats', 'mean', lambda: jnp.zeros(3))
  st.value = st.value + y.mean(0)
  scope.variable('cache', 'v', lambda: jnp.ones(()))
  return y + jax.random.normal(scope.make_rng('dropout'), y.shape)


@pytest.mark.parametrize('config', [
    dict(variable_axes={'params': 1, 'stats': 0, 'cache': None},
         split_rngs={'params': True, 'dropout': False}, in_axes=1),
    dict(variable_axes={'params': 0, 'stats': 0, 'cache': None},
         split_rngs={'params': True, 'dropout': True}),
    dict(variable_axes={'params': None, 'stats': 0, 'cache': None},
         split_rngs={'params': False, 'dropout': True}),
    dict(variable_axes={True: 0}, split_rngs={True: True}),
    dict(variable_axes={'params': -1, 'DENY': 0}, split_rngs={'DENY_dropout': True, 'dropout': False}),
])
def test_vmap_several_variable_axes_and_split_rngs_match_flax(config):
  def build(L):
    D = flax_scope.DenyList if L is flax_lift else lift.DenyList
    axes = {(D('params') if k == 'DENY' else k): v for k, v in config['variable_axes'].items()}
    splits = {(D('dropout') if k == 'DENY_dropout' else k): v for k, v in config['split_rngs'].items()}
    return L.vmap(_vmap_body, variable_axes=axes, split_rngs=splits, in_axes=config.get('in_axes', 0))
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, XB))
  check(build, lambda M, fn: M.apply(fn, mutable='stats')(
      plain(f[1]), XB, rngs={'dropout': jax.random.key(2)}))


def test_vmap_axis_size_without_inputs_matches_flax():
  def body(scope):
    return scope.param('w', jax.nn.initializers.normal(), (2,)) + jax.random.uniform(scope.make_rng('dropout'))
  build = lambda L: L.vmap(body, variable_axes={'params': 0},
                           split_rngs={'params': True, 'dropout': True}, axis_size=4)
  f, o = check(build, lambda M, fn: M.init(fn)(RNGS))
  assert o[1]['params']['w'].shape == (4, 2)


def test_vmap_pytree_in_axes_and_out_axes_match_flax():
  def body(scope, a, b):
    w = scope.param('w', jax.nn.initializers.normal(), (3,))
    return {'p': a['u'] * w + b, 'q': a['v']}, (b * 2,)
  build = lambda L: L.vmap(body, variable_axes={'params': 0}, split_rngs={'params': True},
                           in_axes=({'u': 0, 'v': None}, 1), out_axes=({'p': 1, 'q': None}, 0))
  a = {'u': jnp.ones((2, 3)), 'v': jnp.arange(3.0)}
  check(build, lambda M, fn: M.init(fn)(RNGS, a, jnp.ones((3, 2))))


def test_vmap_nested_children_in_named_children_match_flax():
  def nested(scope, x):
    return scope.child(dense, 'b')(scope.child(dense, 'a')(x))
  def build(L):
    v = L.vmap(nested, variable_axes={'params': 0}, split_rngs={'params': True})
    return lambda s, x: s.child(v, 'outer')(x) + s.child(v, 'outer2')(x)
  check(build, lambda M, fn: M.init(fn)(RNGS, XB))


def _partitioned_dense(scope, x):
  k = scope.param('kernel', meta.with_partitioning(jax.nn.initializers.lecun_normal(), ('in', 'out')),
                  (x.shape[-1], 3))
  b = scope.param('bias', meta.with_partitioning(jax.nn.initializers.normal(0.1), ('out',)), (3,))
  return bias_add(x @ k, b)


@pytest.mark.parametrize('axis', [0, 1])
def test_vmap_partitioned_boxes_get_the_new_axis_name_as_flax(axis):
  build = lambda L: L.vmap(_partitioned_dense, variable_axes={'params': axis}, split_rngs={'params': True},
                           metadata_params={meta.PARTITION_NAME: 'batch'})
  f, o = check(build, lambda M, fn: M.init(fn)(RNGS, XB))
  names = jax.tree.map(lambda b: b.names, o[1], is_leaf=meta.is_axis_metadata)
  assert names['params']['kernel'] == (('batch', 'in', 'out') if axis == 0 else ('in', 'batch', 'out'))
  check(build, lambda M, fn: M.apply(fn)(plain(f[1]), XB))


def test_vmap_and_scan_logical_partitioning_boxes_match_flax():
  def body(scope, x):
    k = scope.param('kernel', flax_nn.with_logical_partitioning(
        jax.nn.initializers.lecun_normal(), ('embed', 'mlp')), (x.shape[-1], 3))
    return x @ k
  build = lambda L: L.vmap(body, variable_axes={'params': 0}, split_rngs={'params': True},
                           metadata_params={meta.PARTITION_NAME: 'heads'})
  check(build, lambda M, fn: M.init(fn)(RNGS, XB))
  build = lambda L: L.scan(lambda s, c: (body(s, c), None), variable_axes={'params': 0},
                           split_rngs={'params': True}, length=3,
                           metadata_params={meta.PARTITION_NAME: 'layers'})
  check(build, lambda M, fn: M.init(fn)(RNGS, X))


@pytest.mark.parametrize('transform', ['vmap', 'scan'])
def test_in_out_variable_axes_are_accepted_as_flax(transform):
  def body(scope, x):
    h = dense(scope, x)
    scope.put_variable('intermediates', 'h', h)
    return h
  axes = {'params': 0, 'intermediates': Out(0)}
  if transform == 'vmap':
    build = lambda L: L.vmap(body, variable_axes=axes, split_rngs={'params': True})
    run = lambda M, fn: M.init(fn)(RNGS, XB)
  else:
    build = lambda L: L.scan(lambda s, c, x: (c, body(s, x)), variable_axes=axes, split_rngs={'params': True})
    run = lambda M, fn: M.init(lambda s, x: fn(s, 0, x))(RNGS, XB)
  check(build, run)
  variables = {'params': {'kernel': jnp.ones((2, 3, 3)), 'bias': jnp.ones((2, 3))},
               'consts': {'c': jnp.ones((2,))}}
  build = lambda L: L.vmap(lambda s, x: dense(s, x) * s.get_variable('consts', 'c'),
                           variable_axes={'params': 0, 'consts': In(0)}, split_rngs={})
  check(build, lambda M, fn: M.apply(fn)(variables, XB))


# -- scan -------------------------------------------------------------------------------------

def _step(scope, c, x):
  h = dense(scope, c + x)
  n = scope.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))
  n.value = n.value + 1
  return jnp.tanh(h), h.sum(-1)


def _with_counter(sc):
  def fn(scope, c, xs):
    scope.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))  # Flax needs carries made outside
    return sc(scope, c, xs)
  return fn


@pytest.mark.parametrize('kwargs', [
    dict(variable_axes={'params': 0}, variable_carry='counter', split_rngs={'params': True}),
    dict(variable_broadcast='params', variable_carry='counter', split_rngs={'params': False}),
    dict(variable_axes={'params': 0, 'counter': 0}, split_rngs={'params': True}, reverse=True),
    dict(variable_axes={'params': 0, 'counter': 0}, split_rngs={'params': True},
         data_transform=lambda vg, rg: (jax.tree.map(lambda a: a * 2, vg), rg)),
])
def test_scan_variable_rules_reverse_and_data_transform_match_flax(kwargs):
  carried = kwargs.get('variable_carry') == 'counter'
  build = lambda L: _with_counter(L.scan(_step, **kwargs)) if carried else L.scan(_step, **kwargs)
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X, XS))
  check(build, lambda M, fn: M.apply(fn, mutable='counter')(plain(f[1]), X, XS))


@pytest.mark.parametrize('split', [True, False])
def test_scan_with_length_only_matches_flax(split):
  def step(scope, c):
    h = dense(scope, c)
    return jnp.tanh(h), jax.random.normal(scope.make_rng('dropout'), (2,))
  build = lambda L: L.scan(step, variable_axes={'params': 0},
                           split_rngs={'params': True, 'dropout': split}, length=3)
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  check(build, lambda M, fn: M.apply(fn)(plain(f[1]), X, rngs={'dropout': jax.random.key(9)}))


def test_scan_broadcast_markers_in_and_out_match_flax():
  def step(scope, c, x, b):
    w = scope.param('w', jax.nn.initializers.normal(), (3,))
    return c + x * b, ((c * b).sum(), w * 2)
  build = lambda L: L.scan(step, variable_broadcast='params', split_rngs={'params': False},
                           in_axes=(0, broadcast_marker(L)), out_axes=(0, broadcast_marker(L)))
  check(build, lambda M, fn: M.init(fn)(RNGS, X, XS, jnp.full((2, 3), 2.0)))
  def step2(scope, c, d):
    return c + d['a'] * d['b'], {'p': d['a'].sum(), 'q': d['b']}
  build = lambda L: L.scan(step2, in_axes=({'a': 0, 'b': broadcast_marker(L)},),
                           out_axes={'p': 0, 'q': broadcast_marker(L)})
  check(build, lambda M, fn: M.init(fn)(RNGS, X, {'a': jnp.ones((4, 2, 3)), 'b': jnp.full((2, 3), 2.0)}))


def test_scan_accepts_flax_broadcast_marker():
  step = lambda s, c, x, b: (c + x * b, None)
  build = lambda L: L.scan(step, in_axes=(0, axes_scan.broadcast))
  check(build, lambda M, fn: M.init(fn)(RNGS, X, XS, jnp.full((2, 3), 2.0)))


@pytest.mark.parametrize('in_axes, out_axes', [(1, (1, 0)), (0, -1), ((0, 1), 0)])
def test_scan_in_axes_and_out_axes_other_than_zero_match_flax(in_axes, out_axes):
  if isinstance(in_axes, tuple):
    step = lambda s, c, x, y: (c + x + y, (c * 2, x.sum(-1)))
    args = (XS, jnp.swapaxes(XS, 0, 1))
  else:
    step = lambda s, c, x: (c + x, (c * 2, x.sum(-1)))
    args = (jnp.moveaxis(XS, 0, in_axes),)
  build = lambda L: L.scan(step, in_axes=in_axes, out_axes=out_axes)
  check(build, lambda M, fn: M.init(fn)(RNGS, X, *args))


def test_scan_with_nested_children_and_dropout_in_a_named_child_matches_flax():
  def deep(scope, c, x):
    h = scope.child(dense, 'l2')(scope.child(dense, 'l1')(c + x))
    d = jax.random.bernoulli(scope.push('drop').make_rng('dropout'), 0.5, h.shape).astype(jnp.float32)
    return jnp.tanh(h) * d, d.sum()
  def build(L):
    sc = L.scan(deep, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True})
    def fn(scope, c, xs):
      pre = scope.param('pre', jax.nn.initializers.normal(), (2,))
      y = scope.child(sc, 'stack')(c, xs)
      return y, pre, scope.param('post', jax.nn.initializers.normal(), (2,))
    return fn
  check(build, lambda M, fn: M.init(fn)(RNGS, X, XS))


@pytest.mark.parametrize('axis', [0, 1])
def test_scan_partitioned_boxes_get_the_new_axis_name_as_flax(axis):
  build = lambda L: L.scan(lambda s, c: (_partitioned_dense(s, c), None), variable_axes={'params': axis},
                           split_rngs={'params': True}, length=2,
                           metadata_params={meta.PARTITION_NAME: 'layers'})
  f, o = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  assert o[1]['params']['bias'].names == (('layers', 'out') if axis == 0 else ('out', 'layers'))
  check(build, lambda M, fn: M.apply(fn)(plain(f[1]), X))


def test_scan_of_vmap_partitioned_names_match_flax():
  def build(L):
    inner = L.vmap(_partitioned_dense, variable_axes={'params': 0}, split_rngs={'params': True},
                   metadata_params={meta.PARTITION_NAME: 'ens'})
    return L.scan(lambda s, c: (inner(s, c), None), variable_axes={'params': 0},
                  split_rngs={'params': True}, length=2, metadata_params={meta.PARTITION_NAME: 'layers'})
  f, o = check(build, lambda M, fn: M.init(fn)(RNGS, XB))
  assert o[1]['params']['kernel'].names == ('layers', 'ens', 'in', 'out')


def test_scan_read_only_broadcast_collection_is_not_returned_as_flax():
  def step(s, c, x):
    w = s.param('w', jax.nn.initializers.normal(), (3,))
    k = s.get_variable('consts', 'k')
    n = s.variable('stats', 'n', lambda: jnp.zeros((), jnp.int32))
    n.value = n.value + 1
    return c * (w * k).reshape(1, 3) + x, None
  def build(L):
    sc = L.scan(step, variable_broadcast=['params', 'consts'], variable_carry='stats',
                split_rngs={'params': False})
    def fn(s, c, xs):
      s.variable('stats', 'n', lambda: jnp.zeros((), jnp.int32))
      return sc(s, c, xs)
    return fn
  consts = {'consts': {'k': jnp.full((3,), 2.0)}}
  for mutable in [True, ['params', 'stats']]:
    check(build, lambda M, fn: M.apply(fn, mutable=mutable)(consts, X, XS, rngs=RNGS))


# -- remat_scan -----------------------------------------------------------------------------------

def _remat_body(scope, c):
  h = dense(scope, c)
  n = scope.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))
  n.value = n.value + 1
  return jnp.tanh(h)


@pytest.mark.parametrize('lengths', [(2, 3), (1, 2, 2)])
def test_remat_scan_shapes_values_and_gradients_match_flax(lengths):
  build = lambda L: L.remat_scan(_remat_body, lengths=lengths)
  f, o = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  assert o[1]['params']['kernel'].shape == lengths + (3, 3)
  assert o[1]['counter']['n'].shape == lengths
  variables = plain(f[1])
  check(build, lambda M, fn: M.apply(fn, mutable='counter')(variables, X))
  check(build, lambda M, fn: jax.grad(lambda p: M.apply(fn, mutable='counter')(
      {**variables, 'params': p}, X)[0].sum())(variables['params']))


def test_remat_scan_broadcast_policy_and_dropout_match_flax():
  check(lambda L: L.remat_scan(_remat_body, lengths=(2, 2), variable_broadcast='params',
                               variable_axes={'counter': 0}, split_rngs={'params': False}),
        lambda M, fn: M.init(fn)(RNGS, X))
  check(lambda L: L.remat_scan(_remat_body, lengths=(2, 2),
                               policy=jax.checkpoint_policies.nothing_saveable),
        lambda M, fn: M.init(fn)(RNGS, X))
  def drop(scope, c):
    h = dense(scope, c)
    return h * jax.random.bernoulli(scope.make_rng('dropout'), 0.5, h.shape).astype(jnp.float32)
  check(lambda L: L.remat_scan(drop, lengths=(2, 3)), lambda M, fn: M.init(fn)(RNGS, X))


# -- checkpoint and jit ---------------------------------------------------------------------------

def _stack(scope, x, n, act):
  for i in range(n):
    x = scope.child(dense, f'd{i}')(x)
  return x if act is None else act(x)


def test_checkpoint_static_argnums_values_and_gradients_match_flax():
  build = lambda L: L.checkpoint(_stack, static_argnums=(1, 2))
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X, 2, jnp.tanh))
  check(build, lambda M, fn: jax.grad(lambda p: M.apply(fn)({'params': p}, X, 2, jnp.tanh).sum())(
      plain(f[1])['params']))
  check(lambda L: L.checkpoint(_stack, static_argnums=1, prevent_cse=False,
                               policy=jax.checkpoint_policies.everything_saveable),
        lambda M, fn: M.init(fn)(RNGS, X, 2, None))


def test_checkpoint_on_two_children_with_dropout_and_stats_matches_flax():
  def build(L):
    c = L.checkpoint(noisy_dense)
    return lambda s, x: (s.child(c, 'a')(x), s.child(c, 'b')(x), key_data(s.make_rng('dropout')))
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  check(build, lambda M, fn: M.apply(fn, mutable='stats')(plain(f[1]), X, rngs={'dropout': jax.random.key(3)}))



def test_checkpoint_accepts_concrete_false_as_flax():
  check(lambda L: L.checkpoint(_stack, static_argnums=(1, 2), concrete=False),
        lambda M, fn: M.init(fn)(RNGS, X, 2, None))


def _bn(scope, x):
  h = dense(scope, x)
  m = scope.variable('stats', 'm', lambda: jnp.zeros(3))
  n = scope.variable('stats', 'n', lambda: jnp.zeros((), jnp.int32))
  m.value = m.value * 0.9 + h.mean(0)
  n.value = n.value + 1
  return h


def test_jit_at_the_root_with_mutable_collections_matches_flax():
  build = lambda L: flax_style_jit(L, _bn)
  f, _ = check(build, lambda M, fn: M.init(fn)({'params': KEY}, X))
  check(build, lambda M, fn: M.apply(fn, mutable='stats')(plain(f[1]), X))
  def twice(L):
    j = flax_style_jit(L, _bn)
    return lambda s, x: j(s, j(s, x))
  check(twice, lambda M, fn: M.apply(fn, mutable='stats')(plain(f[1]), X))
  check(lambda L: flax_style_jit(L, lambda s, x: s.variable('stats', 'z', lambda: x.sum()).value, rngs=False),
        lambda M, fn: M.init(fn)({'params': KEY}, X))
  check(lambda L: flax_style_jit(L, _stack, static_argnames='n'),
        lambda M, fn: M.init(fn)({'params': KEY}, X, n=2, act=None))


# -- map_variables ------------------------------------------------------------------------------

def _transpose(cols):
  return jax.tree.map(lambda a: a.T if a.ndim == 2 else a, cols)


@pytest.mark.parametrize('kwargs', [dict(init=True), dict(init=True, mutable=True), dict(mutable=True)])
def test_map_variables_in_a_child_between_other_params_matches_flax(kwargs):
  def build(L):
    mv = L.map_variables(_bn, 'params', _transpose, _transpose, **kwargs)
    def fn(s, x):
      pre = s.param('pre', jax.nn.initializers.normal(), (2,))
      return pre, s.child(mv, 'mv')(x), s.param('post', jax.nn.initializers.normal(), (2,))
    return fn
  f, o = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  assert o[1]['params']['mv']['kernel'].shape == (3, 3)
  check(build, lambda M, fn: M.apply(fn, mutable=True)(plain(f[1]), X))


def test_map_variables_over_every_collection_and_swap_collection_match_flax():
  double = lambda c: jax.tree.map(lambda a: a * 2, c)
  half = lambda c: jax.tree.map(lambda a: a / 2, c)
  build = lambda L: L.map_variables(_bn, True, double, half, init=True, mutable=True)
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  check(build, lambda M, fn: M.apply(fn, mutable=True)(plain(f[1]), X))
  def swap(scope):
    a = scope.get_variable('a', 'x')
    scope.put_variable('a', 'x', a + 10)
    return a
  check(lambda L: L.swap_collection(swap, 'a', 'b'),
        lambda M, fn: M.apply(fn, mutable=True)({'a': {'x': jnp.float32(1)}, 'b': {'x': jnp.float32(2)}}))


def test_map_variables_init_with_part_of_the_mapped_collections_mutable():
  """map_variables(init=True) over ['params', 'stats'], applied with only 'stats' mutable:
  y and the new stats must be those of applying with everything mutable (Flax fails here too,
  with a missing "params" collection), so this compares with Flax's mutable=True run."""
  double = lambda c: jax.tree.map(lambda a: a * 2, c)
  half = lambda c: jax.tree.map(lambda a: a / 2, c)
  f, _ = both(lambda L: L.map_variables(_bn, ['params', 'stats'], double, half, init=True, mutable=True),
              lambda M, fn: M.init(fn)(RNGS, X))
  variables = plain(f[1])
  flax_fn = flax_lift.map_variables(_bn, ['params', 'stats'], double, half, init=True, mutable=True)
  y_flax, state_flax = flax_scope.apply(flax_fn, mutable=True)(variables, X)
  our_fn = lift.map_variables(_bn, ['params', 'stats'], double, half, init=True, mutable=True)
  y, state = lift.apply(our_fn, mutable='stats')(variables, X)
  assert_same((y_flax, state_flax['stats']), (y, state['stats']))


# -- control flow -------------------------------------------------------------------------------

def _cond_model(L):
  def true_fn(scope, x):
    return noisy_dense(scope, x)
  def false_fn(scope, x):  # no draw: where both branches draw, the keys differ by design (SPEC)
    h = -scope.child(dense, 'd')(x)
    n = scope.variable('stats', 'n', lambda: jnp.zeros((), jnp.int32))
    n.value = n.value + 2
    return h
  def fn(scope, x, pred):
    pre = scope.param('pre', jax.nn.initializers.normal(), (2,))
    y = L.cond(pred, true_fn, false_fn, scope, x)
    post = scope.param('post', jax.nn.initializers.normal(), (2,))
    return y, pre, post, key_data(scope.make_rng('dropout'))
  return fn


def test_cond_init_with_the_first_branch_and_apply_match_flax():
  f, _ = check(_cond_model, lambda M, fn: M.init(fn)(RNGS, X, True))
  for pred in [True, False]:
    check(_cond_model, lambda M, fn: M.apply(fn, mutable='stats')(
        plain(f[1]), X, jnp.array(pred), rngs={'dropout': jax.random.key(3)}))


def test_switch_init_with_the_first_branch_and_apply_match_flax():
  branches = [lambda s, x: s.child(dense, 'd')(x), lambda s, x: 2 * s.child(dense, 'd')(x),
              lambda s, x: jnp.tanh(s.child(dense, 'd')(x))]
  build = lambda L: (lambda s, x, i: L.switch(i, branches, s, x))
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X, 0))
  for i in [0, 1, 2, 7, -3]:
    check(build, lambda M, fn: M.apply(fn)(plain(f[1]), X, jnp.array(i)))


def _while_model(L, split):
  def fn(scope, x):
    scope.variable('state', 'acc', lambda: jnp.zeros(3))
    scope.param('w', jax.nn.initializers.normal(), (3, 3))
    def body(s, c):
      i, h = c
      acc = s.variable('state', 'acc')
      h = jnp.tanh(h @ s.get_variable('params', 'w')) + jax.random.normal(s.make_rng('dropout'), h.shape)
      acc.value = acc.value + h.sum(0)
      return i + 1, h
    y = L.while_loop(lambda s, c: c[0] < 3, body, scope, (0, x),
                     carry_variables='state', split_rngs={'dropout': split})
    return y, key_data(scope.make_rng('dropout'))
  return fn


@pytest.mark.parametrize('split', [True, False])
def test_while_loop_carry_variables_and_body_rngs_match_flax(split):
  build = lambda L: _while_model(L, split)
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  check(build, lambda M, fn: M.apply(fn, mutable='state')(plain(f[1]), X, rngs={'dropout': jax.random.key(3)}))


@pytest.mark.parametrize('split', [False, True])
def test_while_loop_cond_and_body_draw_different_keys_as_flax(split):
  def build(L):
    def fn(scope):
      def cond_fn(s, c):
        i, last_body_key = c
        cond_key = key_data(s.make_rng('dropout'))
        # Runs once in Flax; in ours, while the keys collide, up to 5 times.
        return (i < 1) | (jnp.all(cond_key == last_body_key) & (i < 5))
      def body_fn(s, c):
        return c[0] + 1, key_data(s.make_rng('dropout'))
      init = (0, jnp.zeros((2,), jnp.uint32))
      y = L.while_loop(cond_fn, body_fn, scope, init, split_rngs={'dropout': split})
      return y, key_data(scope.make_rng('dropout'))
    return fn
  check(build, lambda M, fn: M.apply(fn)({}, rngs=RNGS))


# -- autodiff -------------------------------------------------------------------------------------

def _loss(scope, x):
  h = scope.child(dense, 'd')(x)
  n = scope.variable('stats', 'n', lambda: jnp.zeros((), jnp.int32))
  n.value = n.value + 1
  return jnp.sum(h ** 2) + jax.random.normal(scope.make_rng('dropout'))


def _loss_aux(scope, x):
  return _loss(scope, x), {'x': x.sum()}


def _trained():
  _, variables = lift.init(lambda s, x: _loss(s, x))(RNGS, X)
  return variables


def test_vjp_variants_match_flax():
  variables = _trained()
  def plain_vjp(L):
    def fn(s, x):
      y, bwd = L.vjp(_loss, s, x)
      return y, bwd(jnp.ones_like(y)), key_data(s.make_rng('dropout'))
    return fn
  check(plain_vjp, lambda M, fn: M.init(fn)(RNGS, X))
  check(plain_vjp, lambda M, fn: M.apply(fn, mutable='stats')(variables, X, rngs=RNGS))
  def aux_vjp(L):
    def fn(s, x):
      y, bwd, aux = L.vjp(_loss_aux, s, x, has_aux=True, vjp_variables='params', variables=True)
      return y, bwd(jnp.ones_like(y)), aux
    return fn
  check(aux_vjp, lambda M, fn: M.apply(fn, mutable='stats')(variables, X, rngs=RNGS))
  float_state = jax.tree.map(lambda a: a.astype(jnp.float32), variables)
  def two_collections(L):
    def fn(s, x):
      y, bwd = L.vjp(lambda s, x: _loss(s, x) * s.get_variable('stats', 'n'), s, x,
                     vjp_variables=['params', 'stats'])
      return y, bwd(jnp.ones_like(y))
    return fn
  check(two_collections, lambda M, fn: M.apply(fn, mutable='stats')(float_state, X, rngs=RNGS))


def test_value_and_grad_and_jvp_match_flax():
  variables = _trained()
  check(lambda L: (lambda s, x: L.value_and_grad(_loss, s, x)), lambda M, fn: M.init(fn)(RNGS, X))
  check(lambda L: (lambda s, x: L.value_and_grad(_loss_aux, s, x, has_aux=True)),
        lambda M, fn: M.apply(fn, mutable='stats')(variables, X, rngs=RNGS))
  check(lambda L: (lambda s, x, y: L.value_and_grad(lambda s, a, b: _loss(s, a * b), s, x, y)),
        lambda M, fn: M.apply(fn, mutable='stats')(variables, X, X * 2, rngs=RNGS))
  tangent = jax.tree.map(jnp.ones_like, variables['params'])
  check(lambda L: (lambda s, x: L.jvp(_loss, s, (x,), (jnp.ones_like(x),), {'params': tangent})),
        lambda M, fn: M.apply(fn, mutable='stats')(variables, X, rngs=RNGS))
  check(lambda L: (lambda s, x: (L.jvp(_loss, s, (x,), (jnp.ones_like(x),), {}),
                                 key_data(s.make_rng('dropout')))),
        lambda M, fn: M.init(fn)(RNGS, X))


def test_autodiff_over_a_tuple_of_scopes_matches_flax():
  _, variables = lift.init(lambda s, x: dense(s.push('b'), dense(s.push('a'), x)))({'params': KEY}, X)
  def two(scopes, x):
    a, b = scopes
    return dense(b, dense(a, x)).sum()
  def vjp_model(L):
    def fn(s, x):
      _, bwd = L.vjp(two, (s.push('a'), s.push('b')), x)
      return bwd(jnp.ones(()))
    return fn
  check(vjp_model, lambda M, fn: M.apply(fn)(variables, X))
  ta = jax.tree.map(jnp.ones_like, variables['params']['a'])
  tb = jax.tree.map(jnp.zeros_like, variables['params']['b'])
  check(lambda L: (lambda s, x: L.jvp(two, (s.push('a'), s.push('b')), (x,), (jnp.zeros_like(x),),
                                      ({'params': ta}, {'params': tb}))),
        lambda M, fn: M.apply(fn)(variables, X))
  check(lambda L: (lambda s, x: L.value_and_grad(two, (s.push('a'), s.push('b')), x)),
        lambda M, fn: M.apply(fn)(variables, X))


def _custom_dense(L, scale_params=2.0):
  def fn(s, x):
    return s.child(dense, 'd')(x) + jax.random.normal(s.make_rng('dropout'), (2, 3))
  def fwd(s, x):
    return L.vjp(fn, s, x)
  def bwd(vjp_fn, g):
    params_t, x_t = vjp_fn(g)
    return jax.tree.map(lambda a: a * scale_params, params_t), x_t * 3
  cv = L.custom_vjp(fn, fwd, bwd)
  return lambda s, x: cv(s, x) + jax.random.normal(s.make_rng('dropout'), (2, 3))


def test_custom_vjp_values_rngs_and_gradients_match_flax():
  f, _ = check(_custom_dense, lambda M, fn: M.init(fn)(RNGS, X))
  params = plain(f[1])['params']
  check(_custom_dense, lambda M, fn: M.apply(fn)({'params': params}, X, rngs=RNGS))
  check(_custom_dense, lambda M, fn: jax.value_and_grad(
      lambda p, x: M.apply(fn)({'params': p}, x, rngs=RNGS).sum(), argnums=(0, 1))(params, X))


def test_custom_vjp_nondiff_argnums_and_grad_vars_match_flax():
  _, variables = lift.init(lambda s, x: dense(s.push('d'), x))({'params': KEY}, X)
  def nondiff(L):
    def fn(s, x, k):
      return s.child(dense, 'd')(x) * k
    def fwd(s, x, k):
      return L.vjp(lambda s, x: fn(s, x, k), s, x)
    def bwd(k, vjp_fn, g):
      params_t, x_t = vjp_fn(g)
      return params_t, x_t * k
    return L.custom_vjp(fn, fwd, bwd, nondiff_argnums=(2,))
  check(nondiff, lambda M, fn: jax.grad(lambda p, x: M.apply(fn)({'params': p}, x, 2.0).sum(),
                                        argnums=(0, 1))(variables['params'], X))
  def grad_vars(L):
    def fn(s, x):
      return s.child(dense, 'd')(x) * s.get_variable('consts', 'c')
    def fwd(s, x):
      return L.vjp(fn, s, x, vjp_variables=['params', 'consts'])
    return L.custom_vjp(fn, fwd, lambda vjp_fn, g: vjp_fn(g), grad_vars=['params', 'consts'])
  all_vars = {'params': variables['params'], 'consts': {'c': jnp.float32(2.0)}}
  check(grad_vars, lambda M, fn: jax.grad(lambda v, x: M.apply(fn)(v, x).sum(), argnums=(0, 1))(all_vars, X))


# -- scope trees, nesting, rng fallback -------------------------------------------------------------

def _two_scopes(scopes, x):
  a, b = scopes
  y = dense(b, dense(a, x))
  n = b.variable('stats', 'n', lambda: jnp.zeros((), jnp.int32))
  n.value = n.value + 1
  return y + jax.random.normal(a.make_rng('dropout'), y.shape)


_SCOPE_TREE_TRANSFORMS = {
    'vmap': lambda L: L.vmap(_two_scopes, variable_axes={'params': 0, 'stats': 0},
                             split_rngs={'params': True, 'dropout': True}, axis_size=2, in_axes=None),
    'checkpoint': lambda L: L.checkpoint(_two_scopes),
    'scan': lambda L: (lambda sc: lambda s, x: sc(s, x)[0])(L.scan(
        lambda s, c: (_two_scopes(s, c), None), variable_axes={'params': 0, 'stats': 0},
        split_rngs={'params': True, 'dropout': True}, length=2)),
}


@pytest.mark.parametrize('name', sorted(_SCOPE_TREE_TRANSFORMS))
@pytest.mark.parametrize('tree', ['siblings', 'parent_and_child'])
def test_transforms_over_scope_trees_match_flax(name, tree):
  def build(L):
    t = _SCOPE_TREE_TRANSFORMS[name](L)
    def fn(s, x):
      s.param('pre', jax.nn.initializers.normal(), (2,))
      if tree == 'siblings':
        return t((s.push('a'), s.push('b')), x)
      c = s.push('a')
      return t((c, c.push('b')), x)
    return fn
  f, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X))
  check(build, lambda M, fn: M.apply(fn, mutable='stats')(plain(f[1]), X, rngs={'dropout': jax.random.key(3)}))


_NESTED = {
    'vmap(scan)': lambda L: L.vmap(
        lambda s, x: L.scan(lambda s, c, x: (c + 1, noisy_dense(s, x)), variable_axes={'params': 0, 'stats': 0},
                            split_rngs={'params': True, 'dropout': True})(s, 0, x)[1],
        variable_axes={'params': 0, 'stats': 0}, split_rngs={'params': True, 'dropout': True}),
    'scan(checkpoint)': lambda L: (lambda sc: lambda s, x: sc(s, 0, x))(L.scan(
        lambda s, c, x: (c, L.checkpoint(noisy_dense)(s, x)), variable_axes={'params': 0, 'stats': 0},
        split_rngs={'params': True, 'dropout': True})),
    'vmap(remat_scan)': lambda L: L.vmap(
        L.remat_scan(noisy_dense, lengths=(2, 2), variable_axes={'params': 0, 'stats': 0},
                     split_rngs={'params': True, 'dropout': True}),
        variable_axes={'params': 0, 'stats': 0}, split_rngs={'params': True, 'dropout': True}),
    'vmap(vjp)': lambda L: L.vmap(
        lambda s, x: (lambda y_bwd: (y_bwd[0], y_bwd[1](jnp.ones(()))))(
            L.vjp(lambda s, x: noisy_dense(s, x).sum(), s, x, variables=True)),
        variable_axes={'params': 0, 'stats': 0}, split_rngs={'params': True, 'dropout': True}),
}


@pytest.mark.parametrize('name', sorted(_NESTED))
def test_nested_transforms_match_flax(name):
  x = jnp.linspace(-1.0, 1.0, 24).reshape(2, 4, 3)
  f, _ = check(_NESTED[name], lambda M, fn: M.init(fn)(RNGS, x))
  check(_NESTED[name], lambda M, fn: M.apply(fn, mutable='stats')(
      plain(f[1]), x, rngs={'dropout': jax.random.key(2)}))


def test_vmap_of_while_loop_matches_flax():
  def build(L):
    def inner(s, x):
      s.param('w', jax.nn.initializers.normal(), (3, 3))
      body = lambda s, c: (c[0] + 1, jnp.tanh(c[1] @ s.get_variable('params', 'w')))
      return L.while_loop(lambda s, c: c[0] < 2, body, s, (0, x))[1]
    return L.vmap(inner, variable_axes={'params': 0}, split_rngs={'params': True})
  check(build, lambda M, fn: M.init(fn)(RNGS, XB))


def test_streams_not_lifted_fall_back_to_params_as_flax():
  def body(s, x):
    return (x + jax.random.normal(s.make_rng('dropout'), x.shape)
            + jax.random.normal(s.push('c').make_rng('other'), x.shape)), s.has_rng('dropout')
  rngs = {'params': jax.random.key(1), 'dropout': jax.random.key(2)}
  check(lambda L: L.vmap(body, variable_axes={}, split_rngs={'params': True}, out_axes=(0, None)),
        lambda M, fn: M.apply(fn)({}, XB, rngs=rngs))
  check(lambda L: L.checkpoint(body, rngs='params'), lambda M, fn: M.apply(fn)({}, X, rngs=rngs))


def test_flags_and_paths_inside_transforms_match_flax():
  def build(L):
    seen = {}
    def inner(s, x):
      seen.update(flags=dict(s.flags), path=s.path, name=s.name, child=s.push('c').path)
      return x
    def fn(s, x):
      a = s.push('a')
      L.vmap(inner, variable_axes={}, split_rngs={})(a, XB)
      L.checkpoint(inner)(a.push('b'), x)
      return seen
    return fn
  f, o = both(build, lambda M, fn: M.init(fn, flags={'foo': 1})(RNGS, X)[0])
  assert f == o


# -- mutability inside transforms ---------------------------------------------------------------------

_COLS = ('params', 'stats', 'cache', 'other')


def _mutability(s, x):
  return x, {c: s.is_mutable_collection(c) for c in _COLS}


@pytest.mark.parametrize('mutable', [True, ['stats'], ['params', 'stats', 'cache'], False])
@pytest.mark.parametrize('name', ['checkpoint', 'map_variables', 'map_variables_mutable', 'vjp'])
def test_is_mutable_collection_inside_transforms_that_lift_everything_matches_flax(name, mutable):
  def build(L):
    if name == 'checkpoint':
      return L.checkpoint(_mutability)
    if name.startswith('map_variables'):
      return L.map_variables(_mutability, 'params', mutable=name.endswith('mutable'))
    def fn(s, x):
      seen = {}
      L.vjp(lambda s, x: (seen.update(_mutability(s, x)[1]), x.sum())[1], s, x, variables=True)
      return x, seen
    return fn
  f, o = both(build, lambda M, fn: M.apply(fn, mutable=mutable)({'params': {'w': jnp.ones(2)}}, X))
  if mutable is not False:
    f, o = f[0], o[0]
  assert f[1] == o[1]


@pytest.mark.parametrize('name', ['vmap', 'scan', 'checkpoint', 'cond', 'while_loop'])
def test_unlifted_collection_is_immutable_inside_as_flax(name):
  """As Flax: a collection mutable outside that the transform does not return is immutable
  inside, so guarded writes (`sow`) skip it; an unguarded write is an error naming it."""
  guarded = True
  def sow_like(s, x):
    h = dense(s, x)
    if not guarded or s.is_mutable_collection('intermediates'):
      s.put_variable('intermediates', 'h', h)
    return h
  def build(L):
    if name == 'vmap':
      return L.vmap(sow_like, variable_axes={'params': 0}, split_rngs={'params': True})
    if name == 'scan':
      sc = L.scan(lambda s, c, x: (c, sow_like(s, x)), variable_axes={'params': 0}, split_rngs={'params': True})
      return lambda s, x: sc(s, None, x)[1]
    if name == 'checkpoint':
      return L.checkpoint(sow_like, variables='params')
    if name == 'cond':
      return lambda s, x: L.cond(True, sow_like, sow_like, s, x, variables='params')
    def fn(s, x):
      s.param('kernel', jax.nn.initializers.lecun_normal(), (3, 3))
      s.param('bias', jax.nn.initializers.normal(0.1), (3,))
      return L.while_loop(lambda s, c: c[0] < 2, lambda s, c: (c[0] + 1, sow_like(s, c[1])),
                          s, (0, x), broadcast_variables='params')[1]
    return fn
  f, _ = both(build, lambda M, fn: M.init(fn, mutable='params')({'params': KEY}, XB))
  check(build, lambda M, fn: M.apply(fn, mutable='intermediates')(plain(f[1]), XB))
  guarded = False
  with pytest.raises(lift.errors.UnliftedCollectionError,
                     match=f'"intermediates" is immutable inside the lifted `{name}`'):
    lift.apply(build(lift), mutable='intermediates')(plain(f[1]), XB)



# -- signatures ---------------------------------------------------------------------------------------

_SAME_PARAMETERS = ['vmap', 'scan', 'checkpoint', 'remat', 'jit', 'pack', 'map_variables',
                    'swap_collection', 'cond', 'switch', 'while_loop', 'vjp', 'jvp',
                    'value_and_grad', 'custom_vjp', 'remat_scan', 'fold_rngs']


def _parameters(fn):
  return [p for p in inspect.signature(fn).parameters]


@pytest.mark.parametrize('name', _SAME_PARAMETERS)
def test_lifted_transform_accepts_every_flax_parameter_name(name):
  ours = _parameters(getattr(lift, name))
  theirs = _parameters(getattr(flax_lift, name))
  assert [p for p in theirs if p not in ours] == []
  # Positional order of the shared parameters is Flax's, so positional calls port.
  assert [p for p in ours if p in theirs] == [p for p in theirs if p in ours]


# -- Flax's extra parameters do what they say ---------------------------------------------------

def test_flax_only_parameters_behave():
  def fn(scope, x):
    return dense(scope, x)
  variables = lift.init(fn)(KEY, X)[1]
  jitted = lift.jit(fn, backend='cpu')
  with pytest.warns(DeprecationWarning, match='backend'):  # JAX's, so the option reached jax.jit
    np.testing.assert_allclose(lift.apply(jitted)(variables, X), lift.apply(fn)(variables, X))
  with pytest.raises(lift.errors.TransformArgumentError, match='static_argnums'):
    lift.checkpoint(fn, concrete=True)
  step = lambda s, c, x: (c + dense(s, x).sum(), c)
  split = lift.scan(step, variable_broadcast='params', split_rngs={'params': False},
                    _split_transpose=True, check_constancy_invariants=False)
  plain_scan = lift.scan(step, variable_broadcast='params', split_rngs={'params': False})
  xs = jnp.stack([X, 2 * X])
  v = lift.init(plain_scan)(KEY, 0.0, xs)[1]
  grad = lambda f: jax.grad(lambda p: lift.apply(f)({'params': p}, 0.0, xs)[0])(v['params'])
  assert_same(grad(split), grad(plain_scan))

  def identity(scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
    scope = scope_fn(variable_groups, rng_groups)
    return fn(scope, *args, **kwargs), repack_fn(scope)
  packed = lift.pack(identity, (True,), (True,), (True,), name='identity', enable_kwargs=False)
  with pytest.raises(lift.errors.TransformArgumentError, match=r"identity: keyword arguments \['x'\]"):
    lift.apply(packed)(variables, x=X)
  with lift.bind(variables).temporary() as scope:
    fn(scope, X)
  with pytest.raises(lift.InvalidScopeError):
    scope.get_variable('params', 'kernel')
