"""`push_out_dot1`: a carry that only sums per-step products becomes one
contraction after the loop.

A carry ``a`` whose body reads it once, in ``a' = a + L(p(u_t, v_t))``, where
``p`` is a `dot_general` (or a `reduce_sum` of one value) and ``L`` a chain of
linear equations that only reshape (transpose, reshape, ...), ends the loop as
``a_T = a_0 + sum_t L(p(u_t, v_t)) = a_0 + L(P(U, V))``: ``P`` is ``p`` with the
step axis of the stacked ``U, V`` contracted too (or, where one operand does
not change from step to step, summed first). The loop returns the stacked
operands instead of the carry; a sequence input or an output the loop already
stacks costs nothing. Backward loops are where this is found: there each step
adds a product over a few rows into a whole weight gradient, reading and
writing it every step.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from lift import _compat
from lift.scan_rewrites import cost, program
from lift.scan_rewrites.loop import tainted
from lift.scan_rewrites.passes import per_loop
from lift.scan_rewrites.registry import rewrite

NAME = 'push_out_dot1'
RESHAPING = frozenset({'transpose', 'reshape', 'squeeze', 'expand_dims', 'neg',
                       'convert_element_type'})


@rewrite(NAME)
def push_out_dot1(closed, ctx):
  return per_loop(closed, ctx, _rewrite_loop)


@dataclasses.dataclass(frozen=True)
class Accumulator:
  """Carry `index` ends as ``add(init, chain(core(operands summed over steps)))``."""
  index: int
  add: Any  # the equation a' = a + term
  chain: list  # the reshaping equations from the core's result to the term, in order
  core: Any  # the dot_general or reduce_sum
  stacked: list[bool]  # per core operand: whether it changes from step to step


def _accumulator(loop, k, readers, producer, per_step) -> Accumulator | None:
  body = loop.body.jaxpr
  invariant = set(loop.split_inputs(body.invars)[0]) | set(body.constvars)
  a_in, a_out = loop.split_inputs(body.invars)[1][k], body.outvars[k]
  if (not isinstance(a_out, _compat.Var) or a_out not in producer
      or readers.get(a_out) != [len(body.eqns)]):
    return None
  i = producer[a_out]
  add = body.eqns[i]
  if add.primitive.name not in ('add', 'add_any') or readers.get(a_in) != [i]:
    return None
  term = add.invars[1] if add.invars[0] is a_in else add.invars[0]
  if term is a_in or not isinstance(term, _compat.Var) or term.aval != a_out.aval:
    return None
  chain: list = []
  consumer = i
  while term in producer and readers.get(term) == [consumer]:
    j = producer[term]
    eqn = body.eqns[j]
    if eqn.primitive.name in ('dot_general', 'reduce_sum'):
      stacked = [isinstance(v, _compat.Var) and v not in invariant for v in eqn.invars]
      changes = any(isinstance(v, _compat.Var) and v in per_step for v in eqn.invars)
      return Accumulator(k, add, chain[::-1], eqn, stacked) if changes else None
    if eqn.primitive.name not in RESHAPING or not _linear(eqn):
      return None
    chain.append(eqn)
    term, consumer = eqn.invars[0], j
  return None


def _linear(eqn) -> bool:
  """Reshaping equations are linear; a conversion only between floating types."""
  return eqn.primitive.name != 'convert_element_type' or all(
      jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in (*eqn.invars, *eqn.outvars))


def _rows(acc: Accumulator) -> int:
  """The rows a step contracts: the contracted size of the core's per-step operand."""
  eqn = acc.core
  if eqn.primitive.name == 'reduce_sum':
    return math.prod(eqn.invars[0].aval.shape[d] for d in eqn.params['axes'])
  contracting = eqn.params['dimension_numbers'][0]
  side = 0 if acc.stacked[0] else 1
  return math.prod(eqn.invars[side].aval.shape[d] for d in contracting[side])


def _pays(loop, ctx, acc: Accumulator, free: set) -> bool:
  """Products over a few rows per step; sums of values the loop stacks anyway."""
  if acc.core.primitive.name == 'dot_general':
    pays = _rows(acc) <= cost.MAX_ROWS_PER_STEP
    why = f'over {_rows(acc)} rows per step (> {cost.MAX_ROWS_PER_STEP}: already efficient)'
  else:
    pays = all(v in free for v, s in zip(acc.core.invars, acc.stacked) if s)
    why = 'of values the loop does not stack'
  if not pays:
    ctx.record(NAME, loop, False, f'{ctx.describe(loop, "carry", acc.index)} stays a per-step sum: '
               f'it sums a {acc.core.primitive.name} {why}')
  return pays


