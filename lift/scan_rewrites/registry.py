"""The rewrites by name, in the order they run, and the record of what they did."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from lift.scan_rewrites import names


@dataclasses.dataclass(frozen=True)
class Decision:
  """One rewrite at one scan: whether it was applied, where, and why.

  `loop` is the loop's number in the report (`ScanReport.loop_info`), and
  `moved` the number of equations the decision moved out of the loop.
  """
  rewrite: str
  where: str
  applied: bool
  detail: str
  loop: int = 0
  moved: int = 0

  def __str__(self) -> str:
    mark = 'applied' if self.applied else 'declined'
    return f'{self.rewrite:<21} {mark:<8}  {self.where}: {self.detail}'

  def line(self) -> str:
    """The decision under its loop's title: without the location."""
    mark = 'applied' if self.applied else 'declined'
    return f'{self.rewrite:<21} {mark:<8}  {self.detail}'


@dataclasses.dataclass
class Context:
  """What a rewrite is told: whether the cost model decides (else every legal
  site is rewritten), whether a backward pass will follow, what the program's
  loops and values are (`naming`), and where to record its decisions."""
  cost_model: bool
  differentiated: bool = False  # whether the program has, or its caller adds, a backward pass
  decisions: list[Decision] = dataclasses.field(default_factory=list)
  naming: names.Naming = dataclasses.field(default_factory=names.Naming)

  def record(self, rewrite: str, loop, applied: bool, detail: str, moved: int = 0) -> None:
    """Records a decision of `rewrite` at `loop` (a `Loop` of the current jaxpr)."""
    number = self.naming.loop(loop.eqn).number
    decision = Decision(rewrite, loop.where(), applied, detail, number, moved)
    if decision not in self.decisions:
      self.decisions.append(decision)

  def describe(self, loop, kind: str, index: int) -> str:
    """`loop`'s input or output `index` of `kind`, by what it holds (`names.describe`)."""
    return names.describe(self.naming, loop, kind, index)


# name -> rewrite(closed_jaxpr, context) -> new closed jaxpr, or None if nothing changed.
REWRITES: dict[str, Callable] = {}


def rewrite(name: str):
  """Registers a rewrite under `name`; the registration order is the run order."""
  def register(fn):
    REWRITES[name] = fn
    return fn
  return register
