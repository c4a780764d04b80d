"""Building blocks for rules: common step forms and axis bookkeeping."""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

import jax
from jax import lax
import jax.numpy as jnp

from lift.causal import frames
from lift.causal.interpreter import Eqn, Operand, StepForm, Stream

DIFFERENT_AXES = (
    "its operands vary along different axes ({axes}); combining two "
    "positions of the sequence is not causal step by step."
)
# Sharding annotations describe the whole value; a step value has one axis
# fewer, so steps run unannotated.
_SHARDING_PARAMS = ("sharding", "out_sharding")


def bind(eqn: Eqn, args: Sequence[Any], params: dict, **changes) -> list:
  """Binds the equation's primitive with `params` updated by `changes`."""
  params = dict(params, **changes)
  for name in _SHARDING_PARAMS:
    if name in params:
      params[name] = None
  out = eqn.primitive.bind(*args, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def drop_dim(dims: Sequence[int], axis: int) -> tuple[int, ...]:
  """Dimension numbers with `axis` removed and those after it renumbered."""
  return tuple(d - (d > axis) for d in dims if d != axis)


def drop_entry(values: Sequence[Any], index: int) -> tuple[Any, ...]:
  """`values` without entry `index`."""
  return tuple(v for i, v in enumerate(values) if i != index)


def stream_axis(op: Operand) -> int:
  """The scan axis of `op`, an operand the rule knows varies along time."""
  assert op.stream is not None, "the operand does not vary along time"
  return op.stream.axis


def common_axis(eqn: Eqn) -> int:
  """The scan axis shared by every stream operand; raises if they differ."""
  axes = sorted({op.stream.axis for op in eqn.operands
                 if op.stream is not None})
  if len(axes) != 1:
    raise eqn.error(DIFFERENT_AXES.format(axes=axes))
  return axes[0]


def step_args(eqn: Eqn, args: Sequence[Any], index: jax.Array,
              axes: Sequence[int | None]) -> list:
  """Step values of `args`: unscanned operands are indexed along `axes`."""
  return [
      arg if op.stream is not None or axis is None
      else frames.step_slice(arg, axis, index)
      for op, arg, axis in zip(eqn.operands, args, axes)]


def empty_outs(eqn: Eqn, outs: Sequence[Stream]) -> list:
  """Prefixes of no elements for every result."""
  return [frames.empty_prefix(aval, out.axis)
          for aval, out in zip(eqn.out_avals, outs)]


def stateless(eqn: Eqn, outs: Sequence[Stream],
              fn: Callable[[jax.Array, list], list]) -> StepForm:
  """A step form without state: `fn(index, args) -> outs` per element.

  The prefill applies `fn` to every prefix element at once with `jax.vmap`.
  Use it for rules of primitives that act on each element alone.

  >>> import jax.numpy as jnp
  >>> def sin_rule(eqn, **params):
  ...   return stateless(eqn, [eqn.operands[0].stream],
  ...                    lambda index, args: [jnp.sin(args[0])])
  """
  outs = tuple(outs)

  def step(state, index, args):
    return state, list(fn(index, args))

  def prefill(args):
    if eqn.offset == 0:
      return (), empty_outs(eqn, outs)
    in_axes = [op.axis for op in eqn.operands]
    per_element = jax.vmap(fn, in_axes=(0, in_axes),
                           out_axes=[out.axis for out in outs])
    return (), per_element(jnp.arange(eqn.offset, dtype=jnp.int32), args)

  return StepForm(outs, step, prefill)


def stateful(eqn: Eqn, outs: Sequence[Stream], init: Any,
             step: Callable) -> StepForm:
  """A step form with state `init`; its prefill scans `step` over the prefix.

  `step(state, index, args) -> (state, outs)`. Every result must keep the
  operands' offset.

  >>> import jax.numpy as jnp
  >>> def running_sum_rule(eqn, **params):
  ...   x = eqn.operands[0]
  ...   def step(total, index, args):
  ...     total = total + args[0]
  ...     return total, [total]
  ...   init = jnp.zeros(x.aval.shape[1:], x.aval.dtype)
  ...   return stateful(eqn, [x.stream], init, step)
  """
  outs = tuple(outs)

  def prefill(args):
    if eqn.offset == 0:
      return init, empty_outs(eqn, outs)
    xs = [jnp.moveaxis(arg, op.stream.axis, 0)
          for op, arg in zip(eqn.operands, args) if op.stream is not None]

    def body(state, index_and_elements):
      index, elements = index_and_elements
      elements = iter(elements)
      step_in = [arg if op.stream is None else next(elements)
                 for op, arg in zip(eqn.operands, args)]
      return step(state, index, step_in)

    indices = jnp.arange(eqn.offset, dtype=jnp.int32)
    state, ys = lax.scan(body, init, (indices, xs))
    return state, [jnp.moveaxis(y, 0, out.axis) for y, out in zip(ys, outs)]

  return StepForm(outs, step, prefill)

