"""Every lifted transform against flax.core.lift on the same scope functions.

Each test builds a scope function with Flax's transforms and with ours, runs both with
the same keys and compares outputs, variable trees (with axis-metadata names) and mutated
collections, bit for bit unless a depth is given.
"""

import flax.core
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest
from flax.core import axes_scan, lift as flax_lift, meta
from flax.typing import In, Out

import lift
from lift import errors

from tests.helpers import assert_trees_close, assert_trees_equal, check_linen_parity, plain

KEY = jax.random.key(0)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(5)}
DROP = {'dropout': jax.random.key(3)}
X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
XB = jnp.linspace(-1.0, 1.0, 12).reshape(2, 2, 3)  # a leading batch/step axis of 2
XS = jnp.linspace(-1.0, 1.0, 24).reshape(4, 2, 3)  # 4 steps
kd = jax.random.key_data
VMAP = dict(variable_axes={'params': 0, 'stats': 0}, split_rngs={'params': True, 'dropout': True})


def both(build, run):
  """(Flax's result, ours): ``run(M, build(L))`` with Flax's modules, then with ours."""
  return tuple(run(M, build(L)) for M, L in ((flax.core, flax_lift), (lift, lift)))


def check(build, run, depth=None):
  theirs, ours = both(build, run)
  assert_trees_equal(ours, theirs) if depth is None else assert_trees_close(ours, theirs, depth)
  return theirs, ours


def init_then_apply(build, x, mutable='stats', depth=None, **kwargs):
  """Init with RNGS, then apply Flax's variables with fresh dropout keys: both as Flax."""
  theirs, _ = check(build, lambda M, fn: M.init(fn)(RNGS, *x), depth)
  check(build, lambda M, fn: M.apply(fn, mutable=mutable)(plain(theirs[1]), *x, rngs=DROP, **kwargs), depth)
  return theirs


def dense(scope, x, features=3):
  k = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  b = scope.param('bias', jax.nn.initializers.normal(0.1), (features,))
  y = x @ k
  return y + b.reshape((1,) * (y.ndim - 1) + (-1,))


def partitioned_dense(scope, x):
  k = scope.param('kernel', meta.with_partitioning(jax.nn.initializers.lecun_normal(), ('in', 'out')),
                  (x.shape[-1], 3))
  return x @ k + scope.param('bias', meta.with_partitioning(jax.nn.initializers.normal(0.1), ('out',)), (3,))[None]


def count(scope, col='stats', by=1):
  n = scope.variable(col, 'n', lambda: jnp.zeros((), jnp.int32))
  n.value = n.value + by


def noisy_dense(scope, x):
  h = scope.child(dense, 'd')(x)
  count(scope)
  return h + jax.random.normal(scope.make_rng('dropout'), h.shape)


def bn(scope, x):
  h = dense(scope, x)
  m = scope.variable('stats', 'm', lambda: jnp.zeros(3))
  m.value = m.value * 0.9 + h.mean(0)
  count(scope)
  return h


def marker(L):
  return axes_scan.broadcast if L is flax_lift else lift.broadcast


def flax_style_jit(L, fn, **kwargs):
  """flax.core.lift.jit passes a module hash key after the scope; ours does not."""
  if L is lift:
    return lift.jit(fn, **kwargs)
  jitted = flax_lift.jit(lambda s, _, *a, **k: fn(s, *a, **k), **kwargs)
  return lambda s, *a, **k: jitted(s, None, *a, **k)


# -- vmap -------------------------------------------------------------------------------------

def _vmap_body(scope, x):
  y = dense(scope, x)
  st = scope.variable('stats', 'mean', lambda: jnp.zeros(3))
  st.value = st.value + y.mean(0)
  scope.variable('cache', 'v', lambda: jnp.ones(()))
  return y + jax.random.normal(scope.make_rng('dropout'), y.shape)


@pytest.mark.parametrize('config', [
    dict(variable_axes={'params': 1, 'stats': 0, 'cache': None}, split_rngs={'params': True, 'dropout': False},
         in_axes=1),
    dict(variable_axes={'params': 0, 'stats': 0, 'cache': None}, split_rngs={'params': True, 'dropout': True}),
    dict(variable_axes={'params': None, 'stats': 0, 'cache': None}, split_rngs={'params': False, 'dropout': True}),
    dict(variable_axes={True: 0}, split_rngs={True: True}),
    dict(variable_axes={'params': -1, 'DENY': 0}, split_rngs={'DENY_dropout': True, 'dropout': False}),
])
def test_vmap_variable_axes_and_split_rngs(config):
  def build(L):
    D = flax.core.DenyList if L is flax_lift else lift.DenyList
    axes = {(D('params') if k == 'DENY' else k): v for k, v in config['variable_axes'].items()}
    splits = {(D('dropout') if k == 'DENY_dropout' else k): v for k, v in config['split_rngs'].items()}
    return L.vmap(_vmap_body, variable_axes=axes, split_rngs=splits, in_axes=config.get('in_axes', 0))
  init_then_apply(build, (XB,))


