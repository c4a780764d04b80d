"""`flax.linen.normalization`'s names with this package's layers (``nn.normalization.LayerNorm``).

Flax's helpers are Flax's own functions: they compute on arrays, and ``_normalize`` creates
its ``scale`` and ``bias`` with ``mdl.param``, which a module of this package has too. So a
layer written after Flax's (a BatchRenorm calling ``_compute_stats`` and ``_normalize``)
ports with the import swap, inside `vmap` and the other transforms as well.

>>> nn.normalization.LayerNorm is nn.LayerNorm
True
>>> mean, var = nn.normalization._compute_stats(jnp.arange(4.0), (0,), None)
>>> float(mean), float(var)
(1.5, 1.25)
"""
from flax.linen.normalization import (Array, Axes, Dtype, Initializer, PRNGKey, Shape,
                                      canonicalize_dtype, field, merge_param)
from flax.linen.normalization import _abs_sq as _abs_sq
from flax.linen.normalization import _canonicalize_axes as _canonicalize_axes
from flax.linen.normalization import _compute_stats as _compute_stats
from flax.linen.normalization import _l2_normalize as _l2_normalize
from flax.linen.normalization import _normalize as _normalize

from linen_ext.layers.ready_made import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm
from linen_ext.layers.weight_norms import SpectralNorm, WeightNorm
from linen_ext.module import Module, compact
from linen_ext.transforms import map_variables

__all__ = ['Array', 'Axes', 'BatchNorm', 'Dtype', 'GroupNorm', 'Initializer', 'InstanceNorm',
           'LayerNorm', 'Module', 'PRNGKey', 'RMSNorm', 'Shape', 'SpectralNorm', 'WeightNorm',
           'canonicalize_dtype', 'compact', 'field', 'map_variables', 'merge_param']
