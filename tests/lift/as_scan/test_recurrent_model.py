"""A client: a Griffin-style language model written in `flax.linen` for training (RG-LRU
through `lax.associative_scan`, a causal Conv1D of zero-padded windows, local attention
with rotary positions), decoded by `as_scan` and `lift.generate`, against a decoder
written by hand with its own caches."""
import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import lift

VOCAB, WIDTH, HEADS, CONV, WINDOW = 11, 8, 2, 3, 3
HEAD = WIDTH // HEADS
BATCH, LENGTH, PROMPT = 2, 7, 3


def rope(x, positions):  # x [batch, length, heads, head]: rotate the two halves
  half = x.shape[-1] // 2
  frequencies = 100.0 ** (jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions.astype(jnp.float32)[:, :, None, None] / frequencies[None, None, None]
  first, second = x[..., :half], x[..., half:]
  return jnp.concatenate([first * jnp.cos(angle) - second * jnp.sin(angle),
                          second * jnp.cos(angle) + first * jnp.sin(angle)], axis=-1)


def lru_gates(params, x):
  """The RG-LRU's decay and gated input, from the layer's parameters (shared with the
  hand-written decoder)."""
  gate_x = jax.nn.sigmoid(x @ params['gate_x'])
  rate = jnp.expand_dims(jax.nn.softplus(params['a']), range(x.ndim - 1))
  log_a = -8.0 * jax.nn.sigmoid(x @ params['gate_a']) * rate
  a = jnp.exp(log_a)
  return a, x * gate_x * jnp.sqrt(1 - jnp.exp(2 * log_a))


class RGLRU(fnn.Module):
  @fnn.compact
  def __call__(self, x):  # [batch, length, width]
    params = {'gate_x': self.param('gate_x', fnn.initializers.lecun_normal(), (WIDTH, WIDTH)),
              'gate_a': self.param('gate_a', fnn.initializers.lecun_normal(), (WIDTH, WIDTH)),
              'a': self.param('a', fnn.initializers.uniform(2.0), (WIDTH,))}
    a, gated = lru_gates(params, x)

    def combine(left, right):  # h -> a_r * (a_l * h + x_l) + x_r
      return left[0] * right[0], right[0] * left[1] + right[1]

    h = lax.associative_scan(combine, (a, gated), axis=1)[1]
    last = h[:, -1]  # the state a cache path would keep: unused in training
    del last
    return h


class Conv1D(fnn.Module):
  @fnn.compact
  def __call__(self, x):
    w = self.param('w', fnn.initializers.normal(0.5), (CONV, WIDTH))
    out = 0.0
    for shift in range(CONV):  # the window `shift` steps back, zero-padded in front
      window = x[:, :x.shape[1] - shift]
      padding = jnp.zeros((x.shape[0], shift, WIDTH), x.dtype)
      out = out + jnp.concatenate([padding, window], axis=1) * w[CONV - 1 - shift][None, None]
    return out


class LocalAttention(fnn.Module):
  @fnn.compact
  def __call__(self, x):
    positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
    q, k, v = (fnn.DenseGeneral((HEADS, HEAD), use_bias=False, name=name)(x)
               for name in ('q', 'k', 'v'))
    q, k = rope(q, positions), rope(k, positions)
    logits = jnp.einsum('bthd,bshd->bhts', q, k) * HEAD ** -0.5
    gap = positions[:, :, None] - positions[:, None, :]
    mask = (gap >= 0) & (gap <= WINDOW)
    probs = jax.nn.softmax(jnp.where(mask[:, None], logits, -2.3819763e38), axis=-1)
    return fnn.DenseGeneral(WIDTH, axis=(-2, -1), name='out')(
        jnp.einsum('bhts,bshd->bthd', probs, v))


class Griffin(fnn.Module):
  @fnn.compact
  def __call__(self, tokens):  # [batch, length] -> [batch, length, vocab]
    embed = fnn.Embed(VOCAB, WIDTH)
    x = embed(tokens)
    for name, mix in (('recurrent', lambda h: RGLRU()(Conv1D()(fnn.Dense(WIDTH)(h)))),
                      ('attention', LocalAttention())):
      x = x + mix(fnn.RMSNorm(name=f'{name}_norm')(x))
      x = x + fnn.Dense(WIDTH, name=f'{name}_mlp')(jax.nn.gelu(fnn.RMSNorm()(x)))
    return embed.attend(fnn.RMSNorm()(x))


MODEL = Griffin()
TOKENS = jax.random.randint(jax.random.key(1), (BATCH, LENGTH), 0, VOCAB)
PARAMS = MODEL.init(jax.random.key(0), TOKENS)['params']


def rms(params, x):
  return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * params['scale'][None]


def dense(params, x):
  kernel = params['kernel'].reshape(x.shape[-1], -1)
  return x @ kernel + params['bias'][None] if 'bias' in params else x @ kernel


def init_cache():
  """The hand-written decoder's caches: the LRU state, the last CONV - 1 inputs of the
  convolution, every key and value so far (masked to the window when read)."""
  zeros = lambda *shape: jnp.zeros((BATCH, *shape))
  return {'h': zeros(WIDTH), 'conv': zeros(CONV - 1, WIDTH),
          'k': zeros(LENGTH, HEADS, HEAD), 'v': zeros(LENGTH, HEADS, HEAD)}


def decode_step(cache, token, t):
  """One token through the model, written with caches: [batch] -> [batch, vocab]."""
  p = PARAMS
  x = p['Embed_0']['embedding'][token]
  h = dense(p['Dense_0'], rms(p['recurrent_norm'], x))
  inputs = jnp.concatenate([cache['conv'], h[:, None]], axis=1)  # the last CONV inputs
  h = jnp.einsum('bsw,sw->bw', inputs, p['Conv1D_0']['w'])
  a, gated = lru_gates(p['RGLRU_0'], h)
  state = a * cache['h'] + gated
  x = x + state
  x = x + dense(p['recurrent_mlp'], jax.nn.gelu(rms(p['RMSNorm_0'], x)))
  h = rms(p['attention_norm'], x)
  attention = p['LocalAttention_0']
  position = jnp.full((BATCH, 1), t)
  q, k, v = (jnp.einsum('bw,whd->bhd', h, attention[name]['kernel']) for name in 'qkv')
  q, k = rope(q[:, None], position)[:, 0], rope(k[:, None], position)[:, 0]
  keys, values = cache['k'].at[:, t].set(k), cache['v'].at[:, t].set(v)
  gap = t - jnp.arange(LENGTH)
  seen = (gap >= 0) & (gap <= WINDOW)
  logits = jnp.einsum('bhd,bshd->bhs', q, keys) * HEAD ** -0.5
  probs = jax.nn.softmax(jnp.where(seen[None, None], logits, -jnp.inf), axis=-1)
  x = x + dense(attention['out'], jnp.einsum('bhs,bshd->bhd', probs, values).reshape(BATCH, -1))
  x = x + dense(p['attention_mlp'], jax.nn.gelu(rms(p['RMSNorm_1'], x)))
  logits = rms(p['RMSNorm_2'], x) @ p['Embed_0']['embedding'].T
  return {'h': state, 'conv': inputs[:, 1:], 'k': keys, 'v': values}, logits


def logits_fn(tokens):
  return MODEL.apply({'params': PARAMS}, tokens)


@jax.jit
def by_hand(tokens):
  """Per-step logits of the hand-written decoder over every token: [length, batch, vocab]."""
  step = lambda cache, token_t: decode_step(cache, *token_t)
  return lax.scan(step, init_cache(), (tokens.T, jnp.arange(LENGTH)))[1]


@jax.jit
def derived(tokens):
  """Per-step logits of the step derived from the training-mode model, after a prompt."""
  g = lambda xs: jnp.moveaxis(logits_fn(xs.T), 1, 0)
  f, carry, prompt = lift.as_scan_with_prefill(g, tokens.T, tokens.T[:PROMPT])
  return jnp.concatenate([prompt, lax.scan(f, carry, tokens.T[PROMPT:])[1]])


def test_derived_step_equals_the_hand_written_cache_decoder():
  want = by_hand(TOKENS)
  np.testing.assert_allclose(derived(TOKENS), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(jnp.moveaxis(logits_fn(TOKENS), 1, 0), want, rtol=1e-5, atol=1e-5)


def test_generate_equals_greedy_decoding_by_hand():
  new = LENGTH - PROMPT + 1

  @jax.jit
  def greedy_by_hand(prompt):
    cache, logits = init_cache(), None
    for t in range(PROMPT):
      cache, logits = decode_step(cache, prompt[:, t], t)
    tokens = [jnp.argmax(logits, -1)]
    for t in range(PROMPT, PROMPT + new - 1):
      cache, logits = decode_step(cache, tokens[-1], t)
      tokens.append(jnp.argmax(logits, -1))
    return jnp.stack(tokens, 1)

  generated = jax.jit(lambda p: lift.generate(logits_fn, p, max_new_tokens=new).tokens)
  prompt = TOKENS[:, :PROMPT]
  np.testing.assert_array_equal(generated(prompt), greedy_by_hand(prompt))
