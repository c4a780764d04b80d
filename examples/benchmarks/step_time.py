"""Steady-state time of a Transformer training step, by how its layers are looped.

The variants of `compile_time.py` (unrolled linen_ext loop, `nn.Stacked`,
`nn.scan_layers`, `nn.scan`, `flax.linen.scan`, hand-written `lax.scan` over
stacked parameters and over per-layer parameters stacked on every call), all
on the same parameters converted between layouts. Each jitted
`value_and_grad(loss)` is compiled and checked against the hand-written one
(loss and gradients), then the variants take turns: every round times one
step of each, in a rotating order, so that load from other processes hits
them alike. Prints the median step time, its ratio to `lax.scan`, and the
kernel time and minor page faults of a step (XLA:CPU allocates a step's
temporary buffers afresh each time, so every temporary byte is faulted in).

    python examples/benchmarks/step_time.py                     # depth 16, 7 rounds
    python examples/benchmarks/step_time.py --depths 16 64 --rounds 5
    python examples/benchmarks/step_time.py --dtype bfloat16
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import NamedTuple

import jax
import numpy as np
from _transformer import Config, init_params, variants

import linen_ext as nn


def max_grad_difference(grads, reference, name: str) -> float:
  """Largest absolute difference to the hand-written gradients, in their stacked layout."""
  if name in ("unrolled", "scan_layers", "stack+lax.scan"):
    grads = nn.layers_to_stacked(grads)
  elif name != "lax.scan":
    grads = {"params": grads["params"]["layers"]}
  diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), grads, reference)
  return max(jax.tree.leaves(diffs))


def compiled_steps(depth: int, names: list[str], cfg: Config, dtype=np.float32):
  """For each variant: the compiled step and its parameters (in ``dtype``); checks values
  against lax.scan."""
  stacked = jax.tree.map(lambda a: a.astype(dtype), init_params(jax.random.key(0), depth, cfg))
  x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.seq, cfg.d_model), dtype)
  steps, reference = {}, None
  for name in ["lax.scan"] + [n for n in names if n != "lax.scan"]:
    variant = variants(depth, cfg)[name]
    params = variant.params(stacked)
    step = jax.jit(jax.value_and_grad(variant.loss)).trace(params, x).lower().compile()
    loss, grads = step(params, x)
    if reference is None:
      reference = (loss, grads)
    difference = max_grad_difference(grads, reference[1], name)
    print(f"  {name:<16} loss {float(loss):.6f} (lax.scan {float(reference[0]):.6f}), "
          f"max |grad - lax.scan grad| {difference:.1e}", flush=True)
    steps[name] = (step, params)
  return steps, x


class StepCost(NamedTuple):
  seconds: float  # wall clock
  system: float  # kernel CPU time of the process (page faults, mostly)
  page_faults: int  # minor page faults: fresh memory touched for the first time


def time_rounds(steps: dict, x, rounds: int) -> dict[str, list[StepCost]]:
  names = list(steps)
  costs: dict[str, list[StepCost]] = {name: [] for name in names}
  for name in names:  # one untimed run each
    jax.block_until_ready(steps[name][0](steps[name][1], x))
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      step, params = steps[name]
      before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
      jax.block_until_ready(step(params, x))
      seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
      costs[name].append(StepCost(seconds, after.ru_stime - before.ru_stime,
                                  after.ru_minflt - before.ru_minflt))
  return costs


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depths", type=int, nargs="+", default=[16])
  parser.add_argument("--variants", nargs="+", default=None,
                      help="subset of: " + ", ".join(variants(1, Config())))
  parser.add_argument("--rounds", type=int, default=7, help="timed steps per variant")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                      help="dtype of the parameters and activations")
  args = parser.parse_args()
  cfg = Config()
  names = args.variants or list(variants(1, cfg))
  print(f"{cfg}, {args.dtype}, backend {jax.default_backend()}, jax {jax.__version__}, "
        f"median of {args.rounds} interleaved steps")
  for depth in args.depths:
    print(f"depth {depth}: compiling and checking")
    steps, x = compiled_steps(depth, names, cfg, jax.numpy.dtype(args.dtype))
    costs = time_rounds({n: steps[n] for n in names if n in steps}, x, args.rounds)
    median = lambda name, field: statistics.median(getattr(c, field) for c in costs[name])
    reference = median("lax.scan", "seconds") if "lax.scan" in costs else None
    print(f"{'variant':<16} {'depth':>5} {'median s':>9} {'min s':>7} {'/ lax.scan':>10} "
          f"{'system s':>9} {'faults':>8}")
    for name in costs:
      med = median(name, "seconds")
      ratio = f"{med / reference:>10.3f}" if reference else " " * 10
      print(f"{name:<16} {depth:>5} {med:>9.3f} {min(c.seconds for c in costs[name]):>7.3f} "
            f"{ratio} {median(name, 'system'):>9.3f} {median(name, 'page_faults'):>8.0f}",
            flush=True)


if __name__ == "__main__":
  main()
