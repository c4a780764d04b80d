"""Ready-made layers with Flax's constructor arguments, methods and values.

Each class but `Dropout` runs the `flax.linen` layer of the same name through
`run_flax` (see ``flax_adapter``): its dataclass fields are copied from the
flax class, so every flax option works and values equal flax's by construction.
`Dropout` is native because its key is drawn on every call: a native layer
continues the scope's counter across repeated calls exactly as flax does.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
from jax import lax

from linen_ext.flax_adapter import run_flax
from linen_ext.method_wrapping import compact, nowrap
from linen_ext.module import Module


def _copy_flax_fields(cls: type, flax_class: type) -> None:
  """Declares on ``cls`` the dataclass fields of ``flax_class`` (minus parent and name)."""
  annotations = dict(cls.__dict__.get('__annotations__', {}))
  for f in dataclasses.fields(flax_class):
    if not f.init or f.name in ('parent', 'name'):
      continue
    annotations[f.name] = Any
    setattr(cls, f.name, dataclasses.field(default=f.default, default_factory=f.default_factory))
  cls.__annotations__ = annotations


def _as_flax(value: Any) -> Any:
  """A ready-made layer class given as a field (``dot_general_cls=Fp8DotGeneral``) as flax's."""
  if isinstance(value, type) and issubclass(value, FlaxLayer) and 'flax_class' in vars(value):
    return value.flax_class
  return value


class FlaxLayer(Module):
  """Base of the ready-made layers: ``flax_class`` gives the fields and does the work.

  >>> class Dense(FlaxLayer):
  ...   flax_class = flax.linen.Dense
  """
  flax_class: ClassVar[type]

  def __init_subclass__(cls, **kwargs):
    if 'flax_class' in cls.__dict__:
      _copy_flax_fields(cls, cls.flax_class)
    super().__init_subclass__(**kwargs)

  @nowrap
  def to_flax(self) -> flax_nn.Module:
    """The equivalent detached `flax.linen` module.

    >>> Dense(3).to_flax()
    Dense(...)
    """
    fields = {f.name: _as_flax(getattr(self, f.name)) for f in dataclasses.fields(self)
              if f.init and f.name not in ('parent', 'name')}
    return self.flax_class(**fields, parent=None)

  def _capture(self, method_name, y):
    del method_name, y  # flax captures the layer's own intermediates

  def _named_scope(self, method_name):
    del method_name  # flax names the layer's calls (and its submodules') itself
    return contextlib.nullcontext()

  @nowrap
  def _run(self, method: str, args: tuple, kwargs: dict) -> Any:
    scope = self._bound_scope(f'Calling `{type(self).__name__}.{method}`')
    return run_flax(scope, self.to_flax(), method, args, kwargs)

  def __call__(self, *args, **kwargs):
    return self._run('__call__', args, kwargs)


class Dense(FlaxLayer):
  """`flax.linen.Dense`: ``y = x @ kernel + bias``.

  >>> Dense(3).init(key, jnp.ones((2, 4)))  # params: kernel (4, 3), bias (3,)
  """
  flax_class = flax_nn.Dense


class DenseGeneral(FlaxLayer):
  """`flax.linen.DenseGeneral`: a dense layer over several axes.

  >>> DenseGeneral((2, 3), axis=-1).init(key, jnp.ones((5, 4)))  # kernel (4, 2, 3)
  """
  flax_class = flax_nn.DenseGeneral


class Conv(FlaxLayer):
  """`flax.linen.Conv` (padding 'SAME', 'VALID', 'CIRCULAR', 'CAUSAL', ...).

  >>> Conv(8, kernel_size=(3,), padding='CAUSAL').init(key, jnp.ones((2, 16, 4)))
  """
  flax_class = flax_nn.Conv


class Embed(FlaxLayer):
  """`flax.linen.Embed`; ``attend(query)`` is the transposed lookup."""
  flax_class = flax_nn.Embed

  def attend(self, query):
    """``query @ embedding.T``: logits over the vocabulary (``embed.attend(h)``)."""
    return self._run('attend', (query,), {})


class LayerNorm(FlaxLayer):
  """`flax.linen.LayerNorm`.

  >>> LayerNorm().init(key, jnp.ones((2, 4)))  # params: scale, bias
  """
  flax_class = flax_nn.LayerNorm


