"""Attention as people write it converts with a key/value cache, derived from its mask.

Oracle: `check_scan` (the derived step, with and without prefill, reproduces the full
form). Each form draws its shapes (length, heads, key/value heads, features), dtype and
prefill length from hypothesis, a few examples each to keep the suite cheap.
"""
import flax.linen as flax_nn
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift
import linen_ext as nn
from lift.causal.testing import check_scan
from tests.helpers import tolerance

DEPTH = 8  # scores, softmax and the weighted sum, rounded in another order by the step


def split_heads(x, heads, kv_heads):
  """x [T, F] -> q [T, heads, d], k and v [T, kv_heads, d] (d = F // heads)."""
  d = x.shape[1] // heads
  q = x.reshape(x.shape[0], heads, d)
  k = jnp.tanh(x[:, :kv_heads * d]).reshape(x.shape[0], kv_heads, d)
  v = (x[:, ::-1][:, :kv_heads * d] * 0.5).reshape(x.shape[0], kv_heads, d)
  return q, k, v


def repeat_kv(k, heads):
  return jnp.repeat(k, heads // k.shape[1], axis=1)


def flax_mask(x, heads, kv_heads):
  q, k, v = split_heads(x, heads, kv_heads)
  mask = flax_nn.make_causal_mask(jnp.ones((1, x.shape[0])))
  out = flax_nn.dot_product_attention(q[None], repeat_kv(k, heads)[None],
                                      repeat_kv(v, heads)[None], mask=mask)
  return out[0].reshape(x.shape[0], -1)


def jax_is_causal(x, heads, kv_heads):  # grouped-query heads natively
  q, k, v = split_heads(x, heads, kv_heads)
  return jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(x.shape[0], -1)


def jax_window(x, heads, kv_heads):
  q, k, v = split_heads(x, heads, kv_heads)
  out = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(2, 0))
  return out.reshape(x.shape[0], -1)


def jax_mask(x, heads, kv_heads):
  q, k, v = split_heads(x, heads, kv_heads)
  mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
  return jax.nn.dot_product_attention(q, k, v, mask=mask).reshape(x.shape[0], -1)


def hand_where_tril(x, heads, kv_heads):
  q, k, v = split_heads(x, heads, kv_heads)
  scores = jnp.einsum('qhd,khd->hqk', q, repeat_kv(k, heads)) / np.sqrt(q.shape[-1])
  scores = jnp.where(jnp.tril(jnp.ones(scores.shape[1:], bool)), scores,
                     jnp.finfo(scores.dtype).min)
  weights = jax.nn.softmax(scores, axis=-1)
  return jnp.einsum('hqk,khd->qhd', weights, repeat_kv(v, heads)).reshape(x.shape[0], -1)


def hand_iota_bias(x, heads, kv_heads):
  q, k, v = split_heads(x, heads, kv_heads)
  position = jnp.arange(x.shape[0])
  bias = jnp.where(position[:, None] >= position[None, :], 0.0, -jnp.inf).astype(x.dtype)
  scores = jnp.einsum('qhd,khd->hqk', q, repeat_kv(k, heads)) + bias[None]
  weights = jnp.exp(scores - scores.max(-1, keepdims=True))
  weights = weights / weights.sum(-1, keepdims=True)
  return jnp.einsum('hqk,khd->qhd', weights, repeat_kv(v, heads)).reshape(x.shape[0], -1)


def flax_padding_mask(x, heads, kv_heads):  # a key-padding mask (from data) and the causal one
  q, k, v = split_heads(x, heads, kv_heads)
  keep = (x[:, 0] > -0.5)[None]
  mask = flax_nn.combine_masks(flax_nn.make_attention_mask(jnp.ones(keep.shape, bool), keep),
                               flax_nn.make_causal_mask(keep))
  out = flax_nn.dot_product_attention(q[None], repeat_kv(k, heads)[None],
                                      repeat_kv(v, heads)[None], mask=mask)
  return out[0].reshape(x.shape[0], -1)


FORMS = {f.__name__: f for f in (flax_mask, flax_padding_mask, jax_is_causal, jax_window,
                                 jax_mask, hand_where_tril, hand_iota_bias)}


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16], ids=['float32', 'bfloat16'])
@hypothesis.settings(max_examples=1, deadline=None, derandomize=True)
@hypothesis.given(data=st.data())
def test_attention_forms_convert(dtype, data):
  """Every form at once (one compile): a dict of their outputs."""
  length = data.draw(st.integers(2, 6), label='length')
  heads = data.draw(st.sampled_from([1, 2, 4]), label='heads')
  kv_heads = data.draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0]), label='kv')
  prefill = data.draw(st.integers(1, length - 1), label='prefill')
  rng = np.random.default_rng(length)
  x = jnp.asarray(rng.standard_normal((length, 2 * heads)), dtype)
  tol = 2e-2 if dtype == jnp.bfloat16 else tolerance(np.float32, DEPTH)
  with jax.numpy_dtype_promotion('standard'):  # jax.nn promotes bfloat16 logits to float32
    check_scan(lambda x: {name: form(x, heads, kv_heads) for name, form in FORMS.items()}, x,
               prefill=[prefill], rtol=tol, atol=tol)


class Attention(nn.Module):
  @nn.compact
  def __call__(self, x):  # [batch, length, features]
    mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
    ours = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)(x, mask=mask)
    flax_layer = nn.from_flax(flax_nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=4))
    return ours, flax_layer(x, mask=mask)


