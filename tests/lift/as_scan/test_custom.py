"""`custom_causal`, `causal_self_attention`, and a small Transformer."""
import functools

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from lift import as_scan, causal_self_attention, custom_causal
from lift.causal.testing import check_scan
from lift.errors import ScanConversionError

T = 6


def rand(shape, seed=0, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape),
                     dtype)


def running_mean_full(x):
  count = jnp.arange(1, x.shape[0] + 1, dtype=x.dtype)[:, None]
  return jnp.cumsum(x, 0) / count


calls = []


@custom_causal
def running_mean(x):
  return running_mean_full(x)


@running_mean.def_init
def _(x):
  return jnp.zeros(x.shape[1:], x.dtype)


@running_mean.def_step
def _(total, index, x):
  calls.append("step")
  total = total + x
  return total, total / (index + 1).astype(x.dtype)


@running_mean.def_prefill
def _(total, x):
  calls.append("prefill")
  return total + x.sum(0), running_mean_full(x)


@custom_causal
def mean_so_far(x):
  """Causal, with no step rule: as_scan reruns it on the history."""
  return running_mean_full(x)


def test_custom_step_and_prefill_pass_the_oracle():
  calls.clear()
  check_scan(running_mean, rand((T, 3)), prefill=[2])
  assert "step" in calls and "prefill" in calls


def test_custom_step_under_jit_and_shifted_input():
  g = jax.jit(lambda x: running_mean(jnp.concatenate(
      [jnp.zeros((1, 3)), x[:-1]])) * 2)
  check_scan(g, rand((T, 3)), prefill=[3])


def test_custom_without_step_reruns_on_history():
  check_scan(lambda x: mean_so_far(jnp.sin(x)), rand((T, 3)), prefill=[2])


def test_custom_with_time_on_another_axis_converts_the_original():
  # Time is the scan axis 0; running_mean is causal along its axis 0, which
  # here is a feature axis, so as_scan converts its jaxpr instead.
  g = lambda x: running_mean(x.T).T
  check_scan(g, rand((T, 3)), prefill=[2])


def test_custom_values_and_gradients_are_the_originals():
  x = rand((T, 3))
  np.testing.assert_allclose(running_mean(x), running_mean_full(x))

  def derivatives(fn, x):
    loss = lambda x: jnp.sum(fn(x) ** 2)
    return jax.grad(loss)(x), jax.jacfwd(loss)(x), jax.vmap(fn)(x[None])

  derivatives = jax.jit(derivatives, static_argnums=0)
  for got, want in zip(derivatives(running_mean, x),
                       derivatives(running_mean_full, x)):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def flax_causal_attention(q, k, v):
  mask = nn.make_causal_mask(jnp.ones(q.shape[:-2]))
  return nn.dot_product_attention(q, k, v, mask=mask)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-6),
                                       (jnp.bfloat16, 1e-2)])
def test_attention_matches_flax(dtype, tol):
  q, k, v = (rand((2, T, 3, 4), seed, dtype) for seed in range(3))
  got = jax.jit(causal_self_attention)(q, k, v)
  want = jax.jit(flax_causal_attention)(q, k, v)
  np.testing.assert_allclose(np.asarray(got, np.float32),
                             np.asarray(want, np.float32), rtol=tol,
                             atol=tol)
  unbatched = jax.jit(causal_self_attention)(q[0], k[0], v[0])  # no batch axis
  np.testing.assert_allclose(np.asarray(unbatched, np.float32),
                             np.asarray(want[0], np.float32), rtol=tol, atol=tol)


def test_the_authors_step_is_what_runs():
  @custom_causal
  def ident(x):
    return x

  ident.def_init(lambda x: jnp.zeros((), x.dtype))
  ident.def_step(lambda s, i, x: (s, x + 100.0))  # not ident's: shows which one runs
  xs = rand((T, 3))
  f, c = as_scan(ident, xs)
  np.testing.assert_array_equal(lax.scan(f, c, xs)[1], xs + 100.0)
  np.testing.assert_array_equal(ident(xs), xs)


def test_attention_time_first_layout():
  qkv = tuple(rand((T, 2, 4), seed) for seed in range(3))
  check_scan(lambda qkv: causal_self_attention(*qkv), qkv, prefill=[3])


