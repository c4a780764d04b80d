"""lift.scan and lift.remat_scan: oracles (lax.scan over hand-stacked variables, the unrolled
loop, flax.core.lift.scan), shapes, state."""
import flax.core
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import lift as flax_lift
from flax.core import meta
from jax import lax

import lift
from lift import errors
from tests.helpers import assert_trees_close, assert_trees_equal, counter, dense
from tests.lift.test_flax_core_parity import check

KEY = jax.random.key(0)
C0 = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
XS = jnp.linspace(-0.5, 0.5, 30).reshape(5, 2, 3)
LAYERS = dict(variable_axes={'params': 0}, split_rngs={'params': True})
SHARED = dict(variable_broadcast='params', split_rngs={'params': False})


def layer(scope, c, x):
  h = scope.child(dense, 'dense')(c, 3)
  return jnp.tanh(h) + x, h


def _apply_layer(params, c, x):
  return lift.apply(layer)({'params': params}, c, x)


def _layer_params(keys):
  return jax.jit(jax.vmap(lambda k: lift.init(layer)(k, C0, XS[0])[1]['params']))(keys)


def _unrolled(body, reverse=False):
  """The Python loop that a scan of ``body`` over axis 0 means."""
  def run(scope, c, xs):
    ys = [None] * xs.shape[0]
    for i in (reversed if reverse else iter)(range(xs.shape[0])):
      c, ys[i] = body(scope.rewound(), c, xs[i])
    return c, jnp.stack(ys)
  return run


# -- oracles ---------------------------------------------------------------------

@pytest.mark.parametrize('remat', [False, True, 'nested', lift.loops.ScanCheckpointPolicy(nested=2)])
def test_gradient_equals_lax_scan_gradient(remat):
  params = _layer_params(jax.random.split(jax.random.key(1), 5))
  scanned = lift.scan(layer, remat=remat, **LAYERS)
  loss = lambda out: jnp.sum(out[0] ** 2) + jnp.sum(out[1])
  lifted_loss = lambda p: loss(lift.apply(scanned)({'params': p}, C0, XS))
  oracle_loss = lambda p: loss(lax.scan(lambda c, px: _apply_layer(px[0], c, px[1]), C0, (p, XS)))
  assert_trees_close(jax.jit(jax.grad(lifted_loss))(params), jax.grad(oracle_loss)(params), depth=8)


def test_broadcast_output_is_returned_once_not_stacked():
  def step(scope, c, x):
    scale = scope.param('scale', jax.nn.initializers.ones, (3,))
    return c * scale[None] + x, (c, 2.0 * scale)
  scanned = lift.scan(step, out_axes=(0, lift.broadcast), **SHARED)
  (c, (cs, doubled)), variables = lift.init(scanned)(KEY, C0, XS)
  assert cs.shape == (5, 2, 3) and doubled.shape == (3,)
  assert_trees_equal(doubled, 2.0 * variables['params']['scale'])


def test_keyword_arguments_and_data_transform():
  def step(scope, c, x, *, scale):
    c, h = layer(scope, c, x)
    return c * scale, h
  def double_params(variable_groups, rng_groups):
    broadcast, carry, params = variable_groups
    return (broadcast, carry, jax.tree.map(lambda p: 2.0 * p, params)), rng_groups
  params = _layer_params(jax.random.split(jax.random.key(1), 5))
  got = lift.apply(lift.scan(step, data_transform=double_params, **LAYERS))(
      {'params': params}, C0, XS, scale=jnp.float32(0.5))
  doubled = jax.tree.map(lambda p: 2.0 * p, params)
  oracle_step = lambda c, px: (lambda c, h: (0.5 * c, h))(*_apply_layer(px[0], c, px[1]))
  assert_trees_close(got, lax.scan(oracle_step, C0, (doubled, XS)))


def test_scan_inside_vmap_and_under_jit():
  scanned = lift.scan(layer, **LAYERS)
  ensemble = lift.vmap(scanned, variable_axes={'params': 0}, split_rngs={'params': True}, in_axes=(None, 0))
  xss = jnp.stack([XS, 2.0 * XS, 3.0 * XS])
  (c, ys), variables = jax.jit(lift.init(ensemble))(KEY, C0, xss)
  assert variables['params']['dense']['kernel'].shape == (3, 5, 3, 3)
  expected = jax.jit(jax.vmap(lambda p, xs: lift.apply(scanned)({'params': p}, C0, xs)))(variables['params'], xss)
  assert_trees_close((c, ys), expected)


# -- rng parity with flax.core.lift -------------------------------------------------------

def _direct_param_step(scope, c, x):
  w = scope.param('w', jax.nn.initializers.normal(), (3,))
  c, h = layer(scope, c, x)
  return c * w[None], h


def _then_draw(scanned):
  def model(scope, c, xs):
    c, ys = scanned(scope, c, xs)
    return c + scope.param('after', jax.nn.initializers.normal(), (3,))[None], ys
  return model


@pytest.mark.parametrize('kwargs', [LAYERS, dict(variable_axes={'params': 0}, split_rngs={'params': False}), SHARED])
def test_init_matches_flax_core_lift_scan(kwargs):
  check(lambda L: _then_draw(L.scan(_direct_param_step, **kwargs)), lambda M, fn: jax.jit(M.init(fn))(KEY, C0, XS),
        depth=4)


def _dropout_step(scope, c, x):
  c, h = _direct_param_step(scope, c, x)
  return jnp.where(jax.random.bernoulli(scope.make_rng('dropout'), 0.5, c.shape), c, 0.0), h


def _loop_then_draw(loop):
  def model(scope, c, xs):
    c = scope.child(loop, 'loop')(c, xs)[0].reshape(-1, 3).sum(0)
    return c + scope.param('after', jax.nn.initializers.normal(), (3,))
  return model


