"""One `scan` equation, seen as its parts: consts, carries, sequences, outputs."""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable, Sequence

from jax import lax

from lift import _compat
from lift.scan_rewrites import program


def is_scan(eqn) -> bool:
  return eqn.primitive.name == 'scan'


@dataclasses.dataclass(frozen=True)
class Loop:
  """A scan equation. Outer inputs are ``consts + init + xs``; the body reads
  ``consts + carry + x`` and returns ``carry + y``; outer outputs are
  ``final carry + stacked ys``."""
  eqn: Any

  @property
  def body(self):
    return self.eqn.params['jaxpr']

  @property
  def length(self) -> int:
    return self.eqn.params['length']

  @property
  def reverse(self) -> bool:
    return self.eqn.params['reverse']

  @property
  def counts(self) -> tuple[int, int]:
    return self.eqn.params['num_consts'], self.eqn.params['num_carry']

  def split_inputs(self, seq: Sequence) -> tuple[list, list, list]:
    """(consts, carries, sequences) of outer inputs or body inputs."""
    c, k = self.counts
    seq = list(seq)
    return seq[:c], seq[c:c + k], seq[c + k:]

  def split_outputs(self, seq: Sequence) -> tuple[list, list]:
    """(carries, ys) of outer outputs or body outputs."""
    k = self.counts[1]
    return list(seq[:k]), list(seq[k:])

  def bound_body(self, env: dict, consts, carry, x) -> None:
    """Binds the body's constants and inputs in `env`."""
    body = self.body
    program.write(env, body.jaxpr.constvars, body.consts)
    program.write(env, body.jaxpr.invars, [*consts, *carry, *x])

  def scan(self, step: Callable, init: Sequence, xs: Sequence) -> tuple[list, list]:
    """`lax.scan` of ``step(carry, x) -> (carry, y)`` with this loop's length,
    direction and unrolling; carries and sequences are lists."""
    final, ys = lax.scan(step, list(init), list(xs), length=self.length,
                         reverse=self.reverse, unroll=self.eqn.params['unroll'],
                         _split_transpose=self.eqn.params.get('_split_transpose', False))
    return list(final), list(ys)

  def where(self) -> str:
    return _compat.source_summary(self.eqn)


def split_body(loop: Loop, outside: Sequence[bool], removed: Sequence[bool] | None = None
               ) -> tuple[list, list, list]:
  """The body's equations cut in two: (the equations computed outside the loop,
  those left inside, the cut variables: defined by removed equations and read
  inside or returned). `removed` (default `outside`) are the outside equations
  no longer computed inside; the others are computed in both places, as are
  constants (equations with no variable inputs)."""
  removed = outside if removed is None else removed
  eqns = loop.body.jaxpr.eqns
  constant = [not any(isinstance(v, _compat.Var) for v in e.invars) for e in eqns]
  out_eqns = [e for e, o, c in zip(eqns, outside, constant) if o or c]
  in_eqns = [e for e, r in zip(eqns, removed) if not r]
  defined = {v for e, r in zip(eqns, removed) if r for v in e.outvars}
  read_inside = program.variables([v for e in in_eqns for v in e.invars] + loop.body.jaxpr.outvars)
  cut = [v for e in out_eqns for v in e.outvars if v in defined and v in read_inside]
  return out_eqns, in_eqns, list(dict.fromkeys(cut))


def tainted(loop: Loop, sources: set) -> set:
  """The body variables computed from `sources` (body inputs)."""
  result = set(sources)
  for eqn in loop.body.jaxpr.eqns:
    if any(isinstance(v, _compat.Var) and v in result for v in eqn.invars):
      result.update(eqn.outvars)
  return result


def available(loop: Loop, sources: set, allowed: Callable[[Any], bool] = lambda e: True) -> list[bool]:
  """For each body equation, whether it can be computed from `sources` (body
  input variables) alone: it is not pinned, `allowed(eqn)`, and all its inputs
  are sources, literals or outputs of such equations. Constants (no variable
  inputs) are not counted as movable."""
  ok = set(sources)
  result = []
  for eqn in loop.body.jaxpr.eqns:
    vars_in = [v for v in eqn.invars if isinstance(v, _compat.Var)]
    movable = (bool(vars_in) and not program.is_pinned(eqn) and allowed(eqn)
               and all(v in ok for v in vars_in))
    constant = not vars_in and not program.is_pinned(eqn)
    if movable or constant:
      ok.update(eqn.outvars)
    result.append(movable)
  return result


def closure_of(loop: Loop, candidates: Sequence[bool], seeds: Sequence[bool]) -> list[bool]:
  """The seeds and the candidate equations that compute their inputs."""
  eqns = loop.body.jaxpr.eqns
  producer = {v: i for i, e in enumerate(eqns) for v in e.outvars}
  chosen = [False] * len(eqns)
  stack = [i for i, s in enumerate(seeds) if s]
  while stack:
    i = stack.pop()
    if chosen[i] or not candidates[i]:
      continue
    chosen[i] = True
    stack.extend(producer[v] for v in program.variables(eqns[i].invars) if v in producer)
  return chosen
