"""`remove_unused_inputs`: drop what a loop never reads, fold scalar constants in.

A body input is unused if no live equation reads it; a carry is live if its
final value is read after the loop or a live equation reads it; an output is
live if read after the loop. Equations with effects are always live. Constant
scalars passed as loop constants become literals of the body.
"""
from __future__ import annotations

import numpy as np

from lift import _compat
from lift.scan_rewrites import program
from lift.scan_rewrites.passes import per_loop
from lift.scan_rewrites.registry import rewrite

NAME = 'remove_unused_inputs'


@rewrite(NAME)
def remove_unused_inputs(closed, ctx):
  return per_loop(closed, ctx, _rewrite_loop)


def _live(loop, outer):
  """(live body equations, live carries, live ys), to a fixed point over carries."""
  body = loop.body.jaxpr
  final, ys = loop.split_outputs(loop.eqn.outvars)
  carry_in = loop.split_inputs(body.invars)[1]
  keep_y = [v in outer.readers for v in ys]
  keep_c = [v in outer.readers for v in final]
  while True:
    live = program.live_equations(body, keep_c + keep_y)
    read = {v for e, on in zip(body.eqns, live) if on for v in e.invars if isinstance(v, _compat.Var)}
    read |= {v for v, on in zip(body.outvars, keep_c + keep_y) if on and isinstance(v, _compat.Var)}
    more = [k or v in read for k, v in zip(keep_c, carry_in)]
    if more == keep_c:
      return live, read, keep_c, keep_y
    keep_c = more


def _constant_scalar(atom, outer):
  if isinstance(atom, _compat.Literal):
    return atom.val
  value = outer.constants.get(atom)
  return value if value is not None and np.size(value) == 1 and np.ndim(value) == 0 else None


def _rewrite_loop(loop, outer, ctx):
  body = loop.body.jaxpr
  live, read, keep_c, keep_y = _live(loop, outer)
  consts, _, xs = loop.split_inputs(body.invars)
  outer_consts = loop.split_inputs(loop.eqn.invars)[0]
  folded = [v in read and _constant_scalar(a, outer) is not None for v, a in zip(consts, outer_consts)]
  keep_const = [v in read and not f for v, f in zip(consts, folded)]
  keep_x = [v in read for v in xs]
  dropped = {'constant': [not k and not f for k, f in zip(keep_const, folded)],
             'sequence': [not k for k in keep_x], 'carry': [not k for k in keep_c],
             'output': [not k for k in keep_y]}
  if not any(any(d) for d in dropped.values()) and not any(folded) and all(live):
    return None
  ctx.record(NAME, loop, True, _detail(ctx, loop, dropped, folded, live))
  live_eqns = [e for e, on in zip(body.eqns, live) if on]
  pick = lambda seq, keep: [x for x, k in zip(seq, keep) if k]

  def run(*invals):
    c_vals, init, x_vals = loop.split_inputs(invals)
    fixed = [_constant_scalar(a, outer) for a in outer_consts]

    def step(carry, x):
      env: dict = {}
      program.write(env, body.constvars, loop.body.consts)
      program.write(env, pick(consts, keep_const), pick(c_vals, keep_const))
      program.write(env, pick(consts, folded), pick(fixed, folded))
      program.write(env, pick(loop.split_inputs(body.invars)[1], keep_c), carry)
      program.write(env, pick(xs, keep_x), x)
      program.run_equations(live_eqns, env)
      carry_out, ys = loop.split_outputs(body.outvars)
      return ([program.read(env, v) for v in pick(carry_out, keep_c)],
              [program.read(env, v) for v in pick(ys, keep_y)])

    if not any(keep_c) and not any(keep_y) and not live_eqns:
      return [None] * len(loop.eqn.outvars)
    final, ys = loop.scan(step, pick(init, keep_c), pick(x_vals, keep_x))
    final_it, ys_it = iter(final), iter(ys)
    return ([next(final_it) if k else None for k in keep_c] +
            [next(ys_it) if k else None for k in keep_y])
  return program.Step(loop.eqn.invars, loop.eqn.outvars, run, loop.eqn)


def _detail(ctx, loop, dropped: dict, folded: list, live: list) -> str:
  """What was dropped, by name, and why."""
  items = [ctx.describe(loop, kind, i) for kind, gone in dropped.items() for i, g in enumerate(gone) if g]
  parts = [f'dropped what nothing reads: {", ".join(items)}'] if items else []
  if not all(live):
    parts.append(f'dropped {live.count(False)} equation(s) whose results nothing reads')
  if any(folded):
    parts.append(f'folded in {sum(folded)} constant scalar(s) known when tracing: '
                 + ', '.join(ctx.describe(loop, 'constant', i) for i, f in enumerate(folded) if f))
  return '; '.join(parts)
