"""Ready-made layers, and the adapter that runs any `flax.linen` module inside a Module.

Files: `flax_layers` (``Dense``, ``LayerNorm``, ... with Flax's fields,
each running the `flax.linen` layer of its name through the adapter), `flax_cells`
(``LSTMCell``, ``GRUCell``, ...), `flax_adapter`
(``from_flax`` and the machinery it shares with them), `weight_norms` (``WeightNorm``,
``SpectralNorm``), `recurrent` (``RNN``, ``Bidirectional``).
"""
from linen_ext.layers.flax_adapter import FlaxModule, from_flax
from linen_ext.layers.flax_cells import (ConvLSTMCell, GRUCell, LSTMCell, MGUCell,
                                         OptimizedLSTMCell, SimpleCell)
from linen_ext.layers.flax_layers import (BatchNorm, Conv, ConvLocal, ConvTranspose, Dense,
                                          DenseGeneral, Dropout, Einsum, Embed, FlaxLayer,
                                          Fp8DirectDotGeneralOp, Fp8DotGeneral, Fp8DotGeneralOp,
                                          Fp8Einsum, GroupNorm, InstanceNorm, LayerNorm,
                                          MultiHeadAttention, MultiHeadDotProductAttention,
                                          NANOOFp8DotGeneralOp, PReLU, RMSNorm, SelfAttention,
                                          Sequential)
from linen_ext.layers.recurrent import RNN, Bidirectional, RNNCellBase, flip_sequences
from linen_ext.layers.weight_norms import SpectralNorm, WeightNorm

__all__ = ['BatchNorm', 'Bidirectional', 'Conv', 'ConvLocal', 'ConvLSTMCell', 'ConvTranspose',
           'Dense', 'DenseGeneral', 'Dropout', 'Einsum', 'Embed', 'FlaxLayer', 'FlaxModule',
           'Fp8DirectDotGeneralOp', 'Fp8DotGeneral', 'Fp8DotGeneralOp', 'Fp8Einsum',
           'GroupNorm', 'GRUCell', 'InstanceNorm', 'LayerNorm', 'LSTMCell', 'MGUCell',
           'MultiHeadAttention', 'MultiHeadDotProductAttention', 'NANOOFp8DotGeneralOp',
           'OptimizedLSTMCell', 'PReLU', 'RMSNorm', 'RNN', 'RNNCellBase', 'SelfAttention',
           'Sequential', 'SimpleCell', 'SpectralNorm', 'WeightNorm', 'flip_sequences',
           'from_flax']
