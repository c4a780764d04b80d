"""`explain_scans` on a layer stack's training step: every loop by role, moved work by its code."""
import inspect

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import lift
import linen_ext as nn
from lift.causal import attention

D, HEADS, LENGTH, VOCAB, LAYERS = 8, 2, 4, 16, 6


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm()(x)
    q, k, v = (nn.Dense(D)(h).reshape(*h.shape[:-1], HEADS, D // HEADS) for _ in range(3))
    x = x + nn.Dense(D)(nn.causal_self_attention(q, k, v).reshape(x.shape))
    x = x + nn.RNN(nn.SimpleCell(D))(nn.LayerNorm()(x))
    return x + nn.Dense(D)(jax.nn.gelu(nn.Dense(2 * D)(nn.LayerNorm()(x))))


class LM(nn.Module):
  @nn.compact
  def __call__(self, tokens):
    embed = nn.Embed(VOCAB, D)
    x = nn.Stacked(Block, LAYERS, remat='nested')(embed(tokens))
    return embed.attend(nn.LayerNorm()(x))


def loss(params, batch):
  logits = LM().apply({'params': params}, batch['inputs'])
  picked = jnp.take_along_axis(jax.nn.log_softmax(logits), batch['targets'][..., None], -1)
  return -jnp.mean(picked)


def line_of(source, text: str) -> int:
  """The number of the first line of `source` (a module, class or function) holding `text`."""
  lines, start = inspect.getsourcelines(source)
  return next(i for i, line in enumerate(lines, max(start, 1)) if text in line)


@pytest.fixture(scope='module')
def report():
  tokens = jnp.zeros((2, LENGTH), jnp.int32)
  params = LM().init(jax.random.key(0), tokens)['params']
  return lift.explain_scans(jax.value_and_grad(loss), params, {'inputs': tokens, 'targets': tokens})


def test_every_loop_is_listed_with_its_role(report):
  roles = [(i.number, i.role, i.forward, i.parent, i.scope, i.function) for i in report.loop_info]
  recomputed = ('recomputed forward', 3, 2, 'RNN_0', 'Block.__call__')
  assert roles == [(1, 'forward', None, None, 'Stacked_0', 'LM.__call__'),
                   (2, 'backward', 1, None, 'Stacked_0', 'LM.__call__'),
                   (3, 'forward', None, 1, 'RNN_0', 'Block.__call__'),
                   (4, *recomputed), (5, *recomputed), (6, *recomputed),  # nested remat's reruns
                   (7, 'backward', 3, 2, 'RNN_0', 'Block.__call__')]
  text = str(report).splitlines()
  titles = [line for line in text if line.startswith('loop ')]
  assert len(titles) == len(report.loop_info) == report.loops('before') == 7
  stack = f'Stacked_0 in LM.__call__, line {line_of(LM, "nn.Stacked(")} ('
  assert titles[0].startswith(f'loop 1, forward: {stack}')
  assert titles[0].endswith(f', {LAYERS} steps')
  assert text[text.index(titles[0]) + 1] == '  nothing moved: no rewrite applies to this loop'
  assert titles[1].startswith(f'loop 2, backward of loop 1: {stack}')
  rnn = f'RNN_0 in Block.__call__, line {line_of(Block, "nn.RNN(")} ('
  assert titles[3].startswith('loop 4, forward of loop 3, recomputed in the backward pass, '
                              f'nested in loop 2: {rnn}')
  assert titles[6].startswith(f'loop 7, backward of loop 3, nested in loop 2: {rnn}')


def test_moved_work_is_named_by_the_code_that_traced_it(report):
  (moved,) = [d for d in report.decisions if d.rewrite == 'push_out_non_seq' and d.applied]
  mask, scale = 'jnp.tril(jnp.ones((length, length), bool))', 'jnp.sqrt(depth).astype(query.dtype)'
  assert all(text in inspect.getsource(attention) for text in (mask, scale))
  carry = line_of(Block, 'nn.RNN(nn.SimpleCell(D))')
  assert moved.loop == 2 and moved.detail == (
      '4 equation(s) computed once before the loop instead of at each of the 6 steps: '
      f'`{mask}` (lift.causal.attention), `{scale}` (lift.causal.attention) with the '
      'rounding to float32 that remat inserts, the rounding of '
      f'`nn.RNN(nn.SimpleCell(D))(nn.LayerNorm()(x))` (Block.__call__, line {carry}) to float32 '
      'that remat inserts; they read only values fixed before the loop')
  for primitive in ('convert_element_type', 'reduce_precision', '(jit', ', jit'):
    assert primitive not in str(report)


def test_a_conversion_is_named_with_the_value_it_converts():
  def f(xs, w):
    step = lambda c, x: (c + x * jnp.sin(w).astype(jnp.bfloat16), None)
    return lax.scan(step, jnp.bfloat16(0), xs)[0]
  (decision,) = lift.explain_scans(f, jnp.ones(3, jnp.bfloat16), jnp.float32(2)).decisions
  line = line_of(f, 'jnp.sin(w)')
  assert decision.detail == (
      '2 equation(s) computed once before the loop instead of at each of the 3 steps: '
      f'`jnp.sin(w)` (test_a_conversion_is_named_with_the_value_it_converts.<locals>.f.<locals>.'
      f'<lambda>, line {line}) converted to bfloat16; they read only constant 0 f32[] (w)')
