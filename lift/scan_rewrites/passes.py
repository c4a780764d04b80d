"""Running rewrites over a jaxpr: loop by loop, inside nested jaxprs, to a fixed point."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from lift import _compat
from lift.scan_rewrites import program
from lift.scan_rewrites.loop import Loop, is_scan
from lift.scan_rewrites.registry import REWRITES, Context

MAX_ROUNDS = 4


@dataclasses.dataclass(frozen=True)
class Outer:
  """What a loop rewrite may know of the jaxpr around the loop."""
  readers: dict  # variable -> indices of the equations reading it (len(eqns): an output)
  constants: dict  # constant variable -> its concrete value


def outer_of(closed) -> Outer:
  constants = {v: c for v, c in zip(closed.jaxpr.constvars, closed.consts)
               if not isinstance(c, _compat.Tracer)}
  return Outer(program.uses(closed.jaxpr), constants)


def per_loop(closed, ctx: Context, rewrite_loop: Callable) -> object | None:
  """Applies ``rewrite_loop(loop, outer, ctx) -> Step | None`` to every scan of
  `closed` (not those nested in other equations); None if none changed."""
  outer = outer_of(closed)
  steps, changed = [], False
  for eqn in closed.jaxpr.eqns:
    step = rewrite_loop(Loop(eqn), outer, ctx) if is_scan(eqn) else None
    changed |= step is not None
    steps.append(step or program.equation_step(eqn))
  return program.retrace(closed, steps) if changed else None


def optimize_jaxpr(closed, names: Sequence[str], ctx: Context, within=None):
  """`closed` with the named rewrites applied inside out: nested jaxprs first,
  then this one's loops, repeated until nothing changes. `within` is the
  equation `closed` is nested in (None for the traced function's jaxpr)."""
  with ctx.naming.level(closed, within):
    closed = _optimize_nested(closed, names, ctx)
    for _ in range(MAX_ROUNDS):
      changed = False
      for name in REWRITES:
        if name in names:
          ctx.naming.look_at(closed)
          new = REWRITES[name](closed, ctx)
          if new is not None:
            closed, changed = new, True
      if not changed:
        break
  return closed


def _optimize_nested(closed, names, ctx):
  steps, changed = [], False
  for eqn in closed.jaxpr.eqns:
    params = {k: _optimize_param(v, names, ctx, eqn) for k, v in eqn.params.items()}
    if all(params[k] is v for k, v in eqn.params.items()):
      steps.append(program.equation_step(eqn))
      continue
    changed = True
    steps.append(_scan_step(eqn, params['jaxpr']) if is_scan(eqn)
                 else program.equation_step(eqn.replace(params=params)))
  return program.retrace(closed, steps) if changed else closed


def _optimize_param(value, names, ctx, eqn):
  if isinstance(value, _compat.ClosedJaxpr):
    new = optimize_jaxpr(value, names, ctx, eqn)
    return value if new is value else new
  if isinstance(value, _compat.Jaxpr):  # open jaxprs (checkpoint, shard_map) take no constants
    new = optimize_jaxpr(_compat.ClosedJaxpr(value, []), names, ctx, eqn)
    return new.jaxpr if new.jaxpr is not value and not new.consts else value
  if isinstance(value, tuple) and value and all(
      isinstance(v, (_compat.ClosedJaxpr, _compat.Jaxpr)) for v in value):
    new = tuple(_optimize_param(v, names, ctx, eqn) for v in value)
    return value if all(a is b for a, b in zip(new, value)) else new
  return value


def _scan_step(eqn, body) -> program.Step:
  """The scan `eqn` with a new body (whose constants may differ)."""
  loop = Loop(eqn)

  def run(*invals):
    consts, init, xs = loop.split_inputs(invals)

    def step(carry, x):
      outs = program.evaluate(body, [*consts, *carry, *x])
      return loop.split_outputs(outs)
    final, ys = loop.scan(step, init, xs)
    return final + ys
  return program.Step(eqn.invars, eqn.outvars, run, eqn)
