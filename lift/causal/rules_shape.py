"""Rules for primitives that move, add, remove or reorder axes other than
time."""
from __future__ import annotations

import math

from lift import _compat
from lift.causal import forms
from lift.causal.interpreter import Eqn, StepForm, register_scan_rule

BROADCAST_TIME = (
    "it broadcasts {length} element(s) along the scan axis to {want}; a "
    "stream cannot be broadcast along time."
)
MERGES_TIME = (
    "it reshapes {shape} (scan axis {axis}) to {new}, merging or splitting "
    "the scan axis with others. Keep the scan axis a separate axis, e.g. "
    "reshape only the trailing axes."
)
SQUEEZES_TIME = (
    "it removes the scan axis {axis}, as xs[0] does; a fixed position of the "
    "sequence is not one element per step. Index other axes instead."
)
REVERSES_TIME = (
    "it reverses the scan axis {axis} (e.g. xs[::-1]); element t of the "
    "result depends on the last elements of the sequence (anti-causal)."
)

SORTS_TIME = (
    "it sorts along the scan axis {axis}; element t of the result may come "
    "from any position of the sequence."
)
TOP_K_OVER_TIME = (
    "it picks the top k along the scan axis {axis}; element t of the result may "
    "come from any position of the sequence."
)


def broadcast_in_dim_rule(eqn: Eqn, *, shape, broadcast_dimensions,
                          **params) -> StepForm:
  """Broadcasts the step value; the scan axis moves to its new position."""
  axis = forms.stream_axis(eqn.operands[0])
  out_axis = broadcast_dimensions[axis]
  length = eqn.operands[0].aval.shape[axis]
  if length != shape[out_axis]:
    raise eqn.error(BROADCAST_TIME.format(length=length, want=shape[out_axis]))
  step_shape = forms.drop_entry(shape, out_axis)
  step_dims = forms.drop_dim(
      forms.drop_entry(broadcast_dimensions, axis), out_axis)

  def fn(index, args):
    return forms.bind(eqn, args[:1], params, shape=step_shape,
                      broadcast_dimensions=step_dims)

  return forms.stateless(eqn, [eqn.stream(out_axis)], fn)


def reshape_axis(shape, axis: int, new_sizes) -> int | None:
  """Where axis `axis` of `shape` lands in `new_sizes`, if it stays whole."""
  before = math.prod(shape[:axis])
  for out_axis, size in enumerate(new_sizes):
    if size == shape[axis] and math.prod(new_sizes[:out_axis]) == before:
      return out_axis
  return None


def reshape_rule(eqn: Eqn, *, new_sizes, dimensions, **params) -> StepForm:
  """Reshapes the step value when the scan axis stays a whole axis."""
  operand = eqn.operands[0]
  axis = forms.stream_axis(operand)
  out_axis = reshape_axis(operand.aval.shape, axis, new_sizes)
  if out_axis is None or dimensions is not None:
    raise eqn.error(MERGES_TIME.format(
        shape=operand.aval.shape, axis=axis, new=tuple(new_sizes)))
  step_sizes = forms.drop_entry(new_sizes, out_axis)

  def fn(index, args):
    return forms.bind(eqn, args[:1], params, new_sizes=step_sizes,
                      dimensions=None)

  return forms.stateless(eqn, [eqn.stream(out_axis)], fn)


def _other_axes_rule(eqn: Eqn, dimensions, params, error: str, squeezes: bool) -> StepForm:
  """An operation on axes other than the scan axis (``dimensions`` may not name it)."""
  axis = forms.stream_axis(eqn.operands[0])
  if axis in dimensions:
    raise eqn.error(error.format(axis=axis))
  step_dims = forms.drop_dim(dimensions, axis)

  def fn(index, args):
    return forms.bind(eqn, args, params, dimensions=step_dims)

  out_axis = axis - sum(d < axis for d in dimensions) if squeezes else axis
  return forms.stateless(eqn, [eqn.stream(out_axis)], fn)


def squeeze_rule(eqn: Eqn, *, dimensions, **params) -> StepForm:
  """Squeezes axes other than the scan axis."""
  return _other_axes_rule(eqn, dimensions, params, SQUEEZES_TIME, squeezes=True)


def transpose_rule(eqn: Eqn, *, permutation, **params) -> StepForm:
  """Transposes the step value; the scan axis moves with the permutation."""
  axis = forms.stream_axis(eqn.operands[0])
  step_perm = forms.drop_dim(permutation, axis)

  def fn(index, args):
    return forms.bind(eqn, args, params, permutation=step_perm)

  return forms.stateless(eqn, [eqn.stream(permutation.index(axis))], fn)


def rev_rule(eqn: Eqn, *, dimensions, **params) -> StepForm:
  """Reverses axes other than the scan axis."""
  return _other_axes_rule(eqn, dimensions, params, REVERSES_TIME, squeezes=False)


def sort_rule(eqn: Eqn, *, dimension, **params) -> StepForm:
  """Sorts along an axis other than the scan axis."""
  axis = forms.common_axis(eqn)
  if dimension == axis:
    raise eqn.error(SORTS_TIME.format(axis=axis))
  axes = [axis] * len(eqn.operands)

  def fn(index, args):
    return forms.bind(eqn, forms.step_args(eqn, args, index, axes), params,
                      dimension=dimension - (dimension > axis))

  return forms.stateless(eqn, [eqn.stream(axis)] * len(eqn.out_avals), fn)


def top_k_rule(eqn: Eqn, *, axis, **params) -> StepForm:
  """Top k along an axis other than the scan axis: one step's top k per step."""
  time = forms.stream_axis(eqn.operands[0])
  if axis == time:
    raise eqn.error(TOP_K_OVER_TIME.format(axis=time))

  def fn(index, args):
    return forms.bind(eqn, args, params, axis=axis - (axis > time))

  return forms.stateless(eqn, [eqn.stream(time)] * 2, fn)


def stack_rule(eqn: Eqn, *, axis, **params) -> StepForm:
  """Stacks step values on a new axis; the scan axis moves past it if it comes before."""
  time = forms.common_axis(eqn)
  axes = [time] * len(eqn.operands)

  def fn(index, args):
    return forms.bind(eqn, forms.step_args(eqn, args, index, axes), params,
                      axis=axis - (axis > time))

  return forms.stateless(eqn, [eqn.stream(time + (axis <= time))], fn)


def unstack_rule(eqn: Eqn, *, axis, **params) -> StepForm:
  """Unstacks an axis other than the scan axis."""
  time = forms.stream_axis(eqn.operands[0])
  if axis == time:
    raise eqn.error(SQUEEZES_TIME.format(axis=time))

  def fn(index, args):
    return forms.bind(eqn, args, params, axis=axis - (axis > time))

  return forms.stateless(eqn, [eqn.stream(time - (axis < time))] * len(eqn.out_avals), fn)


def _register_all() -> None:
  prims = _compat.scan_primitives
  register_scan_rule(prims.broadcast_in_dim_p, broadcast_in_dim_rule)
  register_scan_rule(prims.reshape_p, reshape_rule)
  register_scan_rule(prims.squeeze_p, squeeze_rule)
  register_scan_rule(prims.transpose_p, transpose_rule)
  register_scan_rule(prims.rev_p, rev_rule)
  register_scan_rule(prims.sort_p, sort_rule)
  register_scan_rule(prims.top_k_p, top_k_rule)
  register_scan_rule(_compat.stack_p, stack_rule)
  register_scan_rule(_compat.unstack_p, unstack_rule)


_register_all()
