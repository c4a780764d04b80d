"""The Flax API surface: signatures, names, re-exports and the fp8 layers.

Oracle: flax.linen. Our functions and Module methods take Flax's parameters in Flax's
order with Flax's defaults (extras may follow); re-exported helpers are Flax's own
objects; the fp8 ``dot_general`` layers give Flax's variables, outputs, gradients and
scale updates. Every name of every ``flax.linen`` submodule: test_flax_names_walk.py.
"""
import functools
import inspect

import flax.core as fcore
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import scope as fscope
from flax.linen import fp8_ops

import lift
import linen_ext as nn

FUNCTIONS = ['vmap', 'scan', 'checkpoint', 'remat', 'jit', 'map_variables', 'cond', 'switch',
             'while_loop', 'vjp', 'jvp', 'grad', 'value_and_grad', 'custom_vjp', 'remat_scan',
             'fold_rngs', 'add_metadata_axis', 'init', 'apply', 'init_with_output']
MODULE_METHODS = ['param', 'variable', 'make_rng', 'sow', 'is_initializing',
                  'is_mutable_collection', 'has_variable', 'has_rng', 'put_variable',
                  'get_variable', 'init', 'init_with_output', 'apply', 'bind', 'unbind', 'clone']
COLLECTIONS = ['params', 'batch_stats', 'cache', 'intermediates']


@pytest.mark.parametrize('name', FUNCTIONS + [f'Module.{m}' for m in MODULE_METHODS])
def test_signatures_match_flax(name):
  """Every public Flax parameter, in Flax's relative order, with Flax's default (private
  ones, ``Module.clone``'s ``_deep_clone``, may come through ``**kwargs``)."""
  ours, theirs = (functools.reduce(getattr, name.split('.'), lib) for lib in (nn, flax_nn))
  ours = {p.name: p.default for p in inspect.signature(ours).parameters.values()}
  theirs = {p.name: p.default for p in inspect.signature(theirs).parameters.values()
            if not p.name.startswith('_') or p.name in ours}
  assert set(theirs) <= set(ours), set(theirs) - set(ours)
  positions = [list(ours).index(param) for param in theirs]
  assert positions == sorted(positions), (list(ours), list(theirs))
  for param, default in theirs.items():
    if isinstance(default, fcore.DenyList):  # the same filter, by what it lets through
      assert ([lift.in_filter(ours[param], c) for c in COLLECTIONS]
              == [fscope.in_filter(default, c) for c in COLLECTIONS]), param
    elif default is inspect.Parameter.empty or (callable(default) and
                                                not isinstance(default, type)):
      continue  # no default, or an identity lambda
    elif hasattr(default, 'keys'):
      assert dict(ours[param]) == dict(default), param
    else:
      assert ours[param] == default, (param, ours[param], default)


def test_api_names_exist_and_reexports_are_flax_objects():
  for name in ['Module', 'compact', 'nowrap', 'broadcast', 'Stacked', 'BlockSeq', 'scan_layers',
               'per_layer', 'from_flax', 'as_scan', 'shard_map']:
    assert hasattr(nn, name), name
  assert isinstance(nn.Module.variables, property)
  assert isinstance(flax_nn.Module.variables, property)
  for name in ['relu', 'gelu', 'with_partitioning', 'Partitioned',
               'PARTITION_NAME', 'get_partition_spec', 'logical_axis_rules',
               'set_logical_axis_rules', 'get_logical_axis_rules', 'with_logical_partitioning',
               'LogicallyPartitioned', 'logical_to_mesh_axes', 'softmax', 'sigmoid', 'tanh',
               'silu', 'swish', 'elu', 'leaky_relu', 'one_hot', 'log_softmax', 'make_causal_mask',
               'make_attention_mask', 'dot_product_attention']:
    assert getattr(nn, name) is getattr(flax_nn, name), name
  for name in ['Dense', 'Conv', 'Embed', 'LayerNorm', 'RMSNorm', 'BatchNorm', 'Dropout',
               'LSTMCell', 'GRUCell', 'MultiHeadDotProductAttention']:
    assert issubclass(getattr(nn, name), nn.Module), name


def test_namespace_functions_are_flaxs():
  x = jnp.arange(8.0).reshape(1, 8, 1)
  np.testing.assert_array_equal(nn.pooling.max_pool(x, (2,)), flax_nn.max_pool(x, (2,)))
  assert nn.attention.make_causal_mask is flax_nn.make_causal_mask
  assert nn.linear.default_kernel_init is flax_nn.linear.default_kernel_init
  assert nn.module.merge_param('x', None, True) is True  # as Flax's examples call it
  assert nn.batch_apply.BatchApply is flax_nn.batch_apply.BatchApply


def _representable(x, dtype):
  return fp8_ops.qdq(x, dtype, jnp.ones((1,)), jnp.float32)


@pytest.mark.filterwarnings('ignore:The Fp8DotGeneralOp is deprecated')
@pytest.mark.parametrize('op', ['Fp8DotGeneral', 'Fp8DotGeneralOp', 'NANOOFp8DotGeneralOp'])
def test_fp8_dot_general_in_dense_matches_flax(op):
  """Same variables (fp8 scales under ``_overwrite_with_gradient``), outputs and gradients."""
  x = _representable(jax.random.uniform(jax.random.key(1), (16, 32)), jnp.float8_e4m3fn)

  def run(lib):
    model = lib.DenseGeneral(64, dot_general_cls=getattr(lib, op))
    variables = jax.jit(model.init)(jax.random.key(0), x)
    loss = lambda v, x: jnp.mean(model.apply(v, x) ** 2)
    return variables, jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(variables, x)

  ours, theirs = run(nn), run(flax_nn)
  assert jax.tree.map(jnp.shape, ours) == jax.tree.map(jnp.shape, theirs)
  assert f'{getattr(nn, op).__name__}_0' in ours[0][fp8_ops.OVERWRITE_WITH_GRADIENT]
  jax.tree.map(np.testing.assert_array_equal, ours, theirs)


def test_fp8_einsum_matches_flax_and_updates_scales_in_training():
  eqn, k1, k2 = '...k,kn->...n', jax.random.key(1), jax.random.key(2)
  x = _representable(jax.random.normal(k1, (2, 3, 16)), jnp.float8_e4m3fn)
  w = _representable(jax.random.normal(k2, (16, 8)), jnp.float8_e4m3fn)

  def train(lib):
    model = lib.Fp8Einsum(amax_history_length=4)
    variables = model.init(jax.random.key(0), eqn, x, w)
    loss = lambda v: jnp.sum(model.apply(v, eqn, x, w) ** 2)
    grads = jax.grad(loss)(variables)
    return model.apply(variables, eqn, x, w), grads

  (y_ours, g_ours), (y_theirs, g_theirs) = train(nn), train(flax_nn)
  np.testing.assert_array_equal(y_ours, y_theirs)
  # fp8 quantizes the output: a coarse bound against the exact float32 einsum of the same values
  np.testing.assert_allclose(y_ours, jnp.einsum(eqn, x, w), rtol=1e-2, atol=1e-2)
  jax.tree.map(np.testing.assert_array_equal, g_ours, g_theirs)
  # the "gradient" of the overwrite collection is the updated amax history and scale
  updated = g_ours[fp8_ops.OVERWRITE_WITH_GRADIENT]
  assert float(updated['input_amax_history'][0]) == pytest.approx(float(jnp.max(jnp.abs(x))))
