"""Greedy decoding speed: the step derived by `as_scan` against two baselines.

A small causal Transformer in plain JAX over a params dict (token and position
embeddings; per block causal self-attention, a causal depthwise convolution
and an MLP, blocks stacked and run by `lax.scan`) generates 256 tokens three
ways, each one jitted `lax.scan` over the steps:

  (a) as_scan   the step `lift.causal.as_scan` derives from the full forward;
  (b) recompute the full forward over the whole token buffer at every step;
  (c) KV cache  a hand-written decoder with KV and convolution caches.

A second model is written as a Flax user writes it: blocks with `SelfAttention`
and `mask=make_causal_mask(tokens)`, nothing about decoding but Flax's own
`decode=True` switch, once with `flax.linen` and once with `linen_ext` (the same
code and variables). It generates three ways:

  (d) as_scan   the step `nn.as_scan` derives from the linen_ext model's
                training-mode `apply` (the cache comes from the causal mask,
                no annotation);
  (e) Flax decode=True, the layer's own cache path, one token per `apply`;
  (f) recompute its full forward at every step.

    python examples/benchmarks/decode.py           # prints a table and ratios
    python examples/benchmarks/decode.py --repeats 10
    python examples/benchmarks/decode.py --tiny    # a quick check that it runs
"""
from __future__ import annotations

import argparse
import functools
import time
from typing import NamedTuple
from collections.abc import Callable

import flax.linen as flax_nn
import jax
from jax import lax
import jax.numpy as jnp

import linen_ext as nn
from lift.causal import as_scan, causal_self_attention


class Config(NamedTuple):
  vocab: int = 256
  d_model: int = 128
  heads: int = 4
  mlp: int = 512
  depth: int = 2
  kernel: int = 4
  steps: int = 256


def init_params(key: jax.Array, cfg: Config) -> dict:
  """Embeddings and stacked block parameters (leading axis: depth)."""
  keys = jax.random.split(key, 7)
  d, n = cfg.d_model, cfg.depth

  def normal(k, shape, fan_in):
    return jax.random.normal(k, shape) / fan_in ** 0.5

  return {
      "embed": normal(keys[0], (cfg.vocab, d), 1.0),
      "pos": normal(keys[1], (cfg.steps, d), 1.0) * 0.1,
      "final_norm": jnp.ones((d,)),
      "blocks": {
          "norm1": jnp.ones((n, d)), "norm2": jnp.ones((n, d)),
          "norm3": jnp.ones((n, d)),
          "qkv": normal(keys[2], (n, d, 3 * d), d),
          "out": normal(keys[3], (n, d, d), d),
          "conv": normal(keys[4], (n, cfg.kernel, 1, d), cfg.kernel),
          "up": normal(keys[5], (n, d, cfg.mlp), d),
          "down": normal(keys[6], (n, cfg.mlp, d), cfg.mlp),
      },
  }


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
  return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def block(cfg: Config, x: jax.Array, p: dict) -> jax.Array:
  """One block on a whole sequence `x` of shape [T, d_model]."""
  length, head_dim = x.shape[0], cfg.d_model // cfg.heads
  qkv = (rms_norm(x, p["norm1"]) @ p["qkv"]).reshape(
      length, 3, cfg.heads, head_dim)
  q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
  x = x + causal_self_attention(q, k, v).reshape(length, -1) @ p["out"]
  h = rms_norm(x, p["norm2"])
  x = x + lax.conv_general_dilated(
      h[None], p["conv"], (1,), [(cfg.kernel - 1, 0)],
      dimension_numbers=("NWC", "WIO", "NWC"),
      feature_group_count=cfg.d_model)[0]
  return x + jax.nn.gelu(rms_norm(x, p["norm3"]) @ p["up"]) @ p["down"]


def forward(cfg: Config, params: dict, tokens: jax.Array) -> jax.Array:
  """Logits [T, vocab] for tokens [T]; causal along T."""
  x = params["embed"][tokens] + params["pos"][:tokens.shape[0]]
  x, _ = lax.scan(lambda h, p: (block(cfg, h, p), None), x, params["blocks"])
  return rms_norm(x, params["final_norm"]) @ params["embed"].T


def greedy(step: Callable, state, first: jax.Array, steps: int) -> jax.Array:
  """Feeds each argmax back: `step(state, token, t) -> (state, logits)`."""

  def body(carry, t):
    state, token = carry
    state, logits = step(state, token, t)
    token = jnp.argmax(logits).astype(jnp.int32)
    return (state, token), token

  return lax.scan(body, (state, first), jnp.arange(steps))[1]


