"""Rules for contractions and indexing: `dot_general`, causal convolutions,
`gather` and `dynamic_slice` off the scan axis."""
from __future__ import annotations

import jax
import numpy as np
from jax import lax
import jax.numpy as jnp

from lift import _compat
from lift.causal import forms
from lift.causal import frames
from lift.causal import rules_pairs
from lift.causal.interpreter import Eqn, StepForm, register_scan_rule

TWO_TIME_AXES = (
    "both operands vary along time and their scan axes are not one shared "
    "batch dimension (lhs axis {lhs}, rhs axis {rhs}); the result pairs "
    "every position with every other, like attention logits. Wrap such a "
    "composite with @lift.custom_causal, or use lift.causal_self_attention."
)
CONTRACTS_TIME = (
    "it contracts the scan axis {axis} of operand {index}, summing over the "
    "whole sequence. Only a contraction with a known lower-triangular "
    "[T, T] matrix (a causal mask built from iota/tril) is causal."
)
KERNEL_OVER_TIME = "the convolution kernel varies along the scan axis."
CONV_FEATURES = (
    "the scan axis {axis} is the convolution's feature axis; convolving "
    "mixes every position of the sequence."
)
CONV_STRIDED = (
    "the convolution along the scan axis has stride {stride} and input "
    "dilation {dilation}; only stride 1 and input dilation 1 give one result "
    "element per step."
)
GATHER_ALONG_TIME = (
    "it gathers along the scan axis {axis} with computed indices, which may "
    "read any position of the sequence."
)


def _drop(dims, removed: int | None) -> tuple[int, ...]:
  return tuple(dims) if removed is None else forms.drop_dim(dims, removed)


def dot_general_rule(eqn: Eqn, *, dimension_numbers, **params) -> StepForm:
  """Contracts step values; the scan axis is a free or a batch dimension."""
  (lc, rc), (lb, rb) = dimension_numbers
  for index, contracting in enumerate((lc, rc)):
    if eqn.operands[index].axis in contracting:
      return _contract_with_mask(eqn, index, dimension_numbers, params)
  if _pairs_times(eqn, dimension_numbers):
    return rules_pairs.product_rule(eqn, dimension_numbers, params)
  removed = _dot_removed(eqn, lb, rb)
  out_axis = _dot_out_axis(eqn, dimension_numbers, removed)
  step_numbers = tuple(tuple(_drop(d, r) for d, r in zip(pair, removed))
                       for pair in dimension_numbers)

  def fn(index, args):
    args = forms.step_args(eqn, args, index, removed)
    return forms.bind(eqn, args, params, dimension_numbers=step_numbers)

  return forms.stateless(eqn, [eqn.stream(out_axis)], fn)


def _pairs_times(eqn: Eqn, dimension_numbers) -> bool:
  """Whether both operands vary along time on free axes (`q @ k.T`)."""
  (lc, rc), (lb, rb) = dimension_numbers
  lhs, rhs = eqn.operands
  return (lhs.stream is not None and rhs.stream is not None
          and lhs.axis not in (*lc, *lb) and rhs.axis not in (*rc, *rb))


def _dot_removed(eqn: Eqn, lb, rb) -> tuple[int | None, int | None]:
  """Per operand, the axis a step drops: its scan axis or batch partner."""
  lhs, rhs = eqn.operands
  if lhs.stream is not None and rhs.stream is not None:
    if (lhs.axis in lb and rhs.axis in rb
        and lb.index(lhs.axis) == rb.index(rhs.axis)):
      return lhs.axis, rhs.axis
    raise eqn.error(TWO_TIME_AXES.format(lhs=lhs.axis, rhs=rhs.axis))
  if lhs.stream is not None:
    return lhs.axis, (rb[lb.index(lhs.axis)] if lhs.axis in lb else None)
  return (lb[rb.index(rhs.axis)] if rhs.axis in rb else None), rhs.axis


