"""Rules for values with two time axes: attention written out, step by step.

A product of two streams along different free axes (`q @ k.T`), or an
elementwise op of two such streams (`pad[q] & pad[k]`), is a **pair** (see
`pairs.py`): the step keeps a cache of the key-side operand and computes one
row of it, every key position, per step. Elementwise ops, masks and shape ops
keep it a pair and track what is known of its upper part (keys after the
query). A reduction over key time (softmax's max and sum) or a contraction of
key time with another stream (weights @ values, that stream cached too) turns
it back into a stream, and is allowed only when the upper part is proven not
to matter: exact, or zero where the cached operand has no keys yet. Nothing
here matches a particular sequence of primitives: `flax.linen`'s
`dot_product_attention`, `jax.nn.dot_product_attention` and hand-written
attention all reduce to these rules.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from lift import _compat
from lift.causal import forms
from lift.causal import frames
from lift.causal import pairs
from lift.causal import rings
from lift.causal.interpreter import PAIR_RULES, Eqn, StepForm
from lift.causal.pairs import Link, Pair, Upper

LENGTHS = (
    "its two time axes have lengths {lengths}; a value pairing query and key "
    "time needs both of the sequence's length."
)
AXES_DIFFER = (
    "its operands vary along time on axes {axes}; only two time axes (query "
    "and key time) can meet in one value."
)
NOT_MASKED = (
    "it {what} over key time (axis {key} of a value from {origin}), but the "
    "entries for keys after the query are {state}. Mask them first with a "
    "causal mask built from iota/tril (jnp.where(mask, scores, -inf), "
    "make_causal_mask), lower-triangular in (query, key) = axes ({query}, {key})."
)
UPPER_STATES = {
    "dirty": "not masked (they depend on later elements, or on a mask that is not "
             "lower-triangular or is computed from data)",
    "not_zero": "not known to be zero",
}
BOTH_TIME_AXES = (
    "it {what} both time axes ({axes}) of a value from {origin}; only key time "
    "may be reduced."
)
QUERY_BATCH = (
    "it contracts key time of a value from {origin} while its query axis "
    "{query} is a batch dimension of the product; keep query time a free axis."
)
KEY_PARTNER = (
    "it contracts key time (axis {key}) of a value from {origin} with an operand "
    "whose time axis is not the partner of that axis; contract key time with the "
    "values' time axis."
)
KEEPS_PAIR = (
    "it keeps both time axes of a value from {origin} while contracting others; "
    "only elementwise ops, shape ops and reductions apply to such values."
)
SHAPE_TIME = "it changes the time axes {axes} of a value with two time axes."


def _origin(eqn: Eqn) -> str:
  return f"`{eqn.primitive.name}` at {eqn.where}"


def _link_error(eqn: Eqn, pair: Pair):
  return eqn.error(
      f"it combines values with two time axes whose query axes disagree "
      f"(from {pair.link.origin}).")


def _paired_operand(eqn: Eqn) -> int:
  return next(i for i, op in enumerate(eqn.operands) if op.pair is not None)


# ---------------------------------------------------------------- creating


def product_rule(eqn: Eqn, dimension_numbers, params) -> StepForm:
  """`q @ k.T`: two streams whose time axes are both free dimensions."""
  (lc, rc), (lb, rb) = dimension_numbers
  lhs, rhs = eqn.operands
  times = (forms.stream_axis(lhs), forms.stream_axis(rhs))
  lengths = (lhs.aval.shape[times[0]], rhs.aval.shape[times[1]])
  if lengths[0] != lengths[1]:
    raise eqn.error(LENGTHS.format(lengths=lengths))
  free = [[d for d in range(op.aval.ndim) if d not in c and d not in b]
          for op, c, b in zip(eqn.operands, (lc, rc), (lb, rb))]
  out_axes = (len(lb) + free[0].index(times[0]),
              len(lb) + len(free[0]) + free[1].index(times[1]))
  link = Link(_origin(eqn))
  pair = Pair(out_axes, eqn.offset, (pairs.DIRTY, pairs.DIRTY), link)
  length = lengths[0]

  def numbers_without(query: int):
    dims = [[lc, rc], [lb, rb]]
    for group in dims:
      group[query] = forms.drop_dim(group[query], times[query])
    return tuple(tuple(tuple(d) for d in group) for group in dims)

  def layout(query: int) -> rings.DotLayout:
    key = 1 - query
    return rings.DotLayout.of(eqn.operands[key].aval, times[key], numbers_without(query), key)

  def step(cache, index, args):
    query = link.query_side() or 0
    stored = layout(query)
    cache = rings.write(cache, stored.frame(args[1 - query]), index, stored.axis,
                        link.ring(length))
    operands = [stored.read(cache)] * 2
    operands[query] = args[query]
    return cache, forms.bind(eqn, operands, params, dimension_numbers=stored.numbers)

  def prefill(args):
    query = link.query_side() or 0
    key = 1 - query
    aval, axis = eqn.operands[key].aval, times[key]
    cache = rings.from_prefix(aval, args[key], axis, eqn.offset, None)
    operands = [cache, cache]
    operands[query] = args[query]
    outs = forms.bind(eqn, operands, params, dimension_numbers=dimension_numbers)
    cache = rings.from_prefix(aval, args[key], axis, eqn.offset, link.ring(length))
    return layout(query).store(cache), outs

  return StepForm((pair,), step, prefill)


def elementwise_rule(eqn: Eqn, query_axis: int | None = None, **params) -> StepForm:
  """An elementwise op of pairs, streams along either time axis, and
  unscanned values (masks); streams along key time are cached.
  `query_axis`: the axis a mask pairs with the only stream's time axis."""
  axes, link = _elementwise_axes(eqn, query_axis)
  regions = [_elementwise_regions(eqn, params, axes, link, side) for side in (0, 1)]
  pair = Pair(axes, eqn.offset, (regions[0][0], regions[1][0]), link,
              (regions[0][1], regions[1][1]))
  length = eqn.out_avals[0].shape[axes[0]]
  compact = [rings.compact(op.known) if op.stream is None and op.pair is None else None
             for op in eqn.operands]

  def key_streams(key):
    return [i for i, op in enumerate(eqn.operands)
            if op.stream is not None and op.axis == key]

  def step(caches, index, args):
    query, key = pair.sides()
    ring, row_key = link.ring(length), key - (key > query)
    caches, values = list(caches), list(args)
    for c, i in enumerate(key_streams(key)):
      caches[c] = rings.write(caches[c], args[i], index, key, ring)
      values[i] = frames.step_slice(caches[c], query, index)
    row_shape = forms.drop_entry(rings.resized(eqn.out_avals[0].shape, key, ring), query)
    for i, op in enumerate(eqn.operands):
      if op.pair is None and op.aval.ndim and (op.stream is None or op.axis == query):
        if op.stream is not None:
          values[i] = rings.key_row(args[i], row_key, index, ring)
        else:  # known masks are kept with their broadcast axes of size 1
          values[i] = jnp.broadcast_to(
              _known_row(args[i], compact[i], query, key, index, ring), row_shape)
    return tuple(caches), forms.bind(eqn, values, params)

  def prefill(args):
    query, key = pair.sides()
    caches, values = [], list(args)
    for i in key_streams(key):
      aval = eqn.operands[i].aval
      cache = rings.from_prefix(aval, args[i], key, eqn.offset, None)
      values[i] = frames.prefix_slice(cache, query, eqn.offset)
      caches.append(rings.from_prefix(aval, args[i], key, eqn.offset, link.ring(length)))
    for i, op in enumerate(eqn.operands):
      if op.stream is None and op.pair is None and op.aval.ndim:
        values[i] = frames.prefix_slice(args[i], query, eqn.offset)
    return tuple(caches), forms.bind(eqn, values, params)

  return StepForm((pair,), step, prefill)


