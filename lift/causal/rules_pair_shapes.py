"""Shape ops on values with two time axes (see `rules_pairs`): the axes move,
and under a ring cache the key axis holds the ring's entries."""
from __future__ import annotations

from lift import _compat
from lift.causal import forms
from lift.causal import rings
from lift.causal import rules_pairs
from lift.causal import rules_shape
from lift.causal.interpreter import PAIR_RULES, Eqn, StepForm
from lift.causal.pairs import Pair


def _moved_pair(eqn: Eqn, axes) -> Pair:
  pair = eqn.operands[0].pair
  first, second = (int(a) for a in axes)
  return Pair((first, second), eqn.offset, pair.uppers, pair.link, pair.fars)


def broadcast_rule(eqn: Eqn, *, shape, broadcast_dimensions, **params) -> StepForm:
  """Broadcasts a pair; its time axes move, keeping their lengths."""
  pair, dims = eqn.operands[0].pair, broadcast_dimensions
  sizes = eqn.operands[0].aval.shape
  if any(sizes[a] != shape[dims[a]] for a in pair.axes):
    raise eqn.error(rules_pairs.SHAPE_TIME.format(axes=pair.axes))

  def fn(index, args):
    query, key = pair.sides()
    step_shape = rings.resized(shape, dims[key], pair.link.ring(shape[dims[key]]))
    return forms.bind(eqn, args, params, shape=forms.drop_entry(step_shape, dims[query]),
                      broadcast_dimensions=forms.drop_dim(
                          forms.drop_entry(dims, query), dims[query]))

  def prefill_params():
    prefix_shape = list(shape)
    prefix_shape[dims[pair.sides()[0]]] = eqn.offset
    return dict(params, shape=tuple(prefix_shape), broadcast_dimensions=dims)

  out = _moved_pair(eqn, (dims[a] for a in pair.axes))
  return rules_pairs.stateless(eqn, [out], fn, prefill_params)


def transpose_rule(eqn: Eqn, *, permutation, **params) -> StepForm:
  """Transposes a pair; its time axes move with the permutation."""
  pair = eqn.operands[0].pair

  def fn(index, args):
    return forms.bind(eqn, args, params,
                      permutation=forms.drop_dim(permutation, pair.sides()[0]))

  out = _moved_pair(eqn, (permutation.index(a) for a in pair.axes))
  return rules_pairs.stateless(eqn, [out], fn, dict(params, permutation=permutation))


def reshape_rule(eqn: Eqn, *, new_sizes, dimensions, **params) -> StepForm:
  """Reshapes a pair that keeps both time axes whole."""
  pair, shape = eqn.operands[0].pair, eqn.operands[0].aval.shape
  moved = [rules_shape.reshape_axis(shape, a, new_sizes) for a in pair.axes]
  if None in moved or dimensions is not None or moved[0] == moved[1]:
    raise eqn.error(rules_pairs.SHAPE_TIME.format(axes=pair.axes))
  where = dict(zip(pair.axes, moved))

  def fn(index, args):
    query, key = pair.sides()
    sizes = rings.resized(new_sizes, where[key], pair.link.ring(new_sizes[where[key]]))
    return forms.bind(eqn, args, params, dimensions=None,
                      new_sizes=forms.drop_entry(sizes, where[query]))

  def prefill_params():
    sizes = list(new_sizes)
    sizes[where[pair.sides()[0]]] = eqn.offset
    return dict(params, new_sizes=tuple(sizes), dimensions=None)

  return rules_pairs.stateless(eqn, [_moved_pair(eqn, moved)], fn, prefill_params)


def squeeze_rule(eqn: Eqn, *, dimensions, **params) -> StepForm:
  """Squeezes axes other than the time axes of a pair."""
  pair = eqn.operands[0].pair
  if set(dimensions) & set(pair.axes):
    raise eqn.error(rules_pairs.SHAPE_TIME.format(axes=pair.axes))

  def fn(index, args):
    return forms.bind(eqn, args, params,
                      dimensions=forms.drop_dim(dimensions, pair.sides()[0]))

  out = _moved_pair(eqn, (a - sum(d < a for d in dimensions) for a in pair.axes))
  return rules_pairs.stateless(eqn, [out], fn, dict(params, dimensions=dimensions))


def _register_all() -> None:
  prims = _compat.scan_primitives
  PAIR_RULES[prims.broadcast_in_dim_p] = broadcast_rule
  PAIR_RULES[prims.transpose_p] = transpose_rule
  PAIR_RULES[prims.reshape_p] = reshape_rule
  PAIR_RULES[prims.squeeze_p] = squeeze_rule


_register_all()