def _dot_out_axis(eqn: Eqn, dimension_numbers, removed) -> int:
  (lc, rc), (lb, rb) = dimension_numbers
  lhs, rhs = eqn.operands
  if removed[0] in lb:
    return lb.index(removed[0])
  lhs_free = [d for d in range(lhs.aval.ndim) if d not in lc and d not in lb]
  if lhs.stream is not None:
    return len(lb) + lhs_free.index(lhs.stream.axis)
  rhs_free = [d for d in range(rhs.aval.ndim) if d not in rc and d not in rb]
  return len(lb) + len(lhs_free) + rhs_free.index(forms.stream_axis(rhs))


def _causal_mask(eqn: Eqn, index: int, dimension_numbers):
  """The mask's contracted axis when the other operand is a known
  lower-triangular [T, T] matrix, else None."""
  (lc, rc), (lb, _) = dimension_numbers
  mask = eqn.operands[1 - index]
  if (mask.stream is not None or lb or mask.aval.ndim != 2 or len(lc) != 1
      or mask.known is None or isinstance(mask.known, _compat.Tracer)):
    return None
  contracted = (lc, rc)[1 - index][0]
  matrix = np.asarray(mask.known)
  matrix = matrix.T if contracted == 0 else matrix
  square = matrix.shape[0] == matrix.shape[1]
  return contracted if square and not np.any(np.triu(matrix, 1)) else None


def _contract_with_mask(eqn: Eqn, index: int, dimension_numbers,
                        params) -> StepForm:
  """`mask @ xs` with a lower-triangular mask: the state is the history."""
  stream = eqn.operands[index]
  contracted = _causal_mask(eqn, index, dimension_numbers)
  if contracted is None:
    raise eqn.error(CONTRACTS_TIME.format(axis=stream.axis, index=index))
  free, axis = 1 - contracted, forms.stream_axis(stream)
  out_axis = 0 if index == 1 else stream.aval.ndim - 1

  def contract(x, rows):
    args = (x, rows) if index == 0 else (rows, x)
    return forms.bind(eqn, args, params,
                      dimension_numbers=dimension_numbers)[0]

  def step(history, i, args):
    frames.read_by_position()
    history = lax.dynamic_update_index_in_dim(history, args[index], i, axis)
    row = lax.dynamic_slice_in_dim(args[1 - index], i, 1, axis=free)
    return history, [lax.index_in_dim(contract(history, row), 0, out_axis,
                                      keepdims=False)]

  def prefill(args):
    history = jnp.zeros(stream.aval.shape, stream.aval.dtype)
    history = lax.dynamic_update_slice_in_dim(history, args[index], 0, axis)
    mask = lax.slice_in_dim(args[1 - index], 0, eqn.offset, axis=free)
    mask = lax.slice_in_dim(mask, 0, eqn.offset, axis=contracted)
    return history, [contract(args[index], mask)]

  return StepForm((eqn.stream(out_axis),), step, prefill)


def conv_rule(eqn: Eqn, **params) -> StepForm:
  """A convolution that is causal along the scan axis, or batched over it.

  Along a spatial axis the state holds the last `max(low, span)` input
  elements (`span` = (taps - 1) * dilation, `low` its left padding).
  """
  lhs, rhs = eqn.operands
  if rhs.stream is not None:
    raise eqn.error(KERNEL_OVER_TIME)
  lhs_spec, _, out_spec = params["dimension_numbers"]
  if lhs.axis == lhs_spec[0]:
    return _conv_over_batch(eqn, out_spec[0], params)
  if lhs.axis == lhs_spec[1]:
    raise eqn.error(CONV_FEATURES.format(axis=lhs.axis))
  return _conv_over_time(eqn, lhs_spec.index(lhs.axis) - 2, params)