class RMSNorm(FlaxLayer):
  """`flax.linen.RMSNorm`.

  >>> RMSNorm().init(key, jnp.ones((2, 4)))  # params: scale
  """
  flax_class = flax_nn.RMSNorm


class BatchNorm(FlaxLayer):
  """`flax.linen.BatchNorm`; running statistics live in 'batch_stats'.

  >>> y, updates = BatchNorm(use_running_average=False).apply(
  ...     variables, x, mutable=['batch_stats'])
  """
  flax_class = flax_nn.BatchNorm


class GroupNorm(FlaxLayer):
  """`flax.linen.GroupNorm`: normalizes over groups of channels (``num_groups`` or ``group_size``).

  >>> GroupNorm(num_groups=2).init(key, jnp.ones((2, 5, 4)))
  """
  flax_class = flax_nn.GroupNorm


class InstanceNorm(FlaxLayer):
  """`flax.linen.InstanceNorm`: normalizes each example's features over the other axes.

  >>> InstanceNorm().init(key, jnp.ones((2, 5, 4)))
  """
  flax_class = flax_nn.InstanceNorm


class ConvTranspose(FlaxLayer):
  """`flax.linen.ConvTranspose`: the transposed (fractionally strided) convolution.

  >>> ConvTranspose(4, kernel_size=(3,), strides=(2,)).init(key, jnp.ones((1, 8, 2)))
  """
  flax_class = flax_nn.ConvTranspose


class ConvLocal(FlaxLayer):
  """`flax.linen.ConvLocal`: a convolution with unshared weights per output position.

  >>> ConvLocal(4, kernel_size=(3,)).init(key, jnp.ones((1, 8, 2)))
  """
  flax_class = flax_nn.ConvLocal


class Einsum(FlaxLayer):
  """`flax.linen.Einsum`: ``einsum(einsum_str, x, kernel) + bias`` with a kernel of ``shape``.

  >>> Einsum((4, 3), 'nk,kd->nd').init(key, jnp.ones((2, 4)))
  """
  flax_class = flax_nn.Einsum


class PReLU(FlaxLayer):
  """`flax.linen.PReLU`: leaky ReLU with a learned negative slope.

  >>> PReLU().init(key, jnp.ones((2, 4)))  # params: negative_slope
  """
  flax_class = flax_nn.PReLU


class _RecurrentCell(FlaxLayer):

  @nowrap
  def initialize_carry(self, rng: jax.Array, input_shape: tuple[int, ...]):
    """The initial carry for inputs of ``input_shape`` (as the flax cell).

    >>> carry = LSTMCell(4).initialize_carry(jax.random.key(0), (2, 3))
    """
    return self.to_flax().initialize_carry(rng, input_shape)

  @property
  def num_feature_axes(self) -> int:
    """How many trailing axes of the input are features (1 but for `ConvLSTMCell`)."""
    return self.to_flax().num_feature_axes


class LSTMCell(_RecurrentCell):
  """`flax.linen.LSTMCell`: ``(carry, x) -> (carry, y)``.

  >>> cell = LSTMCell(8); carry = cell.initialize_carry(key, (2, 4))
  """
  flax_class = flax_nn.LSTMCell


class GRUCell(_RecurrentCell):
  """`flax.linen.GRUCell`: ``(carry, x) -> (carry, y)``.

  >>> cell = GRUCell(8); carry = cell.initialize_carry(key, (2, 4))
  """
  flax_class = flax_nn.GRUCell


class OptimizedLSTMCell(_RecurrentCell):
  """`flax.linen.OptimizedLSTMCell`: `LSTMCell`'s parameters, fused matmuls.

  >>> RNN(OptimizedLSTMCell(8)).init(key, jnp.ones((2, 5, 4)))
  """
  flax_class = flax_nn.OptimizedLSTMCell


class SimpleCell(_RecurrentCell):
  """`flax.linen.SimpleCell`: the Elman cell ``h = act(W x + U h + b)``.

  >>> RNN(SimpleCell(8)).init(key, jnp.ones((2, 5, 4)))
  """
  flax_class = flax_nn.SimpleCell


class MGUCell(_RecurrentCell):
  """`flax.linen.MGUCell`: the minimal gated unit.

  >>> RNN(MGUCell(8)).init(key, jnp.ones((2, 5, 4)))
  """
  flax_class = flax_nn.MGUCell