@functools.partial(jax.jit, static_argnums=0)
def generate_as_scan(cfg: Config, params: dict, first: jax.Array):
  example = jax.ShapeDtypeStruct((cfg.steps,), jnp.int32)
  f, carry = as_scan(functools.partial(forward, cfg, params), example)
  return greedy(lambda c, token, t: f(c, token), carry, first, cfg.steps)


@functools.partial(jax.jit, static_argnums=0)
def generate_recompute(cfg: Config, params: dict, first: jax.Array):
  def step(tokens, token, t):
    tokens = tokens.at[t].set(token)
    return tokens, forward(cfg, params, tokens)[t]

  tokens = jnp.zeros((cfg.steps,), jnp.int32)
  return greedy(step, tokens, first, cfg.steps)


class Cache(NamedTuple):
  keys: jax.Array  # [depth, steps, heads, head_dim]
  values: jax.Array
  conv: jax.Array  # [depth, kernel - 1, d_model]: the last inputs


def cached_block(cfg: Config, t: jax.Array, x: jax.Array, p_and_cache):
  """One block on one position `x` [d_model], updating its caches."""
  p, (keys, values, conv) = p_and_cache
  head_dim = cfg.d_model // cfg.heads
  qkv = (rms_norm(x, p["norm1"]) @ p["qkv"]).reshape(3, cfg.heads, head_dim)
  keys = lax.dynamic_update_index_in_dim(keys, qkv[1], t, 0)
  values = lax.dynamic_update_index_in_dim(values, qkv[2], t, 0)
  logits = jnp.einsum("hd,khd->hk", qkv[0] / jnp.sqrt(jnp.float32(head_dim)),
                      keys)
  visible = jnp.arange(cfg.steps) <= t
  weights = jax.nn.softmax(jnp.where(visible, logits, -1e30))
  attended = jnp.einsum("hk,khd->hd", weights, values)
  x = x + attended.reshape(-1) @ p["out"]
  window = jnp.concatenate([conv, rms_norm(x, p["norm2"])[None]])
  x = x + jnp.sum(window * p["conv"][:, 0, :], axis=0)
  x = x + jax.nn.gelu(rms_norm(x, p["norm3"]) @ p["up"]) @ p["down"]
  return x, (keys, values, window[1:])


@functools.partial(jax.jit, static_argnums=0)
def generate_kv_cache(cfg: Config, params: dict, first: jax.Array):
  def step(cache, token, t):
    x = params["embed"][token] + params["pos"][t]
    x, cache = lax.scan(functools.partial(cached_block, cfg, t), x,
                        (params["blocks"], cache))
    return Cache(*cache), rms_norm(x, params["final_norm"]) @ params[
        "embed"].T

  head_dim, d = cfg.d_model // cfg.heads, cfg.depth
  kv = jnp.zeros((d, cfg.steps, cfg.heads, head_dim))
  cache = Cache(kv, kv, jnp.zeros((d, cfg.kernel - 1, cfg.d_model)))
  return greedy(step, cache, first, cfg.steps)


def lm_class(lib) -> type:
  """The LM as a `lib` user writes it (`lib` is flax.linen or linen_ext): tokens [batch, T]
  -> logits [batch, T, vocab]; with `decode`, T is 1 and positions and attention come
  from the 'cache' collection."""
  class Block(lib.Module):
    cfg: Config
    decode: bool

    @lib.compact
    def __call__(self, x, mask):
      attention = lib.SelfAttention(num_heads=self.cfg.heads, decode=self.decode,
                                    deterministic=True)
      x = x + attention(lib.RMSNorm()(x), mask=mask)
      h = lib.gelu(lib.Dense(self.cfg.mlp)(lib.RMSNorm()(x)))
      return x + lib.Dense(self.cfg.d_model)(h)

  class LM(lib.Module):
    cfg: Config
    decode: bool = False

    @lib.compact
    def __call__(self, tokens):
      cfg = self.cfg
      embed = lib.Embed(cfg.vocab, cfg.d_model)
      positions = self.param("pos", lib.initializers.normal(0.1), (cfg.steps, cfg.d_model))
      if self.decode:
        ready = self.has_variable("cache", "position")
        index = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
        position = lax.dynamic_slice_in_dim(positions, index.value, tokens.shape[1])
        if ready:
          index.value = index.value + 1
        x, mask = embed(tokens) + position[None], None
      else:
        x = embed(tokens) + positions[None, :tokens.shape[1]]
        mask = lib.make_causal_mask(tokens)
      for _ in range(cfg.depth):
        x = Block(cfg, self.decode)(x, mask)
      return embed.attend(lib.RMSNorm()(x))
  return LM


FlaxLM, OurLM = lm_class(flax_nn), lm_class(nn)


