"""Scan rewrites: time and memory of recurrent language models with and without them.

For an LSTM and a GRU language model written as one `lax.scan` step (input
projection, recurrence, output projection inside the loop), at several shapes:
the training step (`value_and_grad`) and inference (the loss), as written, as
rewritten by `lift.optimize_scans` with its cost model (the loss rewritten before
differentiation, and for training also the whole step, backward loop included),
and as `flax.linen.RNN` (cell in the loop, output layer after it). Then `save_mem` (compiled temporary
bytes of a loop read only at its last step) and `merge` (while loops in the
compiled program of two loops over one sequence). All in one process; each
time is the median of `--repeats` runs, the variants interleaved.

  python examples/benchmarks/scan_rewrites.py            # the table of docs/benchmarks.md
  python examples/benchmarks/scan_rewrites.py --tiny     # seconds: that it runs (LSTM only)
"""
from __future__ import annotations

import argparse
import statistics
import time

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
from jax import lax

import lift

SHAPES = [(8, 256, 256, 128), (4, 1024, 256, 64), (32, 512, 128, 256), (32, 256, 256, 128),
          (2, 512, 512, 64), (64, 128, 128, 128)]  # batch, input, hidden, steps
TINY = [(2, 8, 8, 4)]
VOCAB = 256
GATES = {'lstm': 4, 'gru': 3}


def init(key, kind, inputs, hidden):
  k = jax.random.split(key, 4)
  g = GATES[kind] * hidden
  normal = lambda key, shape: jax.random.normal(key, shape) / shape[0] ** 0.5
  return {'embed': normal(k[0], (VOCAB, inputs)), 'w_x': normal(k[1], (inputs, g)),
          'w_h': normal(k[2], (hidden, g)), 'b': jnp.zeros(g), 'w_o': normal(k[3], (hidden, VOCAB))}


def cell(kind, p, carry, x):
  """One step: the input projection is inside, as a step function is usually written."""
  if kind == 'lstm':
    h, c = carry
    i, f, g, o = jnp.split(x @ p['w_x'] + h @ p['w_h'] + p['b'], 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h
  h = carry
  xr, xz, xn = jnp.split(x @ p['w_x'] + p['b'], 3, axis=-1)
  hr, hz, hn = jnp.split(h @ p['w_h'], 3, axis=-1)
  r, z = jax.nn.sigmoid(xr + hr), jax.nn.sigmoid(xz + hz)
  h = (1 - z) * jnp.tanh(xn + r * hn) + z * h
  return h, h


def written_loss(kind, p, tokens):
  """Cross-entropy of next-token prediction; the output layer is in the step."""
  batch, hidden = tokens.shape[1], p['w_h'].shape[0]
  zeros = jnp.zeros((batch, hidden))
  init_carry = (zeros, zeros) if kind == 'lstm' else zeros

  def step(carry, x):
    carry, h = cell(kind, p, carry, x)
    return carry, jax.nn.log_softmax(h @ p['w_o'])
  _, logp = lax.scan(step, init_carry, p['embed'][tokens[:-1]])
  return -jnp.mean(jnp.take_along_axis(logp, tokens[1:, :, None], axis=-1))


def flax_model(kind, hidden):
  class LM(flax_nn.Module):
    @flax_nn.compact
    def __call__(self, tokens):
      x = flax_nn.Embed(VOCAB, self.inputs)(tokens)
      cell = flax_nn.OptimizedLSTMCell(hidden) if kind == 'lstm' else flax_nn.GRUCell(hidden)
      h = flax_nn.RNN(cell, time_major=True)(x)
      return jax.nn.log_softmax(flax_nn.Dense(VOCAB, use_bias=False)(h))
    inputs: int = 0
  return LM


def variants(kind, shape, key):
  """The tokens, and per variant its loss function and variables."""
  batch, inputs, hidden, steps = shape
  tokens = jax.random.randint(key, (steps + 1, batch), 0, VOCAB)
  lm = flax_model(kind, hidden)(inputs=inputs)

  def flax_loss(v, t):
    logp = lm.apply(v, t[:-1])
    return -jnp.mean(jnp.take_along_axis(logp, t[1:, :, None], axis=-1))
  loss = lambda p, t: written_loss(kind, p, t)
  p = init(key, kind, inputs, hidden)
  return tokens, {'written': (loss, p), 'flax.linen.RNN': (flax_loss, lm.init(key, tokens[:-1]))}


def programs(fns, mode):
  """The compiled programs to time: as written, rewritten before differentiation
  (`grad(optimize_scans(loss))`, as `optimize=` on a module does), the whole step
  rewritten (`optimize_scans(grad(loss))`: its backward loop too), and Flax's."""
  (loss, p), (flax_loss, v) = fns['written'], fns['flax.linen.RNN']
  if mode == 'inference':
    return {'written': (jax.jit(loss), p), 'rewritten': (jax.jit(lift.optimize_scans(loss)), p),
            'flax': (jax.jit(flax_loss), v)}
  vg = jax.value_and_grad
  return {'written': (jax.jit(vg(loss)), p), 'rewritten': (jax.jit(vg(lift.optimize_scans(loss))), p),
          'step rewritten': (jax.jit(lift.optimize_scans(vg(loss))), p),
          'flax': (jax.jit(vg(flax_loss)), v)}


def medians(compiled, tokens, repeats):
  """Median time of each program, the programs interleaved (drift hits all alike)."""
  for fn, args in compiled.values():
    jax.block_until_ready(fn(args, tokens))
  samples: dict = {name: [] for name in compiled}
  for _ in range(repeats):
    for name, (fn, args) in compiled.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(args, tokens))
      samples[name].append(time.perf_counter() - start)
  return {name: statistics.median(s) for name, s in samples.items()}


