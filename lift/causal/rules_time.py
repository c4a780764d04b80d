"""Rules for primitives that can act along time: shifts and cumulative ops.

Putting a known piece in front of a stream (`concatenate`, low `pad`) raises
its offset; dropping its first elements (`slice`, `split`) lowers it. The
interpreter delays streams whose offsets differ where they meet, so a shift
by k steps costs a delay line of k elements.
"""
from __future__ import annotations

from jax import lax
import jax.numpy as jnp
import numpy as np

from lift import _compat
from lift.causal import forms
from lift.causal import frames
from lift.causal.interpreter import Eqn, StepForm, register_scan_rule

STRIDED_TIME = (
    "it slices the scan axis {axis} with stride {stride}; a strided slice of "
    "time is not one result element per step."
)
INTERIOR_PAD_TIME = (
    "it pads the scan axis {axis} with interior padding {interior}; that is "
    "not one result element per step."
)
REVERSED_CUMULATIVE = (
    "it accumulates along the scan axis {axis} in reverse, so element t "
    "depends on the elements after t (anti-causal)."
)


def concatenate_rule(eqn: Eqn, *, dimension, **params) -> StepForm:
  """Concatenates step values; along time, a stream follows known pieces."""
  axis = forms.common_axis(eqn)
  if dimension == axis:
    return _concatenate_time(eqn, axis)
  axes = [axis] * len(eqn.operands)

  def fn(index, args):
    return forms.bind(eqn, forms.step_args(eqn, args, index, axes), params,
                      dimension=dimension - (dimension > axis))

  return forms.stateless(eqn, [eqn.stream(axis)], fn)


def _concatenate_time(eqn: Eqn, axis: int) -> StepForm:
  # Pieces of length 0 (a shift by 0 written as a pad of 0 zeros) add nothing.
  kept = [i for i, op in enumerate(eqn.operands) if op.aval.shape[axis]]
  ops = [eqn.operands[i] for i in kept]
  lengths = [op.aval.shape[axis] for op in ops]
  starts = [int(s) for s in np.cumsum([0] + lengths[:-1])]
  streams = [i for i, op in enumerate(ops) if op.stream is not None]
  if not streams:
    return _concatenate_unscanned(eqn, kept, axis)
  lead = starts[streams[0]]
  delays = {i: starts[i] - lead for i in streams if starts[i] > lead}
  slots = {i: b for b, i in enumerate(delays)}
  ends_with_stream = streams[-1] == len(ops) - 1

  def step(buffers, index, args):
    element = index + lead
    buffers, values = list(buffers), []
    for i, (op, arg) in enumerate(zip(ops, (args[k] for k in kept))):
      if op.stream is None:
        values.append(frames.step_slice(arg, axis, element - starts[i],
                                        unused_past_end=ends_with_stream))
      elif i in slots:
        b = slots[i]
        buffers[b], arg = frames.delay_step(buffers[b], element - starts[i],
                                            arg)
        values.append(arg)
      else:
        values.append(arg)
    piece = jnp.sum(jnp.asarray(starts[1:], jnp.int32) <= element,
                    dtype=jnp.int32)
    return tuple(buffers), [lax.select_n(piece, *values)]

  def prefill(args):
    args = [args[k] for k in kept]
    out_length = eqn.offset + lead
    pieces = [lax.slice_in_dim(arg, 0, int(np.clip(out_length - s, 0, n)),
                               axis=axis)
              for arg, s, n in zip(args, starts, lengths)]
    buffers = tuple(frames.delay_prefill(args[i], axis,
                                         out_length - starts[i], d)
                    for i, d in delays.items())
    return buffers, [jnp.concatenate(pieces, axis=axis)]

  return StepForm((eqn.stream(axis, lead),), step, prefill)


def _concatenate_unscanned(eqn: Eqn, kept: list[int], axis: int) -> StepForm:
  """Only pieces of length 0 vary along time: the result does not."""
  def whole(args):
    if not kept:
      return [jnp.zeros(eqn.out_avals[0].shape, eqn.out_avals[0].dtype)]
    return [jnp.concatenate([args[k] for k in kept], axis=axis)]

  return StepForm((None,), lambda state, index, args: (state, whole(args)),
                  lambda args: ((), whole(args)))


def pad_rule(eqn: Eqn, *, padding_config, **params) -> StepForm:
  """Pads step values; low padding along time raises the offset."""
  axis = forms.stream_axis(eqn.operands[0])
  low, high, interior = padding_config[axis]
  if interior:
    raise eqn.error(INTERIOR_PAD_TIME.format(axis=axis, interior=interior))
  step_config = forms.drop_entry(padding_config, axis)
  length = eqn.operands[0].aval.shape[axis]

  def step(state, index, args):
    out = forms.bind(eqn, args, params, padding_config=step_config)[0]
    if high > 0:
      out = jnp.where(index < length, out, jnp.asarray(args[1], out.dtype))
    return state, [out]

  def prefill(args):
    out_length = eqn.offset + low
    if out_length < 0:
      return (), [None]
    config = list(padding_config)
    config[axis] = (low, 0, 0)
    out = forms.bind(eqn, args, params, padding_config=tuple(config))[0]
    if high > 0:
      position = lax.broadcasted_iota(jnp.int32, out.shape, axis)
      out = jnp.where(position < length + low, out,
                      jnp.asarray(args[1], out.dtype))
    return (), [out]

  return StepForm((eqn.stream(axis, low),), step, prefill)