def _known_row(whole, compact, query: int, key: int, index, ring: int | None):
  """Row `index` of a known operand, in the ring's slot order under a ring; a band
  mask's rows from its distances, so that a ring decodes past the example's length."""
  row_key = key - (key > query)
  if ring is not None and compact is not None:
    table = rings.by_distance(compact, query, key, ring)
    if table is not None:
      return rings.distance_row(table, row_key, index, ring)
  whole = whole if compact is None else compact
  return rings.key_row(frames.step_slice(whole, query, index), row_key, index, ring)


def promoted_axis(eqn: Eqn, axis: int) -> int | None:
  """The axis a known mask pairs with a stream's time axis `axis`, if any.

  A stream meeting a concrete array that is triangular in (another axis of
  the sequence's length, `axis`), like a key-padding mask combined with a
  causal mask, is a pair: that other axis is query time, and what the mask
  proves about keys after the query is kept.
  """
  shape = eqn.out_avals[0].shape
  length = shape[axis]
  for op in eqn.operands:
    if (op.stream is not None or op.known is None or not op.aval.ndim
        or isinstance(op.known, _compat.Tracer) or op.aval.shape[axis] != length):
      continue
    if np.unique(np.asarray(op.known)).size < 2:
      continue
    for other in range(op.aval.ndim):
      if other != axis and op.aval.shape[other] == length:
        regions = pairs.known_regions(op.known, (other, axis), shape, (None, None))
        if any(upper.const is not None for upper, _, _ in regions):
          return other
  return None


