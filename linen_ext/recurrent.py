"""`flax.linen.recurrent`'s names with this package's cells and loops (``nn.recurrent.RNN``).

>>> nn.recurrent.LSTMCell is nn.LSTMCell
True
"""
from flax.linen.recurrent import RNNBase

from linen_ext.layers.cells import (ConvLSTMCell, DenseParams, GRUCell, LSTMCell, MGUCell,
                                    OptimizedLSTMCell, SimpleCell)
from linen_ext.layers.recurrent import RNN, Bidirectional, RNNCellBase, flip_sequences

__all__ = ['RNN', 'RNNBase', 'RNNCellBase', 'Bidirectional', 'flip_sequences', 'ConvLSTMCell',
           'DenseParams', 'GRUCell', 'LSTMCell', 'MGUCell', 'OptimizedLSTMCell', 'SimpleCell']
