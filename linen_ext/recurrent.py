"""`flax.linen.recurrent`'s names with this package's cells and loops (``nn.recurrent.RNN``).

Flax's helpers (``_select_last_carry``, ``_expand_dims_like``, ``_concatenate``: functions of
arrays) and type aliases are Flax's own.

>>> nn.recurrent.LSTMCell is nn.LSTMCell
True
"""
from flax.linen.recurrent import (Array, Carry, CarryHistory, CollectionFilter, Dtype,
                                  FrozenDict, InOutScanAxis, Initializer, Output, PRNGKey,
                                  PRNGSequenceFilter, PrecisionLike, RNNBase, default_kernel_init,
                                  promote_dtype, sigmoid, tanh)
from flax.linen.recurrent import _concatenate as _concatenate
from flax.linen.recurrent import _expand_dims_like as _expand_dims_like
from flax.linen.recurrent import _select_last_carry as _select_last_carry

from linen_ext.layers.cells import (ConvLSTMCell, DenseParams, GRUCell, LSTMCell, MGUCell,
                                    OptimizedLSTMCell, SimpleCell)
from linen_ext.layers.ready_made import Conv, Dense
from linen_ext.layers.recurrent import RNN, Bidirectional, RNNCellBase, flip_sequences
from linen_ext.module import Module, compact, nowrap

__all__ = ['RNN', 'RNNBase', 'RNNCellBase', 'Bidirectional', 'flip_sequences', 'ConvLSTMCell',
           'DenseParams', 'GRUCell', 'LSTMCell', 'MGUCell', 'OptimizedLSTMCell', 'SimpleCell',
           'Array', 'Carry', 'CarryHistory', 'CollectionFilter', 'Conv', 'Dense', 'Dtype',
           'FrozenDict', 'InOutScanAxis', 'Initializer', 'Module', 'Output', 'PRNGKey',
           'PRNGSequenceFilter', 'PrecisionLike', 'compact', 'default_kernel_init', 'nowrap',
           'promote_dtype', 'sigmoid', 'tanh']
