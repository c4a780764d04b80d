"""Trace time of a Transformer stack written with ready-made layers: linen_ext, flax.linen, JAX.

The pre-LN block (d_model 256, 4 heads, MLP 1024, seq 128, batch 8) is written
once with `LayerNorm` and `Dense` layers, as a user writes it, and run by
`linen_ext` and by `flax.linen`; the hand-written JAX program does the same
arithmetic on an explicit parameter dict. Each variant is traced with
`jax.make_jaxpr` on abstract variables (nothing runs): the forward pass and the
training step (`value_and_grad`), with the layers unrolled (a Python loop) and
scanned (`nn.scan` / `flax.linen.scan` / `lax.scan`). Variants take turns;
the table shows medians and the ratio to hand-written JAX, and a PNG the ratios.
Two more rows time compiling and running the scanned training step, so that a
faster trace is seen not to cost compile or step time.

    python examples/benchmarks/trace_time.py                       # depths 16 and 64
    python examples/benchmarks/trace_time.py --depths 4 --repeats 1 --out trace.png
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
from _transformer import Config

import linen_ext as nn

LIBRARIES = {"linen_ext": nn, "flax.linen": flax_nn}


def attention(q: jax.Array, k: jax.Array, v: jax.Array, heads: int) -> jax.Array:
  batch, seq, d = q.shape
  split = lambda t: t.reshape(batch, seq, heads, d // heads)
  logits = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / (d // heads) ** 0.5
  weights = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), logits, -1e9))
  return jnp.einsum("bhqk,bkhd->bqhd", weights, split(v)).reshape(batch, seq, d)


def block_class(lib: Any, cfg: Config) -> type:
  """The block as `lib` users write it: `LayerNorm` and `Dense` layers."""
  class Block(lib.Module):
    @lib.compact
    def __call__(self, x, _=None):
      q, k, v = jnp.split(lib.Dense(3 * cfg.d_model)(lib.LayerNorm()(x)), 3, axis=-1)
      x = x + lib.Dense(cfg.d_model)(attention(q, k, v, cfg.heads))
      hidden = jax.nn.gelu(lib.Dense(cfg.mlp)(lib.LayerNorm()(x)))
      return x + lib.Dense(cfg.d_model)(hidden), None
  return Block


def stack_class(lib: Any, cfg: Config, depth: int, scanned: bool) -> type:
  block = block_class(lib, cfg)

  class Stack(lib.Module):
    @lib.compact
    def __call__(self, x):
      if scanned:
        layers = lib.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                          length=depth)
        return layers(name="layers")(x, None)[0]
      for i in range(depth):
        x = block(name=f"layers_{i}")(x)[0]
      return x
  return Stack


def hand_block(x: jax.Array, p: dict[str, Any], heads: int) -> jax.Array:
  def norm(x, p):
    mean, var = jnp.mean(x, -1, keepdims=True), jnp.var(x, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-6) * p["scale"] + p["bias"]
  dense = lambda x, p: x @ p["kernel"] + p["bias"]
  q, k, v = jnp.split(dense(norm(x, p["LayerNorm_0"]), p["Dense_0"]), 3, axis=-1)
  x = x + dense(attention(q, k, v, heads), p["Dense_1"])
  hidden = jax.nn.gelu(dense(norm(x, p["LayerNorm_1"]), p["Dense_2"]))
  return x + dense(hidden, p["Dense_3"])


def hand_forward(cfg: Config, depth: int, scanned: bool) -> Callable[[Any, jax.Array], jax.Array]:
  def forward(variables, x):
    params = variables["params"]
    if scanned:
      return jax.lax.scan(lambda x, p: (hand_block(x, p, cfg.heads), None), x,
                          params["layers"])[0]
    for i in range(depth):
      x = hand_block(x, params[f"layers_{i}"], cfg.heads)
    return x
  return forward


def variants(cfg: Config, depth: int, scanned: bool, x: Any) -> dict[str, tuple]:
  """``{name: (forward(variables, x), abstract variables)}``; variables as Flax makes them."""
  out = {}
  for name, lib in LIBRARIES.items():
    model = stack_class(lib, cfg, depth, scanned)()
    out[name] = (model.apply, jax.eval_shape(model.init, jax.random.key(0), x))
  out["JAX"] = (hand_forward(cfg, depth, scanned), out["flax.linen"][1])
  return out


def trace_seconds(fn: Callable[..., Any], *args: Any) -> float:
  fresh = lambda *a: fn(*a)  # a new function each time: JAX caches traces by function
  start = time.perf_counter()
  jax.make_jaxpr(fresh)(*args)
  return time.perf_counter() - start


def training_step(forward: Callable[[Any, jax.Array], jax.Array]) -> Callable[..., Any]:
  return jax.value_and_grad(lambda variables, x: jnp.mean(forward(variables, x) ** 2))


def run(cfg: Config, depths: list[int], repeats: int) -> dict[tuple[str, int, str, str], float]:
  """Median seconds per (kind, depth, pass, variant); the variants take turns."""
  x = jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.d_model), jnp.float32)
  results = {}
  for depth in depths:
    for kind in ("unrolled", "scan"):
      found = variants(cfg, depth, kind == "scan", x)
      samples: dict[tuple[str, str], list[float]] = {}
      for _ in range(repeats):
        for name, (forward, variables) in found.items():
          for what, fn in (("forward", forward), ("train step", training_step(forward))):
            samples.setdefault((what, name), []).append(trace_seconds(fn, variables, x))
      for (what, name), times in samples.items():
        results[kind, depth, what, name] = statistics.median(times)
  return results


def report(results: dict[tuple[str, int, str, str], float]) -> None:
  print(f"{'loop':9s} {'depth':>5s} {'pass':11s} " +
        " ".join(f"{name:>22s}" for name in (*LIBRARIES, "JAX")))
  for (kind, depth, what, name), seconds in results.items():
    if name != "JAX":
      continue
    row = [results[kind, depth, what, n] for n in (*LIBRARIES, "JAX")]
    cells = " ".join(f"{t * 1e3:9.0f} ms ({t / seconds:4.2f}x)" for t in row)
    print(f"{kind:9s} {depth:5d} {what:11s} {cells}")


def compile_and_step(cfg: Config, depth: int, repeats: int) -> dict[str, tuple[float, float]]:
  """``{variant: (compile seconds, step seconds)}`` of the jitted scanned training step:
  a faster trace must not cost compile or run time. Medians; the variants take turns."""
  x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.seq, cfg.d_model))
  found = variants(cfg, depth, True, x)
  variables = jax.jit(stack_class(flax_nn, cfg, depth, True)().init)(jax.random.key(0), x)
  compiled, compile_s, step_s = {}, {}, {}
  for _ in range(repeats):
    for name, (forward, _) in found.items():
      start = time.perf_counter()
      compiled[name] = jax.jit(training_step(forward)).lower(variables, x).compile()
      compile_s.setdefault(name, []).append(time.perf_counter() - start)
  for _ in range(repeats + 2):
    for name, step in compiled.items():
      start = time.perf_counter()
      jax.block_until_ready(step(variables, x))
      step_s.setdefault(name, []).append(time.perf_counter() - start)
  return {name: (statistics.median(compile_s[name]), statistics.median(step_s[name][1:]))
          for name in found}


def report_compile_and_step(depth: int, found: dict[str, tuple[float, float]]) -> None:
  compile_base, step_base = found["JAX"]
  for what, i, base in (("compile", 0, compile_base), ("step", 1, step_base)):
    cells = " ".join(f"{found[n][i] * 1e3:9.0f} ms ({found[n][i] / base:4.2f}x)"
                     for n in (*LIBRARIES, "JAX"))
    print(f"{'scan':9s} {depth:5d} {what:11s} {cells}")


def plot(results: dict[tuple[str, int, str, str], float], out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = sorted({(k, d, w) for k, d, w, _ in results})
  fig, ax = plt.subplots(figsize=(10, 4))
  width = 0.4
  for i, name in enumerate(LIBRARIES):
    ratios = [results[(*row, name)] / results[(*row, "JAX")] for row in rows]
    ax.bar([r + i * width for r in range(len(rows))], ratios, width, label=name)
  ax.axhline(1.0, color="black", linewidth=0.8, label="hand-written JAX")
  ax.set_xticks([r + width / 2 for r in range(len(rows))],
                [f"{k}\ndepth {d}\n{w}" for k, d, w in rows], fontsize=7)
  ax.set_ylabel("trace time / hand-written JAX")
  ax.legend()
  fig.tight_layout()
  fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> dict[tuple[str, int, str, str], float]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depths", type=int, nargs="+", default=[16, 64])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--d-model", type=int, default=256)
  parser.add_argument("--out", default="trace_time.png")
  parser.add_argument("--compile-depth", type=int, default=16,
                      help="also time compiling and running the scanned step (0: skip)")
  args = parser.parse_args(argv)
  cfg = Config(d_model=args.d_model)
  results = run(cfg, args.depths, args.repeats)
  report(results)
  if args.compile_depth:
    report_compile_and_step(args.compile_depth,
                            compile_and_step(cfg, args.compile_depth, args.repeats))
  plot(results, args.out)
  return results


if __name__ == "__main__":
  with jax.numpy_dtype_promotion("standard"):
    main()
