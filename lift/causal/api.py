"""`as_scan` and `as_scan_with_prefill`: a causal function as a scan step."""
from __future__ import annotations

import functools
from typing import Any, NamedTuple
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lift.causal import frames
from lift.causal import interpreter
from lift.causal.interpreter import NotCausal, Program, Stream
from lift.errors import ScanConversionError

INPUT_SHAPES = (
    "as_scan scans every leaf of example_xs along axis 0, so every leaf needs "
    "the same positive length there; got shapes {shapes}. Fix: pass example_xs whose "
    "leaves share one positive length along axis 0 (the time steps)."
)
PREFILL_SHAPES = (
    "prefill must have example_xs's tree structure, each leaf of shape "
    "[P, *frame] with the frame and dtype of example_xs and the same P <= "
    "{length} for all leaves; got {got} for example_xs {want}. Fix: pass the first P "
    "steps of the input, e.g. prefill=example_xs[:P] (for a tree, every leaf sliced alike)."
)
OUTPUT_SHAPE = (
    "output {index} of the function has shape {shape}; as_scan needs every "
    "output leaf to have length {length} (the input length) along axis 0. Fix: return one "
    "output step per input step, along axis 0."
)
OUTPUT_PAIR = (
    "output {index} of the function varies along time on two axes (from {origin}): "
    "it pairs every position with every other, like attention scores. Fix: reduce "
    "or contract the key-time axis behind a causal mask (softmax, weights @ values), "
    "or wrap the composite with @lift.custom_causal."
)
OUTPUT_AXIS = (
    "output {index} of the function varies along axis {axis}, not axis 0; "
    "lax.scan stacks step outputs along axis 0. Fix: move the time axis to the "
    "front (jnp.moveaxis(y, {axis}, 0)) before returning."
)


class ScanCarry(NamedTuple):
  """The carry of a derived step: the global step and the rules' states."""
  step: jax.Array
  states: Any


class Prefilled(NamedTuple):
  """What `as_scan_with_prefill` returns."""
  f: Callable[[ScanCarry, Any], tuple[ScanCarry, Any]]
  carry: ScanCarry
  out_prefill: Any


def as_scan(g: Callable, example_xs: Any
            ) -> tuple[Callable[[ScanCarry, Any], tuple[ScanCarry, Any]],
                       ScanCarry]:
  """Derives a scan step from a function that is causal along axis 0.

  For causal `g` (`g(xs)[:t] == g(xs[:t])` for every t) returns
  `(f, carry_init)` with `lax.scan(f, carry_init, xs)[1] == g(xs)`. Do not
  use it on functions that look ahead in time: they raise
  `ScanConversionError`.

  Args:
    g: maps a pytree of arrays, all of length T along axis 0, to a pytree of
      arrays of length T along axis 0.
    example_xs: arrays or `jax.ShapeDtypeStruct`s shaped like `g`'s input.

  Returns:
    `(f, carry_init)`; `f(carry, x) -> (carry, y)` takes one element.

  Examples:
    >>> xs = jnp.arange(4.0)
    >>> f, carry = as_scan(jnp.cumsum, xs)
    >>> jax.lax.scan(f, carry, xs)[1]
    Array([0., 1., 3., 6.], dtype=float32)
  """
  converted = _convert(g, example_xs, prefill=None)
  return converted.f, converted.carry


def as_scan_with_prefill(g: Callable, example_xs: Any,
                         prefill: Any) -> Prefilled:
  """Like `as_scan`, but first consumes a known prefix in parallel.

  The prefill runs as one parallel call of `g`, then the step continues.
  Not for conditioning inputs that are not a prefix along axis 0 (an
  encoder's output): close over those in `g` instead.

  Args:
    g: a causal function, as for `as_scan`.
    example_xs: shaped like the whole input, prefill and continuation
      (length P + T along axis 0).
    prefill: the first P elements of the input.

  Returns:
    `Prefilled(f, carry, out_prefill)`: `out_prefill == g(prefill)` and
    `lax.scan(f, carry, rest)[1] == g(concat([prefill, rest]))[P:]`.

  Examples:
    >>> f, carry, out = as_scan_with_prefill(
    ...     jnp.cumsum, jnp.zeros(4), jnp.array([1.0, 2.0]))
    >>> out, f(carry, jnp.float32(3.0))[1]
    (Array([1., 3.], dtype=float32), Array(6., dtype=float32))
  """
  return _convert(g, example_xs, prefill=prefill)


