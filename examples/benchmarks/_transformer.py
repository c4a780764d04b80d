"""The pre-LN Transformer block shared by the benchmarks, in plain JAX and as modules.

`block(x, params, heads)` is the computation; `init_params` makes stacked
parameters for a hand-written `lax.scan`. `Block` (linen_ext) and `FlaxBlock`
(flax.linen) declare the same parameters with `self.param` and call `block`,
so every variant of a benchmark runs the same arithmetic and differs only in
how the layers are looped.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as flax_nn
import jax
import jax.numpy as jnp

import linen_ext as nn
from lift import loops


class Config(NamedTuple):
  d_model: int = 256
  heads: int = 4
  mlp: int = 1024
  seq: int = 128
  batch: int = 8


def param_specs(cfg: Config) -> dict[str, tuple[tuple[int, ...], Callable[..., Any]]]:
  """``{name: (shape, initializer)}`` of one block."""
  d, normal = cfg.d_model, jax.nn.initializers.lecun_normal()
  return {
      "ln1": ((d,), jax.nn.initializers.ones), "ln2": ((d,), jax.nn.initializers.ones),
      "qkv": ((d, 3 * d), normal), "out": ((d, d), normal),
      "up": ((d, cfg.mlp), normal), "down": ((cfg.mlp, d), normal),
  }


def init_params(key: jax.Array, depth: int, cfg: Config) -> dict[str, jax.Array]:
  """Stacked parameters of `depth` blocks: every leaf has shape (depth, ...)."""
  specs = param_specs(cfg)
  keys = dict(zip(specs, jax.random.split(key, len(specs))))
  return {name: jax.vmap(lambda k, s=shape, f=init: f(k, s))(jax.random.split(keys[name], depth))
          for name, (shape, init) in specs.items()}


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


class Block(nn.Module):
  """`block` as a linen_ext module (parameters declared with `self.param`)."""
  cfg: Config = Config()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    params = {name: self.param(name, init, shape)
              for name, (shape, init) in param_specs(self.cfg).items()}
    return block(x, params, self.cfg.heads)


class FlaxBlock(flax_nn.Module):
  """`block` as a flax.linen module."""
  cfg: Config = Config()

  @flax_nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    params = {name: self.param(name, init, shape)
              for name, (shape, init) in param_specs(self.cfg).items()}
    return block(x, params, self.cfg.heads)


def mean_square(y: jax.Array) -> jax.Array:
  return jnp.mean(y ** 2)


# -- the layer loops compared by compile_time.py and step_time.py ----------------------------


class Unrolled(nn.Module):
  """A Python loop over `depth` blocks at ``layers_0``, ``layers_1``, ..."""
  cfg: Config
  depth: int

  def setup(self):
    self.layers = [Block(self.cfg) for _ in range(self.depth)]

  def __call__(self, x: jax.Array) -> jax.Array:
    for layer in self.layers:
      x = layer(x)
    return x


class ScanLayers(Unrolled):
  """The same blocks and variables as `Unrolled`, run by `nn.scan_layers`."""

  def __call__(self, x: jax.Array) -> jax.Array:
    return nn.scan_layers(self.layers, x)


class StackedModel(nn.Module):
  """`nn.Stacked`: one block with stacked parameters at ``layers``."""
  cfg: Config
  depth: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    return nn.Stacked(Block, self.depth, block_kwargs={"cfg": self.cfg}, name="layers")(x)


class _ScanStep(nn.Module):
  cfg: Config

  @nn.compact
  def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
    params = {name: self.param(name, init, shape)
              for name, (shape, init) in param_specs(self.cfg).items()}
    return block(x, params, self.cfg.heads), None


class LiftScan(nn.Module):
  """`nn.scan` (the lifted `lift.scan`) of a block step, parameters at ``layers``."""
  cfg: Config
  depth: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    stack = nn.scan(_ScanStep, variable_axes={"params": 0}, split_rngs={"params": True},
                    length=self.depth)
    return stack(self.cfg, name="layers")(x, None)[0]


class _FlaxScanStep(flax_nn.Module):
  cfg: Config

  @flax_nn.compact
  def __call__(self, x: jax.Array, _: Any) -> tuple[jax.Array, None]:
    params = {name: self.param(name, init, shape)
              for name, (shape, init) in param_specs(self.cfg).items()}
    return block(x, params, self.cfg.heads), None


class FlaxScan(flax_nn.Module):
  """`flax.linen.scan` of the same step, parameters at ``layers``."""
  cfg: Config
  depth: int

  @flax_nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    stack = flax_nn.scan(_FlaxScanStep, variable_axes={"params": 0},
                         split_rngs={"params": True}, length=self.depth)
    return stack(self.cfg, name="layers")(x, None)[0]


def hand_written(params: dict[str, Any], x: jax.Array, heads: int) -> jax.Array:
  """`lax.scan` over the stacked parameters, no module system."""
  return jax.lax.scan(lambda h, p: (block(h, p, heads), None), x, params["params"])[0]


def hand_written_per_layer(params: dict[str, Any], x: jax.Array, heads: int) -> jax.Array:
  """`hand_written` on per-layer parameters (``layers_0``, ...), stacked on every call."""
  layers = params["params"]
  trees = [layers[f"layers_{i}"] for i in range(len(layers))]
  return hand_written({"params": jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)},
                      x, heads)


class Variant(NamedTuple):
  """One way to loop the layers: its loss, and its parameters from the stacked ones."""
  loss: Callable[[Any, jax.Array], jax.Array]
  params: Callable[[dict[str, jax.Array]], Any]


def _per_layer(stacked: dict[str, jax.Array]) -> dict[str, Any]:
  return nn.stacked_to_layers({"params": stacked})


def _at_layers(stacked: dict[str, jax.Array]) -> dict[str, Any]:
  return {"params": {"layers": stacked}}


def _module_loss(model: Any) -> Callable[[Any, jax.Array], jax.Array]:
  return lambda params, x: mean_square(model.apply(params, x))


def variants(depth: int, cfg: Config) -> dict[str, Variant]:
  """The compared loops at `depth`, all over the same parameters."""
  return {
      "unrolled": Variant(_module_loss(Unrolled(cfg, depth)), _per_layer),
      "Stacked": Variant(_module_loss(StackedModel(cfg, depth)), _at_layers),
      "scan_layers": Variant(_module_loss(ScanLayers(cfg, depth)), _per_layer),
      "nn.scan": Variant(_module_loss(LiftScan(cfg, depth)), _at_layers),
      "flax.linen.scan": Variant(_module_loss(FlaxScan(cfg, depth)), _at_layers),
      "lax.scan": Variant(lambda p, x: mean_square(hand_written(p, x, cfg.heads)),
                          lambda stacked: {"params": stacked}),
      "stack+lax.scan": Variant(
          lambda p, x: mean_square(hand_written_per_layer(p, x, cfg.heads)), _per_layer),
  }
