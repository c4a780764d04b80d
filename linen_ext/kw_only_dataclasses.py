"""`flax.linen.kw_only_dataclasses`: Flax's keyword-only dataclass helpers.

>>> from linen_ext.kw_only_dataclasses import field
>>> field(default=1).default
1
"""
from flax.linen.kw_only_dataclasses import KW_ONLY, Annotation, Default, FieldName, dataclass, field
from flax.linen.kw_only_dataclasses import _KwOnlyType as _KwOnlyType
from flax.linen.kw_only_dataclasses import _process_class as _process_class

__all__ = ['KW_ONLY', 'Annotation', 'Default', 'FieldName', 'dataclass', 'field']
