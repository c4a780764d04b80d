"""The ready-made layers: Flax's layers, native (see `NativeLayer`).

Each class takes the fields and runs the method code of the `flax.linen` layer of
its name directly on its own scope, so every flax option works and values equal
flax's by construction; ``Sequential`` is written here. `from_flax` runs any
other flax module through the adapter.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as flax_nn

from linen_ext import errors
from linen_ext.layers.native import NativeLayer, native_function
from linen_ext.module.core import Module
from linen_ext.module.method_wrapping import compact


class Dense(NativeLayer):
  """`flax.linen.Dense`: ``y = x @ kernel + bias``.

  Not for contracting several axes or producing several: use `DenseGeneral`.

  Examples:
    >>> jax.tree.map(jnp.shape, Dense(3).init(jax.random.key(0), jnp.ones((2, 4))))
    {'params': {'bias': (3,), 'kernel': (4, 3)}}
  """
  flax_class = flax_nn.Dense


class DenseGeneral(NativeLayer):
  """`flax.linen.DenseGeneral`: a dense layer over several axes.

  Not needed for one input and one output axis: `Dense` is that layer.

  Examples:
    >>> jax.tree.map(jnp.shape, DenseGeneral((2, 3)).init(jax.random.key(0), jnp.ones((5, 4))))
    {'params': {'bias': (2, 3), 'kernel': (4, 2, 3)}}
  """
  flax_class = flax_nn.DenseGeneral


class _Conv(NativeLayer):
  """`flax.linen.linear._Conv`: the base of `Conv` and `ConvLocal`, whose subclass says by its
  ``shared_weights`` property whether the kernel is shared across positions."""
  flax_class = flax_nn.linear._Conv


class Conv(_Conv):
  """`flax.linen.Conv` (padding 'SAME', 'VALID', 'CIRCULAR', 'CAUSAL', ...).

  Not for unshared weights per position (`ConvLocal`) or upsampling (`ConvTranspose`).

  Examples:
    >>> conv = Conv(2, kernel_size=(3,), padding='CAUSAL')
    >>> y, variables = conv.init_with_output(jax.random.key(0), jnp.ones((1, 5, 4)))
    >>> y.shape, variables['params']['kernel'].shape
    ((1, 5, 2), (3, 4, 2))
  """
  flax_class = flax_nn.Conv


class Embed(NativeLayer):
  """`flax.linen.Embed`; ``attend(query)`` is the transposed lookup.

  Not for continuous inputs: an embedding looks rows up by integer id; use `Dense`.

  Examples:
    >>> variables = Embed(5, 3).init(jax.random.key(0), jnp.array([[0, 4]]))   # ids 0 and 4
    >>> Embed(5, 3).apply(variables, jnp.ones((1, 3)), method='attend').shape   # logits
    (1, 5)
  """
  flax_class = flax_nn.Embed



class LayerNorm(NativeLayer):
  """`flax.linen.LayerNorm`.

  Not for normalising with statistics over the batch: use `BatchNorm`.

  Examples:
    >>> jax.tree.map(jnp.shape, LayerNorm().init(jax.random.key(0), jnp.ones((2, 4))))
    {'params': {'bias': (4,), 'scale': (4,)}}
  """
  flax_class = flax_nn.LayerNorm


class RMSNorm(NativeLayer):
  """`flax.linen.RMSNorm`.

  Not when the mean should be subtracted too: use `LayerNorm`.

  Examples:
    >>> jax.tree.map(jnp.shape, RMSNorm().init(jax.random.key(0), jnp.ones((2, 4))))
    {'params': {'scale': (4,)}}
  """
  flax_class = flax_nn.RMSNorm


class BatchNorm(NativeLayer):
  """`flax.linen.BatchNorm`; running statistics live in 'batch_stats'.

  Not for small batches, whose statistics are noisy: use `LayerNorm` or `GroupNorm`.

  Examples:
    >>> bn, x = BatchNorm(use_running_average=False), jnp.ones((2, 3))
    >>> y, updates = bn.apply(bn.init(jax.random.key(0), x), x, mutable=['batch_stats'])
    >>> jax.tree.map(jnp.shape, updates)
    {'batch_stats': {'mean': (3,), 'var': (3,)}}
  """
  flax_class = flax_nn.BatchNorm


class GroupNorm(NativeLayer):
  """`flax.linen.GroupNorm`: normalizes over groups of channels (``num_groups`` or ``group_size``).

  Not needed with one channel per group: that is `InstanceNorm`.

  Examples:
    >>> jax.tree.map(jnp.shape, GroupNorm(2).init(jax.random.key(0), jnp.ones((2, 5, 4))))
    {'params': {'bias': (4,), 'scale': (4,)}}
  """
  flax_class = flax_nn.GroupNorm


class InstanceNorm(NativeLayer):
  """`flax.linen.InstanceNorm`: normalizes each example's features over the other axes.

  Not for inputs with no axis between batch and features: use `LayerNorm`.

  Examples:
    >>> jax.tree.map(jnp.shape, InstanceNorm().init(jax.random.key(0), jnp.ones((2, 5, 4))))
    {'params': {'bias': (4,), 'scale': (4,)}}
  """
  flax_class = flax_nn.InstanceNorm


class ConvTranspose(NativeLayer):
  """`flax.linen.ConvTranspose`: the transposed (fractionally strided) convolution.

  Not for downsampling: use `Conv` with ``strides``.

  Examples:
    >>> conv = ConvTranspose(4, kernel_size=(3,), strides=(2,))
    >>> conv.init_with_output(jax.random.key(0), jnp.ones((1, 8, 2)))[0].shape
    (1, 16, 4)
  """
  flax_class = flax_nn.ConvTranspose


class ConvLocal(_Conv):
  """`flax.linen.ConvLocal`: a convolution with unshared weights per output position.

  Not when weights should be shared across positions: `Conv` has far fewer.

  Examples:
    >>> variables = ConvLocal(4, kernel_size=(3,)).init(jax.random.key(0), jnp.ones((1, 8, 2)))
    >>> variables['params']['kernel'].shape   # (positions, window * in, out)
    (8, 6, 4)
  """
  flax_class = flax_nn.ConvLocal


class Einsum(NativeLayer):
  """`flax.linen.Einsum`: ``einsum(einsum_str, x, kernel) + bias`` with a kernel of ``shape``.

  Not needed for a matmul over the last axis: `Dense` says it shorter.

  Examples:
    >>> variables = Einsum((4, 3), 'nk,kd->nd').init(jax.random.key(0), jnp.ones((2, 4)))
    >>> jax.tree.map(jnp.shape, variables)
    {'params': {'bias': (3,), 'kernel': (4, 3)}}
  """
  flax_class = flax_nn.Einsum


class PReLU(NativeLayer):
  """`flax.linen.PReLU`: leaky ReLU with a learned negative slope.

  Not needed for a fixed slope: use `nn.leaky_relu`.

  Examples:
    >>> PReLU().init(jax.random.key(0), jnp.ones((2, 4)))
    {'params': {'negative_slope': Array(0.01, dtype=float32)}}
  """
  flax_class = flax_nn.PReLU


class MultiHeadDotProductAttention(NativeLayer):
  """`flax.linen.MultiHeadDotProductAttention` (decode cache in 'cache').

  Not for models decoded with `nn.as_scan`: use `nn.causal_self_attention` there.

  Examples:
    >>> attention = MultiHeadDotProductAttention(num_heads=2, qkv_features=4)
    >>> y, variables = attention.init_with_output(jax.random.key(0), jnp.ones((1, 3, 4)))
    >>> y.shape, variables['params']['query']['kernel'].shape
    ((1, 3, 4), (4, 2, 2))
  """
  flax_class = flax_nn.MultiHeadDotProductAttention


class SelfAttention(NativeLayer):
  """`flax.linen.SelfAttention`.

  Flax deprecates it: not for new code, use `MultiHeadDotProductAttention` on one input.

  Examples:
    >>> y, _ = SelfAttention(num_heads=2).init_with_output(jax.random.key(0), jnp.ones((1, 3, 4)))
    >>> y.shape
    (1, 3, 4)
  """
  flax_class = flax_nn.SelfAttention

  @compact
  def __call__(self, inputs_q, mask=None, deterministic=None, dropout_rng=None,
               sow_weights=False):
    """Attends ``inputs_q`` to itself, with Flax's deprecation warning."""
    warnings.warn('SelfAttention will be deprecated soon. Use '
                  '`MultiHeadDotProductAttention.__call__(inputs_q)` instead.',
                  DeprecationWarning, stacklevel=2)
    return _attend(self, inputs_q, mask=mask, deterministic=deterministic,
                   dropout_rng=dropout_rng, sow_weights=sow_weights)