def _conv_over_batch(eqn: Eqn, out_axis: int, params) -> StepForm:
  axis = forms.stream_axis(eqn.operands[0])

  def fn(index, args):
    out = forms.bind(eqn, [jnp.expand_dims(args[0], axis), args[1]], params)
    return [lax.index_in_dim(out[0], 0, out_axis, keepdims=False)]

  return forms.stateless(eqn, [eqn.stream(out_axis)], fn)


def _conv_over_time(eqn: Eqn, spatial: int, params) -> StepForm:
  lhs, rhs = eqn.operands
  _, rhs_spec, out_spec = params["dimension_numbers"]
  axis, out_axis = forms.stream_axis(lhs), out_spec[2 + spatial]
  stride = params["window_strides"][spatial]
  dilation = params["lhs_dilation"][spatial]
  if stride != 1 or dilation != 1:
    raise eqn.error(CONV_STRIDED.format(stride=stride, dilation=dilation))
  span = (rhs.aval.shape[rhs_spec[2 + spatial]] - 1) * params[
      "rhs_dilation"][spatial]
  low, high = params["padding"][spatial]
  ahead, keep, length = max(0, span - low), max(low, span), lhs.aval.shape[axis]

  def padding(pair):
    return tuple(pair if i == spatial else p
                 for i, p in enumerate(params["padding"]))

  def step(buffer, index, args):
    frame = args[0]
    if high > 0:  # elements past the input's end are padding
      frame = jnp.where(index < length, frame, jnp.zeros_like(frame))
    window = frames.shift_in(buffer, frame)
    if _one_spatial(params, lhs.aval.ndim):
      return window[1:], [_conv_one_position(window[:span + 1], args[1], params)]
    x = jnp.moveaxis(window[:span + 1], 0, axis)
    out = forms.bind(eqn, [x, args[1]], params, padding=padding((0, 0)))[0]
    return window[1:], [lax.index_in_dim(out, 0, out_axis, keepdims=False)]

  def prefill(args):
    x = args[0]
    if high > 0 and eqn.offset > length:
      position = lax.broadcasted_iota(jnp.int32, x.shape, axis)
      x = jnp.where(position < length, x, jnp.zeros_like(x))
    buffer = frames.window(x, axis, eqn.offset - keep, keep)
    if eqn.offset - ahead <= 0:
      return buffer, [frames.empty_prefix(eqn.out_avals[0], out_axis)
                      if eqn.offset == ahead else None]
    return buffer, forms.bind(eqn, [x, args[1]], params,
                              padding=padding((low, span - low - ahead)))

  return StepForm((eqn.stream(out_axis, -ahead),), step, prefill)


def _one_spatial(params, ndim: int) -> bool:
  return ndim == 3 and params["batch_group_count"] == 1


def _conv_one_position(window: jax.Array, kernel: jax.Array, params) -> jax.Array:
  """One output position of a 1-D convolution over `window` (time first, then the
  input's other axes), as one contraction: a convolution kernel's setup costs more
  than its work at a single position. Returns the output without its spatial axis."""
  lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
  dilation, groups = params["rhs_dilation"][0], params["feature_group_count"]
  x = window[::dilation]  # [taps, *lhs without time]: batch and feature in lhs order
  batch_first = lhs_spec[0] < lhs_spec[1]
  x = jnp.moveaxis(x, 0, -1) if batch_first else jnp.moveaxis(x, (0, 1), (2, 1))
  x = x.reshape(x.shape[0], groups, -1, x.shape[-1])  # [batch, groups, in/group, taps]
  w = jnp.transpose(kernel, (rhs_spec[1], rhs_spec[0], rhs_spec[2]))  # [in/group, out, taps]
  w = w.reshape(w.shape[0], groups, -1, w.shape[-1])  # [in/group, groups, out/group, taps]
  out = jnp.einsum("bgct,cgot->bgo", x, w, precision=params["precision"],
                   preferred_element_type=params["preferred_element_type"])
  out = out.reshape(out.shape[0], -1)  # [batch, out features]
  return out if out_spec[0] < out_spec[1] else out.T


