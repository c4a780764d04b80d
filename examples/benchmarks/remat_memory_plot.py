"""Compiled temporary memory of an `nn.Stacked` training step, per `remat=` policy and depth.

The model is `nn.Stacked` over `_transformer.Block` (a pre-LN Transformer
block whose attention output is named 'attn'). For each policy and depth the
script compiles `jax.jit(jax.value_and_grad(loss))` on abstract parameters
and inputs (nothing runs, nothing is allocated) and reads
`compiled.memory_analysis().temp_size_in_bytes`, the scratch memory of the
step beyond its arguments and outputs. Memory analysis is deterministic, so
the figures do not depend on machine load. Prints a table and writes a PNG.

    python examples/benchmarks/remat_memory_plot.py                    # ~2 min on 2 cores
    python examples/benchmarks/remat_memory_plot.py --depths 4 8 --out remat_small.png
"""
from __future__ import annotations

import argparse
import warnings

import jax
import jax.numpy as jnp
from _transformer import Block, Config

import linen_ext as nn
from lift import loops

POLICIES = {
    "False": False,
    "True": True,
    "save_attn": loops.ScanCheckpointPolicy(save_block_internals=["attn"]),
    "save_all": "save_all",
    "offload": "offload",
    "nested": "nested",
}
LABELS = {
    "False": "remat=False",
    "True": "remat=True ('full')",
    "save_attn": "save_block_internals=['attn']",
    "save_all": "remat='save_all'",
    "offload": "remat='offload'",
    "nested": "remat='nested'",
}


def temp_mib(remat, depth: int, cfg: Config) -> float:
  """Compiled temp memory (MiB) of a `value_and_grad` step through `depth` blocks."""
  model = nn.Stacked(Block, depth, remat=remat, block_kwargs={"cfg": cfg})
  x = jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.d_model), jnp.float32)

  def loss(params, x):
    return jnp.mean(model.apply(params, x) ** 2)

  with warnings.catch_warnings():  # on CPU, offload keeps values on device and warns
    warnings.simplefilter("ignore", loops.OffloadFallbackWarning)
    params = jax.eval_shape(model.init, jax.random.key(0), x)
    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, x).compile()
  return compiled.memory_analysis().temp_size_in_bytes / 2 ** 20


def plot(results: dict[str, dict[int, float]], depths: list[int], cfg: Config,
         path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for name, by_depth in results.items():
    overlaid = name in ("save_all", "offload")  # on CPU they equal False and True
    ax.plot(depths, [by_depth[d] for d in depths], "x--" if overlaid else "o-",
            label=LABELS[name], markersize=8 if overlaid else 5)
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
  ax.set(xlabel="depth (blocks)", ylabel="compiled temp memory (MiB)", xticks=depths,
         xticklabels=[str(d) for d in depths],
         title=f"nn.Stacked grad step, d_model {cfg.d_model}, seq {cfg.seq}, batch {cfg.batch}, "
               f"{jax.default_backend()}")
  ax.title.set_fontsize(10)
  ax.legend(fontsize=8)
  ax.grid(True, which="major", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depths", type=int, nargs="+", default=[8, 16, 32, 64])
  parser.add_argument("--d-model", type=int, default=128)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--mlp", type=int, default=512)
  parser.add_argument("--seq", type=int, default=64)
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--policies", nargs="+", default=list(POLICIES),
                      choices=list(POLICIES), metavar="POLICY",
                      help="any of: " + ", ".join(POLICIES))
  parser.add_argument("--out", default="remat_memory.png", help="where to write the PNG")
  args = parser.parse_args()
  cfg = Config(d_model=args.d_model, heads=args.heads, mlp=args.mlp, seq=args.seq,
               batch=args.batch)
  print(f"{cfg}, backend {jax.default_backend()}, jax {jax.__version__}")
  print(f"{'remat=':<10}" + "".join(f"{f'depth {d}':>11}" for d in args.depths) + "  (MiB)")
  results = {}
  for name in args.policies:
    results[name] = {d: temp_mib(POLICIES[name], d, cfg) for d in args.depths}
    print(f"{name:<10}" + "".join(f"{results[name][d]:>11.1f}" for d in args.depths),
          flush=True)
  plot(results, args.depths, cfg, args.out)
  print(f"plot written to {args.out}")


if __name__ == "__main__":
  main()
