"""When moving a matrix product out of a loop pays.

A product done once per step on a few rows uses the machine poorly: batching
it over all steps (one product with ``steps * rows`` rows) is faster. With many
rows per step it is already efficient, and batching only adds the traffic of
the stacked result. The gain is in the backward pass: there each step adds a
rank-`rows` product to the whole weight gradient, which batching turns into
one contraction over all steps. Measured on CPU (the scan-rewrites benchmark),
training steps with 8 or fewer rows run 1.2-2.8x faster batched; at 32 rows
batching loses up to 14%, and forward-only loops (inference) lose at 2 to 8
rows (small products in the loop are already fast). Other equations
(elementwise work) gain nothing from batching.
"""
from __future__ import annotations

import math

from lift import _compat
from lift.scan_rewrites import names, origins

MAX_ROWS_PER_STEP = 16


def rows_per_step(eqn, per_step: set) -> int | None:
  """The rows of a `dot_general` the loop repeats: the free (not contracted, not
  batch) size of its operand that changes per step. None for other equations."""
  if eqn.primitive.name != 'dot_general':
    return None
  (contracting, batch) = eqn.params['dimension_numbers']
  lhs, rhs = eqn.invars
  side = 1 if (isinstance(rhs, _compat.Var) and rhs in per_step
               and not (isinstance(lhs, _compat.Var) and lhs in per_step)) else 0
  operand = eqn.invars[side]
  fixed = set(contracting[side]) | set(batch[side])
  return math.prod(n for d, n in enumerate(operand.aval.shape) if d not in fixed)


def batching_pays(eqn, per_step: set, differentiated: bool) -> tuple[bool, str]:
  """Whether batching `eqn` over the steps of its loop pays, and why."""
  rows = rows_per_step(eqn, per_step)
  if rows is None:
    return False, f'{eqn.primitive.name} gains nothing from batching'
  if not differentiated:
    return False, (f'a product on {rows} rows per step, not differentiated (batching pays '
                   'in the backward pass)')
  if rows <= MAX_ROWS_PER_STEP:
    return True, f'a product on {rows} rows per step (<= {MAX_ROWS_PER_STEP}) in a training program'
  return False, f'a product on {rows} rows per step (> {MAX_ROWS_PER_STEP}: already efficient)'


def decide(ctx, rewrite: str, loop, eqn, per_step: set) -> bool:
  """`batching_pays` for `eqn` in `loop`. A matrix product left in the loop is
  recorded for `explain_scans`; the rewrite records what it moves."""
  pays, why = batching_pays(eqn, per_step, ctx.differentiated)
  if eqn.primitive.name == 'dot_general' and not pays:
    ctx.record(rewrite, loop, False, f'{product(ctx, loop, eqn)} stays in the loop: {why}')
  return pays


def product(ctx, loop, eqn) -> str:
  """A body's matrix product by what its operands hold: ``x @ params/w``."""
  body = ctx.naming.body(loop.eqn)
  return ' @ '.join(names.operand(body, v) for v in eqn.invars)


def batched(ctx, loop, eqns, per_step: set) -> str:
  """What the equations `eqns` moved out of `loop` are, and why they were
  moved: ``x @ params/w: a product on 4 rows per step ...``."""
  dots = [e for e in eqns if e.primitive.name == 'dot_general']
  number = ctx.naming.loop(loop.eqn).number
  inner = [ctx.naming.nested({number}, e, ctx.naming.loop(loop.eqn).role) for e in eqns
           if e.primitive.name == 'scan']
  others = [e for e in eqns if e.primitive.name not in ('dot_general', 'scan')]
  what = ', '.join([product(ctx, loop, e) for e in dots] +
                   [f'loop {i.number}' if i else 'a nested loop' for i in inner] +
                   ([origins.describe(others, ctx.naming.body(loop.eqn).source)] if others else []))
  if not ctx.cost_model:
    return f'{what}: named in `rewrites`'
  verdicts = [batching_pays(e, per_step, ctx.differentiated) for e in dots]
  if not all(pays for pays, _ in verdicts):
    return f'{what}: {"; ".join(dict.fromkeys(why for _, why in verdicts))}'
  rows = ' or '.join(str(r) for r in sorted({rows_per_step(e, per_step) or 0 for e in dots}))
  each = 'each ' if len(dots) > 1 else ''
  return f'{what}: {each}a product on {rows} rows per step (<= {MAX_ROWS_PER_STEP}) in a training program'
