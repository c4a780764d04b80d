"""Values with two time axes (attention scores) and what is proven about them.

Words used here and in `notes/0005-as-scan.md`:

* **pair**: a value varying along time on two axes, one of which is the
  query time (the step's own position) and the other the key time (the
  positions it looks at), like the scores `q @ k.T`. At step `t` the step
  holds row `t` of it: the query axis removed, the key axis whole (length
  `T`), read from a cache of the key-side operand that holds the elements up
  to `t` and zeros after.
* **upper part**: the entries of a pair whose key position comes after the
  query position. The step computes them from the cache's zeros, so they
  are correct only when they do not depend on the keys there: when a
  lower-triangular mask has replaced them by a known fill. What is known of
  the upper part is an `Upper`; a contraction or reduction over key time is
  causal exactly when the upper part is exact (or, for a product with a
  cached operand, exactly zero).
* **far part**: the entries whose key lies `window` or more positions
  before the query, once a band mask (a sliding window) proves a window.
  When both parts are the identity of every reduction and contraction over
  key time (a fill of -inf before the max, zero before the sum and the
  product with values), the step keeps ring caches of `window` keys
  instead of the whole history, and its rows hold `window` entries.
* **link**: which of a pair's two axes is the query. Two streams meeting in
  a product (`q @ k.T`) or an elementwise op (`pad[q] & pad[k]`) do not say;
  a reduction or contraction over one axis later does (that axis is key
  time). Pairs combined elementwise share one decision (a union-find with
  parity), and the step forms read it when they run, after conversion.

Entries are assumed finite (and divisors nonzero), unmasked scores smaller
in magnitude than `SCORE_BOUND / 10` (float16: a fortieth of its range), and
every query row to keep at least one key (under a causal mask, itself): so a
fill of `-1e9`, `finfo.min` or `-inf` stays hugely negative when scores are
added to it or the row's maximum subtracted, `exp` of it is zero, and zero
times or divided by a value stays zero.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lift import _compat
from lift.errors import ScanConversionError

ORIENTATION = (
    "as_scan cannot convert `{name}` at {where}: it treats axis {axis} of the "
    "two-time value from {origin} as key time, but an earlier operation treated "
    "it as query time (the positions the steps produce)."
)


class Upper(NamedTuple):
  """What is known of a pair's upper part (key position after query position).

  Attributes:
    exact: the step computes there what the full form computes.
    const: a scalar every upper entry equals (then `exact`), or None.
    neg_huge: every upper entry is -inf or hugely negative (`is_neg_huge`),
      so `exp` of it (minus a moderate value) is zero.
  """
  exact: bool
  const: Any = None
  neg_huge: bool = False


DIRTY = Upper(False)
EXACT = Upper(True)


# Unmasked scores are assumed below a tenth of this in magnitude; fills at or below
# half its negative (-1e9, also rounded to bfloat16's -999292928; finfo.min; -inf)
# are "hugely negative". Narrow dtypes use a quarter of their range instead.
SCORE_BOUND = 1e9


def is_neg_huge(value: Any, dtype: Any) -> bool:
  """Whether a scalar `value` is -inf or hugely negative for `dtype`."""
  if not jnp.issubdtype(dtype, jnp.floating):
    return False
  bound = min(SCORE_BOUND / 2, float(jnp.finfo(dtype).max) / 4)
  return bool(value <= -bound)


def constant(value: Any, dtype: Any) -> Upper:
  """The upper part of a value equal to `value` there."""
  value = np.asarray(value, dtype).item()
  return Upper(True, value, is_neg_huge(value, dtype))


class Link:
  """Which side of a pair is query time: a union-find node with parity.

  Side 0 and side 1 are the two axes a pair was created with (the operands
  of its product, in order). Unified links decide together; `flip` says a
  node's sides are its parent's swapped.
  """

  def __init__(self, origin: str):
    self.origin = origin
    self.parent: Link | None = None
    self.flip = False
    self.side: int | None = None  # at a root: the query side, once decided
    self.windows: dict[int, int] = {}  # at a root: per query side, a proven window
    self.ring_ok = True  # at a root: every consumer accepts rows of `window` keys

  def root(self) -> tuple[Link, bool]:
    node, flip = self, False
    while node.parent is not None:
      flip ^= node.flip
      node = node.parent
    return node, flip

  def query_side(self) -> int | None:
    """The side that is query time, or None while undecided."""
    root, flip = self.root()
    return None if root.side is None else root.side ^ flip

  def decide(self, side: int, error: ScanConversionError) -> None:
    """Makes `side` the query side; raises `error` if decided otherwise."""
    root, flip = self.root()
    if root.side is None:
      root.side = side ^ flip
    elif root.side ^ flip != side:
      raise error

  def window_of(self, side: int) -> int | None:
    """The window a band mask proved when `side` is the query, if any."""
    root, flip = self.root()
    return root.windows.get(side ^ flip)

  def propose_window(self, side: int, window: int) -> None:
    """Records a band mask's window; the first one proven is kept."""
    root, flip = self.root()
    root.windows.setdefault(side ^ flip, window)

  def refuse_ring(self) -> None:
    """A consumer needs the whole history: no ring caches."""
    self.root()[0].ring_ok = False

  def ring(self, length: int) -> int | None:
    """The ring size when the step keeps rows of `window` keys, else None.
    Read when the steps run, after conversion."""
    root, _ = self.root()
    window = self.window_of(self.query_side() or 0)
    return window if root.ring_ok and window and window < length else None

  def join(self, other: Link, flip: bool, error: ScanConversionError) -> None:
    """Unifies with `other`, whose side 0 is this link's side `flip`."""
    mine, my_flip = self.root()
    theirs, their_flip = other.root()
    relative = my_flip ^ their_flip ^ flip
    if mine is theirs:
      if relative:
        raise error
      return
    if mine.side is not None and theirs.side is not None:
      if mine.side != theirs.side ^ relative:
        raise error
    theirs.parent, theirs.flip = mine, relative
    if mine.side is None and theirs.side is not None:
      mine.side = theirs.side ^ relative
    for side, window in theirs.windows.items():
      mine.windows.setdefault(side ^ relative, window)
    mine.ring_ok = mine.ring_ok and theirs.ring_ok


