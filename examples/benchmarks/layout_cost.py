"""Where the per-layer parameter layout costs step time: its inputs or its gradient outputs.

Hand-written `lax.scan` training steps over the same parameters, differing
only in the layout the jitted step takes and returns:

- `stacked`: stacked parameters in, stacked gradients out (the reference);
- `stacked, grads copied`: the same, each gradient passed through a multiply
  by a runtime 1.0 (an extra pass over every gradient byte);
- `per-layer in`: per-layer parameters stacked inside the step, stacked
  gradients out;
- `per-layer out`: stacked parameters in, gradients split into per-layer
  outputs;
- `per-layer in and out`: both, the layout of `scan_layers` and of the
  `stack+lax.scan` variant of `step_time.py`.

Prints the median step time (interleaved rounds), its ratio to `stacked`, and
the compiled temporary memory. On XLA:CPU the split outputs move the loop's
gradient accumulators from the output buffers into the temporary arena
(temporary memory grows by the size of the parameters); the arena is packed
differently, so the loop bodies' kernels share different buffers, and the
runtime, which orders kernels by the buffers they share, runs the same loop
body with different concurrency.

    python examples/benchmarks/layout_cost.py --depth 16 --rounds 7
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from _transformer import Config, block, init_params, mean_square


def layouts(depth: int, cfg: Config) -> dict[str, tuple[Callable, bool]]:
  """``{name: (step, takes per-layer params)}``; each step is ``step(params, x, one)``."""
  def loss(stacked, x):
    return mean_square(jax.lax.scan(lambda h, p: (block(h, p, cfg.heads), None), x, stacked)[0])

  stack = lambda layers: jax.tree.map(lambda *rows: jnp.stack(rows), *layers)
  split = lambda stacked: [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(depth)]
  grad = jax.value_and_grad(loss)

  def copied(p, x, one):
    value, g = grad(p, x)
    return value, jax.tree.map(lambda a: a * one, g)

  def split_out(p, x, one):
    value, g = grad(p, x)
    return value, split(g)

  return {
      "stacked": (lambda p, x, one: grad(p, x), False),
      "stacked, grads copied": (copied, False),
      "per-layer in": (lambda layers, x, one: grad(stack(layers), x), True),
      "per-layer out": (split_out, False),
      "per-layer in and out": (lambda layers, x, one: jax.value_and_grad(
          lambda ls, x: loss(stack(ls), x))(layers, x), True),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depth", type=int, default=16)
  parser.add_argument("--rounds", type=int, default=7, help="timed steps per layout")
  args = parser.parse_args()
  cfg = Config()
  stacked = init_params(jax.random.key(0), args.depth, cfg)
  per_layer = [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(args.depth)]
  x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.seq, cfg.d_model))
  one = jnp.float32(1.0)
  compiled = {}
  for name, (step, takes_layers) in layouts(args.depth, cfg).items():
    params = per_layer if takes_layers else stacked
    compiled[name] = (jax.jit(step).lower(params, x, one).compile(), params)
    jax.block_until_ready(compiled[name][0](params, x, one))
  times: dict[str, list[float]] = {name: [] for name in compiled}
  names = list(compiled)
  for r in range(args.rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      step, params = compiled[name]
      start = time.perf_counter()
      jax.block_until_ready(step(params, x, one))
      times[name].append(time.perf_counter() - start)
  reference = statistics.median(times["stacked"])
  print(f"{cfg}, depth {args.depth}, backend {jax.default_backend()}, jax {jax.__version__}, "
        f"median of {args.rounds} interleaved steps")
  print(f"{'layout':<22} {'median s':>9} {'/ stacked':>9} {'temp MiB':>9}")
  for name, (step, _) in compiled.items():
    median = statistics.median(times[name])
    temp = step.memory_analysis().temp_size_in_bytes / 2**20
    print(f"{name:<22} {median:>9.3f} {median / reference:>9.3f} {temp:>9.1f}")


if __name__ == "__main__":
  main()
