"""as_scan of models whose layer stacks take a mask and positions built once from the data.

Real models (Gemma, Hugging Face's Flax models, MaxText) build the attention mask
(causal & key padding, `[B, T, T]`) and the positions once and pass them to every
layer. The mask has two time axes; it must pass through the loop each stack emits.
Oracle: `check_scan` (the full forward, the scanned step, and prefill + continuation).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift
import linen_ext as nn
from lift.causal.testing import check_scan
from tests.helpers import tolerance

VOCAB, D, HEADS, LAYERS = 11, 8, 2, 3


def rotate(x, positions):  # rotary embedding; x [B, T, H, d], positions [B, T]
  half = x.shape[-1] // 2
  frequencies = 1.0 / 10_000.0 ** (jnp.arange(half, dtype=jnp.float32) / half)
  angles = positions[..., None, None].astype(jnp.float32) * frequencies[None, None, None]
  sin, cos = jnp.sin(angles).astype(x.dtype), jnp.cos(angles).astype(x.dtype)
  first, second = x[..., :half], x[..., half:]
  return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], -1)


def rms_norm(x):  # in float32, as mixed-precision models normalise
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(x.dtype)


class Block(nn.Module):
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, mask, positions):  # x [B, T, D], mask [B, T, T], positions [B, T]
    h = rms_norm(x)
    q, k, v = (nn.DenseGeneral((HEADS, D // HEADS), dtype=self.dtype, name=name)(h)
               for name in ('query', 'key', 'value'))
    q, k = rotate(q, positions), rotate(k, positions)
    scores = jnp.einsum('bthd,bshd->bhts', q, k)
    weights = jax.nn.softmax(jnp.where(mask[:, None], scores, -1e9).astype(jnp.float32))
    attended = jnp.einsum('bhts,bshd->bthd', weights.astype(self.dtype), v)
    return x + nn.DenseGeneral(D, axis=(-2, -1), dtype=self.dtype, name='out')(attended)


class Carried(nn.Module):  # nn.scan's body returns (carry, ys)
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, mask, positions):
    return Block(self.dtype)(x, mask, positions), None


def layers(kind, dtype):
  if kind.startswith('Stacked'):
    remat = {'Stacked': False, 'Stacked(remat=True)': True,
             "Stacked(remat='nested')": 'nested'}[kind]
    return lambda x, m, p: nn.Stacked(Block, LAYERS, remat=remat,
                                      block_kwargs={'dtype': dtype})(x, m, p)
  if kind == 'BlockSeq':
    return lambda x, m, p: nn.BlockSeq(Block, LAYERS, block_kwargs={'dtype': dtype})(x, m, p)
  if kind == 'scan_layers':
    return lambda x, m, p: nn.scan_layers([Block(dtype) for _ in range(LAYERS)], x, m, p)
  scanned = nn.scan(Carried, variable_axes={'params': 0}, split_rngs={'params': True},
                    in_axes=(nn.broadcast, nn.broadcast), length=LAYERS)
  return lambda x, m, p: scanned(dtype)(x, m, p)[0]


class Model(nn.Module):
  kind: str
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, tokens):  # [B, T]; token 0 is padding
    length = tokens.shape[1]
    valid = tokens != 0
    mask = jnp.tril(jnp.ones((length, length), bool))[None] & valid[:, None, :]
    positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
    x = nn.Embed(VOCAB, D, dtype=self.dtype)(tokens)
    x = layers(self.kind, self.dtype)(x, mask, positions)
    return nn.Dense(VOCAB, dtype=jnp.float32)(rms_norm(x).astype(jnp.float32))


# Right-padded and with a pad in the middle: every query keeps a key (itself at least).
TOKENS = np.array([[3, 1, 4, 1, 5, 9, 2, 6],
                   [2, 7, 0, 8, 1, 8, 0, 0]], np.int32)
KINDS = ['Stacked', 'Stacked(remat=True)', "Stacked(remat='nested')", 'BlockSeq',
         'nn.scan', 'scan_layers']


def check_model(kind, dtype):
  model = Model(kind, dtype)
  variables = model.init(jax.random.key(0), TOKENS)
  g = lambda xs: jnp.moveaxis(model.apply(variables, xs.T), 1, 0)  # time first
  bound = 2e-2 if dtype == jnp.bfloat16 else tolerance(np.float32, 4 * LAYERS)
  check_scan(g, TOKENS.T, prefill=[3], rtol=bound, atol=bound)


@pytest.mark.parametrize('kind, dtype', [(kind, jnp.float32) for kind in KINDS] + [
    (kind, jnp.bfloat16) for kind in ('Stacked', 'nn.scan')],
    ids=lambda v: v if isinstance(v, str) else jnp.dtype(v).name)
def test_a_mask_and_positions_passed_to_every_layer_convert(kind, dtype):
  check_model(kind, dtype)


class LooksAhead(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    length = tokens.shape[1]
    mask = jnp.triu(jnp.ones((length, length), bool))[None] & (tokens != 0)[:, None, :]
    positions = jnp.broadcast_to(jnp.arange(length), tokens.shape)
    x = nn.Embed(VOCAB, D)(tokens)
    return nn.Stacked(Block, 2)(x, mask, positions)


def test_a_conversion_error_inside_a_stack_names_the_users_line():
  model = LooksAhead()
  variables = model.init(jax.random.key(0), TOKENS)
  with pytest.raises(lift.ScanConversionError) as info:
    nn.as_scan(model, variables, TOKENS, time_axis=1)
  message = str(info.value)
  assert 'test_as_scan_stacks.py' in message.split('\n')[0], message
  assert 'lift/loops' not in message and 'linen_ext/stacks' not in message, message
