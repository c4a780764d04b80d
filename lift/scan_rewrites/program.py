"""A jaxpr as a list of steps, and its re-tracing into a new jaxpr.

Every rewrite works the same way: it replaces some equations of a jaxpr by
`Step`s, Python functions over the values of the replaced equations' inputs,
and `retrace` traces the result back into a jaxpr. New scans are written with
`lax.scan` and batched work with `jax.vmap`, so JAX builds every new equation
and checks its types.
"""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable, Sequence

from lift import _compat

# Primitives that draw random bits: never moved out of a loop or batched, even
# where the values would not change, so that the number of draws never does.
RNG_PRIMITIVES = frozenset({
    'random_bits', 'random_split', 'random_fold_in', 'random_seed', 'threefry2x32',
    'rng_bit_generator', 'rng_uniform'})


@dataclasses.dataclass(frozen=True)
class Step:
  """Computes `outvars` from the values of `invars` with ``run(*values) -> list``."""
  invars: Sequence[Any]
  outvars: Sequence[Any]
  run: Callable[..., Sequence[Any]]
  source: Any = None  # the equation whose source location the new equations keep


def variables(atoms) -> set:
  """The variables among `atoms` (literals left out)."""
  return {a for a in atoms if isinstance(a, _compat.Var)}


def equation_step(eqn) -> Step:
  return Step(eqn.invars, eqn.outvars, lambda *args: _compat.bind_equation(eqn, list(args)), eqn)


def read(env: dict, atom):
  return atom.val if isinstance(atom, _compat.Literal) else env[atom]


def write(env: dict, variables, values) -> None:
  for var, value in zip(variables, values, strict=True):
    if not isinstance(var, _compat.DropVar):
      env[var] = value


def run_steps(steps: Sequence[Step], env: dict) -> None:
  for step in steps:
    with _compat.equation_context(step.source):
      outs = step.run(*[read(env, v) for v in step.invars])
    write(env, step.outvars, outs)


def run_equations(eqns, env: dict) -> None:
  """Evaluates `eqns` in order, reading and writing `env` (variable -> value)."""
  run_steps([equation_step(e) for e in eqns], env)


def evaluate(closed, args: Sequence[Any], steps: Sequence[Step] | None = None) -> list:
  """`closed` (a ClosedJaxpr) on `args`, its equations replaced by `steps` if given."""
  jaxpr = closed.jaxpr
  env: dict = {}
  write(env, jaxpr.constvars, closed.consts)
  write(env, jaxpr.invars, args)
  run_steps([equation_step(e) for e in jaxpr.eqns] if steps is None else steps, env)
  return [read(env, v) for v in jaxpr.outvars]


def retrace(closed, steps: Sequence[Step]):
  """The ClosedJaxpr computing what `closed` computes, with `steps` as its equations."""
  return _compat.traced_jaxpr(lambda *args: evaluate(closed, args, steps),
                              [v.aval for v in closed.jaxpr.invars])


def is_pinned(eqn) -> bool:
  """Whether `eqn` must stay where it is: it, or an equation nested in it, has
  effects or draws random bits."""
  if eqn.effects or eqn.primitive.name in RNG_PRIMITIVES:
    return True
  return any(is_pinned(e) for sub in _compat.subjaxprs(eqn) for e in sub.eqns)


def uses(jaxpr) -> dict:
  """For each variable of `jaxpr`, the indices of the equations that read it
  (`len(jaxpr.eqns)` stands for the jaxpr's outputs)."""
  readers: dict = {}
  for i, eqn in enumerate(jaxpr.eqns):
    for v in eqn.invars:
      if isinstance(v, _compat.Var):
        readers.setdefault(v, []).append(i)
  for v in jaxpr.outvars:
    if isinstance(v, _compat.Var):
      readers.setdefault(v, []).append(len(jaxpr.eqns))
  return readers


def live_equations(jaxpr, needed_outputs: Sequence[bool]) -> list[bool]:
  """For each equation, whether the needed outputs read it or it has effects."""
  return live(jaxpr.eqns, [v for v, n in zip(jaxpr.outvars, needed_outputs) if n])


def live(eqns, outputs) -> list[bool]:
  """For each of `eqns`, whether `outputs` read it or it has effects."""
  needed = variables(outputs)
  result = [False] * len(eqns)
  for i in reversed(range(len(eqns))):
    eqn = eqns[i]
    if eqn.effects or any(v in needed for v in eqn.outvars):
      result[i] = True
      needed.update(v for v in eqn.invars if isinstance(v, _compat.Var))
  return result


def without_dead_code(closed):
  """`closed` without the equations nothing reads (effects are kept); None if none."""
  live = live_equations(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
  if all(live):
    return None
  eqns = [e for e, keep in zip(closed.jaxpr.eqns, live) if keep]
  return retrace(closed, [equation_step(e) for e in eqns])