def _elementwise_axes(eqn: Eqn, query_axis: int | None) -> tuple[tuple[int, int], Link]:
  """The two time axes (side 0, side 1) and the shared link."""
  paired = [op.pair for op in eqn.operands if op.pair is not None]
  stream_axes = sorted({forms.stream_axis(op) for op in eqn.operands
                        if op.stream is not None})
  if paired:
    axes, link = paired[0].axes, paired[0].link
  elif query_axis is not None:
    axes, link = (query_axis, stream_axes[0]), Link(_origin(eqn))
    stream_axes.append(query_axis)
  else:
    first = next(op.axis for op in eqn.operands if op.stream is not None)
    axes = (first, next(a for a in stream_axes if a != first))
    link = Link(_origin(eqn))
  every = set(stream_axes).union(*(p.axes for p in paired))
  if every != set(axes) or len(axes) != 2:
    raise eqn.error(AXES_DIFFER.format(axes=sorted(every)))
  shape = eqn.out_avals[0].shape
  if shape[axes[0]] != shape[axes[1]]:
    raise eqn.error(LENGTHS.format(lengths=(shape[axes[0]], shape[axes[1]])))
  for other in paired[1:]:
    link.join(other.link, other.axes != axes, _link_error(eqn, other))
  return axes, link


def _elementwise_regions(eqn: Eqn, params: dict, axes, link: Link,
                         side: int) -> tuple[Upper, Upper]:
  """The result's upper and far parts when `axes[side]` is query time; a
  band mask among the operands proposes its window to `link`."""
  shape = eqn.out_avals[0].shape
  uppers, fars = [], []
  for op in eqn.operands:
    if op.pair is not None:
      mine = side if op.pair.axes == axes else 1 - side
      uppers.append(op.pair.uppers[mine])
      fars.append(op.pair.fars[mine])
    elif op.stream is not None:
      uppers.append(pairs.EXACT if op.axis == axes[side] else pairs.DIRTY)
      fars.append(pairs.EXACT)
    else:
      windows = (link.window_of(0), link.window_of(1))
      upper, far, band = pairs.known_regions(op.known, axes, shape, windows)[side]
      if band and windows[side] is None:
        link.propose_window(side, band)
      uppers.append(upper)
      fars.append(far)
  dtypes = [op.aval.dtype for op in eqn.operands]
  out_dtype = eqn.out_avals[0].dtype
  return (pairs.elementwise_upper(eqn.primitive, params, uppers, dtypes, out_dtype),
          pairs.elementwise_upper(eqn.primitive, params, fars, dtypes, out_dtype))


