"""Nested remat: N steps as b blocks of k steps plus r remaining steps, with a hand-written backward pass.

With N = b*k + r (0 <= r < b), the forward pass keeps only the carry entering
each block (and the remainder). The backward pass visits the blocks in
reverse loop order; for each it recomputes and keeps the k carries entering
its steps (pass 1), then differentiates its steps one at a time from those
carries (pass 2), writing each step's input cotangent into its row of the
`xs` cotangent. Saved carries: at most b + k + r, minimised over b when the
engine chooses (`nested=True`): at most 3*sqrt(N) + 1 for every N.

Steps read `xs` by index instead of slicing it into blocks: a block-sized
slice of `xs` (for a layer stack, k layers of parameters) and its cotangent
would otherwise be copied per block, which `jax.checkpoint` around an inner
`lax.scan` does and which costs more than the carries saved. The price is a
`jax.custom_vjp`: reverse mode of any order, `jit` and `vmap` work; forward
mode (`jax.jvp`) does not.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lift.errors import RematPolicyError
from lift.loops import _messages


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
  is the block count; it need not divide N, but may not exceed it.

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


class Loop(NamedTuple):
  """The static description of a nested loop (`body(carry, x, *consts)`)."""
  body: Callable
  plan: BlockPlan
  reverse: bool
  unroll: int | bool
  offload_carries: bool


def _take(tree: Any, t: jax.Array) -> Any:
  return jax.tree.map(lambda leaf: lax.dynamic_index_in_dim(leaf, t, keepdims=False), tree)


def _differentiable(leaf: Any) -> bool:
  return jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.inexact)


def _diff_leaves(tree: Any) -> list[Any]:
  return [leaf for leaf in jax.tree.leaves(tree) if _differentiable(leaf)]


def _with_diff_leaves(tree: Any, new: list[Any]) -> Any:
  new = iter(new)
  leaves, treedef = jax.tree.flatten(tree)
  return jax.tree.unflatten(treedef, [next(new) if _differentiable(leaf) else leaf
                                      for leaf in leaves])


def _cotangent_like(tree: Any, diff_cts: list[Any]) -> Any:
  """`diff_cts` for the inexact leaves of `tree`, float0 zeros for the others."""
  zeros = jax.tree.map(lambda leaf: np.zeros(np.shape(leaf), jax.dtypes.float0), tree)
  new = iter(diff_cts)
  leaves, treedef = jax.tree.flatten(tree)
  return jax.tree.unflatten(treedef, [next(new) if _differentiable(leaf) else zero
                                      for leaf, zero in zip(leaves, jax.tree.leaves(zeros))])


def _nonzero_cotangents(tree: Any) -> list[Any]:
  """The cotangents of inexact leaves (the others are float0 zeros)."""
  return [leaf for leaf in jax.tree.leaves(tree) if leaf.dtype != jax.dtypes.float0]


def _steps(start: jax.Array | int, length: int) -> jax.Array:
  return start + jnp.arange(length, dtype=jnp.int32)


def _run_steps(loop: Loop, consts: list, xs: Any, carry: Any, start, length: int, *,
               keep_carries: bool = False):
  """Steps start..start+length-1 in loop order: (carry out, carries in or None, ys)."""
  def one(c, t):
    new, y = loop.body(c, _take(xs, t), *consts)
    return new, (c if keep_carries else None, y)
  carry, (carries, ys) = lax.scan(one, carry, _steps(start, length),
                                  reverse=loop.reverse, unroll=loop.unroll)
  return carry, carries, ys


class Entries(NamedTuple):
  """The carries entering the blocks (stacked) and the remainder."""
  blocks: Any
  rest: Any


class Forward(NamedTuple):
  """The loop's result and the carries that its backward pass starts from."""
  carry: Any
  ys: Any
  entries: Entries


def _run_blocks(loop: Loop, consts: list, xs: Any, carry: Any):
  plan = loop.plan

  def block(c, j):
    out, _, ys = _run_steps(loop, consts, xs, c, j * plan.block_length, plan.block_length)
    return out, (c, ys)

  carry, (entries, ys) = lax.scan(block, carry, jnp.arange(plan.blocks, dtype=jnp.int32),
                                  reverse=loop.reverse)
  steps = plan.blocks * plan.block_length
  return carry, entries, jax.tree.map(lambda y: y.reshape((steps,) + y.shape[2:]), ys)


def forward(loop: Loop, consts: list, xs: Any, init: Any) -> Forward:
  """Runs the loop, keeping only the carries that enter blocks and the remainder."""
  plan = loop.plan
  if not plan.remainder:
    carry, entries, ys = _run_blocks(loop, consts, xs, init)
    return Forward(carry, ys, Entries(entries, init))
  rest_start = plan.blocks * plan.block_length
  run_rest = lambda c: _run_steps(loop, consts, xs, c, rest_start, plan.remainder)
  if loop.reverse:
    rest_entry, (carry, _, rest_ys) = init, run_rest(init)
    carry, entries, block_ys = _run_blocks(loop, consts, xs, carry)
  else:
    carry, entries, block_ys = _run_blocks(loop, consts, xs, init)
    rest_entry, (carry, _, rest_ys) = carry, run_rest(carry)
  ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), block_ys, rest_ys)
  return Forward(carry, ys, Entries(entries, rest_entry))


