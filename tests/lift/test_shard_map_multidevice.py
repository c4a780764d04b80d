"""lift.shard_map on 8 simulated CPU devices.

JAX fixes the device count when it starts, so the checks run in one child
interpreter started with ``--xla_force_host_platform_device_count=8``; each
test reports one check's result.
"""
import json
import traceback

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import lift
from lift import errors
from lift.rng import fold_in_static
from tests.helpers import assert_trees_close, counter, run_in_child

CHECKS = {}
RESULT_MARK = 'SHARD_MAP_RESULTS='
X = jnp.linspace(-1.0, 1.0, 32).reshape(4, 8)
KEY = jax.random.key(0)


def check(fn):
  CHECKS[fn.__name__] = fn
  return fn


def _mesh(axis_type=AxisType.Auto):
  return jax.make_mesh((2, 4), ('data', 'model'), axis_types=(axis_type, axis_type))


def row_parallel_dense(scope, x):
  """A dense layer whose input features (and kernel rows) are split over 'model'."""
  w = scope.param('w', jax.nn.initializers.lecun_normal(), (x.shape[-1], 3))
  return jax.lax.psum(x @ w, 'model')


def _draw(key, shape=(2, 3)):
  """The kernel that `row_parallel_dense` creates from ``key`` (first draw, no suffix)."""
  return jax.nn.initializers.lecun_normal()(fold_in_static(key, (1,)), shape)


def _row_parallel(mesh, split):
  return lift.shard_map(row_parallel_dense, mesh=mesh, in_specs=P('data', 'model'), out_specs=P('data'),
                        variable_specs={'params': P('model')}, split_rngs={'params': split})


@check
def split_params_are_the_per_shard_draws_concatenated_on_auto_and_explicit_meshes():
  for mesh in (_mesh(), _mesh(AxisType.Explicit)):
    x = X if mesh.axis_types[0] == AxisType.Auto else jax.sharding.reshard(X, NamedSharding(mesh, P('data', 'model')))
    y, variables = lift.init(_row_parallel(mesh, 'model'))(KEY, x)
    # Shard i along 'model' draws its (2, 3) rows from split(key, 4)[i].
    expected = jnp.concatenate([_draw(k) for k in jax.random.split(KEY, 4)])
    assert_trees_close(variables['params']['w'], expected)
    assert_trees_close(y, X @ expected)
    assert_trees_close(lift.apply(_row_parallel(mesh, 'model'))(variables, x), y)


@check
def unsplit_stream_gives_every_shard_the_same_key():
  _, variables = lift.init(_row_parallel(_mesh(), False))(KEY, X)
  assert_trees_close(variables['params']['w'], jnp.concatenate([_draw(KEY)] * 4))


@check
def split_over_every_axis_gives_each_device_its_key():
  local = lambda scope, x: x + jax.random.normal(scope.make_rng('noise'), x.shape)
  sharded = lift.shard_map(local, mesh=_mesh(), in_specs=P('data', 'model'), out_specs=P('data', 'model'),
                           split_rngs={'noise': True})
  key = jax.random.key(3)
  y = lift.apply(sharded)({}, jnp.zeros((2, 4)), rngs={'noise': key})
  keys = jax.random.split(key, 8).reshape(2, 4)
  expected = jax.vmap(jax.vmap(lambda k: jax.random.normal(fold_in_static(k, (1,)), (1, 1))))(keys)
  assert_trees_close(y, expected.reshape(2, 4))


@check
def gradient_equals_unsharded_gradient():
  sharded = _row_parallel(_mesh(), 'model')
  params = lift.init(sharded)(KEY, X)[1]['params']
  got = jax.jit(jax.grad(lambda p: jnp.sum(lift.apply(sharded)({'params': p}, X) ** 2)))(params)
  assert_trees_close(got, jax.grad(lambda p: jnp.sum((X @ p['w']) ** 2))(params))


@check
def replicated_counter_survives():
  sharded = lift.shard_map(counter, mesh=_mesh(), in_specs=P('data'), out_specs=P('data'),
                           variable_specs={'counter': P()})
  _, variables = lift.init(sharded)(KEY, X)
  assert int(variables['counter']['count']) == 1
  _, updated = lift.apply(sharded, mutable=['counter'])(variables, X)
  assert int(updated['counter']['count']) == 2
  with pytest.raises(errors.ImmutableCollectionError, match='counter'):
    lift.apply(sharded)(variables, X)


@check
def replicated_stats_reduced_with_pmean():
  def normalize(scope, x):
    mean = jax.lax.pmean(x.mean(0), 'data')
    stats = scope.variable('batch_stats', 'mean', jnp.zeros, mean.shape)
    stats.value = 0.9 * stats.value + 0.1 * mean
    return x - mean[None]
  sharded = lift.shard_map(normalize, mesh=_mesh(), in_specs=P('data'), out_specs=P('data'),
                           variable_specs={'batch_stats': P()})
  y, variables = lift.init(sharded)(KEY, X)
  assert_trees_close((y, variables['batch_stats']['mean']), (X - X.mean(0, keepdims=True), 0.1 * X.mean(0)))


def run_checks():
  """Child entry point: runs every check, prints the results as one JSON line."""
  jax.config.update('jax_numpy_dtype_promotion', 'strict')
  jax.config.update('jax_numpy_rank_promotion', 'raise')
  assert jax.device_count() == 8, jax.devices()
  results = {}
  for name, fn in CHECKS.items():
    try:
      fn()
      results[name] = 'ok'
    except Exception:  # noqa: BLE001 (reported to the parent test)
      results[name] = traceback.format_exc()
  print(RESULT_MARK + json.dumps(results))


def test_shard_map_checks_on_8_devices():
  """Every check of CHECKS, in one child with 8 devices: one test, so one child per run
  (pytest-xdist would start one per worker for a module fixture)."""
  proc = run_in_child('lift.test_shard_map_multidevice.run_checks')
  lines = [l for l in proc.stdout.splitlines() if l.startswith(RESULT_MARK)]
  assert lines, f'child failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}'
  results = json.loads(lines[-1][len(RESULT_MARK):])
  failed = {name: results[name] for name in CHECKS if results[name] != 'ok'}
  assert not failed, '\n\n'.join(f'{name}:\n{why}' for name, why in failed.items())