def test_draw_once_streams_draw_as_vmap_and_the_others_as_flax():
  """_draw_once='params': parameters equal a vmapped init's; dropout keys stay Flax's."""
  rngs, dropout = {'params': KEY, 'dropout': jax.random.key(1)}, {'dropout': jax.random.key(1)}
  kwargs = dict(variable_axes={'params': 0}, split_rngs={True: True})
  once = _loop_then_draw(lift.scan(_dropout_step, _draw_once='params', **kwargs))
  y, variables = jax.jit(lift.init(once))(rngs, C0, XS)
  vmapped = lift.vmap(_dropout_step, in_axes=(None, 0), **kwargs)
  assert_trees_close(variables, jax.jit(lift.init(_loop_then_draw(vmapped)))(rngs, C0, XS)[1])
  flax_scan = _loop_then_draw(flax_lift.scan(_dropout_step, **kwargs))
  _, theirs = jax.jit(flax.core.init(flax_scan))(rngs, C0, XS)
  assert not np.allclose(variables['params']['loop']['w'], theirs['params']['loop']['w'])
  got = lift.apply(once)(variables, C0, XS, rngs=dropout)
  assert_trees_close(got, y)  # init's output is apply's
  assert_trees_close(got, flax.core.apply(flax_scan)(variables, C0, XS, rngs=dropout))


# -- shapes and metadata -----------------------------------------------------------------

def _boxed_layer(scope, c):
  init = lambda k, shape: meta.Partitioned(jax.nn.initializers.lecun_normal()(k, shape), ('in', 'out'))
  return jnp.tanh(c @ scope.param('kernel', init, (3, 3)))


@pytest.mark.parametrize('transform, names, shape', [
    ('scan', ('layers', 'in', 'out'), (5, 3, 3)), ('remat_scan', ('layers', None, 'in', 'out'), (2, 3, 3, 3))])
def test_stacks_created_params_and_names_the_outer_axis(transform, names, shape):
  named = {'metadata_params': {meta.PARTITION_NAME: 'layers'}}
  if transform == 'scan':
    scanned, args = lift.scan(lambda s, c, _: (_boxed_layer(s, c), None), length=5, **named, **LAYERS), (C0, None)
  else:
    scanned, args = lift.remat_scan(_boxed_layer, (2, 3), **named), (C0,)
  y, variables = lift.init(scanned)(KEY, *args)
  box = variables['params']['kernel']
  assert box.names == names and box.value.shape == shape
  assert_trees_close(lift.apply(scanned)(variables, *args), y)


# -- nothing lost -------------------------------------------------------------------------

def _count_step(scope, c, x):
  return c, counter(scope, x)


@pytest.mark.parametrize('kwargs, first, second', [
    (dict(variable_axes={'counter': 0}), [1] * 5, [2] * 5), (dict(variable_broadcast='counter'), 1, 2),
    (dict(variable_carry='counter'), 5, 10)])
def test_counter_survives_scan(kwargs, first, second):
  scanned = lift.scan(_count_step, **kwargs)
  _, variables = lift.init(scanned)(KEY, (), XS)
  np.testing.assert_array_equal(variables['counter']['count'], first)
  _, updated = lift.apply(scanned, mutable=['counter'])(variables, (), XS)
  np.testing.assert_array_equal(updated['counter']['count'], second)
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(scanned)(variables, (), XS)


@pytest.mark.parametrize('kwargs, expected', [
    (dict(variable_axes={'counter': 0}), np.ones((2, 3))), (dict(variable_broadcast='counter', variable_axes={}), 1),
    (dict(variable_carry='counter', variable_axes={}), 6)])
def test_counter_survives_remat_scan(kwargs, expected):
  stacked = lift.remat_scan(counter, (2, 3), **kwargs)
  _, variables = lift.init(stacked)(KEY, C0)
  np.testing.assert_array_equal(variables['counter']['count'], expected)
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(stacked)(variables, C0)


# -- carry variables created inside the body ------------------------------------------------

def _stateful_step(scope, c, x):
  h = scope.variable('state', 'h', jnp.zeros_like, c)
  n = scope.variable('state', 'n', lambda: jnp.zeros((), jnp.int32))
  h.value = 0.5 * h.value + c * x
  n.value = n.value + 1
  w = scope.param('w', jax.nn.initializers.normal(), (3,))
  return c + w[None], h.value


@pytest.mark.parametrize('reverse', [False, True])
def test_carry_created_at_init_equals_unrolled_loop(reverse):
  scanned = lift.scan(_stateful_step, variable_carry='state', reverse=reverse, **SHARED)
  loop = _unrolled(_stateful_step, reverse)
  got, variables = lift.init(scanned)(KEY, C0, XS)
  expected, expected_variables = lift.init(loop)(KEY, C0, XS)
  assert_trees_close((got, variables['state']), (expected, expected_variables['state']))
  assert int(variables['state']['n']) == 5
  updated = lift.apply(scanned, mutable=['state'])(variables, C0, XS)
  assert_trees_close(updated, lift.apply(loop, mutable=['state'])(variables, C0, XS))
  assert int(updated[1]['state']['n']) == 10


def test_carry_creation_keeps_the_scanned_params_keys():
  without_state = lambda scope, c, x: (c + scope.param('w', jax.nn.initializers.normal(), (3,))[None], c)
  _, with_state = lift.init(lift.scan(_stateful_step, variable_carry='state', **LAYERS))(KEY, C0, XS)
  _, plain = lift.init(lift.scan(without_state, **LAYERS))(KEY, C0, XS)
  assert_trees_close(with_state['params']['w'], plain['params']['w'])

