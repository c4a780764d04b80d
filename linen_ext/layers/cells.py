"""The ready-made recurrent cells (`LSTMCell`, `GRUCell`, ...): Flax's cells, native (see
`NativeLayer`), with Flax's fields, ``initialize_carry`` and ``num_feature_axes``;
`RNN` loops them."""
from __future__ import annotations

import flax.linen as flax_nn
from flax.linen import recurrent as flax_recurrent

from linen_ext.layers.native import NativeLayer
import linen_ext.layers.ready_made  # noqa: F401  (registers Dense and Conv, which cells build)
from linen_ext.layers.recurrent import RNNCellBase


class DenseParams(NativeLayer):
  """The kernel and bias of a `Dense`, returned unused (`OptimizedLSTMCell` fuses them)."""
  flax_class = flax_recurrent.DenseParams


class _RecurrentCell(NativeLayer, RNNCellBase):
  """A native cell is a `RNNCellBase`, so user code can test for one."""


class LSTMCell(_RecurrentCell):
  """`flax.linen.LSTMCell`: ``(carry, x) -> (carry, y)``.

  It computes one step; not for a whole sequence by hand: wrap it in `nn.RNN`.

  Examples:
    >>> carry = LSTMCell(3).initialize_carry(jax.random.key(0), (2, 4))   # (batch, features)
    >>> (carry, y), _ = LSTMCell(3).init_with_output(jax.random.key(1), carry, jnp.ones((2, 4)))
    >>> y.shape
    (2, 3)
  """
  flax_class = flax_nn.LSTMCell


class GRUCell(_RecurrentCell):
  """`flax.linen.GRUCell`: ``(carry, x) -> (carry, y)``.

  It computes one step; not for a whole sequence by hand: wrap it in `nn.RNN`.

  Examples:
    >>> carry = GRUCell(3).initialize_carry(jax.random.key(0), (2, 4))   # (batch, features)
    >>> (carry, y), _ = GRUCell(3).init_with_output(jax.random.key(1), carry, jnp.ones((2, 4)))
    >>> y.shape
    (2, 3)
  """
  flax_class = flax_nn.GRUCell


class OptimizedLSTMCell(_RecurrentCell):
  """`flax.linen.OptimizedLSTMCell`: `LSTMCell`'s parameters, fused matmuls.

  It computes one step; not for a whole sequence by hand: wrap it in `nn.RNN`.

  Examples:
    >>> y, _ = nn.RNN(OptimizedLSTMCell(3)).init_with_output(jax.random.key(0), jnp.ones((2, 5, 4)))
    >>> y.shape   # (batch, time, features)
    (2, 5, 3)
  """
  flax_class = flax_nn.OptimizedLSTMCell


class SimpleCell(_RecurrentCell):
  """`flax.linen.SimpleCell`: the Elman cell ``h = act(W x + U h + b)``.

  It computes one step; not for a whole sequence by hand: wrap it in `nn.RNN`.

  Examples:
    >>> y, _ = nn.RNN(SimpleCell(3)).init_with_output(jax.random.key(0), jnp.ones((2, 5, 4)))
    >>> y.shape   # (batch, time, features)
    (2, 5, 3)
  """
  flax_class = flax_nn.SimpleCell


class MGUCell(_RecurrentCell):
  """`flax.linen.MGUCell`: the minimal gated unit.

  It computes one step; not for a whole sequence by hand: wrap it in `nn.RNN`.

  Examples:
    >>> y, _ = nn.RNN(MGUCell(3)).init_with_output(jax.random.key(0), jnp.ones((2, 5, 4)))
    >>> y.shape   # (batch, time, features)
    (2, 5, 3)
  """
  flax_class = flax_nn.MGUCell


class ConvLSTMCell(_RecurrentCell):
  """`flax.linen.ConvLSTMCell`: an LSTM cell whose matmuls are convolutions.

  It computes one step; not for a whole sequence by hand: wrap it in `nn.RNN`.

  Examples:
    >>> cell, x = ConvLSTMCell(2, kernel_size=(3,)), jnp.ones((1, 5, 3))   # (batch, width, chan)
    >>> carry = cell.initialize_carry(jax.random.key(0), x.shape)
    >>> jax.eval_shape(cell.init_with_output, jax.random.key(1), carry, x)[0][1].shape   # y
    (1, 5, 2)
  """
  flax_class = flax_nn.ConvLSTMCell


__all__ = ['LSTMCell', 'GRUCell', 'OptimizedLSTMCell', 'SimpleCell', 'MGUCell', 'ConvLSTMCell']
