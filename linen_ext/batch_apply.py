"""`flax.linen.batch_apply`'s names: `BatchApply` is Flax's own (it reshapes around any callable,
a module of this package included).

>>> nn.batch_apply.BatchApply is nn.BatchApply
True
"""
from flax.linen.batch_apply import (BatchApply, arbitrary_mergeable_leaf, merge_leading_dims,
                                   ndim_at_least, split_leading_dim)

__all__ = ['BatchApply', 'arbitrary_mergeable_leaf', 'merge_leading_dims', 'ndim_at_least',
           'split_leading_dim']
