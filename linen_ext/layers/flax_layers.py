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

from linen_ext import errors
from linen_ext.layers.flax_adapter import run_flax
from linen_ext.module.method_wrapping import compact, nowrap
from linen_ext.module.core import Module


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

  Not needed to use a flax module once: `from_flax` wraps any instance.

  Examples:
    >>> class MyDense(FlaxLayer):
    ...   flax_class = flax_nn.Dense
    >>> jax.tree.map(jnp.shape, MyDense(2).init(jax.random.key(0), jnp.ones((1, 3))))
    {'params': {'bias': (2,), 'kernel': (3, 2)}}
  """
  flax_class: ClassVar[type]
  _summary_role: ClassVar[str] = 'row_over_flax'

  def __init_subclass__(cls, **kwargs):
    if 'flax_class' in cls.__dict__:
      _copy_flax_fields(cls, cls.flax_class)
    super().__init_subclass__(**kwargs)

  @nowrap
  def to_flax(self) -> flax_nn.Module:
    """The equivalent detached `flax.linen` module.

    Examples:
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

  Not for contracting several axes or producing several: use `DenseGeneral`.

  Examples:
    >>> jax.tree.map(jnp.shape, Dense(3).init(jax.random.key(0), jnp.ones((2, 4))))
    {'params': {'bias': (3,), 'kernel': (4, 3)}}
  """
  flax_class = flax_nn.Dense


class DenseGeneral(FlaxLayer):
  """`flax.linen.DenseGeneral`: a dense layer over several axes.

  Not needed for one input and one output axis: `Dense` is that layer.

  Examples:
    >>> jax.tree.map(jnp.shape, DenseGeneral((2, 3)).init(jax.random.key(0), jnp.ones((5, 4))))
    {'params': {'bias': (2, 3), 'kernel': (4, 2, 3)}}
  """
  flax_class = flax_nn.DenseGeneral


class Conv(FlaxLayer):
  """`flax.linen.Conv` (padding 'SAME', 'VALID', 'CIRCULAR', 'CAUSAL', ...).

  Not for unshared weights per position (`ConvLocal`) or upsampling (`ConvTranspose`).

  Examples:
    >>> conv = Conv(2, kernel_size=(3,), padding='CAUSAL')
    >>> y, variables = conv.init_with_output(jax.random.key(0), jnp.ones((1, 5, 4)))
    >>> y.shape, variables['params']['kernel'].shape
    ((1, 5, 2), (3, 4, 2))
  """
  flax_class = flax_nn.Conv


class Embed(FlaxLayer):
  """`flax.linen.Embed`; ``attend(query)`` is the transposed lookup.

  Not for continuous inputs: an embedding looks rows up by integer id; use `Dense`.

  Examples:
    >>> variables = Embed(5, 3).init(jax.random.key(0), jnp.array([[0, 4]]))   # ids 0 and 4
    >>> Embed(5, 3).apply(variables, jnp.ones((1, 3)), method='attend').shape   # logits
    (1, 5)
  """
  flax_class = flax_nn.Embed

  def attend(self, query):
    """``query @ embedding.T``: logits over the vocabulary (``embed.attend(h)``)."""
    return self._run('attend', (query,), {})


class LayerNorm(FlaxLayer):
  """`flax.linen.LayerNorm`.

  Not for normalising with statistics over the batch: use `BatchNorm`.

  Examples:
    >>> jax.tree.map(jnp.shape, LayerNorm().init(jax.random.key(0), jnp.ones((2, 4))))
    {'params': {'bias': (4,), 'scale': (4,)}}
  """
  flax_class = flax_nn.LayerNorm


class RMSNorm(FlaxLayer):
  """`flax.linen.RMSNorm`.

  Not when the mean should be subtracted too: use `LayerNorm`.

  Examples:
    >>> jax.tree.map(jnp.shape, RMSNorm().init(jax.random.key(0), jnp.ones((2, 4))))
    {'params': {'scale': (4,)}}
  """
  flax_class = flax_nn.RMSNorm


class BatchNorm(FlaxLayer):
  """`flax.linen.BatchNorm`; running statistics live in 'batch_stats'.

  Not for small batches, whose statistics are noisy: use `LayerNorm` or `GroupNorm`.

  Examples:
    >>> bn, x = BatchNorm(use_running_average=False), jnp.ones((2, 3))
    >>> y, updates = bn.apply(bn.init(jax.random.key(0), x), x, mutable=['batch_stats'])
    >>> jax.tree.map(jnp.shape, updates)
    {'batch_stats': {'mean': (3,), 'var': (3,)}}
  """
  flax_class = flax_nn.BatchNorm


class GroupNorm(FlaxLayer):
  """`flax.linen.GroupNorm`: normalizes over groups of channels (``num_groups`` or ``group_size``).

  Not needed with one channel per group: that is `InstanceNorm`.

  Examples:
    >>> jax.tree.map(jnp.shape, GroupNorm(2).init(jax.random.key(0), jnp.ones((2, 5, 4))))
    {'params': {'bias': (4,), 'scale': (4,)}}
  """
  flax_class = flax_nn.GroupNorm


class InstanceNorm(FlaxLayer):
  """`flax.linen.InstanceNorm`: normalizes each example's features over the other axes.

  Not for inputs with no axis between batch and features: use `LayerNorm`.

  Examples:
    >>> jax.tree.map(jnp.shape, InstanceNorm().init(jax.random.key(0), jnp.ones((2, 5, 4))))
    {'params': {'bias': (4,), 'scale': (4,)}}
  """
  flax_class = flax_nn.InstanceNorm


class ConvTranspose(FlaxLayer):
  """`flax.linen.ConvTranspose`: the transposed (fractionally strided) convolution.

  Not for downsampling: use `Conv` with ``strides``.

  Examples:
    >>> conv = ConvTranspose(4, kernel_size=(3,), strides=(2,))
    >>> conv.init_with_output(jax.random.key(0), jnp.ones((1, 8, 2)))[0].shape
    (1, 16, 4)
  """
  flax_class = flax_nn.ConvTranspose


class ConvLocal(FlaxLayer):
  """`flax.linen.ConvLocal`: a convolution with unshared weights per output position.

  Not when weights should be shared across positions: `Conv` has far fewer.

  Examples:
    >>> variables = ConvLocal(4, kernel_size=(3,)).init(jax.random.key(0), jnp.ones((1, 8, 2)))
    >>> variables['params']['kernel'].shape   # (positions, window * in, out)
    (8, 6, 4)
  """
  flax_class = flax_nn.ConvLocal


class Einsum(FlaxLayer):
  """`flax.linen.Einsum`: ``einsum(einsum_str, x, kernel) + bias`` with a kernel of ``shape``.

  Not needed for a matmul over the last axis: `Dense` says it shorter.

  Examples:
    >>> variables = Einsum((4, 3), 'nk,kd->nd').init(jax.random.key(0), jnp.ones((2, 4)))
    >>> jax.tree.map(jnp.shape, variables)
    {'params': {'bias': (3,), 'kernel': (4, 3)}}
  """
  flax_class = flax_nn.Einsum


class PReLU(FlaxLayer):
  """`flax.linen.PReLU`: leaky ReLU with a learned negative slope.

  Not needed for a fixed slope: use `nn.leaky_relu`.

  Examples:
    >>> PReLU().init(jax.random.key(0), jnp.ones((2, 4)))
    {'params': {'negative_slope': Array(0.01, dtype=float32)}}
  """
  flax_class = flax_nn.PReLU


class MultiHeadDotProductAttention(FlaxLayer):
  """`flax.linen.MultiHeadDotProductAttention` (decode cache in 'cache').

  Not for models decoded with `nn.as_scan`: use `nn.causal_self_attention` there.

  Examples:
    >>> attention = MultiHeadDotProductAttention(num_heads=2, qkv_features=4)
    >>> y, variables = attention.init_with_output(jax.random.key(0), jnp.ones((1, 3, 4)))
    >>> y.shape, variables['params']['query']['kernel'].shape
    ((1, 3, 4), (4, 2, 2))
  """
  flax_class = flax_nn.MultiHeadDotProductAttention


class SelfAttention(FlaxLayer):
  """`flax.linen.SelfAttention`.

  Flax deprecates it: not for new code, use `MultiHeadDotProductAttention` on one input.

  Examples:
    >>> y, _ = SelfAttention(num_heads=2).init_with_output(jax.random.key(0), jnp.ones((1, 3, 4)))
    >>> y.shape
    (1, 3, 4)
  """
  flax_class = flax_nn.SelfAttention


class MultiHeadAttention(FlaxLayer):
  """`flax.linen.MultiHeadAttention`: `MultiHeadDotProductAttention` under its own auto-name.

  Not needed unless a ported checkpoint uses its name: else use `MultiHeadDotProductAttention`.

  Examples:
    >>> attention = MultiHeadAttention(num_heads=2)
    >>> y, variables = attention.init_with_output(jax.random.key(0), jnp.ones((1, 3, 4)))
    >>> list(variables['params'])
    ['query', 'key', 'value', 'out']
  """
  flax_class = flax_nn.MultiHeadAttention


class Fp8DotGeneralOp(FlaxLayer):
  """`flax.linen.Fp8DotGeneralOp`: a ``dot_general`` through fp8 with scaled quantization.

  Its scales and amax histories live in the ``_overwrite_with_gradient`` collection.
  Flax deprecates it: not for new code, use `Fp8DirectDotGeneralOp` or `Fp8Einsum`.

  Examples:
    >>> dense = DenseGeneral(4, dot_general_cls=Fp8DotGeneralOp)
    >>> list(dense.init(jax.random.key(0), jnp.ones((2, 3)))['_overwrite_with_gradient'])
    ['Fp8DotGeneralOp_0']
  """
  flax_class = flax_nn.Fp8DotGeneralOp


class Fp8DirectDotGeneralOp(FlaxLayer):
  """`flax.linen.Fp8DirectDotGeneralOp`; `Fp8DotGeneral` is its other name.

  Not for hardware without fp8 matmuls: keep the default ``dot_general`` there.

  Examples:
    >>> dense = Dense(4, dot_general_cls=Fp8DotGeneral)
    >>> sorted(dense.init(jax.random.key(0), jnp.ones((2, 3))))
    ['_overwrite_with_gradient', 'params']
  """
  flax_class = flax_nn.Fp8DirectDotGeneralOp


Fp8DotGeneral = Fp8DirectDotGeneralOp


class NANOOFp8DotGeneralOp(FlaxLayer):
  """`flax.linen.NANOOFp8DotGeneralOp`: `Fp8DotGeneralOp` with the fnuz fp8 types.

  Not for hardware whose fp8 types are not the fnuz ones: use `Fp8DotGeneralOp`.

  Examples:
    >>> dense = DenseGeneral(4, dot_general_cls=NANOOFp8DotGeneralOp)
    >>> list(dense.init(jax.random.key(0), jnp.ones((2, 3)))['_overwrite_with_gradient'])
    ['NANOOFp8DotGeneralOp_0']
  """
  flax_class = flax_nn.NANOOFp8DotGeneralOp


class Fp8Einsum(FlaxLayer):
  """`flax.linen.Fp8Einsum`: ``jnp.einsum`` through fp8, called as ``(eqn, lhs, rhs)``.

  Not for hardware without fp8 matmuls: keep the default ``dot_general`` there.

  Examples:
    >>> y, variables = Fp8Einsum().init_with_output(
    ...     jax.random.key(0), 'mk,kn->mn', jnp.ones((2, 3)), jnp.ones((3, 4)))
    >>> y.shape
    (2, 4)
  """
  flax_class = flax_nn.Fp8Einsum


class Dropout(Module):
  """Zeroes inputs with probability ``rate`` (rescaling the rest), as `flax.linen.Dropout`.

  Not active at evaluation: with ``deterministic=True`` it returns its input.

  Examples:
    >>> x = jnp.ones((2, 4))
    >>> y = Dropout(0.5, deterministic=False).apply({}, x, rngs={'dropout': jax.random.key(0)})
    >>> sorted(set(y.ravel().tolist()))   # kept values are scaled by 1 / (1 - rate)
    [0.0, 2.0]
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

  Not for layers that need more than the previous output: write a `compact` method.

  Examples:
    >>> model = Sequential([Dense(4), nn.relu, Dense(1)])
    >>> y, variables = model.init_with_output(jax.random.key(0), jnp.ones((2, 3)))
    >>> y.shape, list(variables['params'])
    ((2, 1), ['layers_0', 'layers_2'])
  """
  layers: Sequence[Callable[..., Any]]

  @compact
  def __call__(self, *args, **kwargs):
    if not self.layers:
      assert self.scope is not None  # a compact method runs bound
      raise errors.LayerArgumentError(
          f'Empty Sequential module at "{self.scope.path_text}": it has no layers to apply. '
          'Fix: pass at least one, e.g. `Sequential([Dense(4)])`.')
    outputs = self.layers[0](*args, **kwargs)
    for layer in self.layers[1:]:
      if isinstance(outputs, tuple):
        outputs = layer(*outputs)
      elif isinstance(outputs, dict):
        outputs = layer(**outputs)
      else:
        outputs = layer(outputs)
    return outputs
