"""Memory of `nn.remat_scan` against Flax's and a hand-nested remat scan in plain JAX.

`lengths=(8, 8)` loops 64 pre-LN blocks (`_transformer.block`) as an outer scan of
8 steps, each an inner scan of 8 blocks. The script compiles the `value_and_grad`
training step of each variant and prints its temporary memory
(`memory_analysis().temp_size_in_bytes`) and the ratio to the hand-written
program, in one process:

- `nn.remat_scan`: this package's, every level rematerialized;
- `flax.linen.remat_scan`: Flax's, whose innermost level keeps every block's internals;
- hand-nested: `lax.scan(jax.checkpoint(outer step))` over
  `lax.scan(jax.checkpoint(block))`, on explicitly stacked parameters;
- `nn.Stacked(remat='nested')` and `nn.Stacked(remat=False)` for reference.

Compiling is the only cost (nothing runs), so the figures do not depend on load.

    python examples/benchmarks/remat_scan_memory.py                 # d_model 256, 8 x 8 blocks
    python examples/benchmarks/remat_scan_memory.py --lengths 4 4 --d-model 64
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import flax.linen as flax_nn
import jax
from _transformer import Block, Config, FlaxBlock, block, init_params, mean_square

import linen_ext as nn

MiB = 2 ** 20


def temp_bytes(loss: Callable[[Any, jax.Array], jax.Array], variables: Any, x: jax.Array) -> int:
  compiled = jax.jit(jax.value_and_grad(loss)).lower(variables, x).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def module_loss(model: Any) -> Callable[[Any, jax.Array], jax.Array]:
  return lambda variables, x: mean_square(model.apply(variables, x))


def hand_nested(lengths: tuple[int, int], cfg: Config) -> Callable[[Any, jax.Array], jax.Array]:
  """Two levels of `lax.scan`, each step under `jax.checkpoint`, on (outer, inner, ...) params."""
  inner_step = jax.checkpoint(lambda x, p: (block(x, p, cfg.heads), None))

  @jax.checkpoint
  def outer_step(x, params):
    return jax.lax.scan(inner_step, x, params)[0], None

  def loss(params, x):
    return mean_square(jax.lax.scan(outer_step, x, params)[0])
  return loss


def variants(lengths: tuple[int, int], cfg: Config, x: jax.Array) -> dict[str, tuple]:
  """``{name: (loss, variables)}``, every variant with its own initial variables."""
  depth, key = lengths[0] * lengths[1], jax.random.key(0)
  params = jax.tree.map(lambda p: p.reshape(lengths + p.shape[1:]), init_params(key, depth, cfg))
  ours = nn.remat_scan(Block, lengths=lengths)(cfg)
  theirs = flax_nn.remat_scan(FlaxBlock, lengths=lengths)(cfg)
  stacked = {remat: nn.Stacked(Block, depth, remat=remat, block_kwargs={"cfg": cfg})
             for remat in ("nested", False)}
  return {
      "hand-nested remat scan (JAX)": (hand_nested(lengths, cfg), params),
      "nn.remat_scan": (module_loss(ours), ours.init(key, x)),
      "flax.linen.remat_scan": (module_loss(theirs), theirs.init(key, x)),
      "nn.Stacked(remat='nested')": (module_loss(stacked["nested"]),
                                     stacked["nested"].init(key, x)),
      "nn.Stacked(remat=False)": (module_loss(stacked[False]), stacked[False].init(key, x)),
  }


def main(argv: list[str] | None = None) -> dict[str, int]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", type=int, nargs=2, default=(8, 8))
  parser.add_argument("--d-model", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--mlp", type=int, default=1024)
  parser.add_argument("--seq", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  args = parser.parse_args(argv)
  cfg = Config(args.d_model, args.heads, args.mlp, args.seq, args.batch)
  lengths = tuple(args.lengths)
  x = jax.random.normal(jax.random.key(1), (cfg.batch, cfg.seq, cfg.d_model))
  results = {name: temp_bytes(loss, variables, x)
             for name, (loss, variables) in variants(lengths, cfg, x).items()}
  base = results["hand-nested remat scan (JAX)"]
  print(f"value_and_grad temporaries, {lengths[0]} x {lengths[1]} blocks, d_model "
        f"{cfg.d_model}, seq {cfg.seq}, batch {cfg.batch} ({jax.devices()[0].platform})")
  for name, size in results.items():
    print(f"  {name:30s} {size / MiB:9.1f} MiB   {size / base:5.2f}x hand-nested")
  return results


if __name__ == "__main__":
  with jax.numpy_dtype_promotion("standard"):
    main()