@functools.partial(jax.jit, static_argnums=0)
def generate_nn_as_scan(cfg: Config, variables: dict, first: jax.Array):
  """The same LM written with `linen_ext` (same variables), decoded by `nn.as_scan`."""
  example = jax.ShapeDtypeStruct((1, cfg.steps), jnp.int32)
  f, carry = nn.as_scan(OurLM(cfg), variables, example, time_axis=1)

  def step(carry, token, t):
    carry, logits = f(carry, token[None])
    return carry, logits[0]
  return greedy(step, carry, first, cfg.steps)


@functools.partial(jax.jit, static_argnums=0)
def generate_flax_decode(cfg: Config, variables: dict, first: jax.Array):
  model = FlaxLM(cfg, decode=True)
  cache = model.init(jax.random.PRNGKey(0), jnp.zeros((1, cfg.steps), jnp.int32))["cache"]

  def step(cache, token, t):
    logits, changed = model.apply({"params": variables["params"], "cache": cache},
                                  token.reshape(1, 1), mutable=["cache"])
    return changed["cache"], logits[0, 0]

  return greedy(step, cache, first, cfg.steps)


@functools.partial(jax.jit, static_argnums=0)
def generate_flax_recompute(cfg: Config, variables: dict, first: jax.Array):
  model = FlaxLM(cfg)

  def step(tokens, token, t):
    tokens = tokens.at[t].set(token)
    return tokens, model.apply(variables, tokens[None])[0, t]

  return greedy(step, jnp.zeros((cfg.steps,), jnp.int32), first, cfg.steps)


def best_seconds(fns: dict[str, Callable], repeats: int) -> dict[str, float]:
  """Best wall time of each function over `repeats` rounds, after a compiling
  run; rounds interleave the functions so load changes hit all alike."""
  for fn in fns.values():
    jax.block_until_ready(fn())
  best = dict.fromkeys(fns, float("inf"))
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      best[name] = min(best[name], time.perf_counter() - start)
  return best


def report(title: str, steps: int, times: dict, tokens: dict) -> None:
  """A table of tokens/s, and whether every method gave the first's tokens."""
  print(title)
  print(f"{'method':28s} {'tokens/s':>10s} {'ms':>9s}")
  for name, secs in times.items():
    print(f"{name:28s} {steps / secs:10.0f} {1e3 * secs:9.2f}")
  first = next(iter(tokens.values()))
  same = {name: bool(jnp.all(t == first)) for name, t in tokens.items()}
  print(f"same greedy tokens as {next(iter(tokens))}: {same}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--tiny", action="store_true",
                      help="tiny sizes and one round: checks that it runs")
  args = parser.parse_args()
  cfg = Config()
  if args.tiny:
    cfg = Config(vocab=32, d_model=16, heads=2, mlp=32, depth=2, kernel=3, steps=8)
    args.repeats = 1
  params = init_params(jax.random.PRNGKey(0), cfg)
  flax_variables = FlaxLM(cfg).init(jax.random.PRNGKey(0),
                                    jnp.zeros((1, cfg.steps), jnp.int32))
  first = jnp.int32(1)
  runs = {
      "(a) as_scan step": functools.partial(generate_as_scan, cfg, params, first),
      "(b) recompute prefix": functools.partial(generate_recompute, cfg, params, first),
      "(c) hand-written KV cache": functools.partial(generate_kv_cache, cfg, params, first),
      "(d) LM, nn.as_scan step": functools.partial(
          generate_nn_as_scan, cfg, flax_variables, first),
      "(e) Flax LM, decode=True": functools.partial(
          generate_flax_decode, cfg, flax_variables, first),
      "(f) Flax LM, recompute": functools.partial(
          generate_flax_recompute, cfg, flax_variables, first),
  }
  tokens = {name: run() for name, run in runs.items()}
  times = best_seconds(runs, args.repeats)
  names = list(runs)
  print(f"{cfg.steps} tokens, d_model {cfg.d_model}, depth {cfg.depth}, "
        f"{jax.devices()[0].platform}")
  report("JAX model, causal_self_attention:", cfg.steps,
         {n: times[n] for n in names[:3]}, {n: tokens[n] for n in names[:3]})
  a, b, c = (times[n] for n in names[:3])
  print(f"(a) is {b / a:.1f}x faster than (b); (a) takes {a / c:.2f}x the "
        f"time of (c)")
  report("Flax LM, SelfAttention + make_causal_mask:", cfg.steps,
         {n: times[n] for n in names[3:]}, {n: tokens[n] for n in names[3:]})
  d, e, f = (times[n] for n in names[3:])
  print(f"(d) is {f / d:.1f}x faster than (f); (d) has {e / d:.2f}x the "
        f"tokens/s of (e)")


if __name__ == "__main__":
  main()
