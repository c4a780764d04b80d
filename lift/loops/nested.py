"""Nested remat: only the carries entering N steps' outer blocks are kept; hand-written backward.

The forward pass keeps the carry entering each block. The backward pass
differentiates the steps one at a time in reverse loop order (a pull), each
from the carry entering it, and writes each step's input cotangent into its
row of the `xs` cotangent. The carries of block j-1 are recomputed from its
entry while block j is pulled back, each into the slot the previous pull freed.

Block j is pulled back holding j + k_j carries (the entries of the blocks
before it, its own k_j), so blocks get shorter along the loop (k_j = M - j):
M carries cover M(M+1)/2 steps, about sqrt(2N), where equal blocks need
2*sqrt(N). Block 0's entry is `init`, read where the caller keeps it, so
M - 1 carries are copied: `BlockPlan.saved_carries`.

Steps read `xs` by index instead of slicing it into blocks: a block-sized
slice of `xs` (for a layer stack, k layers of parameters) and its cotangent
would otherwise be copied per block, which `jax.checkpoint` around an inner
`lax.scan` does and which costs more than the carries saved. The price is a
`jax.custom_vjp`: reverse mode of any order, `jit` and `vmap` work; forward
mode (`jax.jvp`) raises `NestedForwardModeError`, which says to use 'full'.
"""
import functools
import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lift import _compat
from lift.errors import NestedForwardModeError, RematPolicyError
from lift.loops import _messages


class BlockPlan(NamedTuple):
  """How a nested loop splits its steps: the length of each outer block, in loop order.

  `plan_blocks` keeps k_{j-1} <= k_j + 1: the backward pass recomputes one
  carry of block j-1 per step of block j it pulls back. Not something to
  pass to a loop: ``nested=`` of a policy takes a block count; build a plan
  (or call `plan_blocks`) to see what a split costs.

  Attributes:
    lengths: the number of steps of each block, in loop order.

  Examples:
    >>> plan = BlockPlan((3, 2, 1))
    >>> plan.blocks, plan.slots, plan.saved_carries
    (3, 3, 2)
  """
  lengths: tuple[int, ...]

  @property
  def blocks(self) -> int:
    return len(self.lengths)

  @property
  def slots(self) -> int:
    """Carries live at once: block j needs the j earlier entries and its own k_j carries."""
    return max(j + length for j, length in enumerate(self.lengths))

  @property
  def saved_carries(self) -> int:
    """Carries copied and kept at once: all live ones but `init`, block 0's entry."""
    return self.slots - 1


