"""`push_out_seq`: batch over all steps, before the loop, what reads only
constants and sequences.

An equation that depends on the step's sequence slices ``x_t`` and constants,
never on a carry, computes ``e(c, x_t)`` for each t independently: the same
values are ``vmap(e, (None, 0))(c, xs)[t]``, computed before the loop and read
as a new sequence. Pinned equations (effects, random draws) stay. The cost
model moves only the matrix products that gain from batching (`cost.py`), with
the equations that compute their inputs.
"""
from __future__ import annotations

from lift.scan_rewrites import cost
from lift.scan_rewrites.hoist import hoisted
from lift.scan_rewrites.loop import available, closure_of, tainted
from lift.scan_rewrites.passes import per_loop
from lift.scan_rewrites.registry import rewrite

NAME = 'push_out_seq'


@rewrite(NAME)
def push_out_seq(closed, ctx):
  return per_loop(closed, ctx, _rewrite_loop)


def _rewrite_loop(loop, outer, ctx):
  body = loop.body.jaxpr
  consts, _, xs = loop.split_inputs(body.invars)
  if not xs:
    return None
  per_step = tainted(loop, set(xs))
  reachable = available(loop, set(consts) | set(xs))
  seq = [r and any(v in per_step for v in e.outvars) for e, r in zip(body.eqns, reachable)]
  if not any(seq):
    return None
  seeds = seq
  if ctx.cost_model:
    seeds = [s and cost.decide(ctx, NAME, loop, e, per_step) for e, s in zip(body.eqns, seq)]
    if not any(seeds):
      return None
  outside = closure_of(loop, reachable, seeds)
  removed = [o and s for o, s in zip(outside, seq)]
  step = hoisted(loop, outside, removed, per_step=True)
  if step is not None:
    moved = [e for e, m in zip(body.eqns, removed) if m]
    ctx.record(NAME, loop, True, f'{len(moved)} equation(s) batched over the {loop.length} steps, '
               f'before the loop: {cost.batched(ctx, loop, moved, per_step)}', moved=len(moved))
  return step
