"""Memory and time of each loop checkpoint policy on a stack of pre-LN Transformer blocks.

The blocks are plain JAX over a stacked params dict (every leaf has a leading
layer axis), run by `lift.loops.scan`. For each policy and depth the script
reports the compiled temporary memory of the `value_and_grad` training step
(`memory_analysis().temp_size_in_bytes`) and its median wall time, prints a
table and writes a plot.

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

from lift import loops


class Config(NamedTuple):
  d_model: int = 256
  heads: int = 4
  mlp: int = 1024
  seq: int = 128
  batch: int = 8


POLICIES = {
    "no remat": False,
    "remat=True": True,
    "save attn": loops.ScanCheckpointPolicy(save_block_internals=["attn"]),
    "nested": "nested",
}


def init_params(key: jax.Array, depth: int, cfg: Config) -> dict[str, jax.Array]:
  """Stacked parameters of `depth` blocks: every leaf has shape (depth, ...)."""
  keys = jax.random.split(key, 4)
  normal = lambda k, shape, fan_in: jax.random.normal(k, (depth,) + shape) / fan_in ** 0.5
  d = cfg.d_model
  return {
      "ln1": jnp.ones((depth, d)), "ln2": jnp.ones((depth, d)),
      "qkv": normal(keys[0], (d, 3 * d), d), "out": normal(keys[1], (d, d), d),
      "up": normal(keys[2], (d, cfg.mlp), d), "down": normal(keys[3], (cfg.mlp, d), cfg.mlp),
  }


def layer_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.var(x, axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + 1e-6) * scale


def attention(params: dict[str, jax.Array], x: jax.Array, heads: int) -> jax.Array:
  batch, seq, d = x.shape
  q, k, v = jnp.split(x @ params["qkv"], 3, axis=-1)
  split = lambda t: t.reshape(batch, seq, heads, d // heads)
  logits = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / (d // heads) ** 0.5
  causal = jnp.tril(jnp.ones((seq, seq), bool))
  weights = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
  mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, split(v)).reshape(batch, seq, d)
  return mixed @ params["out"]


def block(x: jax.Array, params: dict[str, jax.Array], heads: int) -> jax.Array:
  """One pre-LN Transformer block; its attention output is named 'attn'."""
  attn = loops.checkpoint_name(attention(params, layer_norm(x, params["ln1"]), heads), "attn")
  x = x + attn
  hidden = jax.nn.gelu(layer_norm(x, params["ln2"]) @ params["up"])
  return x + hidden @ params["down"]


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