def _plan(length: int, blocks: int) -> BlockPlan:
  """`blocks` blocks of lengths M, M-1, .. (M as small as possible), cut to `length` steps."""
  slots = max(blocks, -(-(length + blocks * (blocks - 1) // 2) // blocks))
  lengths = [slots - j for j in range(blocks)]
  excess = sum(lengths) - length
  for j, block in enumerate(lengths):
    cut = min(excess, block - 1)
    lengths[j], excess = block - cut, excess - cut
  return BlockPlan(tuple(lengths))


def plan_blocks(length: int, nested: bool | int) -> BlockPlan:
  """Splits `length` steps into outer blocks of decreasing length.

  `nested=True` picks the block count with the fewest saved carries (M with
  M(M+1)/2 >= N, about sqrt(2N)), then the most blocks (the fewest recomputed
  steps). An int is the block count; it may not exceed `length`. Not needed
  to use nested remat (loops call it); call it to see what a split costs.

  Examples:
    >>> plan_blocks(13, True)
    BlockPlan(lengths=(3, 4, 3, 2, 1))
    >>> plan_blocks(13, True).saved_carries
    4
  """
  if nested is True:
    candidates = [_plan(length, blocks)
                  for blocks in range(1, min(length, math.isqrt(2 * length) + 2) + 1)]
    return min(candidates, key=lambda plan: (plan.slots, -plan.blocks))
  if nested > length:
    raise RematPolicyError(_messages.NESTED_TOO_MANY.format(blocks=nested, length=length))
  return _plan(length, nested)


class Recompute(NamedTuple):
  """Runs loop-order step `step` from logical slot `src` into slot `dst`; if not `active`, copies.

  Logical slot 0 is `init`, which has no row; slot s is row s-1 of the buffer.
  In a `Schedule` the fields are arrays, `step` a position in `xs`, `dst` a row;
  the backward loop sees them traced. Hence `Any`: a NamedTuple cannot be generic
  on Python 3.10.
  """
  active: Any  # bool
  step: Any  # int
  src: Any  # int
  dst: Any  # int


class Iteration(NamedTuple):
  """One backward iteration: a recompute or copy into a free slot, then a pull of a step."""
  recompute: Recompute
  pull_step: int
  pull_src: int


def _prologue(plan: BlockPlan, starts: list[int], slot: dict[int, int]) -> list[Recompute]:
  """The carries of the last block, recomputed into the free slots before any pull."""
  last, ops = plan.blocks - 1, []
  for i, free in enumerate(range(plan.blocks, plan.blocks + plan.lengths[last] - 1)):
    step = starts[last] + i
    slot[step + 1] = free
    ops.append(Recompute(True, step, slot[step], free))
  return ops


def _iterations(plan: BlockPlan, starts: list[int], slot: dict[int, int]) -> list[Iteration]:
  """Pulls in reverse loop order, each after the recompute that the pull before it made room for.

  Block j-1's carries are recomputed while block j is pulled back, each into
  the slot the previous pull freed (`BlockPlan` keeps k_{j-1} - 1 <= k_j). An
  idle iteration copies the freed slot onto itself, except before the pull of
  step 0, which starts from `init`: there `init` is copied to a free slot, so
  that pulls read rows only.
  """
  ops, recompute = [], Recompute(False, 0, 1, 1)
  for j in reversed(range(plan.blocks)):
    pending = iter(range(starts[j - 1], starts[j] - 1) if j else ())
    for step in reversed(range(starts[j], starts[j] + plan.lengths[j])):
      if not slot[step]:
        recompute = Recompute(False, 0, 0, recompute.dst)
        slot[step] = recompute.dst
      ops.append(Iteration(recompute, step, slot[step]))
      todo = next(pending, None)
      recompute = Recompute(False, 0, slot[step], slot[step])
      if todo is not None:
        recompute = Recompute(True, todo, slot[todo], slot[step])
        slot[todo + 1] = slot[step]
  return ops


class Schedule(NamedTuple):
  """Static index arrays of a nested loop, steps as positions in `xs` and slots as rows.

  `write[t]` is the row that forward step t writes its entry carry to. The
  backward pass runs the `prologue`, then one `Iteration` per row of the
  `iterations` arrays (`Recompute.src` stays a logical slot: it may be `init`).
  """
  write: np.ndarray
  prologue: Recompute
  recompute: Recompute
  pull_t: np.ndarray
  pull_src: np.ndarray


def schedule(plan: BlockPlan, reverse: bool) -> Schedule:
  """The forward writes and backward operations of `plan` (see `Schedule`).

  A forward step that does not enter block j writes slot j+1: the next block's
  entry overwrites it, and after the last block it is a free slot. Slot 0,
  `init`, has no row, so block 0's first step writes slot 1 too.
  """
  steps = sum(plan.lengths)
  position = lambda order: np.asarray(
      [steps - 1 - e if reverse else e for e in order], np.int32).reshape(-1)
  index = lambda column: np.asarray(column, np.int32).reshape(-1)
  row = lambda column: index(column) - 1

  def arrays(ops: list[Recompute]) -> Recompute:
    active, step, src, dst = zip(*ops) if ops else ((),) * 4
    return Recompute(np.asarray(active, bool), position(step), index(src), row(dst))

  starts = np.cumsum((0,) + plan.lengths[:-1]).tolist()
  slot = {start: j for j, start in enumerate(starts)}
  prologue, iterations = _prologue(plan, starts, slot), _iterations(plan, starts, slot)
  write = np.concatenate([[max(j, 1)] + [j + 1] * (length - 1)
                          for j, length in enumerate(plan.lengths)])
  return Schedule(row(write[::-1] if reverse else write), arrays(prologue),
                  arrays([op.recompute for op in iterations]),
                  position([op.pull_step for op in iterations]),
                  row([op.pull_src for op in iterations]))


class Loop(NamedTuple):
  """The static description of a nested loop (`body(carry, x, *consts)`)."""
  body: Callable
  plan: BlockPlan
  reverse: bool
  unroll: int | bool
  offload_carries: bool


def _take(tree: Any, t: int | jax.Array) -> Any:
  return jax.tree.map(lambda leaf: lax.dynamic_index_in_dim(leaf, t, keepdims=False), tree)


def _put(tree: Any, rows: Any, t: jax.Array) -> Any:
  return jax.tree.map(lambda leaf, row: lax.dynamic_update_index_in_dim(leaf, row, t, 0),
                      tree, rows)


def _differentiable(leaf: Any) -> bool:
  return jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.inexact)


def _diff_leaves(tree: Any) -> list[Any]:
  return [leaf for leaf in jax.tree.leaves(tree) if _differentiable(leaf)]


def _with_diff_leaves(tree: Any, new: Iterable[Any]) -> Any:
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


def _read(slots: Any, init: Any, slot: jax.Array) -> Any:
  """The carry in logical slot `slot` (see `Schedule`); `init` is the caller's, never copied."""
  row = jnp.maximum(slot - 1, 0)
  return jax.tree.map(
      lambda rows, first: jnp.where(slot == 0, first,
                                    lax.dynamic_index_in_dim(rows, row, keepdims=False)),
      slots, init)


def _empty_slots(init: Any, count: int) -> Any:
  return jax.tree.map(lambda leaf: jnp.zeros((count,) + jnp.shape(leaf), jnp.result_type(leaf)),
                      init)


def forward(loop: Loop, consts: list, xs: Any, init: Any, write: np.ndarray):
  """Runs the loop, writing block entries into their rows (`Schedule`): (carry, ys, slots)."""
  def one(state, inputs):
    carry, slots = state
    t, slot = inputs
    new, y = loop.body(carry, _take(xs, t), *consts)
    return (new, _put(slots, carry, slot)), y

  steps = jnp.arange(len(write), dtype=jnp.int32)
  slots = _empty_slots(init, max(loop.plan.saved_carries, 1))
  (carry, slots), ys = lax.scan(one, (init, slots), (steps, jnp.asarray(write)),
                                reverse=loop.reverse, unroll=loop.unroll)
  return carry, ys, slots


class Cotangents(NamedTuple):
  """The backward pass's running state: inexact leaves only."""
  carry: list[Any]
  xs: list[Any]
  consts: list[Any]


def _run_step(loop: Loop, consts: list, xs: Any, slots: Any, init: Any, t: jax.Array,
              src: jax.Array) -> Any:
  return loop.body(_read(slots, init, src), _take(xs, t), *consts)[0]


def _pull(loop: Loop, consts: list, xs: Any, ct_ys: list, slots: Any, cts: Cotangents,
          t: jax.Array, src: jax.Array) -> Cotangents:
  """Cotangents of step t's (carry, x, consts), started from the carry in row `src`.

  The `xs` field holds the step's rows, not the whole cotangent of `xs`.
  """
  carry, x = _take(slots, src), _take(xs, t)

  def diff_step(diff_carry, diff_x, diff_consts):
    new, y = loop.body(_with_diff_leaves(carry, diff_carry), _with_diff_leaves(x, diff_x),
                       *diff_consts)
    return _diff_leaves(new), _diff_leaves(y)

  # Saving every residual recomputes nothing, but JAX then passes the residuals
  # from the step's forward to its backward through reduce_precision (JAX PR
  # 22244), and XLA no longer hoists backward products that need only the
  # incoming cotangent (ct @ W.T) above the forward: on the benchmark block (CPU)
  # the step's working set falls from 45.1 to 39.1 MiB; prevent_cse gives 2 of 6.
  step = jax.checkpoint(diff_step, policy=jax.checkpoint_policies.everything_saveable)
  _, pull = jax.vjp(step, _diff_leaves(carry), _diff_leaves(x), consts)
  return Cotangents(*pull((cts.carry, _take(ct_ys, t))))


def _iteration(loop: Loop, consts: list, xs: Any, ct_ys: list, init: Any, state,
               ops: tuple[Recompute, jax.Array, jax.Array]):
  """A recompute or a copy into a free row, then a pull (see `Iteration`).

  Only the recompute is conditional: a `cond` around the pull would keep the
  incoming carry cotangent alive through the whole pull. Writing the row
  before the pull orders it after the previous pull's reads, so it is in
  place; a pull reading `init` directly would materialise a select instead.
  """
  slots, cts = state
  recompute, pull_t, pull_src = ops
  new = lax.cond(recompute.active,
                 lambda: _run_step(loop, consts, xs, slots, init, recompute.step, recompute.src),
                 lambda: _read(slots, init, recompute.src))
  slots = _put(slots, new, recompute.dst)
  step = _pull(loop, consts, xs, ct_ys, slots, cts, pull_t, pull_src)
  cts = Cotangents(step.carry, [lax.dynamic_update_index_in_dim(buf, row, pull_t, 0)
                                for buf, row in zip(cts.xs, step.xs)],
                   [a + b for a, b in zip(cts.consts, step.consts)])
  return (slots, cts), None


def backward(loop: Loop, consts: list, xs: Any, init: Any, slots: Any, ct_carry: Any,
             ct_ys: Any) -> Cotangents:
  """Cotangents of (consts, init, xs) from those of (carry, ys), in reverse loop order."""
  cts = Cotangents(_nonzero_cotangents(ct_carry),
                   [jnp.zeros_like(leaf) for leaf in _diff_leaves(xs)],
                   [jnp.zeros_like(const) for const in consts])
  plan = schedule(loop.plan, loop.reverse)
  if len(plan.prologue.step):
    def recompute(slots, op: Recompute):
      return _put(slots, _run_step(loop, consts, xs, slots, init, op.step, op.src), op.dst), None
    slots, _ = lax.scan(recompute, slots, plan.prologue)
  iteration = functools.partial(_iteration, loop, consts, xs, _nonzero_cotangents(ct_ys), init)
  (_, cts), _ = lax.scan(iteration, (slots, cts),
                         (plan.recompute, plan.pull_t, plan.pull_src), unroll=loop.unroll)
  return cts


def _to_host(tree: Any) -> Any:
  return jax.device_put(tree, jax.memory.Space.Host)


def _to_device(tree: Any) -> Any:
  return jax.device_put(tree, jax.memory.Space.Device)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _nested(loop: Loop, consts: list, fixed: list, init: Any, xs: Any) -> tuple[Any, Any]:
  loop = _with_fixed(loop, fixed)
  one = lambda carry, t: loop.body(carry, _take(xs, t), *consts)
  steps = jnp.arange(sum(loop.plan.lengths), dtype=jnp.int32)
  return lax.scan(one, init, steps, reverse=loop.reverse, unroll=loop.unroll)


def _nested_fwd(loop: Loop, consts: list, fixed: list, init: Any, xs: Any):
  loop = _with_fixed(loop, fixed)
  carry, ys, slots = forward(loop, consts, xs, init, schedule(loop.plan, loop.reverse).write)
  if loop.offload_carries:
    slots = _to_host(jax.tree.map(lambda s: s[:loop.plan.blocks - 1], slots))
  return (carry, ys), (consts, fixed, xs, init, slots)


def _nested_bwd(loop: Loop, residuals, cts):
  consts, fixed, xs, init, slots = residuals
  loop = _with_fixed(loop, fixed)
  if loop.offload_carries:
    free = _empty_slots(init, max(loop.plan.saved_carries, 1) - loop.plan.blocks + 1)
    slots = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), _to_device(slots), free)
  ct_carry, ct_ys = cts
  out = backward(loop, consts, xs, init, slots, ct_carry, ct_ys)
  return out.consts, [None] * len(fixed), _cotangent_like(init, out.carry), _cotangent_like(xs, out.xs)


