"""`lift.generate`: the decode loop on the derived step, for ragged batches and sampling.

Oracles: each prompt decoded alone (a batch of one, no padding), and a Python loop over
the derived step taking the argmax by hand.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift

VOCAB, D, LAYERS, NEW = 13, 16, 2, 6


def init(key):
  keys = jax.random.split(key, 4)
  scale = D ** -0.5
  return {'embed': jax.random.normal(keys[0], (VOCAB, D)),
          'attention': jax.random.normal(keys[1], (LAYERS, 4, D, D)) * scale,
          'mlp': jax.random.normal(keys[2], (LAYERS, D, D)) * scale,
          'head': jax.random.normal(keys[3], (D, VOCAB)) * scale}


def rotate(x, positions):  # x [B, T, D], positions [B, T]
  half = D // 2
  angles = positions[..., None].astype(jnp.float32) * (
      1.0 / 100.0 ** (jnp.arange(half, dtype=jnp.float32) / half))[None, None]
  first, second = x[..., :half], x[..., half:]
  return jnp.concatenate([first * jnp.cos(angles) - second * jnp.sin(angles),
                          second * jnp.cos(angles) + first * jnp.sin(angles)], -1)


def logits(params, tokens, valid):
  """A causal LM that takes a padding mask: the layers in a `lax.scan`, the mask and the
  positions built once and passed to every layer."""
  length = tokens.shape[1]
  positions = jnp.maximum(jnp.cumsum(valid, 1) - 1, 0)
  mask = jnp.tril(jnp.ones((length, length), bool))[None] & valid[:, None, :]

  def layer(x, weights):
    (wq, wk, wv, wo), w = weights
    q, k = rotate(x @ wq, positions), rotate(x @ wk, positions)
    scores = jnp.where(mask, jnp.einsum('btd,bsd->bts', q, k) * D ** -0.5, -1e9)
    x = x + jnp.einsum('bts,bsd->btd', jax.nn.softmax(scores), x @ wv) @ wo
    return x + jnp.tanh(x @ w), None

  x, _ = jax.lax.scan(layer, params['embed'][tokens], (params['attention'], params['mlp']))
  return x @ params['head']


PARAMS = init(jax.random.key(0))
LENGTHS = [1, 3, 5, 8]
PROMPTS = np.array([[3, 0, 0, 0, 0, 0, 0, 0],
                    [5, 1, 7, 0, 0, 0, 0, 0],
                    [2, 9, 4, 4, 1, 0, 0, 0],
                    [6, 2, 8, 3, 1, 5, 7, 2]], np.int32)


@jax.jit
def decode_ragged(params, prompts, lengths):
  return lift.generate(lambda t, v: logits(params, t, v), prompts, max_new_tokens=NEW,
                       prompt_lengths=lengths)


def test_each_row_of_a_ragged_batch_decodes_as_its_prompt_alone():
  batch = decode_ragged(PARAMS, PROMPTS, jnp.array(LENGTHS))
  for row, length in enumerate(LENGTHS):
    alone = decode_ragged(PARAMS, PROMPTS[row:row + 1, :length], jnp.array([length]))
    np.testing.assert_array_equal(batch.tokens[row], alone.tokens[0])
  left_padded = np.stack([np.roll(p, 8 - n) for p, n in zip(PROMPTS, LENGTHS)])
  by_mask = lift.generate(lambda t, v: logits(PARAMS, t, v), left_padded, max_new_tokens=NEW,
                          prompt_mask=left_padded != 0)
  np.testing.assert_array_equal(by_mask.tokens, batch.tokens)


def test_greedy_tokens_equal_a_python_loop_over_the_derived_step():
  prompts = PROMPTS[:, :3]  # no padding
  g = lambda tokens: jnp.moveaxis(logits(PARAMS, tokens.T, jnp.ones(tokens.T.shape, bool)), 1, 0)
  step, carry, prompt_logits = lift.as_scan_with_prefill(
      g, jax.ShapeDtypeStruct((3 + NEW - 1, 4), jnp.int32), prompts.T)
  want = [jnp.argmax(prompt_logits[-1], -1)]
  for _ in range(NEW - 1):
    carry, next_logits = step(carry, want[-1])
    want.append(jnp.argmax(next_logits, -1))
  got = lift.generate(lambda t: logits(PARAMS, t, jnp.ones(t.shape, bool)), prompts,
                      max_new_tokens=NEW)
  np.testing.assert_array_equal(got.tokens, np.stack(want, 1))
  np.testing.assert_array_equal(got.lengths, [NEW] * 4)


def test_a_stop_token_ends_its_row_and_pads_the_rest():
  greedy = decode_ragged(PARAMS, PROMPTS, jnp.array(LENGTHS)).tokens
  stop = int(greedy[0, 2])
  first = [int(np.argmax(np.asarray(row) == stop)) if stop in row else NEW - 1
           for row in np.asarray(greedy)]
  got = lift.generate(lambda t, v: logits(PARAMS, t, v), PROMPTS, max_new_tokens=NEW,
                      prompt_lengths=jnp.array(LENGTHS), stop_tokens=[stop], pad_token=-1)
  for row, end in enumerate(first):
    np.testing.assert_array_equal(got.tokens[row, :end + 1], greedy[row, :end + 1])
    assert (np.asarray(got.tokens[row, end + 1:]) == -1).all()
    assert int(got.lengths[row]) == end + 1


@pytest.mark.parametrize('sampling', [lift.Sampling(temperature=0.0), lift.Sampling(top_k=1),
                                      lift.Sampling(top_p=1e-6)],
                         ids=['temperature_0', 'top_k_1', 'top_p_tiny'])
def test_sampling_that_keeps_one_token_is_greedy(sampling):
  greedy = decode_ragged(PARAMS, PROMPTS, jnp.array(LENGTHS)).tokens
  got = lift.generate(lambda t, v: logits(PARAMS, t, v), PROMPTS, max_new_tokens=NEW,
                      prompt_lengths=jnp.array(LENGTHS), sampling=sampling,
                      key=jax.random.key(1))
  np.testing.assert_array_equal(got.tokens, greedy)


def test_sampled_tokens_stay_in_the_top_k_and_follow_the_key():
  def draw(seed):
    return lift.generate(lambda t, v: logits(PARAMS, t, v), PROMPTS, max_new_tokens=NEW,
                         prompt_lengths=jnp.array(LENGTHS), key=jax.random.key(seed),
                         sampling=lift.Sampling(temperature=2.0, top_k=2)).tokens
  first, again, other = draw(0), draw(0), draw(1)
  np.testing.assert_array_equal(first, again)
  assert not np.array_equal(first, other)
  ranked = jnp.argsort(-logits(PARAMS, jnp.asarray(PROMPTS[3:]), jnp.ones((1, 8), bool))[0, -1])
  assert int(first[3, 0]) in np.asarray(ranked[:2])
