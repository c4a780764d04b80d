"""`flax.linen.batch_apply`'s names: `BatchApply` is Flax's own (it reshapes around any callable,
a module of this package included).

>>> nn.batch_apply.BatchApply is nn.BatchApply
True
"""
from flax.linen.batch_apply import BatchApply

__all__ = ['BatchApply']
