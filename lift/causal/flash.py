"""The Pallas TPU flash-attention kernel that ships with JAX, in the layout of
`causal_self_attention` (`lift/causal/attention.py` loads it on first use)."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash


def flash_kernel(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """The Pallas kernel on ``[batch, length, heads, features]`` blocks (one shard)."""
  length, groups = q.shape[1], q.shape[2] // k.shape[2]
  block = math.gcd(length, 512)
  sizes = pallas_flash.BlockSizes(
      block_q=block, block_k_major=block, block_k=block, block_b=1, block_q_major_dkv=block,
      block_k_major_dkv=block, block_k_dkv=block, block_q_dkv=block, block_k_major_dq=block,
      block_k_dq=block, block_q_dq=block)
  k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))
  q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
  out = pallas_flash.flash_attention(q, k, v, causal=True, sm_scale=q.shape[-1] ** -0.5,
                                     block_sizes=sizes)
  return jnp.swapaxes(out, 1, 2)