class Pair(NamedTuple):
  """A value with two time axes.

  Attributes:
    axes: the axes of side 0 and side 1 of `link`.
    offset: as a stream's, for the query axis.
    uppers: per side, what is known of the upper part when that side is the
      query.
    link: the orientation decision shared with related pairs.
    fars: per side, what is known of the far part (for the link's window).
  """
  axes: tuple[int, int]
  offset: int
  uppers: tuple[Upper, Upper]
  link: Link
  fars: tuple[Upper, Upper] = (EXACT, EXACT)

  def sides(self) -> tuple[int, int]:
    """`(query axis, key axis)`; side 0 is query while undecided."""
    side = self.link.query_side() or 0
    return self.axes[side], self.axes[1 - side]

  def oriented(self, key_axis: int, name: str, where: str) -> tuple[int, Upper]:
    """Decides that `key_axis` is key time; returns the query axis and the
    upper part in that orientation."""
    side = 1 - self.axes.index(key_axis)
    self.link.decide(side, ScanConversionError(ORIENTATION.format(
        name=name, where=where, axis=key_axis, origin=self.link.origin)))
    return self.axes[side], self.uppers[side]


def _uniform(values) -> Upper:
  values = np.unique(np.asarray(values))
  return constant(values[0], values.dtype) if values.size == 1 else EXACT


def _band(moved) -> int | None:
  """The smallest window w such that every entry with key <= query - w holds
  one value, other than the diagonal's: a band mask. `moved`: query, key
  axes first."""
  diagonal = np.unique(np.diagonal(moved, 0, 0, 1))
  value, window = None, None
  for distance in range(moved.shape[0] - 1, 0, -1):
    values = np.unique(np.diagonal(moved, -distance, 0, 1))
    if values.size != 1 or (value is not None and values[0] != value):
      break
    value, window = values[0], distance
  if window is None or (diagonal.size == 1 and diagonal[0] == value):
    return None
  return window


