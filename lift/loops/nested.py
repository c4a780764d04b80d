"""Nested remat: N steps as b recomputed blocks of k steps, plus r remaining steps.

With N = b*k + r (0 <= r < b), the forward pass runs an outer scan over b
blocks that keeps only the carry entering each block, then a flat scan over the
r remaining steps (reversed loops run the remainder first). In the backward
pass each block is recomputed and differentiated on its own, keeping its k
step carries. Saved carries: at most b + k + r, minimised over b when the
engine chooses (`nested=True`): at most 3*sqrt(N) + 1 for every N.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from lift.errors import RematPolicyError
from lift.loops import _messages
from lift.loops.policies import (BLOCK_CARRY_NAME, BLOCK_INPUT_NAME,
                                 ScanCheckpointPolicy, block_policy, checkpoint_step)


class BlockPlan(NamedTuple):
  """How a nested loop splits its steps: `blocks * block_length + remainder`."""
  blocks: int
  block_length: int
  remainder: int

  @property
  def saved_carries(self) -> int:
    """Upper bound on the carries kept at once during the backward pass."""
    return self.blocks + self.block_length + self.remainder


def _plan(length: int, blocks: int) -> BlockPlan:
  return BlockPlan(blocks, length // blocks, length % blocks)


def plan_blocks(length: int, nested: bool | int) -> BlockPlan:
  """Splits `length` steps into outer blocks.

  `nested=True` picks the block count b minimising (b + N // b + N % b, N % b,
  b): the fewest saved carries, then no remainder, then fewer blocks. An int
  is the block count; it may not divide N, but may not exceed it.

  >>> plan_blocks(13, True)
  BlockPlan(blocks=3, block_length=4, remainder=1)
  """
  if nested is True:
    # Beyond 3*sqrt(N) blocks the block count alone exceeds the bound at sqrt(N).
    most = min(length, 3 * math.isqrt(length) + 4)
    candidates = [_plan(length, blocks) for blocks in range(1, most + 1)]
    return min(candidates, key=lambda plan: (plan.saved_carries, plan.remainder, plan.blocks))
  if nested > length:
    raise RematPolicyError(_messages.NESTED_TOO_MANY.format(blocks=nested, length=length))
  return _plan(length, nested)


def _split_blocks(xs: Any, plan: BlockPlan) -> tuple[Any, Any]:
  """xs as (blocks, block_length, ...) leaves, and the remaining steps' xs."""
  head_length = plan.blocks * plan.block_length
  shape = (plan.blocks, plan.block_length)

  def head(leaf):
    leaf = leaf[:head_length] if plan.remainder else leaf
    return leaf.reshape(shape + leaf.shape[1:])

  return jax.tree.map(head, xs), jax.tree.map(lambda leaf: leaf[head_length:], xs)


def _scan_blocks(step: Callable, carry: Any, blocks_xs: Any, plan: BlockPlan,
                 policy: ScanCheckpointPolicy, reverse: bool, unroll: int | bool):
  def run_block(block_carry, block_xs):
    return lax.scan(step, block_carry, block_xs, length=plan.block_length,
                    reverse=reverse, unroll=unroll)

  block = checkpoint_step(run_block, policy, carry_name=BLOCK_CARRY_NAME,
                          input_name=BLOCK_INPUT_NAME, jax_policy=block_policy(policy))
  carry, ys = lax.scan(block, carry, blocks_xs, length=plan.blocks, reverse=reverse)
  steps = plan.blocks * plan.block_length
  return carry, jax.tree.map(lambda y: y.reshape((steps,) + y.shape[2:]), ys)


def nested_scan(step: Callable, init: Any, xs: Any, plan: BlockPlan,
                policy: ScanCheckpointPolicy, *, reverse: bool = False,
                unroll: int | bool = 1) -> tuple[Any, Any]:
  """`lax.scan(step, init, xs)` run as the blocks of `plan`.

  `step` is already checkpointed with the per-step policy; each block is
  checkpointed here with `block_policy(policy)`.
  """
  blocks_xs, rest_xs = _split_blocks(xs, plan)

  def run_blocks(carry):
    return _scan_blocks(step, carry, blocks_xs, plan, policy, reverse, unroll)

  def run_rest(carry):
    return lax.scan(step, carry, rest_xs, length=plan.remainder,
                    reverse=reverse, unroll=unroll)

  if not plan.remainder:
    return run_blocks(init)
  if reverse:
    carry, rest_ys = run_rest(init)
    carry, block_ys = run_blocks(carry)
  else:
    carry, block_ys = run_blocks(init)
    carry, rest_ys = run_rest(carry)
  return carry, jax.tree.map(lambda a, b: jnp.concatenate([a, b]), block_ys, rest_ys)