def changed(compiled, tokens) -> str:
  """Which rewritten programs differ from the written one (lowered to StableHLO)."""
  text = {n: fn.lower(args, tokens).as_text() for n, (fn, args) in compiled.items()}
  names = [n for n in ('rewritten', 'step rewritten') if n in text and text[n] != text['written']]
  return ', '.join(names) or 'none (same program)'


def time_models(kinds, shapes, repeats):
  print('| model | batch, input, hidden, steps | mode | written (ms) | rewritten / written '
        '| step rewritten / written | flax.linen.RNN / written | changed by the rewrites |')
  print('|---|---|---|---|---|---|---|---|')
  worst, wins = 0.0, []
  for kind in kinds:
    for shape in shapes:
      tokens, fns = variants(kind, shape, jax.random.key(0))
      for mode in ('train', 'inference'):
        compiled = programs(fns, mode)
        med = medians(compiled, tokens, repeats)
        ratios = {n: med[n] / med['written'] for n in med}
        what = changed(compiled, tokens)
        if what != 'none (same program)':
          worst = max(worst, ratios['rewritten'], ratios.get('step rewritten', 0.0))
        if shape[0] <= 8 and mode == 'train':
          wins.append(min(ratios['rewritten'], ratios['step rewritten']))
        step = f'{ratios["step rewritten"]:.2f}' if 'step rewritten' in ratios else '-'
        print(f'| {kind} | {", ".join(map(str, shape))} | {mode} | {1e3 * med["written"]:.1f} '
              f'| {ratios["rewritten"]:.2f} | {step} | {ratios["flax"]:.2f} | {what} |', flush=True)
  print(f'\nrewritten / written where the rewrites changed the program: worst {worst:.2f}; '
        f'training at batch <= 8, best of the two rewritten: worst {max(wins):.2f}')


def save_mem_table(steps, batch, hidden):
  w = jax.random.normal(jax.random.key(0), (hidden, hidden)) / hidden ** 0.5
  xs = jnp.ones((steps, batch, hidden))

  def last(w, xs):
    ys = lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros((batch, hidden)), xs)[1]
    return ys[-1]
  temp = lambda f: jax.jit(f).lower(w, xs).compile().memory_analysis().temp_size_in_bytes
  before, after = temp(last), temp(lift.optimize_scans(last, rewrites=['save_mem']))
  print(f'\nsave_mem, {steps} steps of [{batch}, {hidden}] read at the last step: compiled '
        f'temporaries {before} -> {after} bytes ({after / before:.3f}x)')


def merge_table(steps, batch, hidden):
  xs = jnp.ones((steps, batch, hidden))

  def two(xs):
    total = lax.scan(lambda c, x: (c + jnp.tanh(x), None), jnp.zeros((batch, hidden)), xs)[0]
    peak = lax.scan(lambda c, x: (jnp.maximum(c, jnp.tanh(x)), None), xs[0], xs)[0]
    return total, peak
  whiles = lambda f: jax.jit(f).lower(xs).compile().as_text().count(' while(')
  print(f'merge, two loops over one sequence: while loops in the compiled program '
        f'{whiles(two)} -> {whiles(lift.optimize_scans(two))}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--tiny', action='store_true', help='tiny shapes, one repeat')
  parser.add_argument('--repeats', type=int, default=7)
  args = parser.parse_args()
  kinds, shapes, repeats = (['lstm'], TINY, 1) if args.tiny else (list(GATES), SHAPES, args.repeats)
  print(f'JAX {jax.__version__} on {jax.devices()[0].platform}')
  time_models(kinds, shapes, repeats)
  save_mem_table(*((16, 2, 8) if args.tiny else (512, 8, 256)))
  merge_table(*((4, 2, 8) if args.tiny else (256, 8, 256)))


if __name__ == '__main__':
  main()