def test_vmap_axis_size_pytree_axes_and_nested_children():
  body = lambda s: s.param('w', jax.nn.initializers.normal(), (2,)) + jax.random.uniform(s.make_rng('dropout'))
  _, ours = check(lambda L: L.vmap(body, variable_axes={'params': 0},
                                   split_rngs={'params': True, 'dropout': True}, axis_size=4),
                  lambda M, fn: M.init(fn)(RNGS))
  assert ours[1]['params']['w'].shape == (4, 2)
  def pytrees(scope, a, b):
    w = scope.param('w', jax.nn.initializers.normal(), (3,))
    return {'p': a['u'] * w + b, 'q': a['v']}, (b * 2,)
  a = {'u': jnp.ones((2, 3)), 'v': jnp.arange(3.0)}
  check(lambda L: L.vmap(pytrees, variable_axes={'params': 0}, split_rngs={'params': True},
                         in_axes=({'u': 0, 'v': None}, 1), out_axes=({'p': 1, 'q': None}, 0)),
        lambda M, fn: M.init(fn)(RNGS, a, jnp.ones((3, 2))))
  def nested(L):
    v = L.vmap(lambda s, x: s.child(dense, 'b')(s.child(dense, 'a')(x)),
               variable_axes={'params': 0}, split_rngs={'params': True})
    return lambda s, x: s.child(v, 'outer')(x) + s.child(v, 'outer2')(x)
  check(nested, lambda M, fn: M.init(fn)(RNGS, XB))


@pytest.mark.parametrize('axis', [0, 1])
def test_vmap_and_scan_name_the_new_axis_of_partitioned_boxes(axis):
  build = lambda L: L.vmap(partitioned_dense, variable_axes={'params': axis}, split_rngs={'params': True},
                           metadata_params={meta.PARTITION_NAME: 'batch'})
  theirs = init_then_apply(build, (XB,))
  assert theirs[1]['params']['kernel'].names == (('batch', 'in', 'out') if axis == 0 else ('in', 'batch', 'out'))
  build = lambda L: L.scan(lambda s, c: (partitioned_dense(s, c), None), variable_axes={'params': axis},
                           split_rngs={'params': True}, length=2, metadata_params={meta.PARTITION_NAME: 'layers'})
  theirs = init_then_apply(build, (X,))
  assert theirs[1]['params']['bias'].names == (('layers', 'out') if axis == 0 else ('out', 'layers'))


def test_logical_partitioning_and_scan_of_vmap_names():
  def body(scope, x):
    return x @ scope.param('kernel', flax_nn.with_logical_partitioning(
        jax.nn.initializers.lecun_normal(), ('embed', 'mlp')), (x.shape[-1], 3))
  check(lambda L: L.vmap(body, variable_axes={'params': 0}, split_rngs={'params': True},
                         metadata_params={meta.PARTITION_NAME: 'heads'}), lambda M, fn: M.init(fn)(RNGS, XB))
  check(lambda L: L.scan(lambda s, c: (body(s, c), None), variable_axes={'params': 0}, split_rngs={'params': True},
                         length=3, metadata_params={meta.PARTITION_NAME: 'layers'}), lambda M, fn: M.init(fn)(RNGS, X))
  def scan_of_vmap(L):
    inner = L.vmap(partitioned_dense, variable_axes={'params': 0}, split_rngs={'params': True},
                   metadata_params={meta.PARTITION_NAME: 'ens'})
    return L.scan(lambda s, c: (inner(s, c), None), variable_axes={'params': 0},
                  split_rngs={'params': True}, length=2, metadata_params={meta.PARTITION_NAME: 'layers'})
  theirs, _ = check(scan_of_vmap, lambda M, fn: M.init(fn)(RNGS, XB))
  assert theirs[1]['params']['kernel'].names == ('layers', 'ens', 'in', 'out')


