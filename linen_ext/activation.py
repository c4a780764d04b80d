"""`flax.linen.activation`'s names (``from linen_ext.activation import gelu`` ports), with
this package's `PReLU`.

>>> from linen_ext.activation import PReLU, tanh
>>> PReLU is nn.PReLU and tanh is jax.numpy.tanh
True
"""
from flax.linen.activation import (Array, Dtype, celu, elu, gelu, glu, hard_sigmoid, hard_silu,
                                   hard_swish, hard_tanh, leaky_relu, log_sigmoid, log_softmax,
                                   logsumexp, normalize, one_hot, relu, relu6, selu, sigmoid,
                                   silu, soft_sign, softmax, softplus, standardize, swish, tanh)

from linen_ext.layers.ready_made import Dense, PReLU
from linen_ext.module import Module, compact

__all__ = ['Array', 'Dense', 'Dtype', 'Module', 'PReLU', 'celu', 'compact', 'elu', 'gelu', 'glu',
           'hard_sigmoid', 'hard_silu', 'hard_swish', 'hard_tanh', 'leaky_relu', 'log_sigmoid',
           'log_softmax', 'logsumexp', 'normalize', 'one_hot', 'relu', 'relu6', 'selu',
           'sigmoid', 'silu', 'soft_sign', 'softmax', 'softplus', 'standardize', 'swish', 'tanh']
