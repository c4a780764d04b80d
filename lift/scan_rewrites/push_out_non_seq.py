"""`push_out_non_seq`: compute once, before the loop, what reads only constants.

An equation moves if it is not pinned (no effects, no random draws) and every
input is a loop constant, a literal, or the result of a moved equation:
``e(c_1..c_n)`` is the same value at every step, so computing it once changes
no value. The moved results become new loop constants. The cost model leaves
equations that only lay data out (broadcasts, reshapes) in the loop unless
moved work reads them: XLA fuses them into their readers for free, and moved
out they become arrays the loop reads every step.
"""
from __future__ import annotations

from lift import _compat
from lift.scan_rewrites import origins
from lift.scan_rewrites.hoist import hoisted
from lift.scan_rewrites.loop import available, closure_of
from lift.scan_rewrites.passes import per_loop
from lift.scan_rewrites.registry import rewrite

NAME = 'push_out_non_seq'
LAYOUT = frozenset({'broadcast_in_dim', 'reshape', 'squeeze', 'expand_dims'})


@rewrite(NAME)
def push_out_non_seq(closed, ctx):
  return per_loop(closed, ctx, _rewrite_loop)


def _rewrite_loop(loop, outer, ctx):
  consts = loop.split_inputs(loop.body.jaxpr.invars)[0]
  movable = available(loop, set(consts))
  if ctx.cost_model and any(movable):
    work = [m and e.primitive.name not in LAYOUT for e, m in zip(loop.body.jaxpr.eqns, movable)]
    if not any(work):
      ctx.record(NAME, loop, False, 'only layout equations (broadcasts, reshapes) read only '
                 'constants: they are free inside the loop')
    movable = closure_of(loop, movable, work)
  if not any(movable):
    return None
  step = hoisted(loop, movable, movable, per_step=False)
  if step is not None:
    ctx.record(NAME, loop, True, _detail(ctx, loop, movable), moved=sum(movable))
  return step


def _detail(ctx, loop, movable) -> str:
  """What moved, by the code that traced it, and the constants it reads."""
  eqns = [e for e, m in zip(loop.body.jaxpr.eqns, movable) if m]
  consts = loop.split_inputs(loop.body.jaxpr.invars)[0]
  read = {v for e in eqns for v in e.invars if isinstance(v, _compat.Var)}
  named = [ctx.describe(loop, 'constant', i) for i, v in enumerate(consts) if v in read]
  work = origins.describe(eqns, ctx.naming.body(loop.eqn).source)
  return (f'{len(eqns)} equation(s) computed once before the loop instead of at each of the '
          f'{loop.length} steps: {work}; they read only '
          f'{", ".join(named) or "values fixed before the loop"}')
