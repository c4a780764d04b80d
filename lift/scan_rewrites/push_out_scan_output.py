"""`push_out_scan_output`: batch over all steps, after the loop, the work that
only produces stacked outputs.

A body equation is in the loop's tail if no carry reads it: its results reach
only stacked outputs ``y_t`` (directly or through other tail equations). Then
``y_t = e(c, x_t, v_t)``, where ``v_t`` are the values it reads from the rest
of the body, and ``ys = vmap(e, (None, 0, 0))(c, xs, vs)``: the loop returns
the stacked ``vs`` instead and `e` runs once, batched, after it. Pinned
equations (effects, random draws) stay. The cost model moves only the matrix
products that gain from batching, with the tail equations that read them.
"""
from __future__ import annotations

import jax

from lift import _compat
from lift.scan_rewrites import cost, program
from lift.scan_rewrites.loop import tainted
from lift.scan_rewrites.passes import per_loop
from lift.scan_rewrites.registry import rewrite

NAME = 'push_out_scan_output'


@rewrite(NAME)
def push_out_scan_output(closed, ctx):
  return per_loop(closed, ctx, _rewrite_loop)


def _tail(loop) -> list[bool]:
  """For each body equation, whether only stacked outputs and tail equations read it."""
  body = loop.body.jaxpr
  carry_out = program.variables(loop.split_outputs(body.outvars)[0])
  ys = program.variables(loop.split_outputs(body.outvars)[1])
  readers = program.uses(body)
  tail = [False] * len(body.eqns)
  for i in reversed(range(len(body.eqns))):
    eqn = body.eqns[i]
    if program.is_pinned(eqn) or not any(isinstance(v, _compat.Var) for v in eqn.invars):
      continue
    outs = [v for v in eqn.outvars if not isinstance(v, _compat.DropVar)]
    tail[i] = bool(outs) and all(
        v not in carry_out and all(tail[j] if j < len(body.eqns) else v in ys
                                   for j in readers.get(v, [])) for v in outs)
  return tail


def _moved(loop, ctx, tail, per_step) -> list[bool]:
  """The tail equations to move: the paying products and all tail equations after them."""
  body = loop.body.jaxpr
  seeds = [t and any(v in per_step for v in e.invars if isinstance(v, _compat.Var))
           for e, t in zip(body.eqns, tail)]
  if ctx.cost_model:
    seeds = [s and cost.decide(ctx, NAME, loop, e, per_step) for e, s in zip(body.eqns, seeds)]
  moved, defined = [], set()
  for eqn, t, s in zip(body.eqns, tail, seeds):
    m = s or (t and any(v in defined for v in eqn.invars if isinstance(v, _compat.Var)))
    moved.append(m)
    if m:
      defined.update(eqn.outvars)
  return moved


def _rewrite_loop(loop, outer, ctx):
  body = loop.body.jaxpr
  consts, carries, xs = loop.split_inputs(body.invars)
  per_step = tainted(loop, set(carries) | set(xs))
  moved = _moved(loop, ctx, _tail(loop), per_step)
  if not any(moved):
    return None
  moved_eqns = [e for e, m in zip(body.eqns, moved) if m]
  kept_eqns = [e for e, m in zip(body.eqns, moved) if not m]
  defined = {v for e in moved_eqns for v in e.outvars}
  const_set, xs_set = set(consts) | set(body.constvars), set(xs)
  exports = list(dict.fromkeys(
      v for e in moved_eqns for v in e.invars
      if isinstance(v, _compat.Var) and v not in defined and v not in const_set and v not in xs_set))
  ys_out = loop.split_outputs(body.outvars)[1]
  stays = [not (isinstance(v, _compat.Var) and v in defined) for v in ys_out]
  ctx.record(NAME, loop, True,
             f'{len(moved_eqns)} equation(s) batched over the {loop.length} steps, after the loop '
             f'(the loop returns {len(exports)} value(s) they read instead): '
             f'{cost.batched(ctx, loop, moved_eqns, per_step)}', moved=len(moved_eqns))

  def after(c_vals, x_vals, e_vals):
    env: dict = {}
    program.write(env, body.constvars, loop.body.consts)
    program.write(env, consts, c_vals)
    program.write(env, xs, x_vals)
    program.write(env, exports, e_vals)
    program.run_equations(moved_eqns, env)
    return [program.read(env, v) for v, s in zip(ys_out, stays) if not s]

  def run(*invals):
    c_vals, init, x_vals = loop.split_inputs(invals)

    def step(carry, x):
      env: dict = {}
      program.write(env, body.constvars, loop.body.consts)
      program.write(env, body.invars, [*c_vals, *carry, *x])
      program.run_equations(kept_eqns, env)
      carry_out, ys = loop.split_outputs(body.outvars)
      kept_ys = [program.read(env, v) for v, s in zip(ys, stays) if s]
      return [program.read(env, v) for v in carry_out], kept_ys + [env[v] for v in exports]
    final, ys = loop.scan(step, init, x_vals)
    n_kept = sum(stays)
    batched = iter(jax.vmap(after, in_axes=(None, 0, 0))(c_vals, x_vals, ys[n_kept:]))
    kept = iter(ys[:n_kept])
    return final + [next(kept) if s else next(batched) for s in stays]
  return program.Step(loop.eqn.invars, loop.eqn.outvars, run, loop.eqn)
