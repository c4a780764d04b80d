"""`causal_self_attention`'s grouped-query form and its flash implementation.

Oracles: the grouped form equals the full-head form on repeated keys and values (the
same products, to the bit); the Pallas TPU flash kernel, run in interpret mode on this
CPU, equals the XLA form in value and gradients within float32 rounding; the derived
decode step of the grouped form caches only the key/value heads and reproduces it. The
default's choice: the XLA form off a TPU, the kernel on a TPU target (an abstract TPU mesh)
where it takes the shapes and can be placed per shard.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen
from jax.experimental.pallas import tpu as pallas_tpu

import lift
from lift.causal.testing import check_scan
from lift.errors import AttentionArgumentError
from tests.helpers import tolerance

HEADS, KV_HEADS = 4, 2


def qkv(length=128, batch=(2,), features=16):
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (*batch, length, HEADS, features))
  k, v = (jax.random.normal(key, (*batch, length, KV_HEADS, features)) for key in keys[1:])
  return q, k, v


def test_grouped_query_attention_is_attention_on_repeated_heads():
  q, k, v = qkv(length=8)
  repeated = [jnp.repeat(x, HEADS // KV_HEADS, axis=-2) for x in (k, v)]
  np.testing.assert_array_equal(lift.causal_self_attention(q, k, v),
                                lift.causal_self_attention(q, *repeated))


def test_the_grouped_decode_step_caches_key_value_heads_only():
  q, k, v = qkv(length=8, batch=())
  xs = jnp.concatenate([q, k, v], axis=1)  # [T, heads + 2 kv_heads, features]

  def attend(xs):
    return lift.causal_self_attention(xs[:, :HEADS], xs[:, HEADS:HEADS + KV_HEADS],
                                      xs[:, HEADS + KV_HEADS:])
  check_scan(attend, xs, rtol=tolerance(jnp.float32, 8), atol=tolerance(jnp.float32, 8))
  _, carry = lift.as_scan(attend, xs)
  cache_shapes = {x.shape for x in jax.tree.leaves(carry) if x.ndim == 3}
  assert cache_shapes == {(KV_HEADS, 16, 8), (KV_HEADS, 8, 16)}  # keys, values: kv heads


def test_the_flash_kernel_matches_xla_in_values_and_gradients():
  q, k, v = qkv()
  cotangent = jax.random.normal(jax.random.key(1), q.shape)

  def loss(implementation, q, k, v):
    out = lift.causal_self_attention(q, k, v, implementation=implementation)
    return jnp.vdot(out, cotangent)

  with pallas_tpu.force_tpu_interpret_mode():
    flash = jax.value_and_grad(loss, argnums=(1, 2, 3))('flash', q, k, v)
  xla = jax.value_and_grad(loss, argnums=(1, 2, 3))('xla', q, k, v)
  rtol = tolerance(jnp.float32, 8)  # a blocked online softmax rounds in another order
  for got, want in zip(jax.tree.leaves(flash), jax.tree.leaves(xla)):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(jnp.abs(want).max()))


def test_a_model_trained_with_the_kernel_decodes_with_the_cache():
  q, k, v = qkv(length=8, batch=())
  xs = jnp.concatenate([q, k, v], axis=1)
  flash = lambda xs: lift.causal_self_attention(  # noqa: E731
      xs[:, :HEADS], xs[:, HEADS:HEADS + KV_HEADS], xs[:, HEADS + KV_HEADS:],
      implementation='flash')
  step, carry = lift.as_scan(flash, xs)  # the kernel is never run: the step is the cache's
  _, ys = jax.lax.scan(step, carry, xs)
  want = lift.causal_self_attention(xs[:, :HEADS], xs[:, HEADS:HEADS + KV_HEADS],
                                    xs[:, HEADS + KV_HEADS:])
  np.testing.assert_allclose(ys, want, rtol=tolerance(jnp.float32, 8),
                             atol=tolerance(jnp.float32, 8))


@pytest.mark.parametrize('kwargs, match', [
    ({'implementation': 'cudnn'}, "implementation is 'cudnn'; it takes one of"),
    ({'implementation': 'flash', 'mesh_axes': ('data', 'seq', None, None)},
     "mesh_axes is .* with length and features unsharded"),
])
def test_bad_arguments_are_named(kwargs, match):
  q, k, v = qkv(length=8)
  with pytest.raises(AttentionArgumentError, match=match):
    lift.causal_self_attention(q, k, v, **kwargs)
  with pytest.raises(AttentionArgumentError, match=r'shapes \(2, 8, 4, 16\), \(2, 8, 3, 16\)'):
    lift.causal_self_attention(q, k[..., :1, :].repeat(3, -2), v[..., :1, :].repeat(3, -2))


TPU = jax.sharding.AbstractDevice(device_kind='TPU v5 lite', num_cores=1, platform='tpu')


def tpu_mesh(**axes):
  """An abstract mesh of TPU chips: what `jax.set_mesh` of a `tpu_topology` mesh gives."""
  return jax.sharding.AbstractMesh(tuple(axes.values()), tuple(axes),
                                   axis_types=(jax.sharding.AxisType.Auto,) * len(axes),
                                   abstract_device=TPU)


def shapes(length=128, features=16, batch=4):
  return (jax.ShapeDtypeStruct((batch, length, HEADS, features), jnp.float32),
          jax.ShapeDtypeStruct((batch, length, KV_HEADS, features), jnp.float32))


def test_the_default_is_the_xla_form_off_a_tpu():
  q, k, v = qkv(length=128)
  assert lift.choose_attention(q, k) == ('xla', None, 'the target is cpu, not a TPU')
  np.testing.assert_array_equal(lift.causal_self_attention(q, k, v),
                                lift.causal_self_attention(q, k, v, implementation='xla'))


@pytest.mark.parametrize('length, features, reason', [
    (128, 16, None), (512, 128, None), (256, 256, None),
    (100, 16, 'the length 100 is not a multiple of 128'),
    (8, 128, 'the length 8 is not a multiple of 128'),
    (128, 192, 'the features 192 are over 128 and not a multiple of it'),
])
def test_on_a_tpu_the_default_is_the_kernel_where_it_takes_the_shapes(length, features, reason):
  with jax.sharding.use_abstract_mesh(tpu_mesh(data=1)):
    choice = lift.choose_attention(*shapes(length, features))
  if reason is None:
    assert choice.implementation == 'flash' and choice.mesh_axes is None
  else:
    assert choice == ('xla', None, f'the flash kernel cannot take it: {reason}')


@pytest.mark.parametrize('rules, batch, want', [
    ((('batch', 'data'), ('heads', 'model')), 4, ('data', None, 'model', None)),
    ((('batch', ('data', 'model')),), 4, (('data', 'model'), None, None, None)),
    ((), 4, None),  # no rules: nothing says where the batch and heads lie
    ((('batch', 'data'), ('length', 'model')), 4, None),  # the length sharded
    ((('batch', 'data'), ('heads', 'model')), 3, None),  # 3 sequences over data=2
    ((('batch', 'data'), ('heads', 'other')), 4, None),  # an axis the mesh lacks
])
def test_under_a_split_mesh_the_kernel_runs_per_shard_or_not_at_all(rules, batch, want):
  with jax.sharding.use_abstract_mesh(tpu_mesh(data=2, model=2)), linen.logical_axis_rules(rules):
    choice = lift.choose_attention(*shapes(batch=batch))
    given = lift.choose_attention(*shapes(batch=batch), mesh_axes=('data', None, None, None))
  assert choice.implementation == ('xla' if want is None else 'flash')
  assert choice.mesh_axes == want
  assert given[:2] == ('flash', ('data', None, None, None))  # given axes always win
