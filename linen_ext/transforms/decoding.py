"""Autoregressive inference from a training-mode model: `as_scan` at module level.

A causal model's `apply` with bound variables is a plain function of its input
sequence, so `lift.as_scan` derives the one-step form from it. These helpers
handle the module plumbing: binding the variables, choosing the method, and
moving the time axis (Flax models usually take `[batch, length, ...]`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

import lift
from linen_ext import errors

from linen_ext.module.core import Module

if TYPE_CHECKING:  # `lift.causal` loads on the first `as_scan`
  from lift.causal import ScanCarry


def _time_first(module: Any, variables: Any, method: Any, time_axis: int,
                apply_kwargs: dict) -> Callable[[Any], Any]:
  """`xs -> y` with time on axis 0 of every input and output leaf."""
  def g(xs):
    inputs = jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, 0, time_axis), xs)
    y = module.apply(variables, inputs, method=method, **apply_kwargs)
    return jax.tree_util.tree_map(lambda v: jnp.moveaxis(v, time_axis, 0), y)
  return g


def _keeps_state(carry: ScanCarry) -> bool:
  return bool(jax.tree_util.tree_leaves(carry.states))


def _check_time_axis(carry: ScanCarry, reading: tuple, example_xs: Any,
                     time_axis: int) -> None:
  """Refuses a step that keeps no state when another input axis would need some.

  A step without state treats every slice along ``time_axis`` on its own; if the
  module carries information along another axis, that axis is time and the one
  given is most likely the batch.
  """
  if _keeps_state(carry):
    return
  module, variables, method, apply_kwargs = reading
  rank = min(jnp.ndim(x) for x in jax.tree_util.tree_leaves(example_xs))
  for axis in [a for a in range(rank) if a != time_axis % rank]:
    try:
      g = _time_first(module, variables, method, axis, apply_kwargs)
      _, other = lift.as_scan(g, _time_first_example(example_xs, axis))
    except Exception:  # noqa: BLE001 (a probe: any failure means it is not this axis)
      continue
    if _keeps_state(other):
      method_name = method if isinstance(method, str) else getattr(method, '__name__', '__call__')
      raise errors.TimeAxisError(f'{type(module).__name__}.{method_name}', time_axis, axis)


def _time_first_example(example_xs: Any, time_axis: int) -> Any:
  def move(x):
    shape = list(x.shape)
    shape.insert(0, shape.pop(time_axis))
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype)
  return jax.tree_util.tree_map(move, example_xs)


def as_scan(module: Any, variables: Any, example_xs: Any, *, method: Any = None,
            time_axis: int = 0, prefill: Any = None, max_length: int | None = None,
            **apply_kwargs):
  """The step function of a causal module, derived from its training-mode `apply`.

  ``example_xs`` (arrays or ``jax.ShapeDtypeStruct``) gives the full length;
  ``time_axis`` says where time is in the module's inputs and outputs. The step
  takes and returns frames with the time axis removed. Without ``prefill``
  returns ``(step, carry)``; with a prompt (same layout, shorter time axis)
  returns ``(step, carry, out_prefill)`` with the step continuing after it.

  The step's caches hold the length of ``example_xs`` along ``time_axis`` (or
  ``max_length``), prompt included: past it an eager step raises
  `lift.CacheLengthError` and a traced one returns NaN, as `lift.as_scan` says.

  Not for models that look ahead in time (bidirectional attention, 'SAME'
  convolutions): those raise `lift.ScanConversionError` naming the operation.
  A ``time_axis`` along which the module keeps no state, while it does along
  another axis (the batch axis given by mistake), raises `TimeAxisError`.

  Examples:
    >>> class Model(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, xs):   # xs: (batch, time, features)
    ...     return jnp.cumsum(nn.Dense(2)(xs), axis=1)
    >>> model, xs = Model(), jnp.ones((1, 4, 3))
    >>> variables = model.init(jax.random.key(0), xs)
    >>> step, carry = nn.as_scan(model, variables, xs, time_axis=1)
    >>> carry, y = step(carry, xs[:, 0])   # one frame: (batch, features)
    >>> bool(jnp.allclose(y, model.apply(variables, xs)[:, 0]))
    True
  """
  if not isinstance(module, Module):
    raise errors.InvalidInstanceModuleError(
        'nn.as_scan', module, 'nn.as_scan(MyModule(...), variables, example_xs)')
  g = _time_first(module, variables, method, time_axis, apply_kwargs)
  example = _time_first_example(example_xs, time_axis)
  reading = (module, variables, method, apply_kwargs)
  if prefill is None:
    step, carry = lift.as_scan(g, example, max_length=max_length)
    _check_time_axis(carry, reading, example_xs, time_axis)
    return step, carry
  prompt = jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, time_axis, 0), prefill)
  step, carry, out_prefill = lift.as_scan_with_prefill(g, example, prompt,
                                                       max_length=max_length)
  _check_time_axis(carry, reading, example_xs, time_axis)
  out_prefill = jax.tree_util.tree_map(lambda v: jnp.moveaxis(v, 0, time_axis), out_prefill)
  return step, carry, out_prefill