@pytest.mark.parametrize('transform', ['vmap', 'scan'])
def test_in_and_out_variable_axes(transform):
  def body(scope, x):
    h = dense(scope, x)
    scope.put_variable('intermediates', 'h', h)
    return h
  axes = {'params': 0, 'intermediates': Out(0)}
  if transform == 'vmap':
    check(lambda L: L.vmap(body, variable_axes=axes, split_rngs={'params': True}), lambda M, fn: M.init(fn)(RNGS, XB))
  else:
    check(lambda L: L.scan(lambda s, c, x: (c, body(s, x)), variable_axes=axes, split_rngs={'params': True}),
          lambda M, fn: M.init(lambda s, x: fn(s, 0, x))(RNGS, XB))
  variables = {'params': {'kernel': jnp.ones((2, 3, 3)), 'bias': jnp.ones((2, 3))}, 'consts': {'c': jnp.ones((2,))}}
  check(lambda L: L.vmap(lambda s, x: dense(s, x) * s.get_variable('consts', 'c'),
                         variable_axes={'params': 0, 'consts': In(0)}, split_rngs={}),
        lambda M, fn: M.apply(fn)(variables, XB))


# -- scan and remat_scan ----------------------------------------------------------------------

def _step(scope, c, x):
  h = dense(scope, c + x)
  count(scope, 'counter')
  return jnp.tanh(h), h.sum(-1)


def _with_counter(sc):
  def fn(scope, *args):
    scope.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))  # Flax needs carries made outside
    return sc(scope, *args)
  return fn


@pytest.mark.parametrize('kwargs', [
    dict(variable_axes={'params': 0}, variable_carry='counter', split_rngs={'params': True}),
    dict(variable_broadcast='params', variable_carry='counter', split_rngs={'params': False}),
    dict(variable_axes={'params': 0, 'counter': 0}, split_rngs={'params': True}, reverse=True),
    dict(variable_axes={'params': 0, 'counter': 0}, split_rngs={'params': True},
         data_transform=lambda vg, rg: (jax.tree.map(lambda a: a * 2, vg), rg)),
])
def test_scan_variable_rules_reverse_and_data_transform(kwargs):
  carried = kwargs.get('variable_carry') == 'counter'
  init_then_apply(lambda L: (_with_counter if carried else (lambda f: f))(L.scan(_step, **kwargs)), (X, XS),
                  mutable='counter')


@pytest.mark.parametrize('split', [True, False])
def test_scan_with_length_only(split):
  def step(scope, c):
    return jnp.tanh(dense(scope, c)), jax.random.normal(scope.make_rng('dropout'), (2,))
  init_then_apply(lambda L: L.scan(step, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': split},
                                   length=3), (X,), mutable=False)


def test_scan_broadcast_markers_in_and_out_and_linen_broadcast_input():
  def step(scope, c, x, b):
    w = scope.param('w', jax.nn.initializers.normal(), (3,))
    return c + x * b, ((c * b).sum(), w * 2)
  b = jnp.full((2, 3), 2.0)
  check(lambda L: L.scan(step, variable_broadcast='params', split_rngs={'params': False},
                         in_axes=(0, marker(L)), out_axes=(0, marker(L))), lambda M, fn: M.init(fn)(RNGS, X, XS, b))
  def step2(scope, c, d):
    return c + d['a'] * d['b'], {'p': d['a'].sum(), 'q': d['b']}
  check(lambda L: L.scan(step2, in_axes=({'a': 0, 'b': marker(L)},), out_axes={'p': 0, 'q': marker(L)}),
        lambda M, fn: M.init(fn)(RNGS, X, {'a': jnp.ones((4, 2, 3)), 'b': b}))
  check(lambda L: L.scan(lambda s, c, x, b: (c + x * b, None), in_axes=(0, axes_scan.broadcast)),  # Flax's marker
        lambda M, fn: M.init(fn)(RNGS, X, XS, b))
  def linen(nn):
    class Blk(nn.Module):
      @nn.compact
      def __call__(self, c, xs, ctx):
        return c + nn.Dense(3)(xs) * ctx, c.sum()
    scan = nn.scan(Blk, variable_broadcast='params', split_rngs={'params': False}, in_axes=(0, nn.broadcast))
    return scan(name='s').init_with_output(KEY, jnp.zeros(3), jnp.ones((4, 3)), 2.0)
  check_linen_parity(linen)
  def invariant(s, c, x):
    w = s.param('w', jax.nn.initializers.normal(), (3, 3))
    return jnp.tanh(c @ w), jnp.float32(0) if s.is_mutable_collection('params') else w.sum()
  check(lambda L: lambda s, x: L.scan(invariant, variable_broadcast='params', split_rngs={'params': False},
                                      out_axes=marker(L), length=3)(s, x, None), lambda M, fn: M.init(fn)(KEY, X))


