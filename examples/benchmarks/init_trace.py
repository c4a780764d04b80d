"""Trace time of `init` (and `apply`) of a GPT-2-like model ported by the import swap.

The model is written once, as Hugging Face's Flax GPT-2 is (``setup`` methods, blocks
in a list made in ``setup``, a ``Conv1D`` written with ``self.param``, `LayerNorm`,
`Embed`, `Dropout`, a causal mask made in each attention's ``setup``,
`dot_product_attention_weights`, and the tied output head run by the head's own
``apply`` on the embedding), and run by `linen_ext` and by `flax.linen`. Each is traced with `jax.make_jaxpr` (nothing
runs); the two take turns, and the table shows medians and ours over Flax's.

    python examples/benchmarks/init_trace.py                  # 12 layers, d 768, 7 repeats
    python examples/benchmarks/init_trace.py --layers 2 --d-model 64 --repeats 1
"""
from __future__ import annotations

import argparse
import statistics
from typing import Any

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
from trace_time import trace_seconds

import linen_ext as nn

LIBRARIES = {"linen_ext": nn, "flax.linen": flax_nn}


def gpt2(lib: Any, layers: int, d: int, heads: int, vocab: int = 50257,
         positions: int = 1024) -> Any:
  """GPT-2's LM-head model as Hugging Face writes it for Flax, against ``lib``."""
  normal = jax.nn.initializers.normal(0.02)

  class Conv1D(lib.Module):  # GPT-2's transposed Dense, written with `self.param`
    features: int

    @lib.compact
    def __call__(self, x):
      kernel = self.param("kernel", normal, (self.features, x.shape[-1]))
      y = jax.lax.dot_general(x, kernel.T, (((x.ndim - 1,), (0,)), ((), ())))
      return y + self.param("bias", jax.nn.initializers.zeros, (self.features,))

  class Attention(lib.Module):
    def setup(self):
      self.c_attn, self.c_proj = Conv1D(3 * d), Conv1D(d)
      self.resid_dropout = lib.Dropout(0.1)
      self.causal_mask = lib.make_causal_mask(jnp.ones((1, positions), dtype="bool"),
                                              dtype="bool")

    def __call__(self, h, attention_mask, deterministic=True):
      split = lambda t: t.reshape(t.shape[:2] + (heads, d // heads))
      q, k, v = (split(t) for t in jnp.split(self.c_attn(h), 3, axis=2))
      length = q.shape[1]
      causal = self.causal_mask[:, :, :length, :length]
      causal = jnp.broadcast_to(causal, (h.shape[0],) + causal.shape[1:])
      mask = lib.combine_masks(jnp.expand_dims(attention_mask, axis=(-3, -2)), causal)
      bias = jax.lax.select(mask > 0, jnp.full(mask.shape, 0.0), jnp.full(mask.shape, -1e4))
      weights = lib.dot_product_attention_weights(q, k, bias=bias, dropout_rate=0.1,
                                                  deterministic=deterministic)
      out = jnp.einsum("...hqk,...khd->...qhd", weights, v)
      out = self.c_proj(out.reshape(out.shape[:2] + (d,)))
      return self.resid_dropout(out, deterministic=deterministic)

  class MLP(lib.Module):
    def setup(self):
      self.c_fc, self.c_proj = Conv1D(4 * d), Conv1D(d)
      self.dropout = lib.Dropout(0.1)

    def __call__(self, h, deterministic=True):
      h = self.c_proj(jax.nn.gelu(self.c_fc(h), approximate=True))
      return self.dropout(h, deterministic=deterministic)

  class Block(lib.Module):
    def setup(self):
      self.ln_1, self.ln_2 = lib.LayerNorm(epsilon=1e-5), lib.LayerNorm(epsilon=1e-5)
      self.attn, self.mlp = Attention(), MLP()

    def __call__(self, h, attention_mask, deterministic=True):
      h = h + self.attn(self.ln_1(h), attention_mask, deterministic)
      return h + self.mlp(self.ln_2(h), deterministic)

  class Model(lib.Module):
    def setup(self):
      self.wte = lib.Embed(vocab, d, embedding_init=normal)
      self.wpe = lib.Embed(positions, d, embedding_init=normal)
      self.dropout = lib.Dropout(0.1)
      self.h = [Block(name=str(i)) for i in range(layers)]
      self.ln_f = lib.LayerNorm(epsilon=1e-5)

    def __call__(self, ids, attention_mask, position_ids, deterministic=True):
      h = self.dropout(self.wte(ids) + self.wpe(position_ids), deterministic=deterministic)
      for block in self.h:
        h = block(h, attention_mask, deterministic)
      return self.ln_f(h)

  class LMHead(lib.Module):
    def setup(self):
      self.transformer = Model()
      self.lm_head = lib.Dense(vocab, use_bias=False, kernel_init=normal)

    def __call__(self, ids, attention_mask, position_ids, deterministic=True):
      h = self.transformer(ids, attention_mask, position_ids, deterministic)
      shared = self.transformer.variables["params"]["wte"]["embedding"].T  # tied weights
      return self.lm_head.apply({"params": {"kernel": shared}}, h)

  return LMHead()


def run(layers: int, d: int, heads: int, repeats: int, seq: int = 32) -> dict:
  """Median seconds per (pass, library); the libraries take turns."""
  inputs = (jnp.zeros((1, seq), jnp.int32), jnp.ones((1, seq), jnp.int32),
            jnp.arange(seq)[None])  # ids, attention mask, positions, as HF's init_weights
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
  models = {name: gpt2(lib, layers, d, heads) for name, lib in LIBRARIES.items()}
  variables = jax.eval_shape(models["flax.linen"].init, rngs, *inputs)
  samples: dict[tuple[str, str], list[float]] = {}
  for _ in range(repeats):
    for name, model in models.items():
      samples.setdefault(("init", name), []).append(
          trace_seconds(model.init, rngs, *inputs))
      samples.setdefault(("apply", name), []).append(
          trace_seconds(model.apply, variables, *inputs))
  return {key: statistics.median(times) for key, times in samples.items()}


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=12)
  parser.add_argument("--d-model", type=int, default=768)
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args(argv)
  print(f"GPT-2-like, {args.layers} layers, d {args.d_model}; jax {jax.__version__}, "
        f"{jax.default_backend()}; medians of {args.repeats}")
  results = run(args.layers, args.d_model, args.heads, args.repeats)
  print(f"{'pass':6s} {'linen_ext':>10s} {'flax.linen':>11s} {'ours / Flax':>12s}")
  for what in ("init", "apply"):
    ours, theirs = results[what, "linen_ext"], results[what, "flax.linen"]
    print(f"{what:6s} {ours * 1e3:7.0f} ms {theirs * 1e3:8.0f} ms {ours / theirs:11.2f}x")
  return results


if __name__ == "__main__":
  with jax.numpy_dtype_promotion("standard"):
    main()