_nested.defvjp(_nested_fwd, _nested_bwd)


def _with_fixed(loop: Loop, fixed: list) -> Loop:
  """`loop` whose body takes only the float constants; the others (`fixed`) are bound."""
  def body(carry, x, *consts):
    return loop.body(carry, x, *consts, *fixed)
  return loop._replace(body=body)


def _hoist_constants(body: Callable, init: Any, x: Any) -> tuple[Callable, list, list]:
  """``(pure, floats, others)`` with ``pure(carry, x, *floats, *others) == body(carry, x)``.

  As `jax.closure_convert`, but integer, bool and key constants are hoisted too,
  so none is closed over by the custom VJP (under `jit` they are tracers).
  """
  closed, out_shape = jax.make_jaxpr(body, return_shape=True)(init, x)
  is_float = [jnp.issubdtype(jnp.result_type(c), jnp.inexact) for c in closed.consts]
  order = [i for i, f in enumerate(is_float) if f] + [i for i, f in enumerate(is_float) if not f]
  run = _compat.jaxpr_as_fun(_compat.ClosedJaxpr(_compat.convert_constvars_jaxpr(closed.jaxpr), []))
  out_tree = jax.tree.structure(out_shape)

  def pure(carry, x, *consts):
    ordered = [None] * len(consts)
    for position, const in zip(order, consts):
      ordered[position] = const
    return jax.tree.unflatten(out_tree, run(*ordered, *jax.tree.leaves((carry, x))))

  consts = [closed.consts[i] for i in order]
  floats = sum(is_float)
  return pure, consts[:floats], consts[floats:]


def nested_scan(body: Callable, init: Any, xs: Any, plan: BlockPlan, *,
                reverse: bool = False, unroll: int | bool = 1,
                offload_carries: bool = False) -> tuple[Any, Any]:
  """`lax.scan(body, init, xs, length=plan steps)` under nested remat (at least one step).

  `offload_carries` keeps the carries entering blocks in host memory between
  the forward and backward passes.
  """
  pure_body, consts, fixed = _hoist_constants(body, init, _take(xs, 0))
  loop = Loop(pure_body, plan, reverse, unroll, offload_carries)
  try:
    return _nested(loop, consts, fixed, init, xs)
  except TypeError as error:
    if 'forward-mode' not in str(error):
      raise
    raise NestedForwardModeError(_messages.NESTED_FORWARD_MODE) from None