@pytest.mark.parametrize('in_axes, out_axes', [(1, (1, 0)), (0, -1), ((0, 1), 0)])
def test_scan_in_axes_and_out_axes_other_than_zero(in_axes, out_axes):
  if isinstance(in_axes, tuple):
    step, args = lambda s, c, x, y: (c + x + y, (c * 2, x.sum(-1))), (XS, jnp.swapaxes(XS, 0, 1))
  else:
    step, args = lambda s, c, x: (c + x, (c * 2, x.sum(-1))), (jnp.moveaxis(XS, 0, in_axes),)
  check(lambda L: L.scan(step, in_axes=in_axes, out_axes=out_axes), lambda M, fn: M.init(fn)(RNGS, X, *args))


def test_scan_with_nested_children_and_dropout_in_a_named_child():
  def deep(scope, c, x):
    h = scope.child(dense, 'l2')(scope.child(dense, 'l1')(c + x))
    d = jax.random.bernoulli(scope.push('drop').make_rng('dropout'), 0.5, h.shape).astype(jnp.float32)
    return jnp.tanh(h) * d, d.sum()
  def build(L):
    sc = L.scan(deep, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True})
    return lambda s, c, xs: (s.param('pre', jax.nn.initializers.normal(), (2,)), s.child(sc, 'stack')(c, xs),
                             s.param('post', jax.nn.initializers.normal(), (2,)))
  check(build, lambda M, fn: M.init(fn)(RNGS, X, XS))


@pytest.mark.parametrize('mutable', [True, ['params', 'stats']])
def test_scan_read_only_broadcast_collection_is_not_returned(mutable):
  def step(s, c, x):
    w, k = s.param('w', jax.nn.initializers.normal(), (3,)), s.get_variable('consts', 'k')
    count(s)
    return c * (w * k).reshape(1, 3) + x, None
  def build(L):
    sc = L.scan(step, variable_broadcast=['params', 'consts'], variable_carry='stats', split_rngs={'params': False})
    return lambda s, c, xs: (s.variable('stats', 'n', lambda: jnp.zeros((), jnp.int32)), sc(s, c, xs))[1]
  check(build, lambda M, fn: M.apply(fn, mutable=mutable)({'consts': {'k': jnp.full((3,), 2.0)}}, X, XS, rngs=RNGS))


def _remat_body(scope, c):
  h = dense(scope, c)
  count(scope, 'counter')
  return jnp.tanh(h)


@pytest.mark.parametrize('lengths', [(2, 3), (1, 2, 2)])
def test_remat_scan_shapes_values_and_gradients(lengths):
  build = lambda L: L.remat_scan(_remat_body, lengths=lengths)
  theirs = init_then_apply(build, (X,), mutable='counter')
  assert theirs[1]['params']['kernel'].shape == lengths + (3, 3)
  assert theirs[1]['counter']['n'].shape == lengths
  variables = plain(theirs[1])
  check(build, lambda M, fn: jax.grad(lambda p: M.apply(fn, mutable='counter')(
      {**variables, 'params': p}, X)[0].sum())(variables['params']))


def test_remat_scan_broadcast_policy_and_dropout():
  def drop(scope, c):
    h = dense(scope, c)
    return h * jax.random.bernoulli(scope.make_rng('dropout'), 0.5, h.shape).astype(jnp.float32)
  for build in [lambda L: L.remat_scan(_remat_body, lengths=(2, 2), variable_broadcast='params',
                                       variable_axes={'counter': 0}, split_rngs={'params': False}),
                lambda L: L.remat_scan(_remat_body, lengths=(2, 2), policy=jax.checkpoint_policies.nothing_saveable),
                lambda L: L.remat_scan(drop, lengths=(2, 3))]:
    check(build, lambda M, fn: M.init(fn)(RNGS, X))


def test_scan_split_transpose_and_unchecked_invariants_give_the_same_gradients():
  step = lambda s, c, x: (c + dense(s, x).sum(), c)
  split = lift.scan(step, variable_broadcast='params', split_rngs={'params': False},
                    _split_transpose=True, check_constancy_invariants=False)
  plain_scan = lift.scan(step, variable_broadcast='params', split_rngs={'params': False})
  xs = jnp.stack([X, 2 * X])
  v = lift.init(plain_scan)(KEY, 0.0, xs)[1]
  grad = lambda f: jax.grad(lambda p: lift.apply(f)({'params': p}, 0.0, xs)[0])(v['params'])
  assert_trees_close(grad(split), grad(plain_scan))


# -- checkpoint, jit, map_variables --------------------------------------------------------------

def _stack(scope, x, n, act):
  for i in range(n):
    x = scope.child(dense, f'd{i}')(x)
  return x if act is None else act(x)


