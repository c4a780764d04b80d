"""SPEC.md audit: every concrete promise of SPEC, checked against the code (and Flax).

Passing checks are plain tests; the SPEC/Flax discrepancies found by the audit
are strict xfails, so this file passes now and flips when they are fixed.
"""
import dataclasses
import hashlib
import inspect
import itertools

import flax.core as fcore
import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import lift as flift
from flax.core import scope as fscope
from jax import lax

import lift
import linen_ext
from lift import loops

KEY = jax.random.key(0)
kd = jax.random.key_data
tmap = jax.tree_util.tree_map


def plain(tree):
  """FrozenDicts and dicts alike, as nested dicts."""
  return tmap(lambda a: a, dict(tree)) if hasattr(tree, 'keys') else tree


def same_tree(a, b, atol=1e-6):
  a, b = plain(a), plain(b)
  if jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(b):
    return False
  return all(np.allclose(np.asarray(u), np.asarray(v), atol=atol)
             for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def shapes(tree):
  return tmap(jnp.shape, plain(tree))


def hand_key(key, suffix, counter):
  """SPEC's derivation: fold_in(key, u32(first 4 bytes BE of SHA-1(suffix items, counter)))."""
  h = hashlib.sha1()
  for item in list(suffix) + [counter]:
    if isinstance(item, str):
      h.update(item.encode('utf-8'))
    else:
      h.update(int(item).to_bytes(max(1, (int(item).bit_length() + 7) // 8), 'big'))
  return jax.random.fold_in(key, jnp.uint32(int.from_bytes(h.digest()[:4], 'big')))


def same_key(a, b):
  return np.array_equal(kd(a), kd(b))


# ---------------------------------------------------------------------------------------
# Signatures: parameter names, order and defaults as Flax (extras allowed after them).


def _params(fn):
  return [(p.name, p.default, p.kind) for p in inspect.signature(fn).parameters.values()]


def _check_flax_signature(ours, theirs, ignore=()):
  o = [p for p in _params(ours) if p[0] not in ignore]
  t = [p for p in _params(theirs) if p[0] not in ignore]
  names_o = [p[0] for p in o]
  for name, default, _ in t:
    assert name in names_o, f'{ours.__name__}: missing parameter {name}'
  # Flax's parameters appear in the same relative order.
  positions = [names_o.index(name) for name, _, _ in t]
  assert positions == sorted(positions), (names_o, [p[0] for p in t])
  od = {p[0]: p[1] for p in o}
  for name, default, _ in t:
    if default is inspect.Parameter.empty:
      continue
    if isinstance(default, fcore.DenyList):
      assert _sem(od[name], lift.in_filter) == _sem(default, fscope.in_filter), name
      continue
    if callable(default) and not isinstance(default, type):
      continue  # identity lambdas
    assert dict(od[name]) == dict(default) if hasattr(default, 'keys') else od[name] == default, (
        name, od[name], default)


LIFT_NAMES = ['vmap', 'scan', 'checkpoint', 'remat', 'jit', 'map_variables', 'swap_collection',
              'cond', 'switch', 'while_loop', 'vjp', 'jvp', 'value_and_grad', 'custom_vjp',
              'remat_scan', 'fold_rngs', 'init', 'apply', 'bind']


@pytest.mark.parametrize('name', LIFT_NAMES)
def test_lift_signature_matches_flax_core(name):
  theirs = getattr(flift, name, None) or getattr(fcore, name)
  _check_flax_signature(getattr(lift, name), theirs)


def test_pack_signature_matches_spec():
  params = [p.name for p in inspect.signature(lift.pack).parameters.values()]
  assert params[:5] == ['fn', 'in_variable_filters', 'out_variable_filters', 'rng_filters', 'name']
  assert inspect.signature(lift.pack).parameters['name'].default is None
  _check_flax_signature(lift.pack, flift.pack, ignore=('enable_kwargs',))


LINEN_NAMES = ['vmap', 'scan', 'checkpoint', 'remat', 'jit', 'map_variables', 'cond', 'switch',
               'while_loop', 'vjp', 'jvp', 'grad', 'value_and_grad', 'custom_vjp', 'remat_scan',
               'fold_rngs', 'add_metadata_axis', 'init', 'apply', 'init_with_output']


@pytest.mark.parametrize('name', LINEN_NAMES)
def test_linen_ext_signature_matches_flax(name):
  _check_flax_signature(getattr(linen_ext, name), getattr(fnn, name))


SCOPE_METHODS = ['param', 'variable', 'make_rng', 'has_rng', 'push', 'child', 'reserve',
                 'default_name', 'get_variable', 'put_variable', 'has_variable',
                 'is_mutable_collection', 'variables', 'mutable_variables', 'rewound',
                 'invalidate']


@pytest.mark.parametrize('name', SCOPE_METHODS)
def test_scope_method_signature_matches_flax(name):
  _check_flax_signature(getattr(lift.Scope, name), getattr(fscope.Scope, name))


MODULE_METHODS = ['param', 'variable', 'make_rng', 'sow', 'is_initializing',
                  'is_mutable_collection', 'has_variable', 'has_rng', 'put_variable',
                  'get_variable', 'init', 'init_with_output', 'apply', 'bind', 'unbind', 'clone']


@pytest.mark.parametrize('name', MODULE_METHODS)
def test_module_method_signature_matches_flax(name):
  _check_flax_signature(getattr(linen_ext.Module, name), getattr(fnn.Module, name))


def test_module_api_names_exist():
  for name in ['Module', 'compact', 'nowrap', 'broadcast', 'Stacked', 'BlockSeq', 'scan_layers',
               'per_layer', 'from_flax', 'as_scan', 'shard_map']:
    assert hasattr(linen_ext, name), name
  assert isinstance(linen_ext.Module.variables, property)
  assert isinstance(fnn.Module.variables, property)


def test_loops_signatures():
  scan_sig = inspect.signature(loops.scan).parameters
  assert list(scan_sig)[:2] == ['f', 'axis'] and scan_sig['axis'].default == 0
  for name, default in [('remat', False), ('reverse', False), ('unroll', 1), ('length', None)]:
    assert scan_sig[name].kind is inspect.Parameter.KEYWORD_ONLY and scan_sig[name].default == default
  fold_sig = inspect.signature(loops.fold).parameters
  assert list(fold_sig)[:2] == ['f', 'axis'] and fold_sig['remat'].default is False
  assert fold_sig['remat'].kind is inspect.Parameter.KEYWORD_ONLY
  map_sig = inspect.signature(loops.map).parameters
  assert list(map_sig) == ['f', 'axis'] and map_sig['axis'].default == 0
  taps = inspect.signature(loops.scan_taps).parameters
  assert list(taps)[:6] == ['fn', 'sequences', 'outputs_info', 'non_sequences', 'n_steps',
                            'go_backwards']
  assert taps['n_steps'].default is None and taps['go_backwards'].default is False


def test_scan_checkpoint_policy_fields():
  fields = {f.name: f.default for f in dataclasses.fields(loops.ScanCheckpointPolicy)}
  assert fields['save_carries'] is True and fields['save_inputs'] is True
  assert fields['save_block_internals'] is False and tuple(fields['offload_block_internals']) == ()
  assert fields['nested'] is False and fields['prevent_cse'] is False
  assert list(fields)[:6] == ['save_carries', 'save_inputs', 'save_block_internals',
                              'offload_block_internals', 'nested', 'prevent_cse']


def test_stack_signatures():
  sig = inspect.signature(linen_ext.Stacked).parameters
  assert list(sig)[:2] == ['block_cls', 'length']
  for name in ['remat', 'metadata_params']:
    assert sig[name].kind is inspect.Parameter.KEYWORD_ONLY
  assert 'remat' in inspect.signature(linen_ext.BlockSeq).parameters
  for method in ['fold', 'scan', 'vmap', 'fold_via', 'scan_via', 'unstacked']:
    assert callable(getattr(linen_ext.Stacked, method)) and callable(getattr(linen_ext.BlockSeq, method))


# ---------------------------------------------------------------------------------------
# Scope, entry points, PRNG derivation.


def _draw_many(scope, n):
  return [scope.make_rng('params') for _ in range(n)][-1]


def test_prng_formula_by_hand_and_vs_flax():
  def f(scope):
    return (scope.make_rng('params'), scope.make_rng('params'),
            scope.push('child').make_rng('params'), scope.push('x').push('y').make_rng('dropout'),
            _draw_many(scope.push('many'), 300))
  rngs = {'params': KEY, 'dropout': jax.random.key(1)}
  ours, _ = lift.init(f)(rngs)
  theirs, _ = fcore.init(f)(rngs)
  expected = [hand_key(KEY, [], 1), hand_key(KEY, [], 2), hand_key(KEY, ['child'], 1),
              hand_key(jax.random.key(1), ['x', 'y'], 1), hand_key(KEY, ['many'], 300)]
  for o, t, e in zip(ours, theirs, expected):
    assert same_key(o, e) and same_key(o, t)


def test_single_key_means_params():
  def f(scope):
    return scope.make_rng('params'), scope.has_rng('params'), scope.has_rng('dropout')
  key, has_params, has_dropout = lift.apply(f)({}, rngs=KEY)
  assert has_params and not has_dropout
  assert same_key(key, lift.apply(f)({}, rngs={'params': KEY})[0])
  assert lift.bind({}, rngs=KEY).has_rng('params')
  assert same_key(key, fcore.apply(f)({}, rngs={'params': KEY})[0])

  def model(nn):
    class M(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(2)(x) + jax.random.normal(self.make_rng('params'), (1, 2))
    return M
  x = jnp.ones((1, 3))
  v = model(fnn)().init(KEY, x)
  assert same_tree(model(linen_ext)().apply(v, x, rngs=KEY),
                   model(fnn)().apply(v, x, rngs={'params': KEY}))


def test_param_draws_key_only_on_creation():
  def f(scope):
    scope.param('w', lambda r: jax.random.normal(r, ()))
    return scope.make_rng('params')
  y, v = lift.init(f)(KEY)
  assert same_key(y, hand_key(KEY, [], 2))
  assert same_key(lift.apply(f)(v, rngs=KEY), hand_key(KEY, [], 1))
  assert same_key(y, fcore.init(f)(KEY)[0])


def test_scope_methods_vs_flax():
  def f(scope):
    out = {}
    v = scope.variable('state', 'count', lambda: jnp.zeros(()))
    v.value = v.value + 1
    out['v'] = v.value
    out['default_name'] = scope.default_name('Dense')
    out['get'] = (scope.put_variable('col', 'x', 3), scope.get_variable('col', 'x'),
                  scope.get_variable('col', 'nope', 'dflt'))
    out['has'] = (scope.has_variable('col', 'x'), scope.has_variable('col', 'y'))
    out['mut'] = (scope.is_mutable_collection('col'), scope.is_mutable_collection('other'))

    def dense(s, x):
      return x @ s.param('w', jax.nn.initializers.normal(), (x.shape[-1], 2))
    out['child'] = (scope.child(dense, name='d')(jnp.ones((1, 3))),
                    scope.child(dense)(jnp.ones((1, 3))),
                    scope.child(dense, prefix='Layer_')(jnp.ones((1, 3))))
    out['paths'] = (scope.path, scope.push().path, scope.push(prefix='L').path,
                    scope.push('a').push('b').path)
    out['keys'] = sorted(scope.variables()), sorted(scope.mutable_variables())
    out['rewound'] = scope.rewound().default_name('Dense')
    try:
      scope.reserve('d')
      out['reserve'] = None
    except ValueError:
      out['reserve'] = 'ValueError'
    return out
  mutable = ['state', 'col', 'params']
  yo, vo = lift.init(f, mutable=mutable)(KEY)
  yf, vf = fcore.init(f, mutable=mutable)(KEY)
  assert same_tree(vo, vf)
  for key in yo:
    if key in ('paths', 'keys', 'rewound', 'reserve', 'default_name', 'mut', 'has'):
      assert yo[key] == yf[key], key
    elif key == 'get':
      assert yo[key][1:] == yf[key][1:]
    else:
      assert same_tree(yo[key], yf[key]), key


def test_apply_returns_mutated_and_bind():
  def cnt(scope):
    v = scope.variable('state', 'n', lambda: 0)
    v.value += 1
    return v.value
  for m in (lift, fcore):
    y, mutated = m.apply(cnt, mutable=['state'])({'state': {'n': 3}})
    assert y == 4 and plain(mutated) == {'state': {'n': 4}}
  assert lift.apply(lambda s: s.get_variable('state', 'n'))({'state': {'n': 3}}) == 3
  s = lift.bind({'params': {'w': 1.0}}, rngs=KEY)
  assert s.get_variable('params', 'w') == 1.0 and s.has_rng('params')


@pytest.mark.parametrize('transform', ['apply', 'checkpoint', 'jit', 'vmap', 'map_variables'])
def test_invalid_scope_after_return(transform):
  saved = []

  def inner(s, x):
    saved.append(s)
    return x

  wrap = {'checkpoint': lambda f: lift.checkpoint(f), 'jit': lambda f: lift.jit(f),
          'vmap': lambda f: lift.vmap(f, {}, {}), 'map_variables': lambda f: lift.map_variables(f, 'params')}

  if transform == 'apply':
    lift.init(inner)(KEY, 0.0)
    with pytest.raises(lift.InvalidScopeError):
      saved[0].param('z', lambda r: 1.0)
    return

  def outer(scope, x):
    wrap[transform](inner)(scope, x)
    with pytest.raises(lift.InvalidScopeError):
      saved[0].param('z', lambda r: 1.0)
    return x
  lift.init(outer)(KEY, jnp.ones((2,)))


def test_errors_importable():
  from lift import errors
  assert lift.LiftError is errors.LiftError
  assert lift.InvalidScopeError is errors.InvalidScopeError
  assert lift.ScanConversionError is errors.ScanConversionError
  for cls in (lift.InvalidScopeError, lift.ScanConversionError):
    assert issubclass(cls, lift.LiftError)


# ---------------------------------------------------------------------------------------
# Filters.

NAMES = ['params', 'batch_stats', 'cache', 'intermediates']
FILTERS = [True, False, 'params', ['params', 'cache'], ('batch_stats',), set(),
           lift.DenyList('params'), lift.DenyList(['params', 'cache']), lift.DenyList(True),
           lift.DenyList(False)]


def _to_flax(f):
  return fcore.DenyList(_to_flax(f.deny)) if isinstance(f, lift.DenyList) else f


def _sem(f, in_filter):
  return tuple(in_filter(f, n) for n in NAMES)


def test_filter_algebra_vs_flax():
  for f in FILTERS:
    assert _sem(f, lift.in_filter) == _sem(_to_flax(f), fscope.in_filter)
    assert lift.is_filter_empty(f) == fscope.is_filter_empty(_to_flax(f))
  ops = {'union_filters': lambda a, b: a or b, 'intersect_filters': lambda a, b: a and b,
         'subtract_filters': lambda a, b: a and not b}
  for f, g in itertools.product(FILTERS, FILTERS):
    for op, truth in ops.items():
      ours = _sem(getattr(lift, op)(f, g), lift.in_filter)
      expected = tuple(truth(lift.in_filter(f, n), lift.in_filter(g, n)) for n in NAMES)
      assert ours == expected, (op, f, g)
      assert ours == _sem(getattr(fscope, op)(_to_flax(f), _to_flax(g)), fscope.in_filter)


def test_group_collections_vs_flax():
  xs = {'params': 1, 'batch_stats': 2, 'cache': 3, 'other': 4}
  for flt in [(['params'], True), ('params', 'params'), (True,), (lift.DenyList('params'), 'params'), ()]:
    ours = lift.group_collections(xs, flt)
    theirs = fscope.group_collections(xs, tuple(_to_flax(f) for f in flt))
    assert ours == tuple(dict(t) for t in theirs)
    assert sum(len(g) for g in ours) <= len(xs)


# ---------------------------------------------------------------------------------------
# pack.


def test_pack_stages_are_named_functions():
  from lift import pack as pack_module
  import sys
  mod = sys.modules['lift.pack']
  del pack_module
  for name in ['dedup_scopes', 'filter_groups', 'reconstruct', 'repack', 'commit']:
    assert inspect.isfunction(getattr(mod, name)), name


def _seed_lift_transpose(lib):
  """The seed's example, as written (jax.tree_map is jax.tree_util.tree_map in jax 0.10)."""
  def lift_transpose(fn, target='params', variables=True, rngs=True):
    # by default we transpose 'params' and simply pass through all other variables.
    def wrapper(scope_fn, repack_fn, variable_groups, rng_groups, *args):
      # normally we would first call into a JAX transformed function here...
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
  return lift_transpose


def _scope_dense(scope, x, features):
  kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  bias = scope.param('bias', jax.nn.initializers.zeros, (features,))
  return x @ kernel + bias[None]


def test_seed_lift_transpose_runs_and_matches_flax():
  x = jnp.arange(6.0).reshape((3, 2))
  y, params = lift.init(_seed_lift_transpose(lift)(_scope_dense))(jax.random.PRNGKey(0), x, 4)
  fy, fparams = fcore.init(_seed_lift_transpose(flift)(_scope_dense))(jax.random.PRNGKey(0), x, 4)
  assert shapes(params) == {'params': {'kernel': (2, 4), 'bias': (4,)}}
  assert same_tree(params, fparams) and same_tree(y, fy)
  stored = {'params': {'kernel': jnp.arange(8.0).reshape(4, 2), 'bias': jnp.ones(4)}}
  assert same_tree(lift.apply(_seed_lift_transpose(lift)(_scope_dense))(stored, x, 4),
                   fcore.apply(_seed_lift_transpose(flift)(_scope_dense))(stored, x, 4))


def test_pack_unreturned_mutable_collection_names_it():
  def inner(scope_fn, repack_fn, vg, rg):
    scope = scope_fn(vg, rg)
    scope.variable('state', 's', lambda: 0).value = 1
    return 0, repack_fn(scope)
  packed = lift.pack(inner, (True,), ('params',), (True,), name='ident')
  with pytest.raises(lift.LiftError, match='state'):
    lift.init(lambda s: packed(s))(KEY)


def test_pack_dedups_nested_scopes():
  def inner(scope_fn, repack_fn, vg, rg):
    a, b = scope_fn(vg, rg)
    b.param('w', lambda r: 2.0)
    return (a.path, b.path), repack_fn((a, b))
  packed = lift.pack(inner, (True,), (True,), (True,))
  (paths, variables) = lift.init(lambda s: packed((s, s.push('c'))))(KEY)
  assert paths == ((), ('c',)) and plain(variables) == {'params': {'c': {'w': 2.0}}}


# ---------------------------------------------------------------------------------------
# Lifted transforms: rng values, static_argnums, jit caching, metadata.


def _body(scope, x):
  w = scope.param('w', jax.nn.initializers.normal(1.0), (x.shape[-1], 2))
  b = scope.push('sub').param('b', jax.nn.initializers.normal(1.0), (2,))
  y = x @ w
  return y + jnp.broadcast_to(b, y.shape)


def test_non_splitting_transforms_keep_untransformed_params():
  x = jnp.ones((3, 4))
  _, ref = lift.init(lambda s, x: s.child(_body, name='blk')(x))(KEY, x)
  _, fref = fcore.init(lambda s, x: s.child(_body, name='blk')(x))(KEY, x)
  assert same_tree(ref, fref)
  blk = lambda s, x: s.child(_body, name='blk')(x)
  for make in [lambda s, x: lift.checkpoint(blk)(s, x),
               lambda s, x: lift.cond(True, blk, blk, s, x),
               lambda s, x: lift.map_variables(blk, 'params', init=True)(s, x),
               lambda s, x: lift.jit(blk)(s, x)]:
    assert same_tree(lift.init(make)(KEY, x)[1], ref)


@pytest.mark.parametrize('kind', ['checkpoint', 'vmap', 'scan'])
def test_transform_params_vs_flax_core(kind):
  x = jnp.ones((3, 4))
  blk = lambda s, x: s.child(_body, name='blk')(x)
  make = {
      'checkpoint': lambda L: lambda s, x: L.checkpoint(blk)(s, x),
      'vmap': lambda L: lambda s, x: L.vmap(blk, variable_axes={'params': 0},
                                            split_rngs={'params': True})(s, x),
      'scan': lambda L: lambda s, x: L.scan(lambda s, c, x: (c, blk(s, x)),
                                            variable_axes={'params': 0},
                                            split_rngs={'params': True})(s, 0, x)[1],
  }[kind]
  yo, vo = lift.init(make(lift))(KEY, x)
  yf, vf = fcore.init(make(flift))(KEY, x)
  assert same_tree(vo, vf) and same_tree(yo, yf)


def test_vmap_split_key_formula():
  def f(scope, x):
    return lift.vmap(lambda s, x: s.make_rng('params'), variable_axes={},
                     split_rngs={'params': True})(scope.push('a'), x)
  keys, _ = lift.init(f)(KEY, jnp.ones((3, 2)))
  for i, raw in enumerate(jax.random.split(KEY, 3)):
    assert same_key(keys[i], hand_key(raw, ['a'], 1))
  fkeys, _ = fcore.init(lambda s, x: flift.vmap(lambda s, x: s.make_rng('params'), variable_axes={},
                                                split_rngs={'params': True})(s.push('a'), x))(KEY, jnp.ones((3, 2)))
  assert same_key(keys, fkeys)


def test_scan_split_keys_vs_flax_core():
  def f(L):
    return lambda s: L.scan(lambda s, c, x: (c, s.make_rng('dropout')), variable_axes={},
                            split_rngs={'dropout': True}, length=3)(s.push('blk'), 0, None)[1]
  assert same_key(lift.apply(f(lift))({}, rngs={'dropout': KEY}),
                  fcore.apply(f(flift))({}, rngs={'dropout': KEY}))


@pytest.mark.parametrize('name', ['checkpoint', 'jit', 'map_variables'])
def test_inner_scopes_continue_outer_counters(name):
  wrap = {'checkpoint': lift.checkpoint, 'jit': lift.jit,
          'map_variables': lambda f: lift.map_variables(f, 'params')}[name]

  def outer(scope):
    return (scope.make_rng('params'), wrap(lambda s: s.make_rng('params'))(scope),
            scope.make_rng('params'))
  keys, _ = lift.init(outer)(KEY)
  for i, key in enumerate(keys):
    assert same_key(key, hand_key(KEY, [], i + 1))


def _static_body(scope, x, n):
  w = scope.param('w', jax.nn.initializers.normal(), (x.shape[-1], n))
  return jnp.tile(x @ w, (1, n))  # n must be a Python int


def test_lift_static_argnums_counting():
  x = jnp.ones((1, 3))
  # checkpoint: 0 is the first argument after the scope (as flax.core.lift).
  for L, M in [(lift, lift), (flift, fcore)]:
    y, _ = M.init(lambda s, x: L.checkpoint(_static_body, static_argnums=(1,))(s, x, 2))(KEY, x)
    assert y.shape == (1, 4)
  # jit: 0 is the scope itself.
  y, v = lift.init(lambda s, x: lift.jit(_static_body, static_argnums=(2,))(s, x, 2))(KEY, x)
  assert y.shape == (1, 4)
  with pytest.raises(Exception):
    lift.init(lambda s, x: lift.jit(_static_body, static_argnums=(1,))(s, x, 2))(KEY, x)
  y, _ = lift.init(lambda s, x: lift.jit(_static_body, static_argnames='n')(s, x, n=2))(KEY, x)
  assert y.shape == (1, 4)


def _static_block(nn):
  class B(nn.Module):
    @nn.compact
    def __call__(self, x, n):
      return jnp.tile(nn.Dense(n)(x), (1, n))
  return B


@pytest.mark.parametrize('name', ['checkpoint', 'jit'])
def test_linen_static_argnums_count_self(name):
  x = jnp.ones((1, 3))

  def build(nn, argnums):
    B = _static_block(nn)

    class O(nn.Module):
      @nn.compact
      def __call__(self, x):
        return getattr(nn, name)(B, static_argnums=argnums)()(x, 2)
    return O
  yo, vo = build(linen_ext, (2,))().init_with_output(KEY, x)
  yf, vf = build(fnn, (2,))().init_with_output(KEY, x)
  assert yo.shape == yf.shape == (1, 4) and shapes(vo) == shapes(vf)
  if name == 'checkpoint':
    assert same_tree(vo, vf)
  for lib in (linen_ext, fnn):
    with pytest.raises(Exception):
      build(lib, (1,))().init(KEY, x)


def test_linen_jit_static_argnames_vs_flax():
  x = jnp.ones((1, 3))

  def build(nn):
    B = _static_block(nn)

    class O(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.jit(B, static_argnames=('n',))()(x, n=2)
    return O
  assert shapes(build(linen_ext)().init(KEY, x)) == shapes(build(fnn)().init(KEY, x))


@pytest.mark.parametrize('name', ['checkpoint', 'remat'])
def test_linen_checkpoint_accepts_static_argnames(name):
  B = _static_block(linen_ext)

  class O(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return getattr(linen_ext, name)(B, static_argnames=('n',))()(x, n=2)
  assert O().init_with_output(KEY, jnp.ones((1, 3)))[0].shape == (1, 4)


def test_lift_checkpoint_accepts_static_argnames():
  y, _ = lift.init(lambda s, x: lift.checkpoint(_static_body, static_argnames=('n',))(s, x, n=2))(
      KEY, jnp.ones((1, 3)))
  assert y.shape == (1, 4)


def test_jit_no_retrace_repeated_fresh_and_rewrapped():
  traces = [0]

  class Blk(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      traces[0] += 1
      return x @ self.param('w', linen_ext.initializers.normal(), (3, 3))
  JB = linen_ext.jit(Blk)

  class M(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      for i in range(3):
        x = JB(name=f'b{i}')(x)          # fresh instances, same configuration
      shared = JB(name='shared')
      for _ in range(3):
        x = shared(x)                      # the same submodule repeatedly
      return linen_ext.jit(Blk)(name='re')(x)   # re-wrapped
  x = jnp.ones((2, 3))
  v = M().init(KEY, x)
  traces[0] = 0
  M().apply(v, x)
  assert traces[0] == 1
  traces[0] = 0
  M().apply(v, x)
  assert traces[0] == 0
  # Flax, for comparison, retraces per name on the same model (its known failure).
  ftraces = [0]

  class FBlk(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      ftraces[0] += 1
      return x @ self.param('w', fnn.initializers.normal(), (3, 3))

  class FM(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      for i in range(3):
        x = fnn.jit(FBlk)(name=f'b{i}')(x)
      return x
  fv = FM().init(KEY, x)
  ftraces[0] = 0
  FM().apply(fv, x)
  assert ftraces[0] >= 1


def test_lift_jit_rewrap_no_retrace():
  count = [0]

  def body(scope, x):
    count[0] += 1
    return x @ scope.param('w', jax.nn.initializers.ones, (3, 3))

  def outer(scope, x):
    for _ in range(3):
      x = lift.jit(body)(scope, x)
    return x
  x = jnp.ones((2, 3))
  _, v = lift.init(outer)(KEY, x)
  count[0] = 0
  for _ in range(3):
    lift.apply(outer)(v, x)
  assert count[0] <= 1


def test_jit_native_rngs_same_keys_as_without():
  def build(jit):
    class R(linen_ext.Module):
      @linen_ext.compact
      def __call__(self, x):
        w = self.param('w', lambda k, s: jnp.broadcast_to(kd(k).astype(jnp.float32)[:, None], s),
                       (2, 2))
        return self.make_rng('dropout'), w

    class W(linen_ext.Module):
      @linen_ext.compact
      def __call__(self, x):
        C = linen_ext.jit(R) if jit else R
        return C(name='a')(x), C(name='b')(x)
    return W
  x = jnp.ones((2, 3))
  rngs = {'params': KEY, 'dropout': jax.random.key(1)}
  (a, va) = build(False)().init_with_output(rngs, x)
  (b, vb) = build(True)().init_with_output(rngs, x)
  assert same_tree(va, vb)
  for (ka, wa), (kb, wb) in zip(a, b):
    assert same_key(ka, kb) and np.array_equal(wa, wb)


def _partition_block(nn, scan):
  class Blk(nn.Module):
    @nn.compact
    def __call__(self, c):
      w = self.param('w', nn.with_partitioning(nn.initializers.ones, ('in', 'out')), (3, 3))
      return (c @ w, None) if scan else c @ w
  return Blk


def _names_and_shapes(v):
  return tmap(lambda p: (getattr(p, 'names', None), jnp.shape(getattr(p, 'value', p))), plain(v),
              is_leaf=lambda p: isinstance(p, fnn.Partitioned))


@pytest.mark.parametrize('kind', ['scan', 'vmap', 'add_metadata_axis'])
def test_metadata_params_vs_flax(kind):
  def build(nn):
    mp = {nn.PARTITION_NAME: 'layers'}

    class M(nn.Module):
      @nn.compact
      def __call__(self, x):
        if kind == 'scan':
          return nn.scan(_partition_block(nn, True), variable_axes={'params': 0},
                         split_rngs={'params': True}, length=2, metadata_params=mp)()(x)[0]
        if kind == 'vmap':
          return nn.vmap(_partition_block(nn, False), variable_axes={'params': 0},
                         split_rngs={'params': True}, metadata_params=mp)()(x)
        return nn.add_metadata_axis(_partition_block(nn, False), variable_axes={'params': 0},
                                    metadata_params=mp)()(x)
    return M
  x = jnp.ones((2, 3))
  assert _names_and_shapes(build(linen_ext)().init(KEY, x)) == _names_and_shapes(build(fnn)().init(KEY, x))


def test_remat_scan_metadata_params():
  class M(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return linen_ext.remat_scan(_partition_block(linen_ext, False), lengths=(2, 2),
                                  metadata_params={linen_ext.PARTITION_NAME: 'layers'})()(x)
  leaf = jax.tree_util.tree_leaves(M().init(KEY, jnp.ones((2, 3))),
                                   is_leaf=lambda p: isinstance(p, fnn.Partitioned))[0]
  assert leaf.names[0] == 'layers' and leaf.names[-2:] == ('in', 'out')
  assert leaf.value.shape == (2, 2, 3, 3)
  # Flax's remat_scan has no metadata_params and fails on Partitioned params.
  class F(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      return fnn.remat_scan(_partition_block(fnn, False), lengths=(2, 2))()(x)
  with pytest.raises(Exception):
    F().init(KEY, jnp.ones((2, 3)))


def test_lift_metadata_params_vs_flax_core():
  def body(scope, x):
    return x * scope.param('w', fnn.with_partitioning(jax.nn.initializers.ones, ('a',)), (1, 3))
  mp = {fnn.PARTITION_NAME: 'L'}
  make = lambda L: lambda s, x: L.vmap(body, variable_axes={'params': 0}, split_rngs={'params': True},
                                       metadata_params=mp)(s, x)
  a = lift.init(make(lift))(KEY, jnp.ones((2, 1, 3)))[1]['params']['w']
  b = fcore.init(make(flift))(KEY, jnp.ones((2, 1, 3)))[1]['params']['w']
  assert a.names == b.names == ('L', 'a') and a.value.shape == b.value.shape
  rs = lift.init(lambda s, x: lift.remat_scan(lambda s, c: body(s, c), lengths=(2, 2),
                                              metadata_params=mp)(s, x))(KEY, jnp.ones((1, 3)))
  assert rs[1]['params']['w'].names[0] == 'L'


def test_remat_scan_vs_flax():
  def build(nn):
    class Blk(nn.Module):
      @nn.compact
      def __call__(self, c):
        return nn.tanh(nn.Dense(3)(c))

    class M(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.remat_scan(Blk, lengths=(2, 3))()(x)
    return M
  x = jnp.ones((2, 3))
  yo, vo = build(linen_ext)().init_with_output(KEY, x)
  yf, vf = build(fnn)().init_with_output(KEY, x)
  assert same_tree(vo, vf) and same_tree(yo, yf)


def test_scan_broadcast_markers_vs_flax():
  from flax.core.axes_scan import broadcast as fbroadcast

  def body(s, c, x):
    w = s.param('w', jax.nn.initializers.normal(), (3, 3))
    invariant = jnp.float32(0) if s.is_mutable_collection('params') else w.sum()
    return jnp.tanh(c @ w), invariant

  def make(L, bc):
    return lambda s, x: L.scan(body, variable_broadcast='params', split_rngs={'params': False},
                               out_axes=bc, length=3)(s, x, None)
  yo, vo = lift.init(make(lift, lift.broadcast))(KEY, jnp.ones((2, 3)))
  yf, vf = fcore.init(make(flift, fbroadcast))(KEY, jnp.ones((2, 3)))
  assert same_tree(vo, vf) and same_tree(yo, yf)

  def build(nn):
    class Blk(nn.Module):
      @nn.compact
      def __call__(self, c, xs, ctx):
        return c + nn.Dense(3)(xs) * ctx, c.sum()

    class M(nn.Module):
      @nn.compact
      def __call__(self, c, xs, ctx):
        return nn.scan(Blk, variable_broadcast='params', split_rngs={'params': False},
                       in_axes=(0, nn.broadcast))(name='s')(c, xs, ctx)
    return M
  args = (jnp.zeros(3), jnp.ones((4, 3)), 2.0)
  yo, vo = build(linen_ext)().init_with_output(KEY, *args)
  yf, vf = build(fnn)().init_with_output(KEY, *args)
  assert same_tree(vo, vf) and same_tree(yo, yf)


def test_scan_carry_variable_created_in_body():
  class CB(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, c, x):
      n = self.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))
      n.value += 1
      return c + x, n.value

  class CM(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, xs):
      return linen_ext.scan(CB, variable_carry='counter', split_rngs={'params': False})()(
          jnp.zeros(3), xs)
  (c, ns), v = CM().init_with_output(KEY, jnp.ones((4, 3)))
  assert int(v['counter']['ScanCB_0']['n']) == 4 and list(ns) == [1, 2, 3, 4]


def test_lift_autodiff_and_control_flow_vs_flax_core():
  x = jnp.ones((2, 3))

  def dense(scope, x):
    return jnp.tanh(x @ scope.param('w', jax.nn.initializers.normal(), (3, 3)))

  def make(L, kind):
    def f(scope, x):
      if kind == 'vjp':
        y, bwd = L.vjp(dense, scope, x)
        return y, bwd(jnp.ones_like(y))
      if kind == 'value_and_grad':
        return L.value_and_grad(lambda s, x: dense(s, x).sum(), scope, x)
      if kind == 'jvp':
        if scope.is_mutable_collection('params'):
          dense(scope, x)
        return L.jvp(dense, scope, (x,), (jnp.ones_like(x),), {'params': {'w': jnp.ones((3, 3))}})
      if kind == 'custom_vjp':
        def fwd(s, x):
          return L.vjp(dense, s, x)

        def bwd(res, g):
          pg, xg = res(g)
          return tmap(lambda a: a * 3, pg), xg
        return L.custom_vjp(dense, fwd, bwd)(scope, x)
      if kind == 'while_loop':
        if scope.is_mutable_collection('params'):
          dense(scope, x)
        return L.while_loop(lambda s, c: c[0] < 3, lambda s, c: (c[0] + 1, dense(s, c[1])), scope, (0, x))
      if kind == 'switch':
        return L.switch(1, [dense, dense, dense], scope, x)
    return f
  for kind in ['vjp', 'value_and_grad', 'jvp', 'custom_vjp', 'while_loop']:
    yo, vo = lift.init(make(lift, kind))(KEY, x)
    yf, vf = fcore.init(make(flift, kind))(KEY, x)
    assert same_tree(vo, vf) and same_tree(yo, yf), kind
  # switch/cond: SPEC promises the params of untransformed code (Flax's differ at init).
  ys, vs = lift.init(make(lift, 'switch'))(KEY, x)
  yp, vp = lift.init(dense)(KEY, x)
  assert same_tree(vs, vp) and same_tree(ys, yp)
  assert same_tree(lift.apply(make(lift, 'switch'))(vf, x), fcore.apply(make(flift, 'switch'))(vf, x))
  go = jax.grad(lambda p: lift.apply(make(lift, 'custom_vjp'))({'params': p}, x).sum())(vf['params'])
  gf = jax.grad(lambda p: fcore.apply(make(flift, 'custom_vjp'))({'params': p}, x).sum())(vf['params'])
  assert same_tree(go, gf)


def test_swap_collection_vs_flax_core():
  def sw(scope):
    scope.put_variable('b', 'v', 2)
    return scope.get_variable('a', 'v')
  for L, M in [(lift, lift), (flift, fcore)]:
    y, v = M.apply(L.swap_collection(sw, 'a', 'b'), mutable=True)({'a': {'v': 1}, 'b': {'v': 5}})
    assert y == 5 and plain(v) == {'a': {'v': 2}, 'b': {'v': 5}}


def test_shard_map_one_device():
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()[:1]), ('d',))

  class SB(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return linen_ext.Dense(3)(x)

  class SM(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return linen_ext.shard_map(SB, mesh=mesh, in_specs=(P('d'),), out_specs=P('d'),
                                 variable_specs={'params': P()}, split_rngs={'params': False})()(x)

  class FP(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      return fnn.Dense(3, name='Dense_0')(x)
  x = jnp.ones((2, 3))
  y, v = SM().init_with_output(KEY, x)
  inner = v['params']['Shard_mapSB_0']
  assert shapes(inner) == shapes(FP().init(KEY, x)['params'])
  assert np.allclose(y, FP().apply({'params': inner}, x), atol=1e-6)


# ---------------------------------------------------------------------------------------
# Loops.


def test_loops_scan_fold_map_vs_lax():
  xs = jnp.arange(12.0).reshape(4, 3)
  f = lambda c, x: (c + x.sum(), c * 2 + x)
  assert same_tree(loops.scan(f)(0.0, xs), lax.scan(f, 0.0, xs))
  assert same_tree(loops.scan(f, reverse=True, unroll=2)(0.0, xs), lax.scan(f, 0.0, xs, reverse=True))
  c, ys = loops.scan(f, axis=1)(0.0, xs)
  rc, rys = lax.scan(f, 0.0, xs.T)
  assert np.allclose(c, rc) and np.allclose(ys, rys.T)
  g = lambda c, _: (c + 1, c)
  c, ys = loops.scan(g, length=5)(0, None)
  assert c == 5 and list(ys) == [0, 1, 2, 3, 4]
  with pytest.raises(lift.LiftError, match='length'):
    loops.scan(g)(0, None)
  assert np.allclose(loops.fold(lambda c, x: c + x.sum())(0.0, xs), xs.sum())
  assert np.allclose(loops.map(lambda x: x * 2)(xs), xs * 2)
  assert np.allclose(loops.map(jnp.sum, axis=1)(xs), xs.sum(0))


REMATS = [True, 'full', 'nested', 'offload', 'save_all',
          loops.ScanCheckpointPolicy(nested=3),
          loops.ScanCheckpointPolicy(save_block_internals=['a']),
          loops.ScanCheckpointPolicy(offload_block_internals=('a',))]


@pytest.mark.filterwarnings('ignore')
@pytest.mark.parametrize('remat', REMATS, ids=str)
@pytest.mark.parametrize('n', [7, 10])
def test_loop_remat_policies_same_grads(remat, n):
  def loss(w, r):
    return loops.fold(lambda c, x: jnp.sin(c * w + x), remat=r)(jnp.ones(2), jnp.ones((n, 2))).sum()
  assert np.allclose(jax.grad(loss)(0.3, remat), jax.grad(loss)(0.3, False), atol=1e-6)


def test_bad_remat_raises():
  for bad in ['bogus', 3]:
    with pytest.raises(lift.LiftError):
      loops.fold(lambda c, x: c + x, remat=bad)(0.0, jnp.ones(3))


def test_checkpoint_name_tags_tree():
  tree = {'a': jnp.ones(2), 'b': (jnp.zeros(1),)}
  tagged = loops.checkpoint_name(tree, 'x')
  assert jax.tree_util.tree_structure(tagged) == jax.tree_util.tree_structure(tree)
  assert 'name=nm' in str(jax.make_jaxpr(lambda a: loops.checkpoint_name(a, 'nm'))(jnp.ones(2)))


@pytest.mark.filterwarnings('ignore')
@pytest.mark.parametrize('remat', [True, 'nested', 'save_all', loops.ScanCheckpointPolicy(nested=2)], ids=str)
def test_lift_scan_remat_same_grads(remat):
  def body(scope, c, x):
    w = scope.param('w', jax.nn.initializers.normal(), (3, 3))
    return jnp.tanh(c @ w + x), c.sum()

  def model(r):
    return lambda s, c, xs: lift.scan(body, variable_broadcast='params',
                                      split_rngs={'params': False}, remat=r)(s, c, xs)
  c0, xs = jnp.ones(3), jnp.ones((5, 3))
  _, v = lift.init(model(False))(KEY, c0, xs)
  grad = lambda r: jax.grad(lambda p: lift.apply(model(r))({'params': p}, c0, xs)[0].sum())(v['params'])
  assert same_tree(grad(remat), grad(False))


def test_scan_taps_layout():
  x = jnp.arange(1.0, 8.0)

  def fn(xm1, x0, xp1, ym3, ym1, k):
    return ym3 + ym1 + xm1 + k * x0 + 100 * xp1

  def reference(x):
    ys, out = [1.0, 2.0, 3.0], []
    for t in range(1, 6):
      y = ys[-3] + ys[-1] + x[t - 1] + 10 * x[t] + 100 * x[t + 1]
      ys.append(y)
      out.append(y)
    return jnp.stack(out)

  def ours(x):
    return loops.scan_taps(fn, sequences=[{'input': x, 'taps': [-1, 0, 1]}],
                           outputs_info=[{'initial': jnp.array([1.0, 2.0, 3.0]), 'taps': [-3, -1]}],
                           non_sequences=[jnp.float32(10.0)])
  assert np.allclose(ours(x), reference(x))
  assert np.allclose(jax.grad(lambda x: ours(x).sum())(x), jax.grad(lambda x: reference(x).sum())(x))
  fn2 = lambda x0, yprev: (yprev + x0, x0 * 2)
  acc, doubled = loops.scan_taps(fn2, sequences=[x], outputs_info=[jnp.float32(0.0), None])
  assert np.allclose(acc, jnp.cumsum(x)) and np.allclose(doubled, 2 * x)
  acc_b, _ = loops.scan_taps(fn2, sequences=[x], outputs_info=[jnp.float32(0.0), None], go_backwards=True)
  assert np.allclose(acc_b, jnp.cumsum(x[::-1]))
  assert np.allclose(loops.scan_taps(lambda y: y * 2, outputs_info=[jnp.float32(1.0)], n_steps=4),
                     [2.0, 4.0, 8.0, 16.0])


# ---------------------------------------------------------------------------------------
# as_scan and friends.

XS = jax.random.normal(jax.random.key(0), (6, 3))
W_CONV = jax.random.normal(jax.random.key(1), (3, 3, 4))
_cv = jax.custom_vjp(lambda x: x * 2)
_cv.defvjp(lambda x: (x * 2, None), lambda r, g: (g * 2,))

CAUSAL = {
    'elementwise': lambda x: jnp.sin(x) * 2 + 1,
    'cumsum': lambda x: jnp.cumsum(x, axis=0),
    'cumprod': lambda x: jnp.cumprod(x, axis=0),
    'cummax': lambda x: lax.cummax(x, axis=0),
    'shift_concat': lambda x: jnp.concatenate([jnp.zeros((1, 3)), x[:-1]], 0) + x,
    'shift_pad': lambda x: jnp.pad(x, ((2, 0), (0, 0)))[:-2] * x,
    'dot_general': lambda x: x @ jnp.ones((3, 4)),
    'reduce_other_axis': lambda x: x.sum(-1, keepdims=True) * x,
    'broadcast': lambda x: x[:, None, :] + jnp.ones((6, 2, 3)),
    'reshape': lambda x: x.reshape(6, 3, 1).reshape(6, 3),
    'transpose': lambda x: jnp.transpose(x[:, :, None], (0, 2, 1))[:, 0],
    'scan': lambda x: lax.scan(lambda c, a: (c + a, c * a), jnp.zeros(3), x)[1],
    'pjit': lambda x: jax.jit(lambda y: jnp.cumsum(y, 0) ** 2)(x),
    'custom_jvp': lambda x: jax.nn.relu(x) + jax.nn.softplus(x),
    'custom_vjp': lambda x: _cv(x) + x,
    'causal_conv': lambda x: lax.conv_general_dilated(
        jnp.pad(x, ((2, 0), (0, 0)))[None], W_CONV, (1,), 'VALID',
        dimension_numbers=('NWC', 'WIO', 'NWC'))[0],
}


@pytest.mark.parametrize('name', sorted(CAUSAL))
def test_as_scan_matches(name):
  g = CAUSAL[name]
  f, carry = lift.as_scan(g, XS)
  assert np.allclose(lax.scan(f, carry, XS)[1], g(XS), atol=1e-5)


NON_CAUSAL = {
    'rev': lambda x: x[::-1],
    'reduce_sum': lambda x: x.sum(0, keepdims=True) * x,
    'slice': lambda x: jnp.concatenate([x[1:], x[:1]], 0),
    'dot_general': lambda x: jnp.ones((6, 6)) @ x,
}


@pytest.mark.parametrize('name', sorted(NON_CAUSAL))
def test_as_scan_non_causal_names_primitive(name):
  with pytest.raises(lift.ScanConversionError, match=name):
    lift.as_scan(NON_CAUSAL[name], XS)


def test_causal_self_attention_vs_flax():
  q, k, v = [jax.random.normal(jax.random.key(i), (2, 5, 3, 4)) for i in range(3)]
  mask = fnn.make_causal_mask(jnp.ones((2, 5)))
  ref = lambda q: fnn.dot_product_attention(q, k, v, mask=mask)
  assert np.allclose(lift.causal_self_attention(q, k, v), ref(q), atol=1e-5)
  assert np.allclose(lift.causal_self_attention(q[0], k[0], v[0]), ref(q)[0], atol=1e-5)
  assert np.allclose(jax.grad(lambda q: lift.causal_self_attention(q, k, v).sum())(q),
                     jax.grad(lambda q: ref(q).sum())(q), atol=1e-5)
  qt, kt, vt = [jnp.moveaxis(a[0], 0, 0) for a in (q, k, v)]  # [length, heads, features]
  g = lambda xs: lift.causal_self_attention(*xs)
  f, c = lift.as_scan(g, (qt, kt, vt))
  assert np.allclose(lax.scan(f, c, (qt, kt, vt))[1], g((qt, kt, vt)), atol=1e-5)


def test_as_scan_with_prefill_and_prompt_concat():
  xs = jax.random.normal(jax.random.key(3), (7, 3))
  g = lambda x: jnp.cumsum(jnp.tanh(x), 0) * jnp.concatenate([jnp.zeros((1, 3)), x[:-1]])
  f, carry, out_p = lift.as_scan_with_prefill(g, xs, xs[:3])
  assert np.allclose(out_p, g(xs[:3]), atol=1e-5)
  assert np.allclose(lax.scan(f, carry, xs[3:])[1], g(xs)[3:], atol=1e-5)
  prompt = xs[:3]
  f, c = lift.as_scan(lambda ys: g(jnp.concatenate([prompt, ys]))[len(prompt):], xs[3:])
  assert np.allclose(lax.scan(f, c, xs[3:])[1], g(xs)[3:], atol=1e-5)


def test_custom_causal_step_prefill_and_grad():
  xs = jax.random.normal(jax.random.key(3), (7, 3))
  used = []

  @lift.custom_causal
  def mycum(x):
    return jnp.cumsum(x, axis=0)

  @mycum.def_init
  def _(x):
    return jnp.zeros(x.shape[1:], x.dtype)

  @mycum.def_step
  def _(state, index, x):
    del index
    return state + x, state + x

  @mycum.def_prefill
  def _(state, x):
    used.append(True)
    c = state[None] + jnp.cumsum(x, 0)
    return c[-1], c
  f, c = lift.as_scan(lambda x: mycum(x) * 2, xs)
  assert np.allclose(lax.scan(f, c, xs)[1], jnp.cumsum(xs, 0) * 2, atol=1e-5)
  f, c, out = lift.as_scan_with_prefill(lambda x: mycum(x) * 2, xs, xs[:3])
  assert used and np.allclose(out, jnp.cumsum(xs[:3], 0) * 2, atol=1e-5)
  assert np.allclose(lax.scan(f, c, xs[3:])[1], (jnp.cumsum(xs, 0) * 2)[3:], atol=1e-5)
  assert np.allclose(jax.grad(lambda x: (mycum(x) ** 2).sum())(xs),
                     jax.grad(lambda x: (jnp.cumsum(x, 0) ** 2).sum())(xs))

  @lift.custom_causal
  def ident(x):
    return x

  @ident.def_init
  def _(x):
    return jnp.zeros((), x.dtype)

  @ident.def_step
  def _(s, i, x):
    return s, x + 100.0
  f, c = lift.as_scan(ident, xs)
  assert np.allclose(lax.scan(f, c, xs)[1], xs + 100.0)  # the author's step is what runs
  assert np.allclose(ident(xs), xs)


def _tiny_causal_model():
  nn = linen_ext

  class Tiny(nn.Module):
    @nn.compact
    def __call__(self, x):  # [T, F]
      h = nn.Conv(4, kernel_size=(3,), padding='CAUSAL')(x)
      qkv = nn.Dense(12)(h).reshape(h.shape[0], 3, 2, 2)
      a = lift.causal_self_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2]).reshape(h.shape[0], 4)
      return nn.Dense(3)(nn.LayerNorm()(a + h))
  return Tiny


def test_module_level_as_scan():
  Tiny = _tiny_causal_model()
  xs = jax.random.normal(jax.random.key(5), (6, 3))
  variables = Tiny().init(KEY, xs)
  full = Tiny().apply(variables, xs)
  f, c = lift.as_scan(lambda z: Tiny().apply(variables, z), xs)
  assert np.allclose(lax.scan(f, c, xs)[1], full, atol=1e-5)
  step, carry = linen_ext.as_scan(Tiny(), variables, xs)
  assert np.allclose(lax.scan(step, carry, xs)[1], full, atol=1e-5)

  class SameConv(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return linen_ext.Conv(2, kernel_size=(3,), padding='SAME')(x)
  v = SameConv().init(KEY, xs)
  with pytest.raises(lift.ScanConversionError, match='conv_general_dilated'):
    lift.as_scan(lambda z: SameConv().apply(v, z), xs)


def test_module_level_as_scan_batch_first_and_prefill():
  class TinyB(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):  # [B, T, F]
      h = linen_ext.Conv(4, kernel_size=(2,), padding='CAUSAL')(x)
      return linen_ext.Dense(2)(jnp.cumsum(h, axis=1))
  xb = jax.random.normal(jax.random.key(6), (2, 5, 3))
  vb = TinyB().init(KEY, xb)
  full = TinyB().apply(vb, xb)
  step, carry = linen_ext.as_scan(TinyB(), vb, xb, time_axis=1)
  ys = lax.scan(step, carry, jnp.moveaxis(xb, 1, 0))[1]
  assert np.allclose(jnp.moveaxis(ys, 0, 1), full, atol=1e-5)
  step, carry, out_p = linen_ext.as_scan(TinyB(), vb, xb, time_axis=1, prefill=xb[:, :2])
  ys = lax.scan(step, carry, jnp.moveaxis(xb[:, 2:], 1, 0))[1]
  assert np.allclose(out_p, full[:, :2], atol=1e-5)
  assert np.allclose(jnp.moveaxis(ys, 0, 1), full[:, 2:], atol=1e-5)


# ---------------------------------------------------------------------------------------
# linen_ext Module API vs flax.linen.


def _module_api_model(nn):
  class Sub(nn.Module):
    feat: int = 2

    @nn.compact
    def __call__(self, x):
      return nn.Dense(self.feat)(x)

  class SetupM(nn.Module):
    def setup(self):
      self.a = Sub(3)
      self.bs = [Sub(2), Sub(2)]
      self.w = self.param('w', nn.initializers.normal(), (3,))
      self.cnt = self.variable('state', 'cnt', lambda: jnp.zeros(()))

    def __call__(self, x):
      if not self.is_initializing():
        self.cnt.value += 1
      return self.a(x) * self.w[None] + self.bs[1](self.bs[0](x)).sum()

    @nn.nowrap
    def helper(self):
      return 'nowrap'

    def other(self, x):
      return self.a(x)

  class M(nn.Module):
    @nn.compact
    def __call__(self, x):
      info = {'init': self.is_initializing(), 'mut': self.is_mutable_collection('params'),
              'has_rng': self.has_rng('dropout')}
      h = Sub()(x)
      h = Sub()(h)
      h = nn.Dense(3, name='named')(h)
      h = SetupM()(jnp.ones((2, 3))) + h
      self.sow('intermediates', 'h', h)
      self.put_variable('cache', 'z', jnp.ones(2))
      info['get'] = self.get_variable('cache', 'z')
      info['has'] = (self.has_variable('cache', 'z'), self.has_variable('cache', 'q'))
      info['rng'] = kd(self.make_rng('dropout'))
      self.sow('intermediates', 'h', h)
      return h, info
  return Sub, SetupM, M


def test_module_api_vs_flax():
  x = jnp.ones((2, 3))
  rngs = {'params': KEY, 'dropout': jax.random.key(1)}
  res = {}
  for nn in (linen_ext, fnn):
    Sub, SetupM, M = _module_api_model(nn)
    out = {}
    y, v = M().init_with_output(rngs, x)
    out['init'] = (y, v)
    out['init_same'] = same_tree(v, M().init(rngs, x))
    out['apply'] = M().apply({'params': v['params'], 'state': v['state']}, x,
                             rngs={'dropout': KEY}, mutable=['intermediates', 'cache', 'state'])
    out['single_key'] = M().apply({'params': v['params'], 'state': v['state']}, x, rngs=KEY,
                                  mutable=True)[0][0]
    sv = {'params': v['params']['SetupM_0'], 'state': v['state']['SetupM_0']}
    out['method_str'] = SetupM().apply(sv, x, method='other')
    out['method_fn'] = SetupM().apply(sv, x, method=SetupM.other)
    out['nowrap'] = SetupM().helper()
    bound = SetupM().bind(sv, mutable=['state'])
    out['bound'] = bound(x)
    out['bound_vars'] = shapes(bound.variables)
    mod, vs = bound.unbind()
    out['unbind'] = (type(mod).__name__, mod.scope is None, shapes(vs))
    out['clone'] = Sub(2).clone(feat=5).feat
    out['fields'] = [f.name for f in dataclasses.fields(Sub)]
    out['name_parent'] = (Sub(name='x').name, Sub().parent is None)
    res[nn.__name__] = out
  ours, theirs = res['linen_ext'], res['flax.linen']
  for key in ours:
    if key in ('nowrap', 'clone', 'fields', 'name_parent', 'bound_vars', 'unbind', 'init_same'):
      assert ours[key] == theirs[key], key
    else:
      assert same_tree(ours[key], theirs[key]), key


def test_reserved_names_raise_like_flax():
  def build(nn):
    class Dup(nn.Module):
      @nn.compact
      def __call__(self, x):
        nn.Dense(2, name='d')(x)
        return nn.Dense(2, name='d')(x)
    return Dup
  for nn in (linen_ext, fnn):
    with pytest.raises(Exception, match='d'):
      build(nn)().init(KEY, jnp.ones((1, 3)))


# ---------------------------------------------------------------------------------------
# Module transforms: on a class, as a method decorator, and with methods=.

TRANSFORMS = {
    'vmap': dict(variable_axes={'params': 0}, split_rngs={'params': True}, in_axes=0),
    'scan': dict(variable_axes={'params': 0}, split_rngs={'params': True}, length=2),
    'checkpoint': {}, 'remat': {}, 'jit': {},
    'map_variables': dict(mapped_collections='params',
                          trans_in_fn=lambda v: tmap(lambda a: a * 2, v), init=True),
    'fold_rngs': {},
    'add_metadata_axis': dict(variable_axes={'params': 0}, metadata_params={}),
    'remat_scan': dict(lengths=(2,)),
}


def _transformed_models(nn, tname):
  tr = getattr(nn, tname)
  kw = TRANSFORMS[tname]
  is_scan = tname == 'scan'

  class Blk(nn.Module):
    @nn.compact
    def __call__(self, h):
      y = nn.Dense(3)(h)
      return (y, None) if is_scan else y

    def other(self, h):
      return self(h)

  class OnClass(nn.Module):
    @nn.compact
    def __call__(self, x):
      r = tr(Blk, **kw)(name='b')(x)
      return r[0] if is_scan else r

  class Blk2(nn.Module):
    @nn.compact
    def __call__(self, h):
      y = nn.Dense(3)(h)
      return (y, None) if is_scan else y
  Blk2.__call__ = tr(Blk2.__call__, **kw)

  class OnMethod(nn.Module):
    @nn.compact
    def __call__(self, x):
      r = Blk2(name='b')(x)
      return r[0] if is_scan else r

  class WithMethods(nn.Module):
    @nn.compact
    def __call__(self, x):
      r = tr(Blk, methods=['other'], **kw)(name='b').other(x)
      return r[0] if is_scan else r
  return {'class': OnClass, 'method': OnMethod, 'methods=': WithMethods}


@pytest.mark.parametrize('form', ['class', 'method', 'methods='])
@pytest.mark.parametrize('tname', sorted(TRANSFORMS))
def test_module_transforms_vs_flax(tname, form):
  if form == 'methods=' and tname in ('fold_rngs', 'add_metadata_axis', 'remat_scan'):
    pytest.skip('flax has no methods= here (ours: see the test below)')
  x = jnp.ones((2, 3))
  yo, vo = _transformed_models(linen_ext, tname)[form]().init_with_output(KEY, x)
  yf, vf = _transformed_models(fnn, tname)[form]().init_with_output(KEY, x)
  assert shapes(vo) == shapes(vf)
  if tname == 'jit':
    return  # known: values of wrapped flax layers under nn.jit (and flax changes them too)
  assert same_tree(vo, vf) and same_tree(yo, yf)
  M = _transformed_models(linen_ext, tname)[form]
  F = _transformed_models(fnn, tname)[form]
  assert same_tree(M().apply(vf, x), F().apply(vf, x))


def test_fold_rngs_methods_kw():
  x = jnp.ones((2, 3))
  yo, vo = _transformed_models(linen_ext, 'fold_rngs')['methods=']().init_with_output(KEY, x)
  yf, vf = _transformed_models(fnn, 'fold_rngs')['class']().init_with_output(KEY, x)
  assert same_tree(vo, vf) and same_tree(yo, yf)


@pytest.mark.parametrize('tname', ['add_metadata_axis', 'remat_scan'])
def test_methods_kw_on_remaining_transforms(tname):
  x = jnp.ones((2, 3))
  yo, vo = _transformed_models(linen_ext, tname)['methods=']().init_with_output(KEY, x)
  yf, vf = _transformed_models(fnn, tname)['class']().init_with_output(KEY, x)
  assert same_tree(vo, vf) and same_tree(yo, yf)


def _direct_models(nn):
  x = jnp.ones((2, 3))

  class Cond(nn.Module):
    def setup(self):
      self.d1 = nn.Dense(3)
      self.d2 = nn.Dense(3)

    def __call__(self, x, pred):
      if self.is_initializing():
        self.d1(x)
        self.d2(x)
      return nn.cond(pred, lambda m, x: m.d1(x), lambda m, x: m.d2(x), self, x)

  class Switch(nn.Module):
    def setup(self):
      self.ds = [nn.Dense(3) for _ in range(3)]

    def __call__(self, x, i):
      if self.is_initializing():
        for d in self.ds:
          d(x)
      return nn.switch(i, [lambda m, x, j=j: m.ds[j](x) for j in range(3)], self, x)

  class While(nn.Module):
    @nn.compact
    def __call__(self, x):
      d = nn.Dense(3)
      if self.is_initializing():
        d(x)
      return nn.while_loop(lambda m, c: c[0] < 3, lambda m, c: (c[0] + 1, d(c[1])), self, (0, x))[1]

  class VJP(nn.Module):
    @nn.compact
    def __call__(self, x):
      y, bwd = nn.vjp(lambda m, x: m(x), nn.Dense(3), x)
      return y, bwd(jnp.ones_like(y))

  class JVP(nn.Module):
    @nn.compact
    def __call__(self, x):
      d = nn.Dense(3)
      if self.is_initializing():
        d(x)
      vt = tmap(jnp.ones_like, {'params': d.variables['params']})
      return nn.jvp(lambda m, x: m(x), d, (x,), (jnp.ones_like(x),), vt)

  class Grad(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.grad(lambda m, x: m(x).sum(), nn.Dense(3), x)

  class VG(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.value_and_grad(lambda m, x: (m(x) ** 2).sum(), nn.Dense(3), x)

  class CV(nn.Module):
    @nn.compact
    def __call__(self, x):
      def f(m, x, n):
        return m(x) * n

      def fwd(m, x, n):
        return nn.vjp(lambda m, x: f(m, x, n), m, x)

      def bwd(n, vjp_fn, y_t):
        pt, xt = vjp_fn(y_t)
        return tmap(lambda a: a * n, pt), xt
      return nn.custom_vjp(f, forward_fn=fwd, backward_fn=bwd, nondiff_argnums=(2,))(nn.Dense(3), x, 3)
  return {'cond': (Cond, (x, True)), 'switch': (Switch, (x, 1)), 'while_loop': (While, (x,)),
          'vjp': (VJP, (x,)), 'jvp': (JVP, (x,)), 'grad': (Grad, (x,)),
          'value_and_grad': (VG, (x,)), 'custom_vjp': (CV, (x,))}


@pytest.mark.parametrize('name', ['cond', 'switch', 'while_loop', 'vjp', 'jvp', 'grad',
                                  'value_and_grad', 'custom_vjp'])
def test_direct_transforms_vs_flax(name):
  M, args = _direct_models(linen_ext)[name]
  F, _ = _direct_models(fnn)[name]
  yo, vo = M().init_with_output(KEY, *args)
  yf, vf = F().init_with_output(KEY, *args)
  assert same_tree(vo, vf) and same_tree(yo, yf)
  assert same_tree(M().apply(vf, *args), F().apply(vf, *args))
  if name == 'custom_vjp':
    x = args[0]
    assert same_tree(jax.grad(lambda p: M().apply(p, x).sum())(vf),
                     jax.grad(lambda p: F().apply(p, x).sum())(vf))


# ---------------------------------------------------------------------------------------
# Layer stacks.


def _blocks():
  class Blk(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, h, s=1.0):
      return linen_ext.tanh(linen_ext.Dense(3)(h)) * s

  class FBlk(fnn.Module):
    @fnn.compact
    def __call__(self, h, s=1.0):
      return fnn.tanh(fnn.Dense(3)(h)) * s
  return Blk, FBlk


def test_stacked_layout_values_and_modes_vs_flax():
  Blk, FBlk = _blocks()
  x = jnp.ones((2, 3))

  class M(linen_ext.Module):
    mode: str = 'call'

    @linen_ext.compact
    def __call__(self, x, s=None):
      st = linen_ext.Stacked(Blk, 4, name='st')
      if self.mode == 'call':
        return st(x)
      if self.mode == 'per_layer':
        return st(x, linen_ext.per_layer(s))
      if self.mode == 'kwarg':
        return st(x, s=2.0)
      if self.mode == 'vmap':
        return st.vmap(x)
      if self.mode == 'fold':
        return st.fold(x)
      if self.mode == 'fold_via':
        return st.fold_via(lambda b, c: b(c) + 1.0)(x)
      if self.mode == 'scan_via':
        return st.scan_via(lambda b, c: (b(c), c.sum()))(x)
      if self.mode == 'unstacked':
        st(x)
        return [b(x) for b in st.unstacked()]

  class FV(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      return fnn.vmap(FBlk, variable_axes={True: 0}, split_rngs={True: True}, in_axes=None,
                      axis_size=4)(name='st')(x)
  v = M().init(KEY, x)
  assert same_tree(v, FV().init(KEY, x))  # the layout and values of flax.linen.vmap
  p = v['params']['st']
  layer = lambda i, h, s=1.0: FBlk().apply({'params': tmap(lambda a: a[i], p)}, h, s)

  def loop(x, per=(1.0,) * 4, add=0.0):
    for i in range(4):
      x = layer(i, x, per[i]) + add
    return x
  assert np.allclose(M().apply(v, x), loop(x), atol=1e-6)
  assert np.allclose(M('fold').apply(v, x), loop(x), atol=1e-6)
  s = jnp.arange(1.0, 5.0)
  assert np.allclose(M('per_layer').apply(v, x, s), loop(x, list(s)), atol=1e-6)
  assert np.allclose(M('kwarg').apply(v, x), loop(x, (2.0,) * 4), atol=1e-6)
  assert np.allclose(M('vmap').apply(v, x), jnp.stack([layer(i, x) for i in range(4)]), atol=1e-6)
  assert np.allclose(M('fold_via').apply(v, x), loop(x, add=1.0), atol=1e-6)
  c, outs = M('scan_via').apply(v, x)
  h, ref = x, []
  for i in range(4):
    ref.append(h.sum())
    h = layer(i, h)
  assert np.allclose(c, h, atol=1e-6) and np.allclose(outs, jnp.stack(ref), atol=1e-5)
  for i, out in enumerate(M('unstacked').apply(v, x)):
    assert np.allclose(out, layer(i, x), atol=1e-6)


@pytest.mark.filterwarnings('ignore')
@pytest.mark.parametrize('remat', [False, True, 'full', 'nested', 'offload', 'save_all',
                                   loops.ScanCheckpointPolicy(nested=2)], ids=str)
@pytest.mark.parametrize('stack', ['Stacked', 'BlockSeq'])
def test_stack_remat_grads_vs_flax_loop(stack, remat):
  Blk, FBlk = _blocks()
  x = jnp.ones((2, 3))

  class M(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return getattr(linen_ext, stack)(Blk, 4, remat=remat, name='st')(x).sum()
  v = M().init(KEY, x)
  if stack == 'Stacked':
    def ref(p):
      h = x
      for i in range(4):
        h = FBlk().apply({'params': tmap(lambda a: a[i], p['st'])}, h)
      return h.sum()
  else:
    def ref(p):
      h = x
      for i in range(4):
        h = FBlk().apply({'params': p['st'][f'layers_{i}']}, h)
      return h.sum()
  assert same_tree(jax.grad(lambda p: M().apply({'params': p}, x))(v['params']),
                   jax.grad(ref)(v['params']))
  if remat:
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda p: M().apply({'params': p}, x)))(v['params']))
    assert 'checkpoint' in jaxpr or 'remat' in jaxpr or 'custom_vjp' in jaxpr


def test_stacked_metadata_params():
  class PB(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, h):
      return h @ self.param('w', linen_ext.with_partitioning(linen_ext.initializers.ones, ('a', 'b')),
                            (3, 3))

  class M(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return linen_ext.Stacked(PB, 2, metadata_params={linen_ext.PARTITION_NAME: 'layers'}, name='st')(x)
  w = M().init(KEY, jnp.ones((2, 3)))['params']['st']['w']
  assert w.names == ('layers', 'a', 'b') and w.value.shape == (2, 3, 3)


@pytest.mark.parametrize('remat', [False, True, 'nested'], ids=str)
def test_blockseq_vs_flax(remat):
  Blk, FBlk = _blocks()
  x = jnp.ones((2, 3))

  class BS(linen_ext.Module):
    mode: str = 'fold'

    @linen_ext.compact
    def __call__(self, x):
      seq = linen_ext.BlockSeq(Blk, 3, remat=remat)
      if self.mode == 'fold':
        return seq(x)
      if self.mode == 'scan_via':
        return seq.scan_via(lambda b, c: (b(c), c.sum()))(x)
      if self.mode == 'vmap':
        return seq.vmap(x)
      if self.mode == 'per_layer':
        return seq.fold(x, linen_ext.per_layer(jnp.arange(1.0, 4.0)))
      seq(x)
      return [b(x) for b in seq.unstacked()]

  class FSeq(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      for i in range(3):
        x = FBlk(name=f'layers_{i}')(x)
      return x

  class FOut(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      return FSeq(name='BlockSeq_0')(x)
  yo, vo = BS().init_with_output(KEY, x)
  yf, vf = FOut().init_with_output(KEY, x)
  assert same_tree(vo, vf) and same_tree(yo, yf)
  p = vf['params']['BlockSeq_0']
  layer = lambda i, h, s=1.0: FBlk().apply({'params': p[f'layers_{i}']}, h, s)
  assert np.allclose(BS('vmap').apply(vf, x), jnp.stack([layer(i, x) for i in range(3)]), atol=1e-6)
  h = x
  for i in range(3):
    h = layer(i, h, float(i + 1))
  assert np.allclose(BS('per_layer').apply(vf, x), h, atol=1e-6)
  c, outs = BS('scan_via').apply(vf, x)
  assert outs.shape == (3,) and np.allclose(c, FOut().apply(vf, x), atol=1e-6)
  for i, out in enumerate(BS('unstacked').apply(vf, x)):
    assert np.allclose(out, layer(i, x), atol=1e-6)


def test_scan_layers_vs_flax_python_loop():
  Blk, FBlk = _blocks()
  x = jnp.ones((2, 3))

  class SL(linen_ext.Module):
    use_scan: bool

    def setup(self):
      self.layers = [Blk() for _ in range(3)]

    def __call__(self, x):
      if self.use_scan:
        return linen_ext.scan_layers(self.layers, x)
      for layer in self.layers:
        x = layer(x)
      return x

  class FSeq(fnn.Module):
    def setup(self):
      self.layers = [FBlk() for _ in range(3)]

    def __call__(self, x):
      for layer in self.layers:
        x = layer(x)
      return x
  fv = FSeq().init(KEY, x)
  assert same_tree(SL(True).init(KEY, x), fv) and same_tree(SL(False).init(KEY, x), fv)
  assert np.allclose(SL(True).apply(fv, x), FSeq().apply(fv, x), atol=1e-6)
  assert same_tree(jax.grad(lambda p: SL(True).apply({'params': p}, x).sum())(fv['params']),
                   jax.grad(lambda p: FSeq().apply({'params': p}, x).sum())(fv['params']))


# ---------------------------------------------------------------------------------------
# Flax layers and re-exports.


def _layer_model(nn):
  class A(nn.Module):
    @nn.compact
    def __call__(self, x, train):
      h = nn.Dense(4)(x)
      h = nn.RMSNorm()(nn.LayerNorm()(h))
      h = nn.BatchNorm(use_running_average=not train)(h)
      h = nn.Dropout(0.5, deterministic=not train)(h)
      e = nn.Embed(5, 4)(jnp.array([1, 2]))
      c = nn.Conv(2, (2,))(h[None])
      carry = nn.LSTMCell(4).initialize_carry(jax.random.key(1), h.shape)
      _, o = nn.LSTMCell(4)(carry, h)
      _, o2 = nn.GRUCell(4)(jnp.zeros_like(h), h)
      a = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=4)(h[None])
      return h.sum() + e.sum() + c.sum() + o.sum() + o2.sum() + a.sum()
  return A


def test_listed_flax_layers_vs_flax():
  x = jnp.ones((2, 3))
  rngs = {'params': KEY, 'dropout': KEY}
  O, F = _layer_model(linen_ext), _layer_model(fnn)
  yo, vo = O().init_with_output(rngs, x, True)
  yf, vf = F().init_with_output(rngs, x, True)
  assert same_tree(vo, vf) and same_tree(yo, yf)
  r = {'dropout': jax.random.key(7)}
  assert same_tree(O().apply(vf, x, True, rngs=r, mutable=['batch_stats']),
                   F().apply(vf, x, True, rngs=r, mutable=['batch_stats']))
  assert same_tree(O().apply(vf, x, False), F().apply(vf, x, False))


@pytest.mark.parametrize('variant', ['dropout', 'batchnorm'])
def test_flax_layers_under_vmap_vs_flax(variant):
  def build(nn):
    class Inner(nn.Module):
      @nn.compact
      def __call__(self, x):
        h = nn.Dense(3)(x)
        if variant == 'batchnorm':
          return nn.BatchNorm(use_running_average=False)(h)
        return nn.Dropout(0.5, deterministic=False)(h)
    axes = {'params': 0, 'batch_stats': 0} if variant == 'batchnorm' else {'params': 0}
    split = {'params': True} if variant == 'batchnorm' else {'params': True, 'dropout': True}

    class V(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.vmap(Inner, variable_axes=axes, split_rngs=split)()(x)
    return V
  xs = jax.random.normal(KEY, (3, 2, 3))
  rngs = {'params': KEY, 'dropout': KEY}
  O, F = build(linen_ext), build(fnn)
  yo, vo = O().init_with_output(rngs, xs)
  yf, vf = F().init_with_output(rngs, xs)
  assert same_tree(vo, vf) and same_tree(yo, yf)
  mutable = ['batch_stats'] if variant == 'batchnorm' else False
  assert same_tree(O().apply(vf, xs, rngs={'dropout': KEY}, mutable=mutable),
                   F().apply(vf, xs, rngs={'dropout': KEY}, mutable=mutable))


def test_from_flax_custom_module_vs_flax():
  class FCustom(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      s = self.variable('stats', 'n', jnp.zeros, ())
      if not self.is_initializing():
        s.value += 1
      return fnn.GroupNorm(num_groups=2)(fnn.Dense(4)(x)) + jax.random.uniform(self.make_rng('noise'))

  class O(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return linen_ext.from_flax(FCustom(), name='c')(x)

  class F(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      return FCustom(name='c')(x)
  x = jnp.ones((2, 3))
  rngs = {'params': KEY, 'noise': KEY}
  yo, vo = O().init_with_output(rngs, x)
  yf, vf = F().init_with_output(rngs, x)
  assert same_tree(vo, vf) and same_tree(yo, yf)
  assert same_tree(O().apply(vf, x, rngs={'noise': KEY}, mutable=['stats']),
                   F().apply(vf, x, rngs={'noise': KEY}, mutable=['stats']))


FLAX_COMBINATORS = {
    'RNN': lambda **kw: fnn.RNN(fnn.LSTMCell(4), **kw),
    'WeightNorm': lambda **kw: fnn.WeightNorm(fnn.Dense(4), **kw),
    'Sequential': lambda **kw: fnn.Sequential([fnn.Dense(4), fnn.relu, fnn.Dense(2)], **kw),
}


@pytest.mark.parametrize('name', sorted(FLAX_COMBINATORS))
def test_from_flax_combinator_tree_vs_flax(name):
  make = FLAX_COMBINATORS[name]

  class O(linen_ext.Module):
    @linen_ext.compact
    def __call__(self, x):
      return linen_ext.from_flax(make())(x)

  class F(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      return make()(x)
  x = jax.random.normal(KEY, (2, 5, 3))
  vo, vf = O().init(KEY, x), F().init(KEY, x)
  assert shapes(vo) == shapes(vf)
  assert same_tree(O().apply(vf, x), F().apply(vf, x))


def test_reexports_are_flax_objects():
  for name in ['relu', 'gelu', 'initializers', 'with_partitioning', 'Partitioned',
               'PARTITION_NAME', 'get_partition_spec', 'logical_axis_rules',
               'set_logical_axis_rules', 'get_logical_axis_rules', 'with_logical_partitioning',
               'LogicallyPartitioned', 'logical_to_mesh_axes', 'softmax', 'sigmoid', 'tanh',
               'silu', 'swish', 'elu', 'leaky_relu', 'one_hot', 'log_softmax', 'make_causal_mask',
               'make_attention_mask', 'dot_product_attention']:
    assert getattr(linen_ext, name) is getattr(fnn, name), name
  for name in ['Dense', 'Conv', 'Embed', 'LayerNorm', 'RMSNorm', 'BatchNorm', 'Dropout',
               'LSTMCell', 'GRUCell', 'MultiHeadDotProductAttention']:
    assert issubclass(getattr(linen_ext, name), linen_ext.Module), name
