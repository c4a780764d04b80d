"""Snapshots of `RngCounters` trees, for transforms that trace a function more than once.

`cond` and `switch` trace every branch from the same counters and leave the
elementwise maximum behind; `while_loop`'s condition and body draw one after
the other; `jit` traces with zeroed counters to learn how far one call advances them
(or, where keys must be hashed while tracing, from the current ones).
Counter nodes are changed in place and never replaced, because child scopes
hold references to them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax

from lift.rng import RngCounters
from lift.scope import Scope


class CountSnapshot(NamedTuple):
  """The draw counts of one counter node and of its named children."""
  counts: Mapping[str, int]
  children: Mapping[str, CountSnapshot]


EMPTY = CountSnapshot({}, {})


def snapshot(node: RngCounters) -> CountSnapshot:
  return CountSnapshot(dict(node.counts),
                       {name: snapshot(child) for name, child in node.children.items()})


def restore(node: RngCounters, snap: CountSnapshot):
  """Sets ``node``'s counts to ``snap``; children missing from ``snap`` count from zero again."""
  node.counts = dict(snap.counts)
  for name, child in node.children.items():
    restore(child, snap.children.get(name, EMPTY))
  for name, child_snap in snap.children.items():
    restore(node.child(name), child_snap)


def advance(node: RngCounters, increments: CountSnapshot):
  """Adds ``increments`` to ``node``'s counts, creating children as needed."""
  for stream, n in increments.counts.items():
    node.counts[stream] = node.counts.get(stream, 0) + n
  for name, child_increments in increments.children.items():
    advance(node.child(name), child_increments)


def per_stream(before: CountSnapshot, after: CountSnapshot, keep_before) -> CountSnapshot:
  """``before``'s count for the streams where ``keep_before(stream)``, ``after``'s for the others."""
  streams = dict.fromkeys([*before.counts, *after.counts])
  counts = {s: (before if keep_before(s) else after).counts.get(s, 0) for s in streams}
  names = dict.fromkeys([*before.children, *after.children])
  children = {name: per_stream(before.children.get(name, EMPTY), after.children.get(name, EMPTY),
                               keep_before) for name in names}
  return CountSnapshot(counts, children)


def elementwise_max(snaps: Sequence[CountSnapshot]) -> CountSnapshot:
  counts: dict[str, int] = {}
  names: dict[str, None] = {}
  for snap in snaps:
    for stream, n in snap.counts.items():
      counts[stream] = max(counts.get(stream, 0), n)
    names.update(dict.fromkeys(snap.children))
  children = {name: elementwise_max([s.children.get(name, EMPTY) for s in snaps]) for name in names}
  return CountSnapshot(counts, children)


def count_at(node: RngCounters, path: Sequence[str], stream: str) -> int:
  """The count of ``stream`` at the node ``path`` below ``node`` (0 if it does not exist yet)."""
  for name in path:
    if name not in node.children:
      return 0
    node = node.children[name]
  return node.counts.get(stream, 0)


def counter_roots(scope_tree: Any) -> list[RngCounters]:
  """The counter nodes of the distinct root scopes of a scope tree, in order."""
  leaves = jax.tree.leaves(scope_tree, is_leaf=lambda x: isinstance(x, Scope))
  nodes: dict[int, RngCounters] = {}
  for scope in leaves:
    nodes.setdefault(id(scope.root.rng_counters), scope.root.rng_counters)
  return list(nodes.values())


@contextlib.contextmanager
def zeroed(nodes: Sequence[RngCounters]) -> Iterator[list[CountSnapshot]]:
  """Runs the body with ``nodes`` counting from zero, then restores them.

  Yields a list that receives each node's increments when the body succeeds.
  """
  saved = [snapshot(node) for node in nodes]
  increments: list[CountSnapshot] = []
  for node in nodes:
    restore(node, EMPTY)
  try:
    yield increments
    increments.extend(snapshot(node) for node in nodes)
  finally:
    for node, snap in zip(nodes, saved):
      restore(node, snap)


def _minus(after: CountSnapshot, before: CountSnapshot) -> CountSnapshot:
  counts = {s: n - before.counts.get(s, 0) for s, n in after.counts.items()
            if n != before.counts.get(s, 0)}
  children = {name: _minus(child, before.children.get(name, EMPTY))
              for name, child in after.children.items()}
  return CountSnapshot(counts, children)


@contextlib.contextmanager
def measured(nodes: Sequence[RngCounters]) -> Iterator[list[CountSnapshot]]:
  """Runs the body from the current counts, then restores them.

  Yields a list that receives each node's increments when the body succeeds.
  """
  saved = [snapshot(node) for node in nodes]
  increments: list[CountSnapshot] = []
  try:
    yield increments
    increments.extend(_minus(snapshot(node), snap) for node, snap in zip(nodes, saved))
  finally:
    for node, snap in zip(nodes, saved):
      restore(node, snap)


def total(node: RngCounters) -> int:
  """All draws counted at ``node`` and below it."""
  return sum(node.counts.values()) + sum(total(child) for child in node.children.values())


def frozen(snap: CountSnapshot) -> tuple:
  """A hashable form of ``snap`` (a cache key part); zero counts and empty nodes left out."""
  children = ((name, frozen(child)) for name, child in snap.children.items())
  return (tuple(sorted((s, n) for s, n in snap.counts.items() if n)),
          tuple(sorted((name, child) for name, child in children if child != ((), ()))))


class SharedStart:
  """Lets several traces of one lifted call start from the same rng counters.

  Call :meth:`begin` at the start of every trace and :meth:`end` after it;
  :meth:`finish` leaves the elementwise maximum of all ends, so keys drawn
  after the transform are fresh whichever trace ran.
  """

  def __init__(self):
    self.nodes: list[RngCounters] | None = None
    self.start: list[CountSnapshot] = []
    self.ends: list[list[CountSnapshot]] = []

  def begin(self, scope_tree: Any):
    if self.nodes is None:
      self.nodes = counter_roots(scope_tree)
      self.start = [snapshot(node) for node in self.nodes]
    for node, snap in zip(self.nodes, self.start):
      restore(node, snap)

  def end(self):
    self.ends.append([snapshot(node) for node in self.nodes or ()])

  def finish(self):
    for i, node in enumerate(self.nodes or ()):
      restore(node, elementwise_max([end[i] for end in self.ends]))


class Chained:
  """Lets functions that run one after another (a loop's condition, then its body) draw in turn.

  The function at position i of ``order`` starts where the one before it
  ended, so their keys differ; tracing one again restarts it from the same
  point. :meth:`finish` leaves the counters where the last one ended.
  """

  def __init__(self, order: Sequence[str]):
    self.order = tuple(order)
    self.nodes: list[RngCounters] | None = None
    self.ends: dict[str, list[CountSnapshot]] = {}

  def begin(self, name: str, scope_tree: Any):
    if self.nodes is None:
      self.nodes = counter_roots(scope_tree)
      self.ends['start'] = [snapshot(node) for node in self.nodes]
    done = [n for n in ('start',) + self.order[:self.order.index(name)] if n in self.ends]
    for node, snap in zip(self.nodes, self.ends[done[-1]]):
      restore(node, snap)

  def end(self, name: str):
    self.ends[name] = [snapshot(node) for node in self.nodes or ()]

  def finish(self):
    last = [n for n in ('start',) + self.order if n in self.ends]
    for node, snap in zip(self.nodes or (), self.ends[last[-1]] if last else ()):
      restore(node, snap)