def test_checkpoint_static_argnums_policy_concrete_and_gradients():
  build = lambda L: L.checkpoint(_stack, static_argnums=(1, 2))
  theirs, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X, 2, jnp.tanh))
  check(build, lambda M, fn: jax.grad(lambda p: M.apply(fn)({'params': p}, X, 2, jnp.tanh).sum())(
      plain(theirs[1])['params']))
  check(lambda L: L.checkpoint(_stack, static_argnums=1, prevent_cse=False, concrete=False,
                               policy=jax.checkpoint_policies.everything_saveable),
        lambda M, fn: M.init(fn)(RNGS, X, 2, None))


def test_checkpoint_on_two_children_with_dropout_and_stats():
  def build(L):
    c = L.checkpoint(noisy_dense)
    return lambda s, x: (s.child(c, 'a')(x), s.child(c, 'b')(x), kd(s.make_rng('dropout')))
  init_then_apply(build, (X,))


def test_jit_at_the_root_with_mutable_collections_static_argnames_and_backend():
  theirs = init_then_apply(lambda L: flax_style_jit(L, bn), (X,))
  def twice(L):
    j = flax_style_jit(L, bn)
    return lambda s, x: j(s, j(s, x))
  check(twice, lambda M, fn: M.apply(fn, mutable='stats')(plain(theirs[1]), X))
  check(lambda L: flax_style_jit(L, lambda s, x: s.variable('stats', 'z', lambda: x.sum()).value, rngs=False),
        lambda M, fn: M.init(fn)({'params': KEY}, X))
  check(lambda L: flax_style_jit(L, _stack, static_argnames='n'), lambda M, fn: M.init(fn)({'params': KEY}, X, n=2, act=None))
  variables = lift.init(dense)(KEY, X)[1]
  with pytest.warns(DeprecationWarning, match='backend'):  # JAX's, so the option reached jax.jit
    assert_trees_equal(lift.apply(lift.jit(dense, backend='cpu'))(variables, X), lift.apply(lift.jit(dense))(variables, X))


def _transpose(cols):
  return jax.tree.map(lambda a: a.T if a.ndim == 2 else a, cols)


@pytest.mark.parametrize('kwargs', [dict(init=True), dict(init=True, mutable=True), dict(mutable=True)])
def test_map_variables_in_a_child_between_other_params(kwargs):
  def build(L):
    mv = L.map_variables(bn, 'params', _transpose, _transpose, **kwargs)
    return lambda s, x: (s.param('pre', jax.nn.initializers.normal(), (2,)), s.child(mv, 'mv')(x),
                         s.param('post', jax.nn.initializers.normal(), (2,)))
  theirs = init_then_apply(build, (X,), mutable=True)
  assert theirs[1]['params']['mv']['kernel'].shape == (3, 3)
  double = lambda c: jax.tree.map(lambda a: a * 2, c)
  init_then_apply(lambda L: L.map_variables(bn, True, double, lambda c: jax.tree.map(lambda a: a / 2, c),
                                            init=True, mutable=True), (X,), mutable=True)


# -- control flow and autodiff ---------------------------------------------------------------------

def _cond_model(L):
  def false_fn(scope, x):  # no draw: where both branches draw, the keys differ by design
    count(scope, by=2)
    return -scope.child(dense, 'd')(x)
  def fn(scope, x, pred):
    pre = scope.param('pre', jax.nn.initializers.normal(), (2,))
    y = L.cond(pred, noisy_dense, false_fn, scope, x)
    return y, pre, scope.param('post', jax.nn.initializers.normal(), (2,)), kd(scope.make_rng('dropout'))
  return fn


BRANCHES = [lambda s, x: s.child(dense, 'd')(x), lambda s, x: 2 * s.child(dense, 'd')(x),
            lambda s, x: jnp.tanh(s.child(dense, 'd')(x))]


@pytest.mark.parametrize('build, first, preds', [
    (_cond_model, True, [True, False]), (lambda L: lambda s, x, i: L.switch(i, BRANCHES, s, x), 0, [0, 1, 2, 7, -3])],
    ids=['cond', 'switch'])
def test_init_with_the_first_branch_and_apply(build, first, preds):
  theirs, _ = check(build, lambda M, fn: M.init(fn)(RNGS, X, first))
  for pred in preds:
    check(build, lambda M, fn: M.apply(fn, mutable='stats')(plain(theirs[1]), X, jnp.array(pred), rngs=DROP))


