"""Memory and time of each loop checkpoint policy on a stack of pre-LN Transformer blocks.

The blocks (`_transformer.block`) are plain JAX over a stacked params dict
(every leaf has a leading layer axis), run by `lift.loops.scan`. For each
policy and depth the script reports the compiled temporary memory of the
`value_and_grad` training step (`memory_analysis().temp_size_in_bytes`) and
its median wall time, prints a table and writes a plot.

    python examples/benchmarks/remat_memory.py            # d_model 256, batch 8
    python examples/benchmarks/remat_memory.py --quick    # batch 2, one timing run
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
from _transformer import Config, block, init_params

from lift import loops


POLICIES = {
    "no remat": False,
    "remat=True": True,
    "save attn": loops.ScanCheckpointPolicy(save_block_internals=["attn"]),
    "nested": "nested",
}


def train_step(remat, heads: int):
  """`value_and_grad` of a mean-square loss through the scanned stack."""
  stack = loops.scan(lambda x, p: (block(x, p, heads), None), remat=remat)

  def loss(params, x):
    out, _ = stack(x, params)
    return jnp.mean(out ** 2)

  return jax.jit(jax.value_and_grad(loss))


class Measurement(NamedTuple):
  temp_bytes: int
  seconds: float


def measure(remat, depth: int, cfg: Config, repeats: int) -> Measurement:
  """Compiled temp memory, and the median step time over `repeats` runs (NaN for 0)."""
  params = init_params(jax.random.key(0), depth, cfg)
  x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.seq, cfg.d_model))
  compiled = train_step(remat, cfg.heads).lower(params, x).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  if not repeats:
    return Measurement(temp, float("nan"))
  jax.block_until_ready(compiled(params, x))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(params, x))
    times.append(time.perf_counter() - start)
  return Measurement(temp, statistics.median(times))


def plot(results: dict[str, dict[int, Measurement]], depths: list[int], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(10, 4))
  for name, by_depth in results.items():
    mem_ax.plot(depths, [by_depth[d].temp_bytes / 2 ** 20 for d in depths], "o-", label=name)
    time_ax.plot(depths, [by_depth[d].seconds for d in depths], "o-", label=name)
  mem_ax.set(xlabel="depth (blocks)", ylabel="compiled temp memory (MiB)", title="memory",
             yscale="log")
  time_ax.set(xlabel="depth (blocks)", ylabel="train step (s)", title="time")
  mem_ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="batch 2 and one timing run")
  parser.add_argument("--depths", type=int, nargs="+", default=[16, 32, 64])
  parser.add_argument("--repeats", type=int, default=3, help="timed steps; 0: memory only")
  parser.add_argument("--plot", default="remat_memory.png", help="where to write the PNG")
  args = parser.parse_args()
  cfg = Config(batch=2) if args.quick else Config()
  repeats = min(1, args.repeats) if args.quick else args.repeats
  print(f"{cfg}, backend {jax.default_backend()}, median of {repeats} step(s)")
  print(f"{'policy':<12} {'depth':>5} {'temp MiB':>9} {'step s':>8}")
  results: dict[str, dict[int, Measurement]] = {}
  for name, remat in POLICIES.items():
    results[name] = {}
    for depth in args.depths:
      result = results[name][depth] = measure(remat, depth, cfg, repeats)
      print(f"{name:<12} {depth:>5} {result.temp_bytes / 2 ** 20:>9.1f} {result.seconds:>8.3f}",
            flush=True)
  plot(results, args.depths, args.plot)
  print(f"plot written to {args.plot}")


if __name__ == "__main__":
  main()
