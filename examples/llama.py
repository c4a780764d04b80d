"""LLaMA-2 and Gemma decoders, written with `linen_ext` as the main job's model is.

The model family the at-scale script (examples/train_lm_at_scale.py) compiles for TPU
topologies: RMSNorm, rotary positions, grouped-query attention, a gated MLP (SwiGLU,
or GeGLU for Gemma), token embeddings untied from the output head (tied for Gemma),
an `nn.Stacked` of blocks (one compiled loop whatever the depth, ``remat=`` its
checkpoint policy) whose variables carry logical axis names, so the mesh's axis rules
shard them. Variables are float32; the computation runs in ``dtype``.

The same code trains on a CPU (``PRESETS['tiny']``) and decodes with the step
`nn.as_scan` derives (the attention's KV-cache rule), whichever attention kernel the
training step uses.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

import linen_ext as nn


@dataclasses.dataclass(frozen=True)
class Config:
  """The shapes of one model of the family."""
  vocab: int
  d_model: int
  depth: int
  heads: int
  kv_heads: int  # grouped-query attention: each key/value head serves heads // kv_heads
  head_dim: int
  mlp: int
  activation: str = 'silu'  # the gate's: SwiGLU ('silu') or GeGLU ('gelu')
  tie_embeddings: bool = False  # the output head reads the embedding table (Gemma)
  scale_embeddings: bool = False  # embeddings times sqrt(d_model) (Gemma)
  rope_base: float = 10000.0

  def parameters(self) -> int:
    """The parameter count."""
    attention = self.d_model * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
    block = attention + 3 * self.d_model * self.mlp + 2 * self.d_model
    head = 0 if self.tie_embeddings else self.vocab * self.d_model
    return self.depth * block + self.vocab * self.d_model + head + self.d_model


PRESETS: dict[str, Config] = {
    'llama2-7b': Config(32000, 4096, 32, 32, 32, 128, 11008),
    'llama2-13b': Config(32000, 5120, 40, 40, 40, 128, 13824),
    'llama2-70b': Config(32000, 8192, 80, 64, 8, 128, 28672),
    'gemma-7b': Config(256000, 3072, 28, 16, 16, 256, 24576, activation='gelu',
                       tie_embeddings=True, scale_embeddings=True),
    'tiny': Config(128, 64, 2, 4, 2, 16, 128),
}


def named(init, *names):
  """``init`` whose variables carry logical axis names."""
  return nn.with_logical_partitioning(init, names)


KERNEL = nn.initializers.lecun_normal()


def rotary(x: jax.Array, base: float) -> jax.Array:
  """Rotary position embedding of ``x`` ``[batch, length, heads, head_dim]``, the halves
  of each head rotated by position-dependent angles (computed in float32)."""
  length, half = x.shape[-3], x.shape[-1] // 2
  frequencies = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles = jnp.outer(jnp.arange(length, dtype=jnp.float32), frequencies)  # [length, half]
  shape = (1,) * (x.ndim - 3) + (length, 1, half)
  sin, cos = jnp.sin(angles).reshape(shape), jnp.cos(angles).reshape(shape)
  first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], -1)
  return rotated.astype(x.dtype)


class Attention(nn.Module):
  """Grouped-query causal self-attention with rotary positions."""
  config: Config
  dtype: Any = jnp.bfloat16
  implementation: str | None = None  # of nn.causal_self_attention: None (the best for
  # the target: the flash kernel on TPU), 'flash' or 'xla'

  @nn.compact
  def __call__(self, x):
    c = self.config

    def project(heads: int, heads_axis: str, name: str):
      return nn.DenseGeneral((heads, c.head_dim), use_bias=False, dtype=self.dtype, name=name,
                             kernel_init=named(KERNEL, 'embed', heads_axis, 'kv'))(x)
    q = rotary(project(c.heads, 'heads', 'query'), c.rope_base)
    k = rotary(project(c.kv_heads, 'kv_heads', 'key'), c.rope_base)
    v = project(c.kv_heads, 'kv_heads', 'value')
    # On a TPU target the default is the flash kernel, run per shard where the axis
    # rules place 'batch' and 'heads'.
    attended = nn.causal_self_attention(q, k, v, implementation=self.implementation)
    return nn.DenseGeneral(c.d_model, axis=(-2, -1), use_bias=False, dtype=self.dtype,
                           kernel_init=named(KERNEL, 'heads', 'kv', 'embed'),
                           name='out')(attended)


class Block(nn.Module):
  """A pre-norm decoder block: attention, then the gated MLP."""
  config: Config
  dtype: Any = jnp.bfloat16
  attention: str | None = None

  @nn.compact
  def __call__(self, x):  # [batch, length, d_model]
    c = self.config
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))

    def norm(name: str):
      return nn.RMSNorm(dtype=self.dtype, name=name, scale_init=named(nn.initializers.ones,
                                                                       'embed'))
    x = x + Attention(c, self.dtype, self.attention, name='attention')(norm('attention_norm')(x))
    h = norm('mlp_norm')(x)

    def dense(features: int, names: tuple[str, str], name: str):
      return nn.Dense(features, use_bias=False, dtype=self.dtype, name=name,
                      kernel_init=named(KERNEL, *names))
    gate = dense(c.mlp, ('embed', 'mlp'), 'gate')(h)
    up = dense(c.mlp, ('embed', 'mlp'), 'up')(h)
    activation = nn.silu if c.activation == 'silu' else nn.gelu
    return x + dense(c.d_model, ('mlp', 'embed'), 'down')(activation(gate) * up)


def _jax_policy(remat: Any):
  """A stack's ``remat=`` as `nn.remat`'s ``policy=`` for one layer (``None``: save
  nothing; the loop engine's named policies keep nothing inside a layer either)."""
  return remat if callable(remat) else None


class LM(nn.Module):
  """Tokens ``[batch, length]`` to next-token logits ``[batch, length, vocab]`` (float32).

  ``remat``, ``pipeline_stages``/``microbatches``/``stage_axis`` and ``attention`` change
  how the step runs, never the variables: one checkpoint serves every setting.
  """
  config: Config
  remat: Any = 'full'
  attention: str | None = None
  pipeline_stages: int = 1
  microbatches: int = 1
  stage_axis: str | None = None
  dtype: Any = jnp.bfloat16

  @nn.compact
  def __call__(self, tokens, *, hidden: bool = False):
    """Logits; or, with ``hidden=True``, the final normalised states ``[batch, length,
    d_model]`` that the output head reads (for `next_token_loss`)."""
    c = self.config
    embed = nn.Embed(c.vocab, c.d_model, dtype=self.dtype, name='embed',
                     embedding_init=named(nn.initializers.normal(1.0), 'vocab', 'embed'))
    x = embed(tokens)
    if c.scale_embeddings:
      x = x * jnp.sqrt(c.d_model).astype(self.dtype)
    # A pipeline checkpoints each layer, not each tick: a tick's carries hold every
    # microbatch's inputs and outputs, which a tick-level checkpoint would save per tick.
    piped = self.pipeline_stages > 1 and self.remat is not False
    block = nn.remat(Block, policy=_jax_policy(self.remat)) if piped else Block
    blocks = nn.Stacked(block, c.depth, remat=False if piped else self.remat, name='blocks',
                        block_kwargs={'config': c, 'dtype': self.dtype,
                                      'attention': self.attention},
                        metadata_params={nn.PARTITION_NAME: 'layers'})
    if self.pipeline_stages > 1:
      x = blocks.pipeline(x, stages=self.pipeline_stages, microbatches=self.microbatches,
                          mesh_axis=self.stage_axis)
    else:
      x = blocks(x)
    x = nn.RMSNorm(dtype=self.dtype, name='final_norm',
                   scale_init=named(nn.initializers.ones, 'embed'))(x)
    if hidden:
      return x
    if c.tie_embeddings:
      logits = embed.attend(x)
    else:
      logits = nn.Dense(c.vocab, use_bias=False, dtype=self.dtype, name='head',
                        kernel_init=named(KERNEL, 'embed', 'vocab'))(x)
    return nn.with_logical_constraint(logits.astype(jnp.float32), ('batch', 'length', 'vocab'))


def head_kernel(params, config: Config) -> jax.Array:
  """The output head's ``[d_model, vocab]`` weights (the embedding table when tied)."""
  return params['embed']['embedding'].T if config.tie_embeddings else params['head']['kernel']


def chunked_cross_entropy(hidden: jax.Array, kernel: jax.Array, targets: jax.Array,
                          chunk: int = 512) -> jax.Array:
  """Mean cross-entropy of ``targets`` under the logits ``hidden @ kernel`` (float32),
  computed ``chunk`` positions at a time and recomputed in the backward pass: the
  ``[batch, length, vocab]`` logits (1 GiB per sequence of 2048 at a vocabulary of
  128k) never exist at once. The same value as the whole product, rounded per chunk."""
  batch, length, width = hidden.shape
  chunk = chunk if length % chunk == 0 else length
  hs = hidden.reshape(batch, length // chunk, chunk, width).swapaxes(0, 1)
  ts = targets.reshape(batch, length // chunk, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def chunk_loss(h, t):
    logits = jnp.einsum('bcd,dv->bcv', h, kernel.astype(h.dtype)).astype(jnp.float32)
    logits = nn.with_logical_constraint(logits, ('batch', 'length', 'vocab'))
    return optax.softmax_cross_entropy_with_integer_labels(logits, t).sum()

  total, _ = jax.lax.scan(lambda acc, ht: (acc + chunk_loss(*ht), None),
                          jnp.zeros((), jnp.float32), (hs, ts))
  return total / (batch * length)


def next_token_loss(params, model: LM, batch: dict[str, jax.Array]) -> jax.Array:
  """Mean cross-entropy of ``batch['targets']`` given ``batch['inputs']`` (``[batch,
  length]`` each; the targets are the inputs shifted by one), by `chunked_cross_entropy`
  on the model's final states."""
  hidden = model.apply({'params': params}, batch['inputs'], hidden=True)
  return chunked_cross_entropy(hidden, head_kernel(params, model.config), batch['targets'])


# LLaMA-2's gradients were clipped to this global norm: the step clips them
# (`clip_norm=` of nn.compile_train_step), not the optimizer, so that an optimizer state
# in host memory can be updated one layer at a time.
CLIP_NORM = 1.0


def optimizer(learning_rate: float = 3e-4, warmup: int = 2000,
              steps: int = 100_000) -> optax.GradientTransformation:
  """AdamW as LLaMA-2 was trained: warmup, cosine decay to a tenth (with its gradients
  clipped to `CLIP_NORM` by the step)."""
  schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, steps,
                                                end_value=learning_rate / 10)
  return optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1)
