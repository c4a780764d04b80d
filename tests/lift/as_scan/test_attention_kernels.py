"""`causal_self_attention`'s grouped-query form and its flash implementation.

Oracles: the grouped form equals the full-head form on repeated keys and values (the
same products, to the bit); the Pallas TPU flash kernel, run in interpret mode on this
CPU, equals the XLA form in value and gradients within float32 rounding; the derived
decode step of the grouped form caches only the key/value heads and reproduces it.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
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
