"""`merge`: independent loops of the same length and direction become one.

Loops A (earlier) and B can merge if B reads nothing A computes (directly or
through equations between them), the equations between them that B needs have
no effects (they move in front of A), and at most one of A and B has effects.
The merged body runs A's body, then B's, on their own inputs: each output is the
same value. The cost model merges loops that read a common input (their common
work is then done once, as Aesara's motivation for the rewrite says).
"""
from __future__ import annotations

from lift import _compat
from lift.scan_rewrites import program
from lift.scan_rewrites.loop import Loop, is_scan
from lift.scan_rewrites.registry import rewrite

NAME = 'merge'


def _same_shape(a, b) -> bool:
  keys = ('length', 'reverse', 'unroll')
  return all(a.params[k] == b.params[k] for k in keys)


def _between(eqns, a: int, b: int):
  """(whether B reads A, the equations between A and B that B needs, by index)."""
  from_a = set(eqns[a].outvars)
  for eqn in eqns[a + 1:b]:
    if any(v in from_a for v in eqn.invars if isinstance(v, _compat.Var)):
      from_a.update(eqn.outvars)
  reads_a = any(v in from_a for v in eqns[b].invars if isinstance(v, _compat.Var))
  needed = {v for v in eqns[b].invars if isinstance(v, _compat.Var)}
  deps = []
  for i in reversed(range(a + 1, b)):
    if any(v in needed for v in eqns[i].outvars):
      deps.append(i)
      needed.update(v for v in eqns[i].invars if isinstance(v, _compat.Var))
  return reads_a, sorted(deps)


def _shares_input(a, b) -> bool:
  return bool({v for v in a.invars if isinstance(v, _compat.Var)} &
              {v for v in b.invars if isinstance(v, _compat.Var)})


def _pair(eqns, ctx):
  """The first pair of loops (a, b, needed equations between) that may merge."""
  loops = [i for i, e in enumerate(eqns) if is_scan(e)]
  for ia, a in enumerate(loops):
    for b in loops[ia + 1:]:
      if not _same_shape(eqns[a], eqns[b]) or (eqns[a].effects and eqns[b].effects):
        continue
      reads_a, deps = _between(eqns, a, b)
      if reads_a or any(eqns[i].effects for i in deps):
        continue
      if ctx.cost_model and not _shares_input(eqns[a], eqns[b]):
        ctx.record(NAME, Loop(eqns[b]), False, f'could merge with loop {_number(ctx, eqns[a])} but '
                   'shares no input with it: there is no common work to do once')
        continue
      return a, b, deps
  return None


def _merged_step(first: Loop, second: Loop) -> program.Step:
  n_first = len(first.eqn.invars)

  def run(*invals):
    parts = first.split_inputs(invals[:n_first]), second.split_inputs(invals[n_first:])
    (ca, ia, xa), (cb, ib, xb) = parts

    def step(carry, x):
      outs_a = program.evaluate(first.body, [*ca, *carry[:len(ia)], *x[:len(xa)]])
      outs_b = program.evaluate(second.body, [*cb, *carry[len(ia):], *x[len(xa):]])
      (ka, ya), (kb, yb) = first.split_outputs(outs_a), second.split_outputs(outs_b)
      return ka + kb, ya + yb
    final, ys = first.scan(step, [*ia, *ib], [*xa, *xb])
    n_ya = len(first.eqn.outvars) - len(ia)
    return final[:len(ia)] + ys[:n_ya] + final[len(ia):] + ys[n_ya:]
  return program.Step([*first.eqn.invars, *second.eqn.invars],
                      [*first.eqn.outvars, *second.eqn.outvars], run, first.eqn)


@rewrite(NAME)
def merge(closed, ctx):
  changed = False
  while (pair := _pair(closed.jaxpr.eqns, ctx)) is not None:
    a, b, deps = pair
    eqns = closed.jaxpr.eqns
    first, second = Loop(eqns[a]), Loop(eqns[b])
    ctx.record(NAME, first, True, f'merged with loop {_number(ctx, second.eqn)} ({second.where()}): '
               f'the same {first.length} steps, and it reads nothing this loop computes')
    order = ([program.equation_step(e) for e in eqns[:a]] +
             [program.equation_step(eqns[i]) for i in deps] + [_merged_step(first, second)] +
             [program.equation_step(eqns[i]) for i in range(a + 1, b) if i not in deps] +
             [program.equation_step(e) for e in eqns[b + 1:]])
    closed, changed = program.retrace(closed, order), True
    ctx.naming.look_at(closed)
  return closed if changed else None


def _number(ctx, eqn) -> int:
  return ctx.naming.loop(eqn).number