def _why(acc: Accumulator) -> str:
  if acc.core.primitive.name == 'dot_general':
    return f'sums a dot_general over {_rows(acc)} rows per step (<= {cost.MAX_ROWS_PER_STEP})'
  return 'sums a reduce_sum of per-step values'


def _one(acc: Accumulator) -> str:
  return 'contraction' if acc.core.primitive.name == 'dot_general' else 'sum'


def _summed(core, operands, stacked):
  """``sum_t core(operands_t)``: the operands marked stacked have a leading step axis."""
  if core.primitive.name == 'reduce_sum':
    axes = (0, *(a + 1 for a in core.params['axes']))
    params = core.primitive.get_bind_params({**core.params, 'axes': axes})
    return core.primitive.bind(operands[0], **params)
  if not all(stacked):  # linear in the one stacked operand: sum it first
    operands = [x.sum(0) if s else x for x, s in zip(operands, stacked)]
    return _compat.bind_equation(core, operands)[0]
  (lc, rc), (lb, rb) = core.params['dimension_numbers']
  shift = lambda dims: tuple(d + 1 for d in dims)
  numbers = (((0, *shift(lc)), (0, *shift(rc))), (shift(lb), shift(rb)))
  params = core.primitive.get_bind_params({**core.params, 'dimension_numbers': numbers})
  return core.primitive.bind(*operands, **params)


def _rewrite_loop(loop, outer, ctx):
  body = loop.body.jaxpr
  consts, carries, xs = loop.split_inputs(body.invars)
  readers = program.uses(body)
  producer = {v: i for i, e in enumerate(body.eqns) for v in e.outvars}
  per_step = tainted(loop, set(carries) | set(xs))
  free = set(xs) | program.variables(loop.split_outputs(body.outvars)[1])
  candidates = [_accumulator(loop, k, readers, producer, per_step) for k in range(len(carries))]
  found: list[Accumulator] = []
  stacked = set(free)  # what the loop returns stacked: the moved products' operands are too
  for core in ('dot_general', 'reduce_sum'):
    found += [a for a in candidates if a is not None and a.core.primitive.name == core
              and (not ctx.cost_model or _pays(loop, ctx, a, stacked))]
    stacked |= {v for a in found for v, s in zip(a.core.invars, a.stacked) if s}
  for a in sorted(found, key=lambda a: a.index):
    ctx.record(NAME, loop, True, f'{ctx.describe(loop, "carry", a.index)} {_why(a)}: now one {_one(a)} '
               f'over the {loop.length} steps, after the loop', moved=len(a.chain) + 2)
  return _step(loop, found, free) if found else None


def _step(loop, found: list[Accumulator], free: set) -> program.Step:
  body = loop.body.jaxpr
  consts, carries, xs = loop.split_inputs(body.invars)
  carry_out, ys = loop.split_outputs(body.outvars)
  gone = {a.index for a in found}
  kept = [k for k in range(len(carries)) if k not in gone]
  needed = [v for a in found for v, s in zip(a.core.invars, a.stacked) if s]
  exports = list(dict.fromkeys(v for v in needed if v not in free))  # the others are stacked
  new_outs = [carry_out[k] for k in kept] + ys + exports
  eqns = [e for e, keep in zip(body.eqns, program.live(body.eqns, new_outs)) if keep]

  def run(*invals):
    c_vals, init, x_vals = loop.split_inputs(invals)

    def step(carry, x):
      env: dict = {}
      full = list(init)  # the removed carries are never read
      for k, value in zip(kept, carry):
        full[k] = value
      loop.bound_body(env, c_vals, full, x)
      program.run_equations(eqns, env)
      outs = [program.read(env, v) for v in new_outs]
      return outs[:len(kept)], outs[len(kept):]
    final, stacked = loop.scan(step, [init[k] for k in kept], x_vals)
    env: dict = {v: y for v, y in zip(ys, stacked) if isinstance(v, _compat.Var)}
    env.update(zip(exports, stacked[len(ys):]))
    env.update(zip(xs, x_vals))
    program.write(env, body.constvars, loop.body.consts)
    program.write(env, consts, c_vals)
    results = dict(zip(kept, final))
    for a in found:
      value = _summed(a.core, [program.read(env, v) for v in a.core.invars], a.stacked)
      for eqn in a.chain:
        value = _compat.bind_equation(eqn, [value])[0]
      operands = [init[a.index], value] if a.add.invars[0] is carries[a.index] else [value, init[a.index]]
      results[a.index] = _compat.bind_equation(a.add, operands)[0]
    return [results[k] for k in range(len(carries))] + stacked[:len(ys)]
  return program.Step(loop.eqn.invars, loop.eqn.outvars, run, loop.eqn)
