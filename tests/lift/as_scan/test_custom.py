"""`custom_causal`, `causal_self_attention`, and a small Transformer."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lift import as_scan, causal_self_attention, custom_causal
from lift.causal.testing import check_scan

from tests.helpers import assert_trees_close, assert_trees_equal, tolerance

T = 6

# The step form against the full sequence of a small transformer: float32, about 32 layers
# of rounding between them (attention, softmax, two blocks, prefill and step).
STEP_TOL = dict(rtol=tolerance(np.float32, 32), atol=tolerance(np.float32, 32))


def rand(shape, seed=0, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def running_mean_full(x):
  return jnp.cumsum(x, 0) / jnp.arange(1, x.shape[0] + 1, dtype=x.dtype)[:, None]


calls = []


@custom_causal
def running_mean(x):
  return running_mean_full(x)


@running_mean.def_init
def _(x):
  return jnp.zeros(x.shape[1:], x.dtype)


@running_mean.def_step
def _(total, index, x):
  calls.append('step')
  total = total + x
  return total, total / (index + 1).astype(x.dtype)


@running_mean.def_prefill
def _(total, x):
  calls.append('prefill')
  return total + x.sum(0), running_mean_full(x)


@custom_causal
def mean_so_far(x):
  """Causal, with no step rule: as_scan reruns it on the history."""
  return running_mean_full(x)


def test_custom_step_and_prefill_pass_the_oracle():
  calls.clear()
  check_scan(running_mean, rand((T, 3)), prefill=[2])
  assert 'step' in calls and 'prefill' in calls


CUSTOM_USES = {
    'under_jit_and_shifted': jax.jit(
        lambda x: running_mean(jnp.concatenate([jnp.zeros((1, 3)), x[:-1]])) * 2),
    'without_step_reruns_on_history': lambda x: mean_so_far(jnp.sin(x)),
    # Time is the scan axis 0; running_mean is causal along its axis 0, which here is a
    # feature axis, so as_scan converts its jaxpr instead.
    'time_on_another_axis_converts_the_original': lambda x: running_mean(x.T).T,
}


@pytest.mark.parametrize('g', list(CUSTOM_USES.values()), ids=list(CUSTOM_USES))
def test_custom_causal_uses_pass_the_oracle(g):
  check_scan(g, rand((T, 3)), prefill=[2])


def test_custom_values_and_gradients_are_the_originals():
  x = rand((T, 3))
  np.testing.assert_array_equal(running_mean(x), running_mean_full(x))

  def derivatives(fn, x):
    loss = lambda x: jnp.sum(fn(x) ** 2)
    return jax.grad(loss)(x), jax.jacfwd(loss)(x), jax.vmap(fn)(x[None])

  derivatives = jax.jit(derivatives, static_argnums=0)
  assert_trees_close(derivatives(running_mean, x), derivatives(running_mean_full, x))


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


def flax_causal_attention(q, k, v):
  return nn.dot_product_attention(q, k, v, mask=nn.make_causal_mask(jnp.ones(q.shape[:-2])))


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_attention_matches_flax(dtype):
  q, k, v = (rand((2, T, 3, 4), seed, dtype) for seed in range(3))
  want = jax.jit(flax_causal_attention)(q, k, v)
  assert_trees_equal(jax.jit(causal_self_attention)(q, k, v), want)
  assert_trees_equal(jax.jit(causal_self_attention)(q[0], k[0], v[0]), want[0])  # no batch axis


def test_attention_gradients_are_the_originals():
  q, k, v = (rand((T, 2, 4), seed) for seed in range(3))

  @functools.partial(jax.jit, static_argnums=0)
  def grad(attention, q):
    return jax.grad(lambda q: jnp.sum(attention(q, k, v) ** 2))(q)

  assert_trees_close(grad(causal_self_attention, q), grad(flax_causal_attention, q), depth=8)


def _batch_first(x):  # xs [T, batch, heads, feat]; attention sees [batch, T, heads, feat]
  x = jnp.swapaxes(x, 0, 1)
  return jnp.swapaxes(causal_self_attention(x, 2 * x, jnp.sin(x)), 0, 1)


BF16_TOL = 3e-2
ATTENTION_USES = {
    'time_first': (lambda qkv: causal_self_attention(*qkv),
                   tuple(rand((T, 2, 4), seed) for seed in range(3)), 3, 1e-5),
    'batch_first_after_transpose': (_batch_first, rand((T, 2, 3, 4)), 2, 1e-5),
    'time_as_a_batch_axis_runs_whole_per_step': (
        lambda x: causal_self_attention(x, x, x), rand((T, 5, 2, 4)), 2, 1e-5),
    'bfloat16_steps': (lambda x: causal_self_attention(x, x, x),
                       rand((T, 2, 4), dtype=jnp.bfloat16), 2, BF16_TOL),
}


@pytest.mark.parametrize('g, xs, prefill, tol', list(ATTENTION_USES.values()), ids=list(ATTENTION_USES))
def test_attention_layouts_pass_the_oracle(g, xs, prefill, tol):
  check_scan(g, xs, prefill=[prefill], rtol=tol, atol=tol)


def transformer(params, tokens):
  """Embeddings, then per layer attention, a causal conv and an MLP."""
  x = params['embed'][tokens] + params['pos'][:tokens.shape[0]]

  def layer(x, p):
    q, k, v = jnp.split((x @ p['qkv']).reshape(x.shape[0], 3, 2, 4), 3, 1)
    x = x + causal_self_attention(q[:, 0], k[:, 0], v[:, 0]).reshape(x.shape[0], 8) @ p['out']
    x = x + lax.conv_general_dilated(x[None], p['conv'], (1,), [(2, 0)],
                                     dimension_numbers=('NWC', 'WIO', 'NWC'), feature_group_count=8)[0]
    return x + jax.nn.gelu(x @ p['up']) @ p['down'], None

  x, _ = lax.scan(layer, x, params['layers'])
  return x @ params['embed'].T


def test_small_transformer_steps_match_the_full_forward_and_prompted():
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape) / shape[-2] ** 0.5, jnp.float32)
  params = {
      'embed': normal(11, 8), 'pos': normal(T + 3, 8),
      'layers': {'qkv': normal(2, 8, 24), 'out': normal(2, 8, 8), 'conv': normal(2, 3, 1, 8),
                 'up': normal(2, 8, 16), 'down': normal(2, 16, 8)},
  }
  tokens = jnp.asarray(np.arange(T) * 7 % 11, jnp.int32)
  check_scan(lambda t: transformer(params, t), tokens, prefill=[3], **STEP_TOL)
  prompt = jnp.asarray([3, 1, 4], jnp.int32)
  check_scan(lambda t: transformer(params, jnp.concatenate([prompt, t]))[3:], tokens, prefill=[2],
             **STEP_TOL)


class FlaxBlock(nn.Module):
  """A causal flax.linen model: Embed, LayerNorm, attention, causal Conv."""

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(11, 8)(tokens)
    qkv = nn.DenseGeneral((3, 2, 4))(nn.LayerNorm()(x))
    x = x + nn.DenseGeneral(8, axis=(-2, -1))(causal_self_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2]))
    x = x + nn.Conv(8, (3,), padding='CAUSAL', kernel_dilation=2)(nn.RMSNorm()(x)[None])[0]
    return nn.Dense(11)(nn.gelu(x))


def test_flax_linen_model_apply_steps():
  model = FlaxBlock()
  tokens = jnp.asarray(np.arange(T) * 3 % 11, jnp.int32)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)
  check_scan(lambda t: model.apply(variables, t), tokens, prefill=[2], **STEP_TOL)
