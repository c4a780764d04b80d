"""`flax.linen.linear`'s names with this package's layers, so ``nn.linear.Dense`` ports.

Two private helpers of Flax's module are kept for layers written after ``DenseGeneral``
(a LoRA adapter, for example): ``_canonicalize_tuple`` and ``_normalize_axes``.

>>> nn.linear.Dense(4) is not None and nn.linear.default_kernel_init is not None
True
"""
from collections.abc import Iterable, Sequence

from flax.linen.linear import (PromoteDtypeFn, canonicalize_padding, default_embed_init,
                               default_kernel_init)

from linen_ext.layers.ready_made import Conv, ConvLocal, ConvTranspose, Dense, DenseGeneral, Einsum, Embed

__all__ = ['Conv', 'ConvLocal', 'ConvTranspose', 'Dense', 'DenseGeneral', 'Einsum', 'Embed',
           'PromoteDtypeFn', 'canonicalize_padding', 'default_embed_init', 'default_kernel_init']


def _canonicalize_tuple(x: Sequence[int] | int) -> tuple[int, ...]:
  """``x`` as a tuple: an int becomes a 1-tuple (``features=4`` or ``(2, 4)``).

  >>> _canonicalize_tuple(4), _canonicalize_tuple([2, 4])
  ((4,), (2, 4))
  """
  return tuple(x) if isinstance(x, Iterable) else (x,)


def _normalize_axes(axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
  """``axes`` of an ``ndim``-dimensional array as sorted non-negative indices.

  >>> _normalize_axes((-1, 0), 3)
  (0, 2)
  """
  return tuple(sorted(ax if ax >= 0 else ndim + ax for ax in axes))
