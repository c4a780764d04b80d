"""`ScanReport`: what `explain_scans` found, grouped by loop, with a summary."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from lift import _compat
from lift.scan_rewrites.names import LoopInfo
from lift.scan_rewrites.registry import Decision


# The line under a loop no rewrite changed or declined: every loop of the program is listed.
NOTHING_MOVED = 'nothing moved: no rewrite applies to this loop'


@dataclasses.dataclass(frozen=True)
class ScanReport:
  """What `explain_scans` found: each rewrite's decision at each loop, the
  loops themselves, and the jaxprs before and after.

  Printed, it is a summary line (loops before and after, equations moved out
  of loops, bytes saved), then every loop: its number, role (forward, backward
  of which loop, a forward loop the backward pass runs again, nested in
  which), the user's function and line, and one line per decision naming the
  values and the code it concerns and the measured sizes that decided it
  (``nothing moved`` under a loop no rewrite changed).

  Examples:
    >>> def f(xs, w):  # sin(w) does not change from step to step
    ...   return jax.lax.scan(lambda c, x: (c + x, jnp.sin(w) * x), 0.0, xs)
    >>> report = lift.explain_scans(f, jnp.ones(3), 2.0)
    >>> report.applied, report.loops('after'), report.equations_moved
    (('push_out_non_seq',), 1, 2)
    >>> print(report.summary())
    scans: 1 before, 1 after; 2 equation(s) moved out of loops; 0 B saved (sequences, carries and stacked outputs: 28 B before, 28 B after)
    >>> print(report.decisions[0].detail)
    2 equation(s) computed once before the loop instead of at each of the 3 steps: `jnp.sin(w)` (f.<locals>.<lambda>, line 2); they read only constant 0 f32[] (w)
  """
  decisions: tuple[Decision, ...]
  before: Any
  after: Any
  loop_info: tuple[LoopInfo, ...] = ()

  @property
  def applied(self) -> tuple[str, ...]:
    """The names of the rewrites that changed the program, in order, once each."""
    return tuple(dict.fromkeys(d.rewrite for d in self.decisions if d.applied))

  def loops(self, which: str = 'after') -> int:
    """The number of scans in the jaxpr `which` ('before' or 'after'), nested ones included."""
    return count_scans(getattr(self, which).jaxpr)

  @property
  def equations_moved(self) -> int:
    """The equations the applied rewrites moved out of loops."""
    return sum(d.moved for d in self.decisions if d.applied)

  def stacked_bytes(self, which: str = 'after') -> int:
    """The bytes of the loops' sequences, carries and stacked outputs in the
    jaxpr `which` ('before' or 'after'), each array counted once."""
    return stacked_bytes(getattr(self, which).jaxpr)

  @property
  def bytes_saved(self) -> int:
    """``stacked_bytes('before') - stacked_bytes('after')``: negative where
    the rewrites store more (a product batched over the steps is stored whole)."""
    return self.stacked_bytes('before') - self.stacked_bytes('after')

  def summary(self) -> str:
    saved = self.bytes_saved
    memory = f'{_size(saved)} saved' if saved >= 0 else f'{_size(-saved)} more memory'
    return (f'scans: {self.loops("before")} before, {self.loops("after")} after; '
            f'{self.equations_moved} equation(s) moved out of loops; {memory} (sequences, carries '
            f'and stacked outputs: {_size(self.stacked_bytes("before"))} before, '
            f'{_size(self.stacked_bytes("after"))} after)')

  def __str__(self) -> str:
    lines = [self.summary()]
    if not self.decisions and not self.loop_info:
      lines.append('no rewrite applies')
    for info in self.loop_info:
      mine = [d for d in self.decisions if d.loop == info.number]
      lines += [info.title()] + ([f'  {d.line()}' for d in mine] or [f'  {NOTHING_MOVED}'])
    lines += [str(d) for d in self.decisions if d.loop not in {i.number for i in self.loop_info}]
    return '\n'.join(lines)


def _size(n: int) -> str:
  return f'{n} B' if n < 1024 else f'{n / 1024:.1f} KiB' if n < 1024 ** 2 else f'{n / 1024 ** 2:.1f} MiB'


def count_scans(jaxpr) -> int:
  """The scans of `jaxpr` and of the jaxprs nested in it."""
  return sum((eqn.primitive.name == 'scan') + sum(count_scans(sub) for sub in _compat.subjaxprs(eqn))
             for eqn in jaxpr.eqns)


def stacked_bytes(jaxpr) -> int:
  """The bytes of the sequences, final carries and stacked outputs of the
  scans of `jaxpr` (and of those nested in it), each variable once."""
  arrays: dict = {}
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'scan':
      seqs = eqn.invars[eqn.params['num_consts'] + eqn.params['num_carry']:]
      arrays.update((v, v.aval) for v in [*seqs, *eqn.outvars]
                    if isinstance(v, _compat.Var) and not isinstance(v, _compat.DropVar))
  inner = sum(stacked_bytes(sub) for eqn in jaxpr.eqns for sub in _compat.subjaxprs(eqn))
  return inner + sum(math.prod(a.shape) * a.dtype.itemsize for a in arrays.values())