def test_multi_head_attention_layers_decode_with_nn_as_scan():
  """linen_ext's layer and flax.linen's (wrapped), with a prompt prefilled."""
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 8)), jnp.float32)
  model = Attention()
  variables = model.init(jax.random.key(0), x)
  want = model.apply(variables, x)
  step, carry, out_prompt = nn.as_scan(model, variables, x, time_axis=1, prefill=x[:, :2])
  _, rest = jax.lax.scan(step, carry, jnp.moveaxis(x[:, 2:], 1, 0))
  got = jax.tree.map(lambda p, r: jnp.concatenate([p, jnp.moveaxis(r, 0, 1)], axis=1),
                     out_prompt, rest)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


T = 5


def masked(mask, fill=-jnp.inf):
  def attend(x):
    scores = x @ x.T
    return jax.nn.softmax(jnp.where(mask(scores), scores, fill)) @ x
  return attend


NOT_CAUSAL = {  # name: (function of xs [T, T], what the message says)
    'upper_triangular': (masked(lambda s: jnp.triu(jnp.ones((T, T), bool))),
                         '`reduce_max`.*key time.*not masked'),
    'shifted_the_wrong_way': (masked(lambda s: jnp.tril(jnp.ones((T, T), bool), 1)),
                              '`reduce_max`.*key time.*not masked'),
    'mask_from_data': (masked(lambda s: s > 0), '`reduce_max`.*key time.*not masked'),
    'no_mask': (masked(lambda s: True), '`reduce_max`.*key time.*not masked'),
    'weights_not_zero_after_the_query': (
        lambda x: jnp.where(jnp.tril(jnp.ones((T, T), bool)), x @ x.T, 1.0) @ x,
        '`dot_general`.*contracts values.*not known to be zero'),
    'feature_axis_paired_with_time': (lambda x: jnp.tril(jnp.ones((T, T))) * (x @ x),
                                      '`dot_general`.*contracts the scan axis'),
    'scores_returned': (lambda x: x @ x.T, 'output 0.*two axes.*`dot_general`'),
    'query_axis_reduced': (lambda x: jnp.where(jnp.tril(jnp.ones((T, T), bool)), x @ x.T,
                                               0.0).sum(0)[:, None] * x,
                           '`reduce_sum`.*key time.*not masked'),
}


@pytest.mark.parametrize('fn, match', list(NOT_CAUSAL.values()), ids=list(NOT_CAUSAL))
def test_attention_that_is_not_causal_raises(fn, match):
  with pytest.raises(lift.ScanConversionError, match=match) as info:
    lift.as_scan(fn, jnp.ones((T, T)))
  assert 'test_attention_forms.py' in str(info.value)


WINDOW, LONG = 3, 7


def banded(x, far=-jnp.inf):
  """Attention over the last WINDOW keys; `far`: what the keys before the window get."""
  position = jnp.arange(x.shape[0])
  distance = position[:, None] - position[None, :]
  scores = jnp.where(distance < 0, -jnp.inf, jnp.where(distance < WINDOW, x @ x.T, far))
  return jax.nn.softmax(scores) @ x


def decayed(x):  # keys before the window count half: the band is not a window
  position = jnp.arange(x.shape[0])
  distance = position[:, None] - position[None, :]
  weights = jnp.where(distance < 0, 0.0, jnp.where(distance < WINDOW, 1.0, 0.5))
  return weights @ jnp.tanh(x) + (weights * (x @ x.T)) @ x


@pytest.mark.parametrize('g, cache_length', [(banded, WINDOW), (decayed, LONG)],
                         ids=['sliding_window_ring', 'decay_keeps_history'])
def test_a_sliding_window_keeps_a_ring_of_its_size(g, cache_length):
  x = jnp.asarray(np.random.default_rng(1).standard_normal((LONG, 2)), jnp.float32)
  check_scan(g, x, prefill=[1, 5], rtol=tolerance(np.float32, DEPTH),
             atol=tolerance(np.float32, DEPTH))
  _, carry = lift.as_scan(g, x)
  caches = [leaf.shape for leaf in jax.tree.leaves(carry.states)]
  assert caches and all(cache_length in shape and (cache_length == LONG or LONG not in shape)
                        for shape in caches), caches


def through_control_flow(x):
  """A mask and scores made outside, used inside `switch` and `while_loop`; more made inside."""
  length = x.shape[0]
  mask = jnp.tril(jnp.ones((length, length), bool)) & (x[:, 0] > -0.5)[None, :]
  scores = x @ x.T

  def attend(mask, scores, x):
    return jax.nn.softmax(jnp.where(mask, scores, -jnp.inf)) @ x

  def attend_inside(mask, scores, x):  # scores of its own, under the mask from outside
    return jax.nn.softmax(jnp.where(mask, jnp.tanh(x) @ x.T, -1e9)) @ x

  branch = jnp.argmax(jnp.array([0.0, 1.0]))  # known, so the switch stays a switch
  switched = jax.lax.switch(branch, [attend, attend_inside], mask, scores, x)

  def body(state):
    i, total = state
    return i + 1, total + jnp.sum(jnp.where(mask, scores, 0.0), -1)

  _, looped = jax.lax.while_loop(lambda state: state[0] < 2, body,
                                 (0, jnp.zeros(length, x.dtype)))
  return switched + looped[:, None]


def test_values_with_two_time_axes_pass_through_switch_and_while_loop():
  x = jnp.asarray(np.random.default_rng(2).standard_normal((5, 3)), jnp.float32)
  x = x.at[1, 0].set(-1.0)  # a padded key
  check_scan(through_control_flow, x, prefill=[2], rtol=tolerance(np.float32, DEPTH),
             atol=tolerance(np.float32, DEPTH))