def test_attention_batch_first_layout_after_transpose():
  # xs [T, batch, heads, feat]; attention sees [batch, T, heads, feat].
  def g(x):
    x = jnp.swapaxes(x, 0, 1)
    return jnp.swapaxes(causal_self_attention(x, 2 * x, jnp.sin(x)), 0, 1)
  check_scan(g, rand((T, 2, 3, 4)), prefill=[2])


def test_attention_with_time_as_a_batch_axis_runs_whole_per_step():
  check_scan(lambda x: causal_self_attention(x, x, x), rand((T, 5, 2, 4)),
             prefill=[2])


def test_attention_bfloat16_steps():
  x = rand((T, 2, 4), dtype=jnp.bfloat16)
  check_scan(lambda x: causal_self_attention(x, x, x), x, prefill=[2],
             rtol=3e-2, atol=3e-2)


def test_attention_gradients_are_the_originals():
  q, k, v = (rand((T, 2, 4), seed) for seed in range(3))

  @functools.partial(jax.jit, static_argnums=0)
  def grad(attention, q):
    return jax.grad(lambda q: jnp.sum(attention(q, k, v) ** 2))(q)

  np.testing.assert_allclose(grad(causal_self_attention, q),
                             grad(flax_causal_attention, q), rtol=1e-5,
                             atol=1e-6)


def test_hand_written_attention_asks_for_custom_causal():
  def attention(x):
    logits = jnp.einsum("qd,kd->qk", x, x)
    mask = jnp.tril(jnp.ones((x.shape[0],) * 2, bool))
    return jax.nn.softmax(jnp.where(mask, logits, -1e9)) @ x
  with pytest.raises(ScanConversionError, match="custom_causal"):
    as_scan(attention, rand((T, 3)))


def transformer(params, tokens):
  """Embeddings, then per layer attention, a causal conv and an MLP."""
  x = params["embed"][tokens] + params["pos"][:tokens.shape[0]]

  def layer(x, p):
    q, k, v = jnp.split((x @ p["qkv"]).reshape(x.shape[0], 3, 2, 4), 3, 1)
    x = x + causal_self_attention(q[:, 0], k[:, 0], v[:, 0]).reshape(
        x.shape[0], 8) @ p["out"]
    x = x + lax.conv_general_dilated(
        x[None], p["conv"], (1,), [(2, 0)],
        dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=8)[0]
    return x + jax.nn.gelu(x @ p["up"]) @ p["down"], None

  x, _ = lax.scan(layer, x, params["layers"])
  return x @ params["embed"].T


def test_small_transformer_steps_match_the_full_forward_and_prompted():
  rng = np.random.default_rng(0)

  def normal(*shape):
    return jnp.asarray(rng.standard_normal(shape) / shape[-2] ** 0.5,
                       jnp.float32)

  params = {
      "embed": normal(11, 8), "pos": normal(T + 3, 8),
      "layers": {"qkv": normal(2, 8, 24), "out": normal(2, 8, 8),
                 "conv": normal(2, 3, 1, 8), "up": normal(2, 8, 16),
                 "down": normal(2, 16, 8)},
  }
  tokens = jnp.asarray(np.arange(T) * 7 % 11, jnp.int32)
  check_scan(lambda t: transformer(params, t), tokens, prefill=[3],
             rtol=1e-4, atol=1e-5)
  prompt = jnp.asarray([3, 1, 4], jnp.int32)
  check_scan(lambda t: transformer(params, jnp.concatenate([prompt, t]))[3:],
             tokens, prefill=[2], rtol=1e-4, atol=1e-5)


class FlaxBlock(nn.Module):
  """A causal flax.linen model: Embed, LayerNorm, attention, causal Conv."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(11, 8)(tokens)
    qkv = nn.DenseGeneral((3, 2, 4))(nn.LayerNorm()(x))
    attended = causal_self_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2])
    x = x + nn.DenseGeneral(8, axis=(-2, -1))(attended)
    x = x + nn.Conv(8, (3,), padding="CAUSAL", kernel_dilation=2)(
        nn.RMSNorm()(x)[None])[0]
    return nn.Dense(11)(nn.gelu(x))


def test_flax_linen_model_apply_steps():
  model = FlaxBlock()
  tokens = jnp.asarray(np.arange(T) * 3 % 11, jnp.int32)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)
  check_scan(lambda t: model.apply(variables, t), tokens, prefill=[2],
             rtol=1e-4, atol=1e-5)
