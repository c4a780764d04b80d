"""`flax.linen.recurrent`'s names with this package's cells and loops (``nn.recurrent.RNN``).

>>> nn.recurrent.LSTMCell is nn.LSTMCell
True
"""
from linen_ext.layers.cells import (ConvLSTMCell, GRUCell, LSTMCell, MGUCell,
                                         OptimizedLSTMCell, SimpleCell)
from linen_ext.layers.recurrent import RNN, Bidirectional, RNNCellBase, flip_sequences

__all__ = ['RNN', 'RNNCellBase', 'Bidirectional', 'flip_sequences', 'ConvLSTMCell', 'GRUCell',
           'LSTMCell', 'MGUCell', 'OptimizedLSTMCell', 'SimpleCell']