def _convert(g, example_xs, prefill) -> Prefilled:
  leaves, in_tree = jax.tree.flatten(example_xs)
  length = _input_length(leaves)
  prefix_leaves = _prefill_leaves(leaves, in_tree, length, prefill)
  offset = 0 if prefill is None else prefix_leaves[0].shape[0]
  shapes = jax.tree.unflatten(in_tree, [
      jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves])
  closed, out_shapes = jax.make_jaxpr(g, return_shape=True)(shapes)
  out_shapes, out_tree = jax.tree.flatten(out_shapes)
  _check_output_shapes(out_shapes, length)
  program = interpreter.convert(
      closed.jaxpr, closed.consts, [Stream(0, offset)] * len(leaves),
      [None] * len(leaves), out_offsets=[offset] * len(out_shapes))
  _check_output_infos(program)
  states, outs = interpreter.run_prefill(program, prefix_leaves)
  outs = [out if isinstance(info, Stream) else out[:offset]
          for out, info in zip(outs, program.out_infos)]
  carry = ScanCarry(jnp.zeros((), jnp.int32), states)
  f = functools.partial(_step, program, in_tree, out_tree, offset)
  return Prefilled(f, carry, jax.tree.unflatten(out_tree, outs))


def _input_length(leaves) -> int:
  shapes = [np.shape(x) for x in leaves]
  lengths = {s[0] if s else 0 for s in shapes}
  if len(lengths) != 1 or 0 in lengths:
    raise ScanConversionError(INPUT_SHAPES.format(shapes=shapes))
  return lengths.pop()


def _prefill_leaves(leaves, in_tree, length, prefill) -> list:
  if prefill is None:
    return [frames.empty_prefix(x, 0) for x in leaves]
  got, got_tree = jax.tree.flatten(prefill)
  shapes = [np.shape(x) for x in got]
  ok = (got_tree == in_tree and len({s[:1] for s in shapes}) == 1 and all(
      s[1:] == np.shape(x)[1:] and s[0] <= length and p.dtype == x.dtype
      for s, p, x in zip(shapes, got, leaves)))
  if not ok:
    raise ScanConversionError(PREFILL_SHAPES.format(
        length=length, got=(got_tree, shapes),
        want=(in_tree, [np.shape(x) for x in leaves])))
  return [jnp.asarray(x) for x in got]


def _check_output_shapes(shapes, length: int) -> None:
  for index, shape in enumerate(shapes):
    if not shape.shape or shape.shape[0] != length:
      raise ScanConversionError(OUTPUT_SHAPE.format(
          index=index, shape=shape.shape, length=length))


def _check_output_infos(program: Program) -> None:
  for index, info in enumerate(program.out_infos):
    link = getattr(info, "link", None)  # a value with two time axes
    if link is not None:
      raise ScanConversionError(OUTPUT_PAIR.format(index=index, origin=link.origin))
    if isinstance(info, NotCausal):
      raise ScanConversionError(f'{info.message}\n  {interpreter.FIX}')
    if isinstance(info, Stream) and info.axis != 0:
      raise ScanConversionError(OUTPUT_AXIS.format(index=index, axis=info.axis))


def _step(program: Program, in_tree, out_tree, offset: int,
          carry: ScanCarry, x: Any):
  leaves = in_tree.flatten_up_to(x)
  states, outs = interpreter.run_step(program, carry.states, carry.step,
                                      leaves)
  outs = [out if isinstance(info, Stream)
          else frames.step_slice(out, 0, carry.step + offset)
          for out, info in zip(outs, program.out_infos)]
  return (ScanCarry(carry.step + 1, states),
          jax.tree.unflatten(out_tree, outs))
