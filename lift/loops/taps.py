"""PyTensor/Aesara-style `scan` with taps, lowered to one `run_scan`.

Step t (0 <= t < n) reads sequence `s` with taps T_s at `s[t + k - min(min(T_s), 0)]`
for k in T_s, and a fed-back output `o` with negative taps T_o at `o[t + k]`,
where o[-L..-1] = initial[0..L-1] and L = -min(T_o). The scan carry of such an
output is a shifting window of its last L values (window[L + k] is tap k).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lift.errors import ScanTapsError
from lift.loops import _messages
from lift.loops.engine import run_scan


class SequenceSpec(NamedTuple):
  """A sequence and the taps at which each step reads it."""
  values: jax.Array
  taps: tuple[int, ...]

  @property
  def offset(self) -> int:
    """Index of step 0's tap 0 in `values`: `-min(mintap, 0)`."""
    return -min(min(self.taps), 0)

  @property
  def steps(self) -> int:
    """`len - (max(maxtap, 0) - min(mintap, 0))`."""
    return self.values.shape[0] - (max(max(self.taps), 0) + self.offset)


class OutputSpec(NamedTuple):
  """An output: not fed back (`window` None) or fed back at negative `taps`."""
  window: jax.Array | None
  taps: tuple[int, ...]


def _taps(where: str, taps: Any) -> tuple[int, ...]:
  if (isinstance(taps, (str, bytes)) or not isinstance(taps, Sequence) or not taps
      or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in taps)):
    raise ScanTapsError(_messages.TAPS_SPEC.format(
        where=where, value=taps, expected="a non-empty list of ints"))
  return tuple(int(k) for k in taps)


def parse_sequence(index: int, spec: Any) -> SequenceSpec:
  """An array (tap 0) or `{'input': x, 'taps': [...]}` as a `SequenceSpec`."""
  taps: tuple[int, ...]
  if not isinstance(spec, dict):
    values, taps = spec, (0,)
  elif set(spec) <= {"input", "taps"} and "input" in spec:
    values = spec["input"]
    taps = _taps(f"sequences[{index}]['taps']", spec.get("taps", [0]))
  else:
    raise ScanTapsError(_messages.TAPS_SPEC.format(
        where=f"sequences[{index}]", value=spec,
        expected="an array or {'input': x, 'taps': [...]}"))
  values = jnp.asarray(values)
  if values.ndim == 0:
    raise ScanTapsError(_messages.TAPS_SPEC.format(
        where=f"sequences[{index}]", value=values,
        expected="an array with a leading step axis"))
  return SequenceSpec(values, taps)


def _initial_window(index: int, initial: Any, taps: tuple[int, ...]) -> jax.Array:
  needed = -min(taps)
  initial = jnp.asarray(initial)
  if initial.ndim == 0 or initial.shape[0] < needed:
    raise ScanTapsError(_messages.TAPS_INITIAL_SHORT.format(
        index=index, taps=list(taps), needed=needed, shape=initial.shape))
  return initial[:needed]


def parse_output(index: int, spec: Any) -> OutputSpec:
  """`None`, an initial value (tap -1) or `{'initial': x0, 'taps': [...]}`."""
  if spec is None:
    return OutputSpec(None, ())
  if not isinstance(spec, dict):
    return OutputSpec(jnp.asarray(spec)[None], (-1,))
  if not set(spec) <= {"initial", "taps"}:
    raise ScanTapsError(_messages.TAPS_SPEC.format(
        where=f"outputs_info[{index}]", value=spec,
        expected="None, an initial value or {'initial': x0, 'taps': [...]}"))
  if spec.get("initial") is None:
    return OutputSpec(None, ())
  if "taps" not in spec:
    return OutputSpec(jnp.asarray(spec["initial"])[None], (-1,))
  taps = spec["taps"]
  if (isinstance(taps, (str, bytes)) or not isinstance(taps, Sequence) or not taps
      or not all(isinstance(k, (int, np.integer)) and k < 0 for k in taps)):
    raise ScanTapsError(_messages.TAPS_OUTPUT_NOT_PAST.format(index=index, taps=taps))
  taps = tuple(int(k) for k in taps)
  if taps == (-1,):  # as PyTensor: the state itself, like a bare initial value
    return OutputSpec(jnp.asarray(spec["initial"])[None], taps)
  return OutputSpec(_initial_window(index, spec["initial"], taps), taps)


def count_steps(sequences: list[SequenceSpec], n_steps: int | None) -> int:
  """The number of steps: `n_steps`, or what every sequence gives.

  Without `n_steps` all sequences must give the same count; with it, each
  must give at least `n_steps` (the first `n_steps` steps are run).
  """
  if n_steps is not None:
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 0:
      raise ScanTapsError(_messages.NO_STEPS.format(n_steps=n_steps))
    for index, seq in enumerate(sequences):
      if seq.steps < n_steps:
        raise ScanTapsError(_messages.TOO_FEW_STEPS.format(
            n_steps=n_steps, index=index, size=seq.values.shape[0],
            taps=list(seq.taps), steps=seq.steps))
    return int(n_steps)
  if not sequences:
    raise ScanTapsError(_messages.NO_STEPS.format(n_steps=n_steps))
  counts = {seq.steps for seq in sequences}
  if len(counts) > 1:
    detail = "; ".join(
        f"sequences[{i}] has length {seq.values.shape[0]}, taps {list(seq.taps)}: "
        f"{seq.steps} steps" for i, seq in enumerate(sequences))
    raise ScanTapsError(_messages.SEQUENCE_STEPS.format(detail=detail))
  return counts.pop()


