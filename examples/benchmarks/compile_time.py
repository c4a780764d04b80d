"""Trace and compile time of a Transformer training step, by how its layers are looped.

Seven variants of the same pre-LN block stack (`_transformer.py`: d_model 256,
4 heads, MLP 1024, seq 128, batch 8) are compared at each depth: an unrolled
Python loop of linen_ext blocks, `nn.Stacked`, `nn.scan_layers`, `nn.scan`
(the lifted `lift.scan`), `flax.linen.scan`, a hand-written `lax.scan` over
stacked parameters, and the same over per-layer parameters stacked in the
step with `jnp.stack` (`stack+lax.scan`: the per-layer layout written by
hand; `scan_layers` stacks with `lift.loops.stack_rows` instead). For each, a
fresh `jax.jit(value_and_grad(loss))` is traced (`.trace`, then `.lower`) and
compiled (`.compile`), each stage timed separately, on abstract parameters
(nothing runs). Variants are interleaved
and repeated; the table shows medians. Prints a table and ratios and writes
a PNG.

    python examples/benchmarks/compile_time.py                    # depths 4..64, ~10 min on 2 cores
    python examples/benchmarks/compile_time.py --depths 4 16 --repeats 1
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
from _transformer import Config, init_params, variants


class Timing(NamedTuple):
  trace: float  # jax.jit(...).trace and .lower: Python and JAX tracing, lowering to StableHLO
  compile: float  # .compile: XLA

  @property
  def total(self) -> float:
    return self.trace + self.compile


def measure(variant, stacked, x) -> Timing:
  """Traces, lowers and compiles a fresh jitted training step."""
  params = jax.eval_shape(variant.params, stacked)
  step = jax.jit(jax.value_and_grad(variant.loss))
  start = time.perf_counter()
  lowered = step.trace(params, x).lower()
  traced = time.perf_counter()
  lowered.compile()
  return Timing(traced - start, time.perf_counter() - traced)


def median(timings: list[Timing]) -> Timing:
  return Timing(statistics.median(t.trace for t in timings),
                statistics.median(t.compile for t in timings))


def run(depths: list[int], names: list[str], repeats: int, unrolled_repeats: int,
        cfg: Config, report: bool = True) -> dict[str, dict[int, Timing]]:
  """Median timings per variant and depth; within a depth the variants take turns."""
  x = jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.d_model), jnp.float32)
  results: dict[str, dict[int, Timing]] = {name: {} for name in names}
  for depth in depths:
    stacked = jax.eval_shape(lambda: init_params(jax.random.key(0), depth, cfg))
    by_name = variants(depth, cfg)
    seen: dict[str, list[Timing]] = {name: [] for name in names}
    for rep in range(repeats):
      order = names[rep % len(names):] + names[:rep % len(names)]
      for name in order:
        if name == "unrolled" and rep >= unrolled_repeats:
          continue
        seen[name].append(measure(by_name[name], stacked, x))
    for name in names:
      results[name][depth] = median(seen[name])
      t = results[name][depth]
      if report:
        print(f"{name:<16} {depth:>5} {t.trace:>8.2f} {t.compile:>9.2f} {t.total:>8.2f}"
              f"   (n={len(seen[name])})", flush=True)
  return results


def print_ratios(results: dict[str, dict[int, Timing]], depths: list[int]) -> None:
  pairs = [("unrolled", "Stacked"), ("unrolled", "scan_layers"), ("Stacked", "lax.scan"),
           ("scan_layers", "lax.scan"), ("scan_layers", "stack+lax.scan"),
           ("nn.scan", "lax.scan"), ("flax.linen.scan", "lax.scan"),
           ("Stacked", "flax.linen.scan")]
  pairs = [(a, b) for a, b in pairs if a in results and b in results]
  print("\ntotal (trace + compile) ratios")
  print(f"{'depth':>5} " + " ".join(f"{a + ' / ' + b:>30}" for a, b in pairs))
  for depth in depths:
    cells = [results[a][depth].total / results[b][depth].total for a, b in pairs]
    print(f"{depth:>5} " + " ".join(f"{c:>30.2f}" for c in cells))


def plot(results: dict[str, dict[int, Timing]], depths: list[int], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker
  fig, (total_ax, trace_ax) = plt.subplots(1, 2, figsize=(11, 4))
  for name, by_depth in results.items():
    total_ax.plot(depths, [by_depth[d].total for d in depths], "o-", label=name)
    trace_ax.plot(depths, [by_depth[d].trace for d in depths], "o-", label=name)
  total_ax.set(xlabel="depth (blocks)", ylabel="seconds", title="trace + compile",
               xscale="log", yscale="log")
  trace_ax.set(xlabel="depth (blocks)", ylabel="seconds", title="trace + lower only",
               xscale="log", yscale="log")
  for ax in (total_ax, trace_ax):
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xticks(depths, [str(d) for d in depths])
  total_ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depths", type=int, nargs="+", default=[4, 8, 16, 32, 64])
  parser.add_argument("--variants", nargs="+", default=None,
                      help="subset of: " + ", ".join(variants(1, Config())))
  parser.add_argument("--repeats", type=int, default=2, help="timed compilations per variant")
  parser.add_argument("--unrolled-repeats", type=int, default=1,
                      help="timed compilations of the unrolled loop (slow at depth)")
  parser.add_argument("--plot", default="compile_time.png", help="where to write the PNG")
  args = parser.parse_args()
  cfg = Config()
  names = args.variants or list(variants(1, cfg))
  print(f"{cfg}, backend {jax.default_backend()}, jax {jax.__version__}, "
        f"median of {args.repeats} (unrolled: {args.unrolled_repeats})")
  print(f"{'variant':<16} {'depth':>5} {'trace s':>8} {'compile s':>9} {'total s':>8}")
  run([1], ["lax.scan"], 1, 0, cfg, report=False)  # warm-up: the first compilation of a process is slower
  results = run(args.depths, names, args.repeats, args.unrolled_repeats, cfg)
  print_ratios(results, args.depths)
  plot(results, args.depths, args.plot)
  print(f"plot written to {args.plot}")


if __name__ == "__main__":
  main()
