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


# -- oracles ---------------------------------------------------------------------

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


# -- axes ---------------------------------------------------------------------------

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


def test_keyword_arguments_alone_reach_every_item_whole_given_axis_size():
  def keyword_only(scope, *, x):
    return dense(scope, x, 2)

  mapped = lift.vmap(keyword_only, axis_size=3, **ENSEMBLE)
  y, variables = lift.init(mapped)(KEY, x=XS)
  kernel, bias = variables['params']['kernel'], variables['params']['bias']
  expected = jnp.einsum('bf,ifo->ibo', XS, kernel) + bias[:, None, :]
  assert kernel.shape == (3, 5, 2)
  assert_trees_close(y, expected, depth=1)
  assert_trees_close(lift.apply(mapped)(variables, x=XS), expected, depth=1)


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
