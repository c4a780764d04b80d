"""Ready-made layers, and the adapter that runs any `flax.linen` module inside a Module.

Files: `native` (`NativeLayer`: a layer with a `flax.linen` layer's fields that runs
its code on our scopes), `ready_made` (``Dense``, ``LayerNorm``, ... native), `cells`
(``LSTMCell``, ``GRUCell``, ... native), `flax_layer` (`FlaxLayer`, which runs a
flax layer through the adapter instead), `flax_module` (``from_flax``, ``FlaxModule``),
`flax_adapter` (``run_flax``: how both run flax modules on our scopes), `weight_norms`
(``WeightNorm``, ``SpectralNorm``), `recurrent` (``RNN``, ``Bidirectional``).
"""
from linen_ext.layers.flax_module import FlaxModule, from_flax
from linen_ext.layers.cells import (ConvLSTMCell, GRUCell, LSTMCell, MGUCell,
                                         OptimizedLSTMCell, SimpleCell)
from linen_ext.layers.flax_layer import FlaxLayer
from linen_ext.layers.native import NativeLayer
from linen_ext.layers.ready_made import (BatchNorm, Conv, ConvLocal, ConvTranspose, Dense,
                                          DenseGeneral, Dropout, Einsum, Embed,
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
           'MultiHeadAttention', 'MultiHeadDotProductAttention', 'NANOOFp8DotGeneralOp', 'NativeLayer',
           'OptimizedLSTMCell', 'PReLU', 'RMSNorm', 'RNN', 'RNNCellBase', 'SelfAttention',
           'Sequential', 'SimpleCell', 'SpectralNorm', 'WeightNorm', 'flip_sequences',
           'from_flax']
