"""This project's figures on the device at hand, as one markdown table (`device_check.sh`).

Three measurements, each side by side in one process:

1. the time of a training step (`value_and_grad`) of `nn.Stacked`, a hand-written
   `lax.scan` and `flax.linen.scan` over the same pre-LN Transformer blocks
   (`_transformer.py`; d_model 1024, 16 and 48 layers, bfloat16), median of interleaved
   steps;
2. the compiled temporary memory of a training step under the loop engine's checkpoint
   policies (no remat, ``remat=True``, ``'nested'``; float32, 48 layers);
3. decode tokens/s of the step `as_scan` derives, a hand-written KV cache and Flax's
   ``decode=True`` (`decode.py`'s models), best of interleaved rounds.

    examples/benchmarks/device_check.sh               # the full sizes, for an accelerator
    examples/benchmarks/device_check.sh --tiny        # sizes a CPU runs in seconds
"""
from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp

import decode
import remat_memory
from _transformer import Config, init_params, variants


def step_times(depth: int, cfg: Config, rounds: int) -> dict[str, float]:
  """Median seconds of a bfloat16 training step of each loop, taking turns."""
  stacked = jax.tree.map(lambda a: a.astype(jnp.bfloat16),
                         init_params(jax.random.key(0), depth, cfg))
  x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.seq, cfg.d_model), jnp.bfloat16)
  steps = {}
  for name in ('lax.scan', 'Stacked', 'flax.linen.scan'):
    variant = variants(depth, cfg)[name]
    params = variant.params(stacked)
    step = jax.jit(jax.value_and_grad(variant.loss)).lower(params, x).compile()
    jax.block_until_ready(step(params, x))
    steps[name] = functools.partial(step, params, x)
  times: dict[str, list[float]] = {name: [] for name in steps}
  for r in range(rounds):
    names = list(steps)[r % len(steps):] + list(steps)[:r % len(steps)]
    for name in names:
      start = time.perf_counter()
      jax.block_until_ready(steps[name]())
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def decode_rates(cfg: decode.Config, repeats: int) -> dict[str, float]:
  """Tokens/s of the derived steps and their baselines; checks they give the same tokens."""
  params = decode.init_params(jax.random.key(0), cfg)
  flax_variables = decode.FlaxLM(cfg).init(jax.random.key(0), jnp.zeros((1, cfg.steps), jnp.int32))
  first = jnp.int32(1)
  runs = {
      'as_scan step (JAX model)': functools.partial(decode.generate_as_scan, cfg, params, first),
      'hand-written KV cache (JAX model)': functools.partial(
          decode.generate_kv_cache, cfg, params, first),
      'nn.as_scan step (Flax-written LM)': functools.partial(
          decode.generate_nn_as_scan, cfg, flax_variables, first),
      'Flax decode=True (Flax-written LM)': functools.partial(
          decode.generate_flax_decode, cfg, flax_variables, first),
  }
  tokens = {name: run() for name, run in runs.items()}
  names = list(runs)
  for a, b in ((names[0], names[1]), (names[2], names[3])):
    assert bool(jnp.all(tokens[a] == tokens[b])), f'{a} and {b} decode different tokens'
  return {name: cfg.steps / s for name, s in decode.best_seconds(runs, repeats).items()}


def table(args) -> list[str]:
  device = jax.devices()[0]
  cfg = Config(d_model=1024, heads=8, mlp=4096, seq=256, batch=8)
  depths, memory_depth, rounds = [16, 48], 48, 5
  decode_cfg = decode.Config()
  if args.tiny:
    cfg = Config(d_model=32, heads=2, mlp=64, seq=8, batch=2)
    depths, memory_depth, rounds = [2], 3, 1
    decode_cfg = decode.Config(vocab=32, d_model=16, heads=2, mlp=32, depth=2, kernel=3,
                               steps=8)
  lines = [f'Device: {device.device_kind} ({device.platform}), jax {jax.__version__}.', '',
           '| measurement | variant | value | relative |', '|---|---|---|---|']
  for depth in depths:
    seconds = step_times(depth, cfg, rounds)
    for name, value in seconds.items():
      lines.append(f'| train step, {depth} layers, d {cfg.d_model}, bf16 (median of {rounds}) '
                   f'| {name} | {value * 1e3:.1f} ms | {value / seconds["lax.scan"]:.2f}x '
                   'lax.scan |')
  memory = {name: remat_memory.measure(policy, memory_depth, cfg._replace(batch=cfg.batch), 0)
            .temp_bytes for name, policy in (('no remat', False), ('remat=True', True),
                                              ('nested', 'nested'))}
  for name, value in memory.items():
    lines.append(f'| step temporaries, {memory_depth} layers, f32 | {name} | '
                 f'{value / 2**20:.1f} MiB | {value / memory["remat=True"]:.2f}x remat=True |')
  rates = decode_rates(decode_cfg, rounds)
  names = list(rates)
  for name in names:
    base = rates[names[1]] if 'JAX model' in name else rates[names[3]]
    lines.append(f'| decode, {decode_cfg.steps} tokens | {name} | {rates[name]:.0f} tokens/s | '
                 f'{rates[name] / base:.2f}x the baseline |')
  return lines


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--tiny', action='store_true', help='tiny sizes: a quick check on CPU')
  parser.add_argument('--out', type=pathlib.Path, default=None, help='also write the table here')
  args = parser.parse_args()
  lines = table(args)
  text = '\n'.join(lines) + '\n'
  print(text, end='')
  if args.out is not None:
    args.out.write_text(text)


if __name__ == '__main__':
  main()