@pytest.mark.parametrize('split', [True, False])
def test_while_loop_carry_variables_and_body_rngs(split):
  def build(L):
    def fn(scope, x):
      scope.variable('state', 'acc', lambda: jnp.zeros(3))
      scope.param('w', jax.nn.initializers.normal(), (3, 3))
      def body(s, c):
        h = jnp.tanh(c[1] @ s.get_variable('params', 'w')) + jax.random.normal(s.make_rng('dropout'), c[1].shape)
        s.put_variable('state', 'acc', s.get_variable('state', 'acc') + h.sum(0))
        return c[0] + 1, h
      y = L.while_loop(lambda s, c: c[0] < 3, body, scope, (0, x), carry_variables='state',
                       split_rngs={'dropout': split})
      return y, kd(scope.make_rng('dropout'))
    return fn
  init_then_apply(build, (X,), mutable='state')
  def keys(L):  # the cond and body draw different keys: cond runs once in Flax, in ours up to 5 times
    def fn(scope):
      cond_fn = lambda s, c: (c[0] < 1) | (jnp.all(kd(s.make_rng('dropout')) == c[1]) & (c[0] < 5))
      y = L.while_loop(cond_fn, lambda s, c: (c[0] + 1, kd(s.make_rng('dropout'))), scope,
                       (0, jnp.zeros((2,), jnp.uint32)), split_rngs={'dropout': split})
      return y, kd(scope.make_rng('dropout'))
    return fn
  check(keys, lambda M, fn: M.apply(fn)({}, rngs=RNGS))


def _loss(scope, x):
  count(scope)
  return jnp.sum(scope.child(dense, 'd')(x) ** 2) + jax.random.normal(scope.make_rng('dropout'))


def _loss_aux(scope, x):
  return _loss(scope, x), {'x': x.sum()}


def test_vjp_value_and_grad_and_jvp_variants():
  variables = lift.init(_loss)(RNGS, X)[1]
  run = lambda *args: lambda M, fn: M.apply(fn, mutable='stats')(variables, *args, rngs=RNGS)
  def vjp(L):
    def fn(s, x):
      y, bwd = L.vjp(_loss, s, x)
      return y, bwd(jnp.ones_like(y)), kd(s.make_rng('dropout'))
    return fn
  check(vjp, lambda M, fn: M.init(fn)(RNGS, X))
  check(vjp, run(X))
  def aux_vjp(L):
    def fn(s, x):
      y, bwd, aux = L.vjp(_loss_aux, s, x, has_aux=True, vjp_variables='params', variables=True)
      return y, bwd(jnp.ones_like(y)), aux
    return fn
  check(aux_vjp, run(X))
  def two_collections(L):
    def fn(s, x):
      y, bwd = L.vjp(lambda s, x: _loss(s, x) * s.get_variable('stats', 'n'), s, x, vjp_variables=['params', 'stats'])
      return y, bwd(jnp.ones_like(y))
    return fn
  float_state = jax.tree.map(lambda a: a.astype(jnp.float32), variables)
  check(two_collections, lambda M, fn: M.apply(fn, mutable='stats')(float_state, X, rngs=RNGS))
  check(lambda L: (lambda s, x: L.value_and_grad(_loss, s, x)), lambda M, fn: M.init(fn)(RNGS, X))
  check(lambda L: (lambda s, x: L.value_and_grad(_loss_aux, s, x, has_aux=True)), run(X))
  check(lambda L: (lambda s, x, y: L.value_and_grad(lambda s, a, b: _loss(s, a * b), s, x, y)), run(X, X * 2))
  tangent = jax.tree.map(jnp.ones_like, variables['params'])
  check(lambda L: (lambda s, x: L.jvp(_loss, s, (x,), (jnp.ones_like(x),), {'params': tangent})), run(X))
  check(lambda L: (lambda s, x: (L.jvp(_loss, s, (x,), (jnp.ones_like(x),), {}), kd(s.make_rng('dropout')))),
        lambda M, fn: M.init(fn)(RNGS, X))


def test_autodiff_over_a_tuple_of_scopes():
  def two(scopes, x):
    return dense(scopes[1], dense(scopes[0], x)).sum()
  variables = lift.init(lambda s, x: two((s.push('a'), s.push('b')), x))({'params': KEY}, X)[1]
  run = lambda M, fn: M.apply(fn)(variables, X)
  def vjp(L):
    return lambda s, x: L.vjp(two, (s.push('a'), s.push('b')), x)[1](jnp.ones(()))
  check(vjp, run)
  ta, tb = (jax.tree.map(f, variables['params'][k]) for f, k in ((jnp.ones_like, 'a'), (jnp.zeros_like, 'b')))
  check(lambda L: (lambda s, x: L.jvp(two, (s.push('a'), s.push('b')), (x,), (jnp.zeros_like(x),),
                                      ({'params': ta}, {'params': tb}))), run)
  check(lambda L: (lambda s, x: L.value_and_grad(two, (s.push('a'), s.push('b')), x)), run)