class Cotangents(NamedTuple):
  """The backward pass's running state: inexact leaves only."""
  carry: list[Any]
  xs: list[Any]
  consts: list[Any]


def _step_backward(loop: Loop, consts: list, xs: Any, ct_ys: list, cts: Cotangents,
                   carry: Any, t: jax.Array) -> Cotangents:
  """Pulls the cotangents back through step t, started from `carry`."""
  x = _take(xs, t)

  def diff_step(diff_carry, diff_x, diff_consts):
    new, y = loop.body(_with_diff_leaves(carry, diff_carry), _with_diff_leaves(x, diff_x),
                       *diff_consts)
    return _diff_leaves(new), _diff_leaves(y)

  _, pull = jax.vjp(diff_step, _diff_leaves(carry), _diff_leaves(x), consts)
  ct_carry, ct_x, ct_consts = pull((cts.carry, _take(ct_ys, t)))
  ct_xs = [lax.dynamic_update_index_in_dim(buf, row, t, 0) for buf, row in zip(cts.xs, ct_x)]
  return Cotangents(ct_carry, ct_xs, [a + b for a, b in zip(cts.consts, ct_consts)])


def _segment_backward(loop: Loop, consts: list, xs: Any, ct_ys: list, cts: Cotangents,
                      entry: Any, start, length: int) -> Cotangents:
  """Recomputes the carries of steps start..start+length-1 (pass 1), then pulls back (pass 2)."""
  _, carries, _ = _run_steps(loop, consts, xs, entry, start, length, keep_carries=True)

  def back(state, inputs):
    return _step_backward(loop, consts, xs, ct_ys, state, *inputs), None

  cts, _ = lax.scan(back, cts, (carries, _steps(start, length)), reverse=not loop.reverse)
  return cts


def _blocks_backward(loop: Loop, consts: list, xs: Any, ct_ys: list, cts: Cotangents,
                     entries: Any) -> Cotangents:
  plan = loop.plan

  def back(state, inputs):
    entry, j = inputs
    entry = _to_device(entry) if loop.offload_carries else entry
    return _segment_backward(loop, consts, xs, ct_ys, state, entry,
                             j * plan.block_length, plan.block_length), None

  blocks = jnp.arange(plan.blocks, dtype=jnp.int32)
  cts, _ = lax.scan(back, cts, (entries, blocks), reverse=not loop.reverse)
  return cts


def backward(loop: Loop, consts: list, xs: Any, entries: Entries, ct_carry: Any,
             ct_ys: Any) -> Cotangents:
  """Cotangents of (consts, init, xs) from those of (carry, ys), in reverse loop order."""
  cts = Cotangents(_nonzero_cotangents(ct_carry),
                   [jnp.zeros_like(leaf) for leaf in _diff_leaves(xs)],
                   [jnp.zeros_like(const) for const in consts])
  ct_ys = _nonzero_cotangents(ct_ys)
  plan = loop.plan
  rest = lambda state: _segment_backward(loop, consts, xs, ct_ys, state, entries.rest,
                                         plan.blocks * plan.block_length, plan.remainder)
  if plan.remainder and not loop.reverse:
    cts = rest(cts)
  cts = _blocks_backward(loop, consts, xs, ct_ys, cts, entries.blocks)
  return rest(cts) if plan.remainder and loop.reverse else cts


def _to_host(tree: Any) -> Any:
  return jax.device_put(tree, jax.memory.Space.Host)


def _to_device(tree: Any) -> Any:
  return jax.device_put(tree, jax.memory.Space.Device)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _nested(loop: Loop, consts: list, init: Any, xs: Any) -> tuple[Any, Any]:
  fwd = forward(loop, consts, xs, init)
  return fwd.carry, fwd.ys


def _nested_fwd(loop: Loop, consts: list, init: Any, xs: Any):
  fwd = forward(loop, consts, xs, init)
  entries = fwd.entries
  if loop.offload_carries:
    entries = entries._replace(blocks=_to_host(entries.blocks))
  return (fwd.carry, fwd.ys), (consts, xs, entries)


def _nested_bwd(loop: Loop, residuals, cts):
  consts, xs, entries = residuals
  ct_carry, ct_ys = cts
  out = backward(loop, consts, xs, entries, ct_carry, ct_ys)
  # The remainder's entry carry has the types of `init`.
  return out.consts, _cotangent_like(entries.rest, out.carry), _cotangent_like(xs, out.xs)


_nested.defvjp(_nested_fwd, _nested_bwd)


def nested_scan(body: Callable, init: Any, xs: Any, plan: BlockPlan, *,
                reverse: bool = False, unroll: int | bool = 1,
                offload_carries: bool = False) -> tuple[Any, Any]:
  """`lax.scan(body, init, xs, length=plan steps)` under nested remat (at least one step).

  `offload_carries` keeps the carries entering blocks in host memory between
  the forward and backward passes.
  """
  pure_body, consts = jax.closure_convert(body, init, _take(xs, 0))
  loop = Loop(pure_body, plan, reverse, unroll, offload_carries)
  return _nested(loop, list(consts), init, xs)
