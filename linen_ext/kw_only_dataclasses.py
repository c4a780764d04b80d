"""`flax.linen.kw_only_dataclasses`: Flax's keyword-only dataclass helpers.

>>> from linen_ext.kw_only_dataclasses import field
>>> field(default=1).default
1
"""
from flax.linen.kw_only_dataclasses import KW_ONLY, dataclass, field

__all__ = ['KW_ONLY', 'dataclass', 'field']