def slice_rule(eqn: Eqn, *, start_indices, limit_indices, strides,
               **params) -> StepForm:
  """Slices step values; dropping the first k elements of time lowers the
  offset by k."""
  axis = forms.stream_axis(eqn.operands[0])
  stride = 1 if strides is None else strides[axis]
  if stride != 1:
    raise eqn.error(STRIDED_TIME.format(axis=axis, stride=stride))
  start = start_indices[axis]
  step_params = dict(
      params, start_indices=forms.drop_entry(start_indices, axis),
      limit_indices=forms.drop_entry(limit_indices, axis),
      strides=None if strides is None else forms.drop_entry(strides, axis))

  def step(state, index, args):
    return state, forms.bind(eqn, args, step_params)

  def prefill(args):
    if eqn.offset < start:
      return (), [None]
    starts, limits = list(start_indices), list(limit_indices)
    limits[axis] = eqn.offset
    return (), forms.bind(eqn, args, params, start_indices=tuple(starts),
                          limit_indices=tuple(limits), strides=strides)

  return StepForm((eqn.stream(axis, -start),), step, prefill)


def split_rule(eqn: Eqn, *, sizes, axis, **params) -> StepForm:
  """Splits step values; along time, later pieces start later."""
  time = forms.stream_axis(eqn.operands[0])
  if axis != time:
    def fn(index, args):
      return forms.bind(eqn, args, params, sizes=sizes,
                        axis=axis - (axis > time))
    return forms.stateless(eqn, [eqn.stream(time)] * len(sizes), fn)
  starts = [int(s) for s in np.cumsum([0] + list(sizes[:-1]))]

  def step(state, index, args):
    return state, [args[0]] * len(sizes)

  def prefill(args):
    return (), [lax.slice_in_dim(args[0], s, eqn.offset, axis=time)
                if s <= eqn.offset else None for s in starts]

  return StepForm(tuple(eqn.stream(time, -s) for s in starts), step, prefill)


def _identity(primitive, dtype):
  """The element that leaves an accumulation by `primitive` unchanged."""
  prims = _compat.scan_primitives
  if primitive is prims.cumsum_p:
    return 0
  if primitive is prims.cumprod_p:
    return 1
  if jnp.issubdtype(dtype, jnp.inexact):
    low, high = -np.inf, np.inf
  else:
    low, high = jnp.iinfo(dtype).min, jnp.iinfo(dtype).max
  return high if primitive is prims.cummin_p else low


def _combine(primitive):
  prims = _compat.scan_primitives
  return {prims.cumsum_p: lax.add, prims.cumprod_p: lax.mul,
          prims.cummax_p: lax.max, prims.cummin_p: lax.min,
          prims.cumlogsumexp_p: jnp.logaddexp}[primitive]


def cumulative_rule(eqn: Eqn, *, axis, reverse, **params) -> StepForm:
  """Cumulative ops: along time the state is the running accumulation."""
  operand = eqn.operands[0]
  time = forms.stream_axis(operand)
  if axis != time:
    def fn(index, args):
      return forms.bind(eqn, args, params, axis=axis - (axis > time),
                        reverse=reverse)
    return forms.stateless(eqn, [eqn.stream(time)], fn)
  if reverse:
    raise eqn.error(REVERSED_CUMULATIVE.format(axis=axis))
  shape = forms.drop_entry(operand.aval.shape, time)
  init = jnp.full(shape, _identity(eqn.primitive, operand.aval.dtype),
                  operand.aval.dtype)
  combine = _combine(eqn.primitive)

  def step(acc, index, args):
    acc = combine(acc, args[0])
    return acc, [acc]

  def prefill(args):
    if eqn.offset == 0:
      return init, forms.empty_outs(eqn, [eqn.stream(time)])
    out = forms.bind(eqn, args, params, axis=axis, reverse=False)[0]
    return lax.index_in_dim(out, eqn.offset - 1, time, keepdims=False), [out]

  return StepForm((eqn.stream(time),), step, prefill)


def _register_all() -> None:
  prims = _compat.scan_primitives
  register_scan_rule(prims.concatenate_p, concatenate_rule)
  register_scan_rule(prims.pad_p, pad_rule)
  register_scan_rule(prims.slice_p, slice_rule)
  register_scan_rule(_compat.split_p, split_rule)
  for prim in (prims.cumsum_p, prims.cumprod_p, prims.cummax_p,
               prims.cummin_p, prims.cumlogsumexp_p):
    register_scan_rule(prim, cumulative_rule)


_register_all()