def _gather_removed(eqn: Eqn, numbers, slice_sizes):
  """Per operand (operand, indices), the axis a step drops."""
  operand, indices = eqn.operands
  batching, index_batching = (numbers.operand_batching_dims,
                              numbers.start_indices_batching_dims)
  if indices.stream is not None:
    removed = (batching[index_batching.index(indices.axis)]
               if indices.axis in index_batching else None)
    if (indices.axis == indices.aval.ndim - 1
        or operand.stream is not None and operand.axis != removed):
      raise eqn.error(GATHER_ALONG_TIME.format(axis=operand.axis))
    return removed, indices.axis
  axis = operand.axis
  if axis in batching:
    return axis, index_batching[batching.index(axis)]
  if (axis in numbers.collapsed_slice_dims or axis in numbers.start_index_map
      or slice_sizes[axis] != operand.aval.shape[axis]):
    raise eqn.error(GATHER_ALONG_TIME.format(axis=axis))
  return axis, None


def _gather_out_axis(eqn: Eqn, numbers, removed) -> int:
  operand_axis, index_axis = removed
  if index_axis is not None:
    batch = [d for d in range(eqn.out_avals[0].ndim)
             if d not in numbers.offset_dims]
    return batch[index_axis]
  kept = [d for d in range(eqn.operands[0].aval.ndim)
          if d not in numbers.collapsed_slice_dims
          and d not in numbers.operand_batching_dims]
  return numbers.offset_dims[kept.index(operand_axis)]


def gather_rule(eqn: Eqn, *, dimension_numbers, slice_sizes,
                **params) -> StepForm:
  """Gathers per element when time is a batch axis of the indices or an
  axis the gather keeps whole."""
  numbers = dimension_numbers
  removed = _gather_removed(eqn, numbers, slice_sizes)
  out_axis = _gather_out_axis(eqn, numbers, removed)
  operand_axis, index_axis = removed
  step_numbers = numbers._replace(
      offset_dims=forms.drop_dim(numbers.offset_dims, out_axis),
      collapsed_slice_dims=_drop(numbers.collapsed_slice_dims, operand_axis),
      start_index_map=_drop(numbers.start_index_map, operand_axis),
      operand_batching_dims=_drop(numbers.operand_batching_dims,
                                  operand_axis),
      start_indices_batching_dims=_drop(
          numbers.start_indices_batching_dims, index_axis))
  step_sizes = (slice_sizes if operand_axis is None
                else forms.drop_entry(slice_sizes, operand_axis))

  def fn(index, args):
    args = forms.step_args(eqn, args, index, removed)
    return forms.bind(eqn, args, params, dimension_numbers=step_numbers,
                      slice_sizes=step_sizes)

  return forms.stateless(eqn, [eqn.stream(out_axis)], fn)


def dynamic_slice_rule(eqn: Eqn, *, slice_sizes, **params) -> StepForm:
  """A dynamic slice that keeps the scan axis whole."""
  operand = eqn.operands[0]
  axis = forms.stream_axis(operand)
  if slice_sizes[axis] != operand.aval.shape[axis]:
    raise eqn.error(GATHER_ALONG_TIME.format(axis=axis))
  step_sizes = forms.drop_entry(slice_sizes, axis)

  def fn(index, args):
    starts = forms.drop_entry(args[1:], axis)
    return forms.bind(eqn, [args[0], *starts], params, slice_sizes=step_sizes)

  return forms.stateless(eqn, [eqn.stream(axis)], fn)


def _register_all() -> None:
  prims = _compat.scan_primitives
  register_scan_rule(prims.dot_general_p, dot_general_rule)
  register_scan_rule(prims.conv_general_dilated_p, conv_rule)
  register_scan_rule(prims.gather_p, gather_rule)
  register_scan_rule(prims.dynamic_slice_p, dynamic_slice_rule)


_register_all()