# ---------------------------------------------------------------- consuming


def _check_upper(eqn: Eqn, pair: Pair, query: int, key: int, upper: Upper,
                 what: str, ok: bool, state: str = "dirty") -> None:
  if not ok:
    raise eqn.error(NOT_MASKED.format(
        what=what, key=key, origin=pair.link.origin, query=query,
        state=UPPER_STATES[state]))


def dot_rule(eqn: Eqn, *, dimension_numbers, **params) -> StepForm:
  """Contracts key time of a pair with a stream's time (cached) or with an
  unscanned operand: one row of weights times every value so far."""
  index = _paired_operand(eqn)
  other = eqn.operands[1 - index]
  pair = eqn.operands[index].pair
  (lc, rc), (lb, rb) = dimension_numbers
  contracting, batch = (lc, rc)[index], (lb, rb)[index]
  partners = (lc, rc)[1 - index]
  keys = [a for a in pair.axes if a in contracting]
  if other.pair is not None or not keys:
    raise eqn.error(KEEPS_PAIR.format(origin=pair.link.origin))
  if len(keys) == 2:
    raise eqn.error(BOTH_TIME_AXES.format(
        what="contracts", axes=pair.axes, origin=pair.link.origin))
  key = keys[0]
  query, upper = pair.oriented(key, eqn.primitive.name, eqn.where)
  if query in batch:
    raise eqn.error(QUERY_BATCH.format(origin=pair.link.origin, query=query))
  partner = partners[contracting.index(key)]
  if other.stream is not None:
    if other.axis != partner:
      raise eqn.error(KEY_PARTNER.format(key=key, origin=pair.link.origin))
    _check_upper(eqn, pair, query, key, upper, "contracts values",
                 upper.const is not None and upper.const == 0, "not_zero")
  else:
    _check_upper(eqn, pair, query, key, upper, "contracts", upper.exact)
  far = pair.fars[pair.axes.index(query)]
  if not (_is_zero(upper) and _is_zero(far)):
    pair.link.refuse_ring()
  length = eqn.operands[index].aval.shape[key]
  out_axis = _dot_out_axis(eqn, dimension_numbers, index, query)
  numbers = [[tuple(lc), tuple(rc)], [tuple(lb), tuple(rb)]]
  for group in numbers:
    group[index] = forms.drop_dim(group[index], query)
  step_numbers = tuple(tuple(tuple(d) for d in group) for group in numbers)

  stored = rings.DotLayout.of(other.aval, partner, step_numbers, 1 - index)

  def step(cache, i, args):
    values, ring = list(args), pair.link.ring(length)
    if other.stream is None:
      values[1 - index] = rings.key_row(args[1 - index], partner, i, ring)
      return cache, forms.bind(eqn, values, params, dimension_numbers=step_numbers)
    cache = rings.write(cache, stored.frame(args[1 - index]), i, stored.axis, ring)
    values[1 - index] = stored.read(cache)
    return cache, forms.bind(eqn, values, params, dimension_numbers=stored.numbers)

  def prefill(args):
    values, cache = list(args), None
    if other.stream is not None:
      prefix = args[1 - index]
      values[1 - index] = rings.from_prefix(other.aval, prefix, partner, eqn.offset, None)
      cache = stored.store(rings.from_prefix(other.aval, prefix, partner, eqn.offset,
                                             pair.link.ring(length)))
    return cache, forms.bind(eqn, values, params,
                             dimension_numbers=dimension_numbers)

  return StepForm((eqn.stream(out_axis),), step, prefill)