_attend = native_function(flax_nn.MultiHeadDotProductAttention.__call__, 'SelfAttention')


class MultiHeadAttention(NativeLayer):
  """`flax.linen.MultiHeadAttention`: `MultiHeadDotProductAttention` under its own auto-name.

  Not needed unless a ported checkpoint uses its name: else use `MultiHeadDotProductAttention`.

  Examples:
    >>> attention = MultiHeadAttention(num_heads=2)
    >>> y, variables = attention.init_with_output(jax.random.key(0), jnp.ones((1, 3, 4)))
    >>> list(variables['params'])
    ['query', 'key', 'value', 'out']
  """
  flax_class = flax_nn.MultiHeadAttention


class Fp8DotGeneralBase(NativeLayer):
  """`flax.linen.fp8_ops.Fp8DotGeneralBase`: the scales and amax histories of the fp8 layers.

  A base for fp8 ``dot_general`` layers of your own; the ready-made ones are below.

  Examples:
    >>> base = Fp8DotGeneralBase(amax_history_length=4)
    >>> variables = base.init(jax.random.key(0), method=lambda m: m.input_scale)
    >>> variables['_overwrite_with_gradient']['input_amax_history'].shape
    (4,)
  """
  flax_class = flax_nn.fp8_ops.Fp8DotGeneralBase


