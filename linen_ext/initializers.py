"""`flax.linen.initializers`: Flax's (and JAX's) initializers, ``nn.initializers.lecun_normal()``.

>>> from linen_ext.initializers import zeros_init
>>> zeros_init()(jax.random.key(0), (2,))
Array([0., 0.], dtype=float32)
"""
from flax.linen.initializers import (Initializer, constant, delta_orthogonal, glorot_normal,
                                     glorot_uniform, he_normal, he_uniform, kaiming_normal,
                                     kaiming_uniform, lecun_normal, lecun_uniform, normal, ones,
                                     ones_init, orthogonal, truncated_normal, uniform,
                                     variance_scaling, xavier_normal, xavier_uniform, zeros,
                                     zeros_init)

__all__ = ['Initializer', 'constant', 'delta_orthogonal', 'glorot_normal', 'glorot_uniform',
           'he_normal', 'he_uniform', 'kaiming_normal', 'kaiming_uniform', 'lecun_normal',
           'lecun_uniform', 'normal', 'ones', 'ones_init', 'orthogonal', 'truncated_normal',
           'uniform', 'variance_scaling', 'xavier_normal', 'xavier_uniform', 'zeros', 'zeros_init']