def _dot_out_axis(eqn: Eqn, dimension_numbers, index: int, axis: int) -> int:
  (lc, rc), (lb, rb) = dimension_numbers
  free = [[d for d in range(op.aval.ndim) if d not in c and d not in b]
          for op, c, b in zip(eqn.operands, (lc, rc), (lb, rb))]
  return len(lb) + (len(free[0]) if index else 0) + free[index].index(axis)


_NEEDS = {"reduce_max": lambda u: u.exact or u.neg_huge}
# What a reduction over key time needs of the parts a ring leaves out.
_RING_NEEDS = {"reduce_max": lambda u: u.neg_huge,
               "reduce_sum": lambda u: u.const is not None and u.const == 0}


def _is_zero(upper: Upper) -> bool:
  return upper.const is not None and upper.const == 0
_KEEP_CONST = {"reduce_max", "reduce_min", "reduce_and", "reduce_or"}
_KEEP_HUGE = {"reduce_max", "reduce_min", "reduce_sum"}


def reduction_rule(eqn: Eqn, *, axes, **params) -> StepForm:
  """Reduces over key time (the upper part must not change the result), or
  over axes other than time (the value stays a pair)."""
  pair = eqn.operands[0].pair
  name = eqn.primitive.name
  reduced = [a for a in pair.axes if a in axes]
  if len(reduced) == 2:
    raise eqn.error(BOTH_TIME_AXES.format(
        what="reduces", axes=pair.axes, origin=pair.link.origin))
  if reduced:
    key = reduced[0]
    query, upper = pair.oriented(key, name, eqn.where)
    _check_upper(eqn, pair, query, key, upper, "reduces",
                 _NEEDS.get(name, lambda u: u.exact)(upper))
    ring_ok = _RING_NEEDS.get(name, lambda u: False)
    if not (ring_ok(upper) and ring_ok(pair.fars[pair.axes.index(query)])):
      pair.link.refuse_ring()
    out_axis = query - sum(a < query for a in axes)
    step_axes = forms.drop_dim(axes, query)

    def fn(index, args):
      return forms.bind(eqn, args, params, axes=step_axes)

    return stateless(eqn, [eqn.stream(out_axis)], fn, dict(params, axes=axes))
  moved = tuple(int(a - sum(r < a for r in axes)) for a in pair.axes)
  uppers = (_reduced_upper(pair.uppers[0], name), _reduced_upper(pair.uppers[1], name))
  fars = (_reduced_upper(pair.fars[0], name), _reduced_upper(pair.fars[1], name))
  out = pair._replace(axes=moved, uppers=uppers, fars=fars, offset=eqn.offset)

  def fn_other(index, args):
    return forms.bind(eqn, args, params, axes=forms.drop_dim(axes, pair.sides()[0]))

  return stateless(eqn, [out], fn_other, dict(params, axes=axes))


def _reduced_upper(upper: Upper, name: str) -> Upper:
  if name.startswith("arg"):
    return Upper(upper.exact)
  const = upper.const
  keep = name in _KEEP_CONST or (name == "reduce_sum" and const == 0)
  return Upper(upper.exact, const if keep else None,
               upper.neg_huge and name in _KEEP_HUGE)


def stateless(eqn: Eqn, outs: Sequence, fn, params) -> StepForm:
  """A stateless form whose prefill binds the op on the prefix at once; a
  pair's prefix is its first rows, whole. `params`: the equation's, or a
  function giving them once the query axis is known (for ops whose
  params name the query axis's length)."""

  def step(state, index, args):
    return state, list(fn(index, args))

  def prefill(args):
    return (), forms.bind(eqn, args, params() if callable(params) else params)

  return StepForm(tuple(outs), step, prefill)


def _register_all() -> None:
  # Elementwise ops, reductions and calls register their pair rules with
  # their other rules (rules_elementwise, rules_control); shape ops in
  # rules_pair_shapes.
  PAIR_RULES[_compat.scan_primitives.dot_general_p] = dot_rule


_register_all()
