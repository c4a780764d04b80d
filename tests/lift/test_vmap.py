"""lift.vmap: oracles (jax.vmap over hand-stacked variables, flax.core.lift.vmap), shapes, state."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import meta

import lift
from lift import errors
from tests.helpers import assert_trees_close, counter, dense, mlp
from tests.lift.test_flax_core_parity import check

KEY = jax.random.key(0)
XS = jnp.linspace(-1.0, 1.0, 15).reshape(3, 5)
ENSEMBLE = dict(variable_axes={'params': 0}, split_rngs={'params': True})


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


# -- oracles ---------------------------------------------------------------------

def test_vmap_equals_jax_vmap_over_hand_stacked_params():
  keys = jax.random.split(jax.random.key(1), 3)
  params = _stack([lift.init(mlp)(k, XS[i])[1]['params'] for i, k in enumerate(keys)])
  expected = jax.jit(jax.vmap(lambda p, x: lift.apply(mlp)({'params': p}, x)))(params, XS)
  got = jax.jit(lift.apply(lift.vmap(mlp, **ENSEMBLE)))({'params': params}, XS)
  assert_trees_close(got, expected, depth=1)


def test_vmap_gradient_equals_jax_vmap_gradient():
  _, variables = jax.jit(lift.init(lift.vmap(mlp, **ENSEMBLE)))(KEY, XS)

  def lifted_loss(params):
    return jnp.sum(lift.apply(lift.vmap(mlp, **ENSEMBLE))({'params': params}, XS) ** 2)

  def oracle_loss(params):
    return jnp.sum(jax.vmap(lambda p, x: lift.apply(mlp)({'params': p}, x))(params, XS) ** 2)

  got = jax.jit(jax.grad(lifted_loss))(variables['params'])
  assert_trees_close(got, jax.jit(jax.grad(oracle_loss))(variables['params']))


def test_shared_params_equal_unmapped_call():
  shared = lift.vmap(mlp, variable_axes={'params': None}, split_rngs={'params': False})
  y, variables = lift.init(shared)(KEY, XS)
  _, expected_variables = lift.init(mlp)(KEY, XS[0])
  assert_trees_close(variables, expected_variables)
  assert_trees_close(y, lift.apply(mlp)(variables, XS), depth=1)


@pytest.mark.parametrize('axis, split', [(0, True), (0, False), (None, False), (0, 1), (0, 0)])
def test_init_matches_flax_core_lift_vmap(axis, split):
  """0 and 1 as split flags too: Flax tests their truth."""
  check(lambda L: L.vmap(mlp, variable_axes={'params': axis}, split_rngs={'params': split}),
        lambda M, fn: M.init(fn)(KEY, XS))


def test_unsplit_stream_gives_every_item_the_same_key():
  def noise(scope, x):
    return x + jax.random.normal(scope.make_rng('noise'), x.shape)

  mapped = lift.vmap(noise, variable_axes={}, split_rngs={'noise': False})
  y = lift.apply(mapped)({}, jnp.zeros((3, 2)), rngs={'noise': KEY})
  np.testing.assert_allclose(y, jnp.broadcast_to(y[0], y.shape))
  split = lift.vmap(noise, variable_axes={}, split_rngs={'noise': True})
  y = lift.apply(split)({}, jnp.zeros((3, 2)), rngs={'noise': KEY})
  assert not np.allclose(y[0], y[1])


# -- axes ---------------------------------------------------------------------------

@pytest.mark.parametrize('axis, kernel, bias', [
    (0, (3, 5, 2), (3, 2)), (1, (5, 3, 2), (2, 3)), (-1, (5, 2, 3), (2, 3))])
def test_created_variables_get_the_mapped_axis(axis, kernel, bias):
  mapped = lift.vmap(dense, variable_axes={'params': axis}, split_rngs={'params': True})
  _, variables = lift.init(mapped)(KEY, XS, features=2)
  shapes = jax.tree.map(jnp.shape, variables)
  assert shapes == {'params': {'kernel': kernel, 'bias': bias}}
  y = lift.apply(mapped)(variables, XS, features=2)
  kernels = jnp.moveaxis(variables['params']['kernel'], axis, 0)
  biases = jnp.moveaxis(variables['params']['bias'], axis if axis >= 0 else -1, 0)
  assert_trees_close(y, jnp.einsum('bi,bio->bo', XS, kernels) + biases, depth=3)


def test_in_axes_out_axes_and_negative_axes():
  def affine(scope, x, shift):
    return dense(scope, x, 2) + shift

  mapped = lift.vmap(affine, variable_axes={'params': None}, split_rngs={'params': False},
                     in_axes=(-1, None), out_axes=1)
  shift = jnp.arange(2.0)
  y, variables = lift.init(mapped)(KEY, XS.T, shift)
  expected = jax.vmap(lambda x: lift.apply(affine)(variables, x, shift), in_axes=-1,
                      out_axes=1)(XS.T)
  assert y.shape == (2, 3)
  assert_trees_close(y, expected, depth=1)


def test_axis_name_reduces_a_shared_collection():
  def normalize(scope, x):
    mean = jax.lax.pmean(x, 'batch')
    stats = scope.variable('batch_stats', 'mean', jnp.zeros, x.shape)
    stats.value = 0.9 * stats.value + 0.1 * mean
    return x - mean

  mapped = lift.vmap(normalize, variable_axes={'batch_stats': None}, split_rngs={},
                     axis_name='batch')
  y, variables = lift.init(mapped)(KEY, XS)
  assert_trees_close(variables['batch_stats']['mean'], 0.1 * XS.mean(0), depth=1)
  assert_trees_close(y, XS - XS.mean(0, keepdims=True), depth=1)
  _, updated = lift.apply(mapped, mutable=['batch_stats'])(variables, XS)
  assert_trees_close(updated['batch_stats']['mean'], 0.19 * XS.mean(0), depth=1)


def test_keyword_arguments_reach_every_item_unmapped():
  def scaled(scope, x, *, scale):
    return dense(scope, x, 2) * scale

  mapped = lift.vmap(scaled, **ENSEMBLE)
  y, variables = lift.init(mapped)(KEY, XS, scale=jnp.float32(2.0))
  assert_trees_close(y, 2.0 * lift.apply(lift.vmap(dense, **ENSEMBLE))(variables, XS, features=2), depth=1)


# -- metadata ------------------------------------------------------------------------

def _boxed_dense(scope, x):
  init = lambda k, shape: meta.Partitioned(jax.nn.initializers.lecun_normal()(k, shape), ('in', 'out'))
  kernel = scope.param('kernel', init, (x.shape[-1], 2))
  return x @ kernel


@pytest.mark.parametrize('axis, names', [(0, ('batch', 'in', 'out')), (1, ('in', 'batch', 'out')),
                                         (-1, ('in', 'out', 'batch'))])
def test_metadata_params_name_the_new_axis(axis, names):
  mapped = lift.vmap(_boxed_dense, variable_axes={'params': axis}, split_rngs={'params': True},
                     metadata_params={meta.PARTITION_NAME: 'batch'})
  y, variables = lift.init(mapped)(KEY, XS)
  box = variables['params']['kernel']
  assert isinstance(box, meta.Partitioned) and box.names == names
  assert box.value.shape[names.index('batch')] == 3
  assert_trees_close(lift.apply(mapped)(variables, XS), y, depth=1)


# -- nothing lost -------------------------------------------------------------------------

@pytest.mark.parametrize('axis, expected', [(0, [1, 1, 1]), (None, 1)])
def test_counter_survives_and_immutable_counter_is_rejected(axis, expected):
  mapped = lift.vmap(counter, variable_axes={'counter': axis}, split_rngs={})
  _, variables = lift.init(mapped)(KEY, XS)
  np.testing.assert_array_equal(variables['counter']['count'], expected)
  _, updated = lift.apply(mapped, mutable=['counter'])(variables, XS)
  np.testing.assert_array_equal(updated['counter']['count'], np.add(expected, 1))
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(mapped)(variables, XS)


def test_axis_size_without_mapped_inputs():
  _, variables = lift.init(lift.vmap(dense, in_axes=(None, None), axis_size=4, **ENSEMBLE))(KEY, XS, 2)
  assert variables['params']['kernel'].shape == (4, 5, 2)


def test_spmd_axis_name_reaches_sharding_constraints():
  def constrained(scope, x):
    return jax.lax.with_sharding_constraint(dense(scope, x, 3), jax.sharding.PartitionSpec('model'))

  mapped = lift.vmap(constrained, spmd_axis_name='data', **ENSEMBLE)
  mesh = jax.make_mesh((1, 1), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with jax.set_mesh(mesh):
    _, variables = jax.jit(lift.init(mapped))(KEY, XS)
    text = jax.jit(lift.apply(mapped)).lower(variables, XS).as_text()
  assert '[{"data"}, {"model"}]' in text
