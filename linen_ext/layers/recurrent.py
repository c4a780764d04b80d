"""`RNN` and `Bidirectional`: a recurrent cell looped over time by the lifted `scan`.

They take Flax's constructor and call arguments, so ``nn.RNN(nn.LSTMCell(64))``
ports by changing the import, and give Flax's variable tree and values. Cells
are the ready-made ones (`LSTMCell`, `GRUCell`, ...) or `RNNCellBase`
subclasses. The cell runs under `linen_ext.scan` with its parameters
broadcast (one set for every step); ``seq_lengths`` marks the padding at the
end of each sequence: a reversed pass flips only the real steps, and the
returned carry is the one after each sequence's last real step.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax.core import FrozenDict

from linen_ext import errors
from linen_ext.module.method_wrapping import nowrap
from linen_ext.module.core import Module
from linen_ext.transforms.module_transforms import scan


class RNNCellBase(Module):
  """Base of recurrent cells ``(carry, x) -> (carry, y)`` that `RNN` can loop.

  A subclass defines ``__call__`` and ``initialize_carry``; ``num_feature_axes``
  (trailing feature axes of an input step) is 1 unless overridden. Not
  needed for the usual cells: `LSTMCell`, `GRUCell`, ... are ready-made.

  Examples:
    >>> class Accumulate(nn.RNNCellBase):
    ...   def __call__(self, carry, x):
    ...     return carry + x, carry + x
    ...   def initialize_carry(self, rng, input_shape):
    ...     return jnp.zeros(input_shape)
    >>> nn.RNN(Accumulate()).apply({}, jnp.ones((1, 3, 2)))   # (batch, time, features)
    Array([[[1., 1.],
            [2., 2.],
            [3., 3.]]], dtype=float32)
  """

  @nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]) -> Any:
    """The carry before the first step, for one input step of ``input_shape``."""
    raise NotImplementedError(
        f'{type(self).__name__} does not define initialize_carry(rng, input_shape); '
        'define it, or pass initial_carry= to RNN.')

  @property
  def num_feature_axes(self) -> int:
    """How many trailing axes of an input step are features."""
    return 1


def flip_sequences(inputs: jax.Array, seq_lengths: jax.Array | None, num_batch_dims: int,
                   time_major: bool) -> jax.Array:
  """Reverses each sequence's first ``seq_lengths`` steps; padding stays at the end.

  `RNN` with ``reverse=True`` calls it; not needed for sequences without
  padding: ``jnp.flip`` along the time axis is the same.

  Examples:
    >>> flip_sequences(jnp.array([[1, 2, 0]]), jnp.array([2]), 1, False).tolist()
    [[2, 1, 0]]
  """
  time_axis = 0 if time_major else num_batch_dims
  if seq_lengths is None:
    return jnp.flip(inputs, axis=time_axis)
  steps = inputs.shape[time_axis]
  # Step t of a sequence of length n reads step n - 1 - t (mod steps: padding reads padding).
  source = (jnp.expand_dims(seq_lengths, time_axis) - 1 - jax.lax.broadcasted_iota(
      jnp.int32, (1,) * time_axis + (steps,) + (1,) * (num_batch_dims - time_axis), time_axis))
  source = (source % steps).reshape(source.shape + (1,) * (inputs.ndim - source.ndim))
  return jnp.take_along_axis(inputs, source, axis=time_axis)


def _carry_at(carries: Any, seq_lengths: jax.Array) -> Any:
  """From carries stacked over time (axis 0), each sequence's carry after its last step."""
  batch = jnp.arange(seq_lengths.shape[0])
  return jax.tree.map(lambda c: c[seq_lengths - 1, batch], carries)


