"""`push_out_non_seq`: compute once, before the loop, what reads only constants.

An equation moves if it is not pinned (no effects, no random draws) and every
input is a loop constant, a literal, or the result of a moved equation:
``e(c_1..c_n)`` is the same value at every step, so computing it once changes
no value. The moved results become new loop constants.
"""
from __future__ import annotations

from lift.scan_rewrites.hoist import hoisted
from lift.scan_rewrites.loop import available
from lift.scan_rewrites.passes import per_loop
from lift.scan_rewrites.registry import rewrite

NAME = 'push_out_non_seq'


@rewrite(NAME)
def push_out_non_seq(closed, ctx):
  return per_loop(closed, ctx, _rewrite_loop)


def _rewrite_loop(loop, outer, ctx):
  consts = loop.split_inputs(loop.body.jaxpr.invars)[0]
  movable = available(loop, set(consts))
  if not any(movable):
    return None
  step = hoisted(loop, movable, movable, per_step=False)
  if step is not None:
    names = sorted({e.primitive.name for e, m in zip(loop.body.jaxpr.eqns, movable) if m})
    ctx.record(NAME, loop.where(), True,
               f'{sum(movable)} loop-invariant equation(s) computed once ({", ".join(names)})')
  return step
