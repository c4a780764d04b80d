"""`as_scan` and `as_scan_with_prefill`: a causal function as a scan step."""
from __future__ import annotations

import functools
import re
from typing import Any, NamedTuple
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from lift import _compat
from lift.causal import associative
from lift.causal import frames
from lift.causal import interpreter
from lift.causal.interpreter import NotCausal, Program, Stream
from lift.errors import CacheLengthError, ModelLengthError, ScanConversionError

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
MAX_LENGTH = (
    "max_length must be a positive int, at least the prefill's length ({prefill}); got "
    "{got!r}. Fix: pass the number of elements the step must hold, prefill included."
)
PAST_CACHE = (
    "the derived step was called for element {element} (0-based), but its caches hold "
    "{capacity} elements (the length of example_xs, or max_length), and reading past them "
    "would give wrong values. Fix: derive the step with max_length= at least the number "
    "of elements you decode, prefill included."
)
MODEL_LENGTH = (
    "{runs}, but it fails there: {error}\n  at {where}\n  It runs at length {short}, so a "
    "value in it is shorter than {length} along time{shapes}: a table read by position (a "
    "position embedding sliced to the input's length), a mask or a cache of fixed size. Fix: "
    "make that value at least {length} long (a larger maximum length in the model's "
    "configuration), or {fewer}."
)
OUTPUT_AXIS = (
    "output {index} of the function varies along axis {axis}, not axis 0; "
    "lax.scan stacks step outputs along axis 0. Fix: move the time axis to the "
    "front (jnp.moveaxis(y, {axis}, 0)) before returning."
)


class Length(NamedTuple):
  """The length a derived step holds, and how to say why in an error."""
  length: int
  runs: str  # "as_scan runs the function at length 12 (max_length)"
  fewer: str  # how to ask for a shorter one


class ScanCarry(NamedTuple):
  """The carry of a derived step: the global step and the rules' states."""
  step: jax.Array
  states: Any


class Prefilled(NamedTuple):
  """What `as_scan_with_prefill` returns."""
  f: Callable[[ScanCarry, Any], tuple[ScanCarry, Any]]
  carry: ScanCarry
  out_prefill: Any


def as_scan(g: Callable, example_xs: Any, *, max_length: int | None = None
            ) -> tuple[Callable[[ScanCarry, Any], tuple[ScanCarry, Any]],
                       ScanCarry]:
  """Derives a scan step from a function that is causal along axis 0.

  For causal `g` (`g(xs)[:t] == g(xs[:t])` for every t) returns
  `(f, carry_init)` with `lax.scan(f, carry_init, xs)[1] == g(xs)`. Do not
  use it on functions that look ahead in time: they raise
  `ScanConversionError`.

  The step's caches hold the length of `example_xs` (or `max_length`) elements.
  Calling it past them raises `CacheLengthError` when the step count is known
  on the host (eager calls), and gives NaN outputs under `jit` or `lax.scan`
  (integer outputs: their dtype's minimum). A step whose only caches are
  sliding-window rings, or that keeps none, runs without limit.

  Args:
    g: maps a pytree of arrays, all of length T along axis 0, to a pytree of
      arrays of length T along axis 0.
    example_xs: arrays or `jax.ShapeDtypeStruct`s shaped like `g`'s input.
    max_length: the number of elements the step holds, if not the length of
      `example_xs`; `g` is traced at that length.

  Returns:
    `(f, carry_init)`; `f(carry, x) -> (carry, y)` takes one element.

  Examples:
    >>> xs = jnp.arange(4.0)
    >>> f, carry = as_scan(jnp.cumsum, xs)
    >>> jax.lax.scan(f, carry, xs)[1]
    Array([0., 1., 3., 6.], dtype=float32)
  """
  converted = derive(g, example_xs, prefill=None, max_length=max_length)
  return converted.f, converted.carry


def as_scan_with_prefill(g: Callable, example_xs: Any, prefill: Any, *,
                         max_length: int | None = None) -> Prefilled:
  """Like `as_scan`, but first consumes a known prefix in parallel.

  The prefill runs as one parallel call of `g`, then the step continues.
  Not for conditioning inputs that are not a prefix along axis 0 (an
  encoder's output): close over those in `g` instead.

  Args:
    g: a causal function, as for `as_scan`.
    example_xs: shaped like the whole input, prefill and continuation
      (length P + T along axis 0).
    prefill: the first P elements of the input.
    max_length: as for `as_scan`: the elements the step holds, prefill included.

  Returns:
    `Prefilled(f, carry, out_prefill)`: `out_prefill == g(prefill)` and
    `lax.scan(f, carry, rest)[1] == g(concat([prefill, rest]))[P:]`.

  Examples:
    >>> f, carry, out = as_scan_with_prefill(
    ...     jnp.cumsum, jnp.zeros(4), jnp.array([1.0, 2.0]))
    >>> out, f(carry, jnp.float32(3.0))[1]
    (Array([1., 3.], dtype=float32), Array(6., dtype=float32))
  """
  return derive(g, example_xs, prefill=prefill, max_length=max_length)