def known_regions(value: Any, axes: tuple[int, int], out_shape,
                  windows: tuple[int | None, int | None]):
  """Per side as query: `(upper part, far part, band window)` of a value
  known at conversion time.

  A concrete array is read: a uniform part is a constant. A traced value
  (weights inside `jit`) is exact: the step indexes its rows. The far part
  is taken for `windows[side]`, or for the array's own band if none.
  """
  if value is None or isinstance(value, _compat.Tracer):
    return [(EXACT, EXACT, None)] * 2
  array = np.asarray(value)
  if array.ndim == 0:
    return [(constant(array, array.dtype), constant(array, array.dtype), None)] * 2
  full = np.broadcast_to(array, out_shape)
  regions = []
  for side, (query, key) in enumerate((axes, axes[::-1])):
    moved = np.moveaxis(full, (query, key), (0, 1))
    rows, cols = np.indices(moved.shape[:2])
    band = _band(moved)
    window = windows[side] or band
    upper = _uniform(moved[cols > rows])
    far = _uniform(moved[cols <= rows - window]) if window else EXACT
    regions.append((upper, far, band))
  return regions


def _all_const(uppers) -> bool:
  return all(u.const is not None for u in uppers)


def _fold(primitive, params, uppers, dtypes) -> Upper:
  """The upper part when every operand's is a constant: evaluate the op."""
  args = [np.asarray(u.const, d) for u, d in zip(uppers, dtypes)]
  params = {k: (None if k in ("sharding", "out_sharding") else v)
            for k, v in params.items()}
  with jax.ensure_compile_time_eval():
    out = primitive.bind(*args, **params)
  out = out[0] if primitive.multiple_results else out
  return constant(np.asarray(out), out.dtype)


_PASS_THROUGH = {"stop_gradient", "copy", "reduce_precision", "convert_element_type",
                 "optimization_barrier", "name"}


def elementwise_upper(primitive, params, uppers, dtypes, out_dtype) -> Upper:
  """The upper part of an elementwise op's result, from its operands'.

  Args:
    primitive: the op; `params` its parameters.
    uppers: per operand, its upper part.
    dtypes: per operand, its dtype.
    out_dtype: the result's dtype.
  """
  name = primitive.name
  if _all_const(uppers):
    return _fold(primitive, params, uppers, dtypes)
  exact = all(u.exact for u in uppers)
  if name == "select_n" and uppers[0].const is not None:
    return uppers[1 + int(uppers[0].const)]
  if name in ("and", "or"):
    absorbing = name == "or"
    if any(u.const is not None and bool(u.const) == absorbing
           and dtypes[i] == np.bool_ for i, u in enumerate(uppers)):
      return constant(absorbing, np.bool_)
  if name in _PASS_THROUGH:
    floating = jnp.issubdtype(out_dtype, jnp.floating)
    return Upper(exact, None, uppers[0].neg_huge and floating)
  if name == "add" and any(u.neg_huge for u in uppers):
    return _absorbed(uppers, exact)
  if name == "sub" and uppers[0].neg_huge and not uppers[1].neg_huge:
    return _absorbed(uppers[:1], exact)
  if name == "mul" and any(u.const is not None and u.const == 0 for u in uppers):
    return constant(0, out_dtype)
  if name == "div" and uppers[0].const is not None and uppers[0].const == 0:
    return constant(0, out_dtype)
  if name == "exp" and uppers[0].neg_huge:
    return constant(0, out_dtype)
  if name == "max" and all(u.neg_huge for u in uppers):
    return Upper(exact, None, True)
  return EXACT if exact else DIRTY


def _absorbed(huge, exact: bool) -> Upper:
  """Adding moderate values to hugely negative ones: -inf stays exact."""
  if any(u.const is not None and np.isneginf(u.const) for u in huge):
    return Upper(True, -np.inf, True)
  return Upper(exact, None, True)
