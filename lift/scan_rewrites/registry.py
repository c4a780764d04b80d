"""The rewrites by name, in the order they run, and the record of what they did."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Decision:
  """One rewrite at one scan: whether it was applied, where, and why."""
  rewrite: str
  where: str
  applied: bool
  detail: str

  def __str__(self) -> str:
    mark = 'applied' if self.applied else 'declined'
    return f'{self.rewrite:<21} {mark:<8}  {self.where}: {self.detail}'


@dataclasses.dataclass
class Context:
  """What a rewrite is told: whether the cost model decides (else every legal
  site is rewritten), whether a backward pass will follow, and where to record
  its decisions."""
  cost_model: bool
  differentiated: bool = False  # whether the program has, or its caller adds, a backward pass
  decisions: list[Decision] = dataclasses.field(default_factory=list)

  def record(self, rewrite: str, where: str, applied: bool, detail: str) -> None:
    decision = Decision(rewrite, where, applied, detail)
    if decision not in self.decisions:
      self.decisions.append(decision)


# name -> rewrite(closed_jaxpr, context) -> new closed jaxpr, or None if nothing changed.
REWRITES: dict[str, Callable] = {}


def rewrite(name: str):
  """Registers a rewrite under `name`; the registration order is the run order."""
  def register(fn):
    REWRITES[name] = fn
    return fn
  return register