def _custom_dense(L):
  fn = lambda s, x: s.child(dense, 'd')(x) + jax.random.normal(s.make_rng('dropout'), (2, 3))
  def bwd(vjp_fn, g):
    params_t, x_t = vjp_fn(g)
    return jax.tree.map(lambda a: a * 2.0, params_t), x_t * 3
  cv = L.custom_vjp(fn, lambda s, x: L.vjp(fn, s, x), bwd)
  return lambda s, x: cv(s, x) + jax.random.normal(s.make_rng('dropout'), (2, 3))


def test_custom_vjp_values_rngs_gradients_nondiff_argnums_and_grad_vars():
  variables = lift.init(lambda s, x: dense(s.push('d'), x))({'params': KEY}, X)[1]
  def nondiff(L):
    fn = lambda s, x, k: s.child(dense, 'd')(x) * k
    def bwd(k, vjp_fn, g):
      params_t, x_t = vjp_fn(g)
      return params_t, x_t * k
    return L.custom_vjp(fn, lambda s, x, k: L.vjp(lambda s, x: fn(s, x, k), s, x), bwd, nondiff_argnums=(2,))
  check(nondiff, lambda M, fn: jax.grad(lambda p, x: M.apply(fn)({'params': p}, x, 2.0).sum(),
                                        argnums=(0, 1))(variables['params'], X))
  def grad_vars(L):
    fn = lambda s, x: s.child(dense, 'd')(x) * s.get_variable('consts', 'c')
    fwd = lambda s, x: L.vjp(fn, s, x, vjp_variables=['params', 'consts'])
    return L.custom_vjp(fn, fwd, lambda vjp_fn, g: vjp_fn(g), grad_vars=['params', 'consts'])
  all_vars = {'params': variables['params'], 'consts': {'c': jnp.float32(2.0)}}
  check(grad_vars, lambda M, fn: jax.grad(lambda v, x: M.apply(fn)(v, x).sum(), argnums=(0, 1))(all_vars, X))
  theirs, _ = check(_custom_dense, lambda M, fn: M.init(fn)(RNGS, X))  # values, rngs and gradients
  params = plain(theirs[1])['params']
  check(_custom_dense, lambda M, fn: M.apply(fn)({'params': params}, X, rngs=RNGS))
  check(_custom_dense, lambda M, fn: jax.value_and_grad(
      lambda p, x: M.apply(fn)({'params': p}, x, rngs=RNGS).sum(), argnums=(0, 1))(params, X))


# -- what every transform shares: untransformed params, scope trees, nesting, mutability -------------

def _blk(s, x):
  return s.child(lambda s, x: dense(s.push('sub'), x), name='blk')(x)


@pytest.mark.parametrize('name', ['checkpoint', 'cond', 'switch', 'map_variables', 'jit', 'vjp'])
def test_non_splitting_transforms_create_the_params_of_untransformed_code(name):
  make = {'checkpoint': lambda s, x: lift.checkpoint(_blk)(s, x),
          'cond': lambda s, x: lift.cond(True, _blk, _blk, s, x),
          'switch': lambda s, x: lift.switch(1, [_blk, _blk, _blk], s, x),
          'map_variables': lambda s, x: lift.map_variables(_blk, 'params', init=True)(s, x),
          'jit': lambda s, x: lift.jit(_blk)(s, x), 'vjp': lambda s, x: lift.vjp(_blk, s, x)[0]}[name]
  assert_trees_equal(lift.init(make)(KEY, X), flax.core.init(_blk)(KEY, X))


def _two_scopes(scopes, x):
  a, b = scopes
  y = dense(b, dense(a, x))
  count(b)
  return y + jax.random.normal(a.make_rng('dropout'), y.shape)


SCOPE_TREE_TRANSFORMS = {
    'vmap': lambda L: L.vmap(_two_scopes, **VMAP, axis_size=2, in_axes=None),
    'checkpoint': lambda L: L.checkpoint(_two_scopes),
    'scan': lambda L: (lambda sc: lambda s, x: sc(s, x)[0])(L.scan(
        lambda s, c: (_two_scopes(s, c), None), **VMAP, length=2)),
}


@pytest.mark.parametrize('name', sorted(SCOPE_TREE_TRANSFORMS))
@pytest.mark.parametrize('tree', ['siblings', 'parent_and_child'])
def test_transforms_over_scope_trees(name, tree):
  def build(L):
    t = SCOPE_TREE_TRANSFORMS[name](L)
    def fn(s, x):
      s.param('pre', jax.nn.initializers.normal(), (2,))
      c = s.push('a')
      return t((c, s.push('b') if tree == 'siblings' else c.push('b')), x)
    return fn
  init_then_apply(build, (X,))


