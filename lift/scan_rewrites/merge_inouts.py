"""`merge_inouts`: one input for inputs passed twice, one output for outputs
computed twice, and no loop at all for values the loop only passes through.

- Constants or sequences given the same outer value are one input.
- Carries are equal if they start from the same value and their updates are the
  same computation, assuming they are equal (true at step 0, and then at every
  step by induction); equal carries are one carry. Stacked outputs computed by
  the same equations from the same inputs are one output.
- A carry whose update is itself is its initial value; a stacked output that
  is a sequence input is that sequence.
Equal computations are found by value numbering the body (pinned equations
are never equal to another).
"""
from __future__ import annotations

from lift import _compat
from lift.scan_rewrites import program
from lift.scan_rewrites.passes import per_loop
from lift.scan_rewrites.registry import rewrite

NAME = 'merge_inouts'


@rewrite(NAME)
def merge_inouts(closed, ctx):
  return per_loop(closed, ctx, _rewrite_loop)


def _key(atom):
  return ('literal', repr(atom.val), str(atom.aval)) if isinstance(atom, _compat.Literal) else atom


def _params_key(eqn):
  try:
    key = tuple(sorted(eqn.params.items()))
    hash(key)
    return key
  except TypeError:
    return id(eqn)


def _numbers(body, input_ids) -> dict:
  """Value numbers of the body's variables, given those of its inputs."""
  ids = dict(zip(body.jaxpr.invars, input_ids))
  ids.update((v, ('const', i)) for i, v in enumerate(body.jaxpr.constvars))
  table: dict = {}
  for eqn in body.jaxpr.eqns:
    ins = tuple(ids[v] if isinstance(v, _compat.Var) else _key(v) for v in eqn.invars)
    key = id(eqn) if program.is_pinned(eqn) else (eqn.primitive, _params_key(eqn), ins)
    number = table.setdefault(key, len(table))
    ids.update((v, (number, k)) for k, v in enumerate(eqn.outvars))
  return ids


def _carry_classes(loop, outer_ids):
  """Value numbers for the carries: refined until equal carries have equal updates."""
  body = loop.body.jaxpr
  n_c, n_k = loop.counts
  carry_ids: list[tuple] = [('carry', outer_ids[n_c + i]) for i in range(n_k)]
  while True:
    ids = _numbers(loop.body, outer_ids[:n_c] + carry_ids + outer_ids[n_c + n_k:])
    out = [ids.get(v, _key(v)) if isinstance(v, _compat.Var) else _key(v) for v in body.outvars]
    refined = [(c, out[i]) for i, c in enumerate(carry_ids)]
    groups = {r: k for k, r in reversed(list(enumerate(refined)))}
    new_ids = [('carry', groups[r]) + c[1:] for r, c in zip(refined, carry_ids)]
    if len(set(new_ids)) == len(set(carry_ids)):
      return carry_ids, out
    carry_ids = new_ids


def _rewrite_loop(loop, outer, ctx):
  body = loop.body.jaxpr
  n_c, n_k = loop.counts
  roles = ['const'] * n_c + ['carry'] * n_k + ['sequence'] * (len(loop.eqn.invars) - n_c - n_k)
  outer_ids = [(role, _key(a)) for role, a in zip(roles, loop.eqn.invars)]
  carry_ids, out = _carry_classes(loop, outer_ids)
  b_consts, b_carry, b_xs = loop.split_inputs(body.invars)
  carry_out, ys_out = loop.split_outputs(body.outvars)
  fixed = [out[i] == carry_ids[i] for i in range(n_k)]  # carries whose update is themselves
  through = {j: b_xs.index(v) for j, v in enumerate(ys_out) if v in b_xs}
  first = lambda ids, i: ids.index(ids[i])
  inputs = outer_ids[:n_c] + carry_ids + outer_ids[n_c + n_k:]
  rep_in = [first(inputs, i) for i in range(len(inputs))]
  rep_y = [first(out[n_k:], j) for j in range(len(ys_out))]
  merged = sum(r != i for i, r in enumerate(rep_in)) + sum(r != j for j, r in enumerate(rep_y))
  if not merged and not any(fixed) and not through:
    return None
  ctx.record(NAME, loop, True, _detail(ctx, loop, rep_in, rep_y, fixed, through))
  keep_in = [r == i and not (n_c <= i < n_c + n_k and fixed[i - n_c]) for i, r in enumerate(rep_in)]
  keep_y = [r == j and j not in through for j, r in enumerate(rep_y)]
  carry_keep = keep_in[n_c:n_c + n_k]

  def run(*invals):
    vals = list(invals)
    c_vals, init, x_vals = loop.split_inputs(vals)
    pick = lambda seq, keep: [s for s, k in zip(seq, keep) if k]
    carry_const = [v for v, f in zip(init, fixed) if f]

    def step(carry, x):
      known = dict(zip(pick(range(len(vals)), keep_in), [*pick(c_vals, keep_in[:n_c]), *carry, *x]))
      fixed_it = iter(carry_const)
      args = [known[rep_in[i]] if keep_in[rep_in[i]] else None for i in range(len(vals))]
      args = [next(fixed_it) if (n_c <= i < n_c + n_k and fixed[i - n_c]) else a for i, a in enumerate(args)]
      outs = program.evaluate(loop.body, args)
      k_out, y_out = loop.split_outputs(outs)
      return pick(k_out, carry_keep), pick(y_out, keep_y)
    final, ys = loop.scan(step, pick(init, carry_keep), pick(x_vals, keep_in[n_c + n_k:]))
    final_by = dict(zip(pick(range(n_k), carry_keep), final))
    ys_by = dict(zip(pick(range(len(ys_out)), keep_y), ys))
    finals = [init[i] if fixed[i] else final_by[rep_in[n_c + i] - n_c] for i in range(n_k)]
    stacked = [x_vals[through[j]] if j in through else ys_by[rep_y[j]] for j in range(len(ys_out))]
    return finals + stacked
  return program.Step(loop.eqn.invars, loop.eqn.outvars, run, loop.eqn)


def _input(loop, i: int) -> tuple[str, int]:
  """(kind, index) of the loop's flat input `i`."""
  n_c, n_k = loop.counts
  return ('constant', i) if i < n_c else ('carry', i - n_c) if i < n_c + n_k else ('sequence', i - n_c - n_k)


def _detail(ctx, loop, rep_in, rep_y, fixed, through) -> str:
  """Which inputs and outputs became one, by name."""
  name = lambda kind, i: ctx.describe(loop, kind, i)
  parts = [f'{name(*_input(loop, i))} is {name(*_input(loop, r))}' for i, r in enumerate(rep_in) if r != i]
  parts += [f'{name("output", j)} is {name("output", r)}' for j, r in enumerate(rep_y) if r != j]
  parts += [f'{name("carry", k)} never changes: its initial value' for k, f in enumerate(fixed) if f]
  parts += [f'{name("output", j)} is {name("sequence", x)}, passed through' for j, x in through.items()]
  return 'merged inputs and outputs that hold the same values: ' + '; '.join(parts)
