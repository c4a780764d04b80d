"""`flax.linen.experimental.layers_with_named_axes`: its ``Dense``, ``Embed`` and ``LayerNorm``
(T5X-era layers that declare their parameters with logical axis names) as this package's
layers, running Flax's code (see `NativeLayer`); its helpers are Flax's own.

Flax's ``LayerNorm`` with a scale or bias calls a method Flax's modules lack
(``mdl.param_with_axes``), so it raises ``AttributeError`` in both libraries; with
``use_scale=False, use_bias=False`` it runs.

>>> from linen_ext.experimental.layers_with_named_axes import Dense
>>> variables = Dense(4, kernel_axes=('embed', 'mlp')).init(jax.random.key(0), jnp.ones((2, 3)))
>>> variables['params_axes']['kernel_axes']
AxisMetadata(names=('embed', 'mlp'))
"""
from flax.linen.experimental import layers_with_named_axes as flax_layers
from flax.linen.experimental.layers_with_named_axes import (Activation, Array, Axes,
                                                            DotGeneralT, Dtype, Initializer,
                                                            PrecisionLike, default_embed_init,
                                                            default_kernel_init,
                                                            with_sharding_constraint)
from flax.linen.experimental.layers_with_named_axes import _abs_sq as _abs_sq
from flax.linen.experimental.layers_with_named_axes import _canonicalize_axes as _canonicalize_axes
from flax.linen.experimental.layers_with_named_axes import _compute_stats as _compute_stats
from flax.linen.experimental.layers_with_named_axes import _normalize as _normalize

from linen_ext.layers.native import NativeLayer
from linen_ext.partitioning import param_with_axes


class Dense(NativeLayer):
  """Flax's experimental ``Dense``: a dense layer whose ``kernel_axes`` name its kernel's axes
  (recorded under ``params_axes``); the bias takes the kernel's last axis name."""
  flax_class = flax_layers.Dense


class Embed(NativeLayer):
  """Flax's experimental ``Embed``: an embedding table with logical axes ``('vocab', 'embed')``."""
  flax_class = flax_layers.Embed


class LayerNorm(NativeLayer):
  """Flax's experimental ``LayerNorm`` (see the module's note on its scale and bias)."""
  flax_class = flax_layers.LayerNorm


__all__ = ['Activation', 'Array', 'Axes', 'Dense', 'DotGeneralT', 'Dtype', 'Embed', 'Initializer',
           'LayerNorm', 'PrecisionLike', 'default_embed_init', 'default_kernel_init',
           'param_with_axes', 'with_sharding_constraint']