class ConvLSTMCell(_RecurrentCell):
  """`flax.linen.ConvLSTMCell`: an LSTM cell whose matmuls are convolutions.

  >>> RNN(ConvLSTMCell(8, kernel_size=(3, 3))).init(key, jnp.ones((2, 5, 16, 16, 3)))
  """
  flax_class = flax_nn.ConvLSTMCell


class MultiHeadDotProductAttention(FlaxLayer):
  """`flax.linen.MultiHeadDotProductAttention` (decode cache in 'cache').

  >>> MultiHeadDotProductAttention(num_heads=2).init(key, q, k, v)
  """
  flax_class = flax_nn.MultiHeadDotProductAttention


class SelfAttention(FlaxLayer):
  """`flax.linen.SelfAttention`.

  >>> SelfAttention(num_heads=2).init(key, jnp.ones((2, 5, 8)))
  """
  flax_class = flax_nn.SelfAttention


class MultiHeadAttention(FlaxLayer):
  """`flax.linen.MultiHeadAttention`: `MultiHeadDotProductAttention` under its own auto-name.

  >>> MultiHeadAttention(num_heads=2).init(key, q, k, v)
  """
  flax_class = flax_nn.MultiHeadAttention


class Fp8DotGeneralOp(FlaxLayer):
  """`flax.linen.Fp8DotGeneralOp`: a ``dot_general`` through fp8 with scaled quantization.

  Its scales and amax histories live in the ``_overwrite_with_gradient`` collection.

  >>> DenseGeneral(4, dot_general_cls=Fp8DotGeneralOp)
  """
  flax_class = flax_nn.Fp8DotGeneralOp


class Fp8DirectDotGeneralOp(FlaxLayer):
  """`flax.linen.Fp8DirectDotGeneralOp`; `Fp8DotGeneral` is its other name.

  >>> Dense(4, dot_general_cls=Fp8DotGeneral)
  """
  flax_class = flax_nn.Fp8DirectDotGeneralOp


Fp8DotGeneral = Fp8DirectDotGeneralOp


class NANOOFp8DotGeneralOp(FlaxLayer):
  """`flax.linen.NANOOFp8DotGeneralOp`: `Fp8DotGeneralOp` with the fnuz fp8 types.

  >>> DenseGeneral(4, dot_general_cls=NANOOFp8DotGeneralOp)
  """
  flax_class = flax_nn.NANOOFp8DotGeneralOp


class Fp8Einsum(FlaxLayer):
  """`flax.linen.Fp8Einsum`: ``jnp.einsum`` through fp8, called as ``(eqn, lhs, rhs)``.

  >>> Fp8Einsum()('mk,kn->mn', x, w)
  """
  flax_class = flax_nn.Fp8Einsum


class Dropout(Module):
  """Zeroes inputs with probability ``rate`` (rescaling the rest), as `flax.linen.Dropout`.

  >>> y = Dropout(0.5, deterministic=False).apply({}, x, rngs={'dropout': key})
  """
  rate: float
  broadcast_dims: tuple[int, ...] = ()
  deterministic: bool | None = None
  rng_collection: str = 'dropout'

  @compact
  def __call__(self, inputs, deterministic: bool | None = None, rng: jax.Array | None = None):
    deterministic = flax_nn.merge_param('deterministic', self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:  # keeps gradients finite
      return jnp.zeros_like(inputs)
    keep_prob = 1.0 - self.rate
    if rng is None:
      rng = self.make_rng(self.rng_collection)
    dims = {d % inputs.ndim for d in self.broadcast_dims}
    shape = [1 if d in dims else n for d, n in enumerate(inputs.shape)]
    mask = jnp.broadcast_to(jax.random.bernoulli(rng, p=keep_prob, shape=shape), inputs.shape)
    return lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))


class Sequential(Module):
  """Applies ``layers`` in order; a tuple output is splatted, a dict passed as keywords.

  >>> model = Sequential([Dense(4), relu, Dense(1)])
  """
  layers: Sequence[Callable[..., Any]]

  @compact
  def __call__(self, *args, **kwargs):
    if not self.layers:
      raise ValueError(f'Empty Sequential module at "{self.scope.path_text}": it has no '
                       'layers to apply. Fix: pass at least one, e.g. `Sequential([Dense(4)])`.')
    outputs = self.layers[0](*args, **kwargs)
    for layer in self.layers[1:]:
      if isinstance(outputs, tuple):
        outputs = layer(*outputs)
      elif isinstance(outputs, dict):
        outputs = layer(**outputs)
      else:
        outputs = layer(outputs)
    return outputs