def derive(g, example_xs, prefill, max_length, wording: Length | None = None) -> Prefilled:
  """`as_scan_with_prefill` (`as_scan` without `prefill`); `wording` says why the step
  holds its length when the function fails there."""
  leaves, in_tree = jax.tree.flatten(example_xs)
  length = _input_length(leaves)
  prefix_leaves = _prefill_leaves(leaves, in_tree, length, prefill)
  offset = 0 if prefill is None else prefix_leaves[0].shape[0]
  shorter = offset or length
  if max_length is not None:
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < max(
        offset, 1):
      raise ScanConversionError(MAX_LENGTH.format(prefill=offset, got=max_length))
    length = max_length
  wording = wording or _wording(length, max_length is not None)
  closed, out_shapes = _trace(g, leaves, in_tree, wording, shorter)
  out_shapes, out_tree = jax.tree.flatten(out_shapes)
  _check_output_shapes(out_shapes, length)
  program = interpreter.convert(
      associative.fold(closed).jaxpr, closed.consts, [Stream(0, offset)] * len(leaves),
      [None] * len(leaves), out_offsets=[offset] * len(out_shapes))
  _check_output_infos(program)
  states, outs = interpreter.run_prefill(program, prefix_leaves)
  outs = [out if isinstance(info, Stream) else out[:offset]
          for out, info in zip(outs, program.out_infos)]
  carry = ScanCarry(jnp.zeros((), jnp.int32), states)
  f = functools.partial(_step, program, in_tree, out_tree, offset, length)
  return Prefilled(f, carry, jax.tree.unflatten(out_tree, outs))


def _wording(length: int, from_max_length: bool) -> Length:
  if from_max_length:
    return Length(length, f"as_scan runs the function at length {length} (max_length)",
                  "pass a smaller max_length")
  return Length(length, f"as_scan runs the function at length {length} (example_xs's)",
                "pass a shorter example_xs")


def _shaped(leaves, in_tree, length: int):
  return jax.tree.unflatten(in_tree, [
      jax.ShapeDtypeStruct((length, *np.shape(x)[1:]), x.dtype) for x in leaves])


def _trace(g, leaves, in_tree, wording: Length, shorter: int):
  """`g`'s jaxpr and output shapes at `wording.length`; if it fails there but not at
  the `shorter` length, a `ModelLengthError` naming the failure."""
  try:
    return jax.make_jaxpr(g, return_shape=True)(_shaped(leaves, in_tree, wording.length))
  except Exception as error:  # noqa: BLE001 (retraced below; re-raised unless it is the length)
    if not 0 < shorter < wording.length or not _traces(g, _shaped(leaves, in_tree, shorter)):
      raise
    raise ModelLengthError(MODEL_LENGTH.format(
        runs=wording.runs, error=f"{type(error).__name__}: {error}",
        where=_compat.user_location(error.__traceback__), short=shorter,
        length=wording.length, shapes=_shapes_seen(str(error), wording.length),
        fewer=wording.fewer)) from error


def _traces(g, shapes) -> bool:
  try:
    jax.eval_shape(g, shapes)
  except Exception:  # noqa: BLE001 (any failure: the length is not the only problem)
    return False
  return True


def _shapes_seen(message: str, length: int) -> str:
  """` (shapes (1, 12, 16) and (1, 8, 16))`: the shapes in the message, when one of them
  has the length and another is shorter where it has it."""
  shapes = [tuple(int(d) for d in found.split(",") if d.strip())
            for found in re.findall(r"\((\d+(?:, *\d+)*),?\)", message)]
  for long in shapes:
    for short in shapes:
      if len(long) == len(short) and any(
          a == length and 1 < b < length for a, b in zip(long, short)):
        return f" (shapes {long} and {short})"
  return ""


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


def _step(program: Program, in_tree, out_tree, offset: int, capacity: int,
          carry: ScanCarry, x: Any):
  leaves = in_tree.flatten_up_to(x)
  with frames.watching_positions() as reads:
    states, outs = interpreter.run_step(program, carry.states, carry.step,
                                        leaves)
    outs = [out if isinstance(info, Stream)
            else frames.step_slice(out, 0, carry.step + offset)
            for out, info in zip(outs, program.out_infos)]
  if reads.bounded:
    outs = _within_capacity(outs, carry.step + offset, capacity)
  return (ScanCarry(carry.step + 1, states),
          jax.tree.unflatten(out_tree, outs))


def _within_capacity(outs: list, element: jax.Array, capacity: int) -> list:
  """The outputs, or an error past the caches: NaN where the step is traced."""
  if not isinstance(element, _compat.Tracer):
    if int(element) >= capacity:
      raise CacheLengthError(PAST_CACHE.format(element=int(element), capacity=capacity))
    return outs
  inside = element < capacity
  return [jnp.where(inside, out, _invalid(out.dtype)) for out in outs]


def _invalid(dtype) -> Any:
  if jnp.issubdtype(dtype, jnp.inexact):
    return jnp.array(jnp.nan, dtype)
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.array(jnp.iinfo(dtype).min, dtype)
  return jnp.zeros((), dtype)
