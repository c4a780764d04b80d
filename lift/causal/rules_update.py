"""Rules for writes into a stream: `scatter` and `dynamic_update_slice`.

Where the written values and positions do not vary along time, the result
at element `t` is the stream's element `t` with the written entries of
that element replaced (or combined): causal, whatever the positions. The
rule builds the written entries once, on a blank value (zeros, or the
combination's identity), with a mask of where they go, and combines them
with each step's element. Where the written values are a stream covering
the whole time axis (`x.at[:, 0].set(y)`), each step writes its element.
"""
from __future__ import annotations

import numpy as np
from jax import lax
import jax.numpy as jnp

from lift import _compat
from lift.causal import forms
from lift.causal import frames
from lift.causal.interpreter import Eqn, StepForm, register_scan_rule

WRITES_TIME = (
    "the values it writes vary along time but do not cover the scan axis {axis} "
    "whole (or the positions vary along time); only writes of unscanned values, "
    "or of a stream along the whole time axis, are one element per step."
)


def _blank_and_combine(eqn: Eqn):
  """The value to write into (the combination's identity) and how the
  written entries meet the stream's element."""
  name = eqn.primitive.name
  aval = eqn.operands[0].aval
  if name == "scatter-add":
    return jnp.zeros(aval.shape, aval.dtype), lambda x, written, mask: x + written
  if name == "scatter-mul":
    return jnp.ones(aval.shape, aval.dtype), lambda x, written, mask: x * written
  if name in ("scatter-min", "scatter-max"):
    info = jnp.finfo if jnp.issubdtype(aval.dtype, jnp.inexact) else jnp.iinfo
    low = name == "scatter-max"
    fill = info(aval.dtype).min if low else info(aval.dtype).max
    pick = lax.max if low else lax.min
    return jnp.full(aval.shape, fill, aval.dtype), lambda x, written, mask: pick(x, written)
  return jnp.zeros(aval.shape, aval.dtype), lambda x, written, mask: jnp.where(mask, written, x)


def _unscanned_writes(eqn: Eqn, params: dict) -> StepForm:
  """Writes of unscanned values at unscanned positions into the stream."""
  axis = forms.stream_axis(eqn.operands[0])
  blank, combine = _blank_and_combine(eqn)
  aval = eqn.operands[0].aval
  scatter = eqn.primitive.name.startswith("scatter")

  def written(args):
    rest = list(args[1:])
    values = forms.bind(eqn, [blank, *rest], params)[0]
    update = 1 if scatter else 0  # the position of the written values in rest
    ones = jnp.ones(np.shape(rest[update]), bool)
    marks = rest[:update] + [ones] + rest[update + 1:]
    mask = forms.bind(eqn, [jnp.zeros(aval.shape, bool), *marks], params)[0]
    return values, mask

  known = [op.known for op in eqn.operands[1:]]
  hoisted = None if any(k is None for k in known) else written([None, *known])

  def fn(index, args):
    values, mask = hoisted if hoisted is not None else written(args)
    return [combine(args[0], frames.step_slice(values, axis, index),
                    frames.step_slice(mask, axis, index))]

  return forms.stateless(eqn, [eqn.stream(axis)], fn)


def dynamic_update_slice_rule(eqn: Eqn, **params) -> StepForm:
  """Writes unscanned values, or a stream's element when the update covers
  the whole time axis."""
  operand, update = eqn.operands[:2]
  if all(op.stream is None for op in eqn.operands[1:]):
    return _unscanned_writes(eqn, params)
  axis = forms.stream_axis(operand)
  if (operand.stream is None or update.axis != axis
      or update.aval.shape[axis] != operand.aval.shape[axis]
      or any(op.stream is not None for op in eqn.operands[2:])):
    raise eqn.error(WRITES_TIME.format(axis=axis))

  def fn(index, args):
    starts = forms.drop_entry(args[2:], axis)
    return forms.bind(eqn, [args[0], args[1], *starts], params)

  return forms.stateless(eqn, [eqn.stream(axis)], fn)


def scatter_rule(eqn: Eqn, *, dimension_numbers, **params) -> StepForm:
  """Writes unscanned values, or a stream's element when time is a window
  axis the update covers whole."""
  operand, indices, updates = eqn.operands
  params = dict(params, dimension_numbers=dimension_numbers)
  if operand.stream is not None and indices.stream is None and updates.stream is None:
    return _unscanned_writes(eqn, params)
  numbers = dimension_numbers
  axis = forms.stream_axis(operand) if operand.stream is not None else None
  window = [d for d in range(operand.aval.ndim)
            if d not in numbers.inserted_window_dims and d not in numbers.operand_batching_dims]
  if (axis is None or indices.stream is not None or axis not in window
      or axis in numbers.scatter_dims_to_operand_dims):
    raise eqn.error(WRITES_TIME.format(axis=axis))
  update_axis = numbers.update_window_dims[window.index(axis)]
  if (updates.stream is not None and updates.axis != update_axis) or (
      updates.aval.shape[update_axis] != operand.aval.shape[axis]):
    raise eqn.error(WRITES_TIME.format(axis=axis))
  step_numbers = numbers._replace(
      update_window_dims=forms.drop_dim(
          forms.drop_entry(numbers.update_window_dims, window.index(axis)), update_axis),
      inserted_window_dims=forms.drop_dim(numbers.inserted_window_dims, axis),
      scatter_dims_to_operand_dims=forms.drop_dim(numbers.scatter_dims_to_operand_dims, axis),
      operand_batching_dims=forms.drop_dim(numbers.operand_batching_dims, axis))

  def fn(index, args):
    args = forms.step_args(eqn, args, index, [axis, None, update_axis])
    return forms.bind(eqn, args, params, dimension_numbers=step_numbers)

  return forms.stateless(eqn, [eqn.stream(axis)], fn)


def _register_all() -> None:
  prims = _compat.scan_primitives
  register_scan_rule(prims.dynamic_update_slice_p, dynamic_update_slice_rule)
  for name in ("scatter", "scatter_add", "scatter_mul", "scatter_min", "scatter_max"):
    if hasattr(prims, f"{name}_p"):
      register_scan_rule(getattr(prims, f"{name}_p"), scatter_rule)


_register_all()
