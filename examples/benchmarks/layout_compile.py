"""What the per-layer parameter layout costs to compile, apart from any model.

Each program takes the six parameters of `_transformer.py`'s block for
`depth` layers, multiplies them by 2 and returns them, in one of these
layouts:

- `stacked`: six stacked arrays in and out;
- `per-layer`: the 6 x depth per-layer arrays in and out;
- `stack_rows`: per-layer in, stacked by `lift.loops.stack_rows`, six out;
- `unstack_rows`: six in, split by `lift.loops.unstack_rows` into per-layer out;
- `split, starts as args`: the same split by dynamic slices whose row starts
  are jit arguments (nothing for XLA to fold: the floor for any split).

Prints the fastest trace + compile of each (variants take turns, each a fresh
jit, so nothing is cached).

    python examples/benchmarks/layout_compile.py --depth 64 --repeats 5
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
from _transformer import Config, param_specs
from jax import lax

from lift.loops import stack_rows, unstack_rows


def programs(depth: int, cfg: Config) -> dict:
  """``{name: (fn, abstract args)}``."""
  shapes = {name: shape for name, (shape, _) in param_specs(cfg).items()}
  layer = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in shapes.items()}
  stacked = {name: jax.ShapeDtypeStruct((depth,) + shape, jnp.float32)
             for name, shape in shapes.items()}
  starts = [jax.ShapeDtypeStruct((), jnp.int32)] * depth
  double = lambda tree: jax.tree.map(lambda a: a * 2, tree)

  def split_at(tree, starts):
    return [jax.tree.map(lambda a, i=i: lax.dynamic_index_in_dim(a, i, keepdims=False), tree)
            for i in starts]

  return {
      "stacked": (double, (stacked,)),
      "per-layer": (double, ([layer] * depth,)),
      "stack_rows": (lambda rows: double(stack_rows(rows)), ([layer] * depth,)),
      "unstack_rows": (lambda tree: unstack_rows(double(tree)), (stacked,)),
      "split, starts as args": (lambda tree, s: split_at(double(tree), s), (stacked, starts)),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depth", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  progs = programs(args.depth, Config())
  best = {name: float("inf") for name in progs}
  for _ in range(args.repeats):
    for name, (fn, abstract) in progs.items():
      start = time.perf_counter()
      jax.jit(lambda *a, fn=fn: fn(*a)).trace(*abstract).lower().compile()
      best[name] = min(best[name], time.perf_counter() - start)
  print(f"depth {args.depth}, backend {jax.default_backend()}, fastest of {args.repeats}")
  for name, seconds in best.items():
    print(f"{name:<24} {seconds:6.3f} s")


if __name__ == "__main__":
  main()