NESTED = {
    'vmap(scan)': lambda L: L.vmap(lambda s, x: L.scan(
        lambda s, c, x: (c + 1, noisy_dense(s, x)), **VMAP)(s, 0, x)[1], **VMAP),
    'scan(checkpoint)': lambda L: (lambda sc: lambda s, x: sc(s, 0, x))(L.scan(
        lambda s, c, x: (c, L.checkpoint(noisy_dense)(s, x)), **VMAP)),
    'vmap(remat_scan)': lambda L: L.vmap(L.remat_scan(noisy_dense, lengths=(2, 2), **VMAP), **VMAP),
    'vmap(vjp)': lambda L: L.vmap(lambda s, x: (lambda y_bwd: (y_bwd[0], y_bwd[1](jnp.ones(()))))(
        L.vjp(lambda s, x: noisy_dense(s, x).sum(), s, x, variables=True)), **VMAP),
    'vmap(while_loop)': lambda L: L.vmap(lambda s, x: (
        s.param('w', jax.nn.initializers.normal(), (3, 3)), L.while_loop(
            lambda s, c: c[0] < 2, lambda s, c: (c[0] + 1, jnp.tanh(c[1] @ s.get_variable('params', 'w'))),
            s, (0, x))[1])[1], variable_axes={'params': 0}, split_rngs={'params': True}),
}


@pytest.mark.parametrize('name', sorted(NESTED))
def test_nested_transforms(name):
  init_then_apply(NESTED[name], (jnp.linspace(-1.0, 1.0, 24).reshape(2, 4, 3),))


def test_streams_not_lifted_fall_back_to_params_and_flags_and_paths_inside():
  def body(s, x):
    return (x + jax.random.normal(s.make_rng('dropout'), x.shape)
            + jax.random.normal(s.push('c').make_rng('other'), x.shape)), s.has_rng('dropout')
  rngs = {'params': jax.random.key(1), 'dropout': jax.random.key(2)}
  check(lambda L: L.vmap(body, variable_axes={}, split_rngs={'params': True}, out_axes=(0, None)),
        lambda M, fn: M.apply(fn)({}, XB, rngs=rngs))
  check(lambda L: L.checkpoint(body, rngs='params'), lambda M, fn: M.apply(fn)({}, X, rngs=rngs))
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
  theirs, ours = both(build, lambda M, fn: M.init(fn, flags={'foo': 1})(RNGS, X)[0])
  assert theirs == ours


def _mutability(s, x):
  return x, {c: s.is_mutable_collection(c) for c in ('params', 'stats', 'cache', 'other')}


@pytest.mark.parametrize('mutable', [True, ['stats'], ['params', 'stats', 'cache'], False])
@pytest.mark.parametrize('name', ['checkpoint', 'map_variables', 'map_variables_mutable', 'vjp'])
def test_is_mutable_collection_inside_transforms_that_lift_everything(name, mutable):
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
  check(build, lambda M, fn: M.apply(fn, mutable=mutable)({'params': {'w': jnp.ones(2)}}, X))


@pytest.mark.parametrize('name', ['vmap', 'scan', 'checkpoint', 'cond', 'while_loop'])
def test_unlifted_collection_is_immutable_inside(name):
  """A collection mutable outside that the transform does not return is immutable inside, so
  guarded writes (`sow`) skip it, as in Flax; an unguarded write is an error naming it."""
  def build(L, guarded=True):
    def sow_like(s, x):
      h = dense(s, x)
      if not guarded or s.is_mutable_collection('intermediates'):
        s.put_variable('intermediates', 'h', h)
      return h
    if name == 'vmap':
      return L.vmap(sow_like, variable_axes={'params': 0}, split_rngs={'params': True})
    if name == 'scan':
      sc = L.scan(lambda s, c, x: (c, sow_like(s, x)), variable_axes={'params': 0}, split_rngs={'params': True})
      return lambda s, x: sc(s, None, x)[1]
    if name == 'checkpoint':
      return L.checkpoint(sow_like, variables='params')
    if name == 'cond':
      return lambda s, x: L.cond(True, sow_like, sow_like, s, x, variables='params')
    return lambda s, x: (dense(s, x[0]), L.while_loop(lambda s, c: c[0] < 2, lambda s, c: (c[0] + 1, sow_like(s, c[1])),
                                                      s, (0, x), broadcast_variables='params')[1])[1]
  theirs, _ = both(build, lambda M, fn: M.init(fn, mutable='params')({'params': KEY}, XB))
  check(build, lambda M, fn: M.apply(fn, mutable='intermediates')(plain(theirs[1]), XB))
  with pytest.raises(errors.UnliftedCollectionError, match=f'"intermediates" is immutable inside the lifted `{"remat" if name == "checkpoint" else name}`'):
    lift.apply(build(lift, guarded=False), mutable='intermediates')(plain(theirs[1]), XB)
