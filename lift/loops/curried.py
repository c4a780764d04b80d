"""Curried `scan`, `fold` and `map` over any axis, with unscanned leaves passed to every step.

Rule: a leaf of `xs` is scanned iff it is an array (`jax.Array` or
`numpy.ndarray`) with `-ndim <= axis < ndim`; its `axis` is moved to the front
for the engine. Every other leaf (Python numbers, strings, None-like statics,
arrays of lower rank) is passed unchanged to every step. A stacked output
gets the step axis at `axis` if its stacked rank has that axis, else first
(so `map(jnp.sum, axis=1)` over a (2, 3) array gives shape (3,)).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lift.errors import ScanAxisError
from lift.loops import _messages
from lift.loops.engine import run_scan
from lift.loops.policies import Remat, resolve_remat


class AxisSplit(NamedTuple):
  """The leaves of `xs`, split into those scanned along the axis and the others."""
  treedef: Any
  scanned_mask: tuple[bool, ...]
  scanned: list[Any]
  unscanned: list[Any]


def is_scanned(leaf: Any, axis: int) -> bool:
  """Whether `leaf` is scanned along `axis` (see the module docstring).

  Examples:
    >>> is_scanned(np.zeros((2, 3)), -1), is_scanned(1.0, 0)
    (True, False)
  """
  if not isinstance(leaf, (jax.Array, np.ndarray)):
    return False
  return -leaf.ndim <= axis < leaf.ndim


def split_axis(xs: Any, axis: int) -> AxisSplit:
  """Splits `xs` into scanned leaves (axis moved to 0) and unscanned leaves."""
  leaves, treedef = jax.tree.flatten(xs)
  mask = tuple(is_scanned(leaf, axis) for leaf in leaves)
  scanned = [jnp.moveaxis(leaf, axis, 0) for leaf, hit in zip(leaves, mask) if hit]
  unscanned = [leaf for leaf, hit in zip(leaves, mask) if not hit]
  return AxisSplit(treedef, mask, scanned, unscanned)


def merge_axis(split: AxisSplit, slices: list[Any]) -> Any:
  """One step's `xs`: the scanned leaves' slices and the unscanned leaves."""
  scanned, unscanned = iter(slices), iter(split.unscanned)
  leaves = [next(scanned) if hit else next(unscanned) for hit in split.scanned_mask]
  return jax.tree.unflatten(split.treedef, leaves)


def _check_axis(axis: Any, name: str) -> int:
  if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
    raise ScanAxisError(_messages.AXIS_TYPE.format(axis=axis, name=name))
  return int(axis)


def _check_split(split: AxisSplit, axis: int, length: int | None, name: str) -> None:
  """``name``: the function called (`scan`, `fold` or `map`, which takes no ``length``)."""
  if split.scanned or length is not None:
    return
  # Nothing is scanned, so the unscanned leaves are all the leaves of xs.
  ranks = jax.tree.unflatten(split.treedef, [
      np.ndim(leaf) if isinstance(leaf, (jax.Array, np.ndarray)) else "static"
      for leaf in split.unscanned])
  if name == 'map':
    raise ScanAxisError(_messages.MAP_NOTHING.format(axis=axis, ranks=ranks))
  if any(isinstance(leaf, (jax.Array, np.ndarray)) for leaf in split.unscanned):
    raise ScanAxisError(_messages.AXIS_ABSENT.format(axis=axis, ranks=ranks, name=name))
  raise ScanAxisError(_messages.NO_LENGTH.format(name=name))


def _stack_at(ys: Any, axis: int) -> Any:
  def move(y):
    return jnp.moveaxis(y, 0, axis) if -y.ndim <= axis < y.ndim else y

  return ys if axis == 0 else jax.tree.map(move, ys)


def scan(f: Callable[[Any, Any], tuple[Any, Any]], axis: int = 0, *,
         remat: Remat = False, reverse: bool = False, unroll: int | bool = 1,
         length: int | None = None) -> Callable[[Any, Any], tuple[Any, Any]]:
  """Curried scan: `scan(f, axis)(init, xs) -> (carry, ys)`.

  `f(carry, x) -> (carry, y)` sees one slice of every scanned leaf of `xs` and
  every unscanned leaf whole (see the module docstring for the rule); `ys` are
  stacked at `axis`. `remat` is a checkpoint policy (`resolve_remat`),
  checked here. Prefer `jax.vmap` when steps do not depend on each other.

  Examples:
    >>> import jax.numpy as jnp
    >>> carry, ys = scan(lambda c, x: (c + x, c), axis=1)(jnp.zeros(2), jnp.ones((2, 3)))
    >>> carry.tolist(), ys.shape
    ([3.0, 3.0], (2, 3))
  """
  return _scan(f, axis, 'scan', remat=remat, reverse=reverse, unroll=unroll, length=length)


def _scan(f: Callable[[Any, Any], tuple[Any, Any]], axis: int, name: str, *, remat: Remat = False,
          reverse: bool = False, unroll: int | bool = 1,
          length: int | None = None) -> Callable[[Any, Any], tuple[Any, Any]]:
  """`scan`, its messages naming ``name`` (the function the user called)."""
  axis = _check_axis(axis, name)
  resolve_remat(remat)

  def scanned(init: Any, xs: Any) -> tuple[Any, Any]:
    split = split_axis(xs, axis)
    _check_split(split, axis, length, name)

    def body(carry, slices):
      return f(carry, merge_axis(split, slices))

    carry, ys = run_scan(body, init, split.scanned, length=length, reverse=reverse,
                         unroll=unroll, remat=remat)
    return carry, _stack_at(ys, axis)

  return scanned


def fold(f: Callable[[Any, Any], Any], axis: int = 0, *, remat: Remat = False,
         reverse: bool = False, unroll: int | bool = 1,
         length: int | None = None) -> Callable[[Any, Any], Any]:
  """Curried fold: `fold(f, axis)(init, xs) -> carry`, with `f(carry, x) -> carry`.

  Same slicing rules and `remat` policies as `scan`, without stacked outputs.
  Not when the per-step outputs are needed: use `scan`.

  Examples:
    >>> import jax.numpy as jnp
    >>> float(fold(lambda c, x: c * x, remat=True)(1.0, jnp.arange(1.0, 5.0)))
    24.0
  """
  step = lambda carry, x: (f(carry, x), None)
  run = _scan(step, axis, 'fold', remat=remat, reverse=reverse, unroll=unroll, length=length)
  return lambda init, xs: run(init, xs)[0]


def map(f: Callable[[Any], Any], axis: int = 0) -> Callable[[Any], Any]:  # noqa: A001 (Haliax's name)
  """Curried sequential map: `map(f, axis)(xs)` applies `f` to each slice along `axis`.

  Uses the memory of one step at a time; prefer `jax.vmap` when memory allows.

  Examples:
    >>> import jax.numpy as jnp
    >>> map(lambda x: x.sum(), axis=1)(jnp.ones((2, 3))).tolist()
    [2.0, 2.0, 2.0]
  """
  run = _scan(lambda carry, x: (carry, f(x)), axis, 'map')
  return lambda xs: run(None, xs)[1]