def tap_slices(seq: SequenceSpec, steps: int, go_backwards: bool = False) -> list[jax.Array]:
  """For each tap k, the `steps` values that step t reads: `values[t + k + offset]`.

  Backwards, as PyTensor: each tap's window is cut in original time, then
  reversed, so step t reads `values[last - t + k + offset]` (tap -1 is the
  element before in the sequence, not the one visited before).
  """
  if not go_backwards:
    return [lax.slice_in_dim(seq.values, k + seq.offset, k + seq.offset + steps)
            for k in seq.taps]
  return [jnp.flip(lax.slice_in_dim(seq.values, k + seq.offset, k + seq.offset + seq.steps),
                   0)[:steps] for k in seq.taps]


def _freeze_before(cut: jax.Array, tree: Any) -> Any:
  """`tree` with no gradient when `cut` is true (truncated backpropagation)."""
  def freeze(leaf):
    if not isinstance(leaf, jax.Array):
      return leaf
    return jnp.where(cut, lax.stop_gradient(leaf), leaf)
  return jax.tree.map(freeze, tree)


def _as_outputs(result: Any, expected: int | None) -> list[Any]:
  outputs = list(result) if isinstance(result, (list, tuple)) else [result]
  if expected is not None and len(outputs) != expected:
    raise ScanTapsError(_messages.OUTPUT_COUNT.format(got=len(outputs), expected=expected))
  return outputs


@dataclasses.dataclass(frozen=True, eq=False)
class TapsStep:
  """The scan body of `scan_taps`: reads taps, calls `fn`, shifts the windows."""
  fn: Callable[..., Any]
  outputs: list[OutputSpec]
  non_sequences: tuple[Any, ...]
  first_grad_step: int | None

  def __call__(self, windows, step_xs):
    taps, step = step_xs
    non_sequences = self.non_sequences
    if self.first_grad_step is not None:
      cut = step < self.first_grad_step
      windows, taps, non_sequences = _freeze_before(cut, (windows, taps, non_sequences))
    fed = [spec for spec in self.outputs if spec.window is not None]
    past = [window[window.shape[0] + k] for spec, window in zip(fed, windows) for k in spec.taps]
    results = _as_outputs(self.fn(*taps, *past, *non_sequences),
                          len(self.outputs) or None)
    new = [value for spec, value in zip(self.outputs, results) if spec.window is not None]
    windows = [jnp.concatenate([window[1:], jnp.asarray(value)[None]]) for window, value in zip(windows, new)]
    return windows, results


def scan_taps(fn: Callable[..., Any], sequences: Any = (), outputs_info: Any = (),
              non_sequences: Any = (), n_steps: int | None = None,
              go_backwards: bool = False, truncate_gradient: int = -1) -> Any:
  """PyTensor's `scan` with taps, as one differentiable `lax.scan`.

  For porting PyTensor/Theano code and recurrences over several past steps.
  Not needed for a loop that only looks one step back: `scan` is simpler.

  Args:
    fn: called once per step with the taps of every sequence (in the order of
      `sequences`, each in the order of its taps), then the taps of every
      fed-back output, then `non_sequences`; returns one value per
      `outputs_info` entry (a bare value when there is one), or any number of
      values when `outputs_info` is empty.
    sequences: arrays (tap 0) or `{'input': x, 'taps': [-1, 0, 1]}`; a single
      one may be given bare.
    outputs_info: per output, `None` (not fed back), an initial value (fed
      back at tap -1), or `{'initial': x0, 'taps': [-2, -1]}` where `x0[i]`
      is the value at step `i - L`, `L = -min(taps)` (with taps `[-1]` alone,
      `x0` is the state itself, as in PyTensor); a single one may be given
      bare.
    non_sequences: values passed whole to every step.
    n_steps: number of steps; by default what every sequence gives,
      `len - (max(maxtap, 0) - min(mintap, 0))`.
    go_backwards: iterate over the sequences from their end; a tap k still
      reads k elements away in the sequence's own order, and outputs stay in
      iteration order, as in PyTensor.
    truncate_gradient: k >= 0 gives gradients through the last k steps only
      (earlier steps act as constants), -1 full backpropagation.

  Returns:
    The outputs stacked over steps (initial values not included): a bare
    array for a single output, else a list. PyTensor's `updates` have no
    counterpart and are not returned.

  Examples:
    >>> import jax.numpy as jnp
    >>> fib = scan_taps(lambda a, b: a + b, n_steps=5,
    ...                 outputs_info={'initial': jnp.array([0, 1]), 'taps': [-2, -1]})
    >>> fib.tolist()
    [1, 2, 3, 5, 8]
  """
  outputs_info = list(outputs_info) if isinstance(outputs_info, (list, tuple)) else [outputs_info]
  sequences = [sequences] if not isinstance(sequences, (list, tuple)) else list(sequences)
  non_sequences = tuple(non_sequences) if isinstance(non_sequences, (list, tuple)) else (non_sequences,)
  seqs = [parse_sequence(i, spec) for i, spec in enumerate(sequences)]
  outputs = [parse_output(i, spec) for i, spec in enumerate(outputs_info)]
  steps = count_steps(seqs, n_steps)
  truncated = 0 <= truncate_gradient < steps
  step = TapsStep(fn, outputs, non_sequences, steps - truncate_gradient if truncated else None)
  taps = [column for seq in seqs for column in tap_slices(seq, steps, go_backwards)]
  index = jnp.arange(steps, dtype=jnp.int32) if truncated else None
  windows = [spec.window for spec in outputs if spec.window is not None]
  _, ys = run_scan(step, windows, (taps, index), length=steps)
  return ys[0] if len(ys) == 1 else ys