def _concatenate(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.concatenate([a, b], axis=-1)


class RNN(Module):
  """Loops ``cell`` over the time axis of its inputs, as `flax.linen.RNN`.

  ``time_major=False`` reads inputs as ``(*batch, time, *features)``;
  ``reverse=True`` runs from the last step to the first (and returns the
  outputs in that order unless ``keep_order``). The ``variable_*`` and
  ``split_rngs`` fields go to the lifted `scan`. Not for one step at a time
  (decoding): call the cell itself with its carry.

  Attributes:
    optimize: rewrite the loop with `lift.optimize_scans` (True: its cost model decides;
      default off, as Flax's RNN).

  Examples:
    >>> rnn, x = nn.RNN(nn.GRUCell(3), return_carry=True), jnp.ones((2, 5, 4))
    >>> variables = rnn.init(jax.random.key(0), x)   # x: (batch, time, features)
    >>> carry, y = rnn.apply(variables, x, seq_lengths=jnp.array([5, 2]))
    >>> carry.shape, y.shape
    ((2, 3), (2, 5, 3))
  """
  cell: Module
  time_major: bool = False
  return_carry: bool = False
  reverse: bool = False
  keep_order: bool = False
  unroll: int = 1
  optimize: Any = False
  variable_axes: Mapping[Any, Any] = FrozenDict()
  variable_broadcast: Any = 'params'
  variable_carry: Any = False
  split_rngs: Mapping[Any, bool] = FrozenDict({'params': False})

  def __call__(self, inputs: jax.Array, *, initial_carry: Any = None,
               init_key: jax.Array | None = None, seq_lengths: jax.Array | None = None,
               return_carry: bool | None = None, time_major: bool | None = None,
               reverse: bool | None = None, keep_order: bool | None = None) -> Any:
    """The outputs over time, or ``(carry, outputs)`` with ``return_carry``."""
    pick = lambda value, default: default if value is None else value
    return_carry, time_major = pick(return_carry, self.return_carry), pick(time_major,
                                                                           self.time_major)
    reverse, keep_order = pick(reverse, self.reverse), pick(keep_order, self.keep_order)
    features = getattr(self.cell, 'num_feature_axes', None)
    if not isinstance(features, int):
      raise errors.LayerArgumentError(
          f'RNN: the cell {type(self.cell).__name__} is not a recurrent cell (it '
          'has no num_feature_axes). Fix: pass a cell such as nn.LSTMCell(n), or '
          'subclass nn.RNNCellBase with __call__(carry, x) -> (carry, y).')
    time_axis = 0 if time_major else inputs.ndim - features - 1
    batch_dims = time_axis if not time_major else inputs.ndim - features - 1
    flip = lambda xs: jax.tree.map(
        lambda x: flip_sequences(x, seq_lengths, batch_dims, time_major), xs)
    if reverse:
      inputs = flip(inputs)
    if initial_carry is None:
      step_shape = inputs.shape[:time_axis] + inputs.shape[time_axis + 1:]
      key = jax.random.key(0) if init_key is None else init_key
      initial_carry = self.cell.initialize_carry(key, step_shape)
    keep_carries = seq_lengths is not None and return_carry

    def step(cell, carry, x):
      carry, y = cell(carry, x)
      return carry, ((carry, y) if keep_carries else y)

    loop = scan(step, variable_axes=self.variable_axes,
                variable_broadcast=self.variable_broadcast,
                variable_carry=self.variable_carry, split_rngs=self.split_rngs,
                in_axes=time_axis, out_axes=(0, time_axis) if keep_carries else time_axis,
                unroll=self.unroll, optimize=self.optimize)
    carry, outputs = loop(self.cell, initial_carry, inputs)
    if keep_carries:
      assert seq_lengths is not None  # keep_carries says so
      carries, outputs = outputs
      carry = _carry_at(carries, seq_lengths)
    if reverse and keep_order:
      outputs = flip(outputs)
    return (carry, outputs) if return_carry else outputs


class Bidirectional(Module):
  """Runs ``forward_rnn`` and ``backward_rnn`` (reversed, order kept) and merges their outputs.

  As `flax.linen.Bidirectional`; the carry is ``(forward carry, backward carry)``.
  Not for causal models (decoding): the backward direction reads the future.

  Attributes:
    forward_rnn: the `RNN` run from the first step.
    backward_rnn: the `RNN` run from the last step (its outputs back in time order).
    merge_fn: merges the two outputs (default: concatenated along the last axis).
    time_major: whether time is the inputs' first axis (else the one before features).
    return_carry: whether the call returns ``(carries, outputs)`` rather than the outputs.

  Examples:
    >>> layer = nn.Bidirectional(nn.RNN(nn.GRUCell(4)), nn.RNN(nn.GRUCell(4)))
    >>> y, variables = layer.init_with_output(jax.random.key(0), jnp.ones((2, 5, 3)))
    >>> y.shape   # forward and backward outputs concatenated
    (2, 5, 8)
  """
  forward_rnn: Module
  backward_rnn: Module
  merge_fn: Callable[[jax.Array, jax.Array], jax.Array] = _concatenate
  time_major: bool = False
  return_carry: bool = False

  def __call__(self, inputs: jax.Array, *, initial_carry: Any = None,
               init_key: jax.Array | None = None, seq_lengths: jax.Array | None = None,
               return_carry: bool | None = None, time_major: bool | None = None,
               reverse: bool | None = None, keep_order: bool | None = None) -> Any:
    """Merged outputs, or ``((forward carry, backward carry), outputs)`` with ``return_carry``.

    ``reverse`` and ``keep_order`` are accepted for Flax's signature and not used.
    """
    del reverse, keep_order
    time_major = self.time_major if time_major is None else time_major
    return_carry = self.return_carry if return_carry is None else return_carry
    keys = (None, None) if init_key is None else tuple(jax.random.split(init_key))
    carries = (None, None) if initial_carry is None else initial_carry
    common = dict(seq_lengths=seq_lengths, return_carry=True, time_major=time_major)
    carry_forward, forward = self.forward_rnn(
        inputs, initial_carry=carries[0], init_key=keys[0], reverse=False, **common)
    carry_backward, backward = self.backward_rnn(
        inputs, initial_carry=carries[1], init_key=keys[1], reverse=True, keep_order=True,
        **common)
    outputs = jax.tree.map(self.merge_fn, forward, backward)
    return ((carry_forward, carry_backward), outputs) if return_carry else outputs


__all__ = ['RNN', 'RNNCellBase', 'Bidirectional', 'flip_sequences']
