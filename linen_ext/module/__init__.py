"""The Module class and what runs it: method wrapping, the variables API, ``init``/``apply``,
method interception, profiling names (and `flax.linen.module`'s names: ``nn.module.Module``).

Files: `core` (the `Module` class: dataclass fields, parents, names, setup, binding),
`method_wrapping` (``compact``, ``nowrap``), `variables` (``param``, ``variable``, ``sow``...),
`init_apply` (``init``, ``apply``, ``bind``), `interception`, `named_call`, `share_scope`,
`state` (per-module and per-thread state).
"""
from flax.linen.module import merge_param

from linen_ext.module.core import Module
from linen_ext.module.init_apply import apply, init, init_with_output
from linen_ext.module.interception import InterceptorContext, intercept_methods
from linen_ext.module.method_wrapping import compact, compact_name_scope, nowrap
from linen_ext.module.named_call import (disable_named_call, enable_named_call,
                                        override_named_call)
from linen_ext.module.share_scope import share_scope

__all__ = ['Module', 'compact', 'compact_name_scope', 'nowrap', 'share_scope', 'apply', 'init',
           'init_with_output', 'intercept_methods', 'InterceptorContext', 'merge_param',
           'enable_named_call', 'disable_named_call', 'override_named_call']