class Fp8DotGeneralOp(NativeLayer):
  """`flax.linen.Fp8DotGeneralOp`: a ``dot_general`` through fp8 with scaled quantization.

  Its scales and amax histories live in the ``_overwrite_with_gradient`` collection.
  Flax deprecates it: not for new code, use `Fp8DirectDotGeneralOp` or `Fp8Einsum`.

  Examples:
    >>> dense = DenseGeneral(4, dot_general_cls=Fp8DotGeneralOp)
    >>> list(dense.init(jax.random.key(0), jnp.ones((2, 3)))['_overwrite_with_gradient'])
    ['Fp8DotGeneralOp_0']
  """
  flax_class = flax_nn.Fp8DotGeneralOp


class Fp8DirectDotGeneralOp(NativeLayer):
  """`flax.linen.Fp8DirectDotGeneralOp`; `Fp8DotGeneral` is its other name.

  Not for hardware without fp8 matmuls: keep the default ``dot_general`` there.

  Examples:
    >>> dense = Dense(4, dot_general_cls=Fp8DotGeneral)
    >>> sorted(dense.init(jax.random.key(0), jnp.ones((2, 3))))
    ['_overwrite_with_gradient', 'params']
  """
  flax_class = flax_nn.Fp8DirectDotGeneralOp


Fp8DotGeneral = Fp8DirectDotGeneralOp


class NANOOFp8DotGeneralOp(NativeLayer):
  """`flax.linen.NANOOFp8DotGeneralOp`: `Fp8DotGeneralOp` with the fnuz fp8 types.

  Not for hardware whose fp8 types are not the fnuz ones: use `Fp8DotGeneralOp`.

  Examples:
    >>> dense = DenseGeneral(4, dot_general_cls=NANOOFp8DotGeneralOp)
    >>> list(dense.init(jax.random.key(0), jnp.ones((2, 3)))['_overwrite_with_gradient'])
    ['NANOOFp8DotGeneralOp_0']
  """
  flax_class = flax_nn.NANOOFp8DotGeneralOp


class Fp8Einsum(NativeLayer):
  """`flax.linen.Fp8Einsum`: ``jnp.einsum`` through fp8, called as ``(eqn, lhs, rhs)``.

  Not for hardware without fp8 matmuls: keep the default ``dot_general`` there.

  Examples:
    >>> y, variables = Fp8Einsum().init_with_output(
    ...     jax.random.key(0), 'mk,kn->mn', jnp.ones((2, 3)), jnp.ones((3, 4)))
    >>> y.shape
    (2, 4)
  """
  flax_class = flax_nn.Fp8Einsum


class Dropout(NativeLayer):
  """Zeroes inputs with probability ``rate`` (rescaling the rest), as `flax.linen.Dropout`.

  Not active at evaluation: with ``deterministic=True`` it returns its input.

  Examples:
    >>> x = jnp.ones((2, 4))
    >>> y = Dropout(0.5, deterministic=False).apply({}, x, rngs={'dropout': jax.random.key(0)})
    >>> sorted(set(y.ravel().tolist()))   # kept values are scaled by 1 / (1 - rate)
    [0.0, 2.0]
  """
  flax_class = flax_nn.Dropout


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
