"""The Module class and what runs it: method wrapping, the variables API, ``init``/``apply``,
method interception, profiling names (and `flax.linen.module`'s names: ``nn.module.Module``).

Files: `core` (the `Module` class: dataclass fields, parents, names, setup, binding),
`method_wrapping` (``compact``, ``nowrap``), `variables` (``param``, ``variable``, ``sow``...),
`init_apply` (``init``, ``apply``, ``bind``), `interception`, `named_call`, `share_scope`,
`state` (per-module and per-thread state).

Flax's private names that real clients reach through ``nn.module`` are kept with the same
meaning (docs/porting.md, "Private Flax names we keep"): ``_context`` (its
``module_stack[-1]`` is the module whose method runs), ``_get_unbound_fn``, ``_Sentinel``
(the type of an unspecified ``parent``), ``_ModuleInternalState`` (the type of a module's
``_state``), ``SetupState`` and ``wrap_method_once``.
"""
from flax.linen.module import merge_param

from linen_ext.module.core import Module
from linen_ext.module.core import _Unspecified as _Sentinel
from linen_ext.module.init_apply import apply, init, init_with_output
from linen_ext.module.init_apply import unbound_fn as _get_unbound_fn
from linen_ext.module.interception import InterceptorContext, intercept_methods
from linen_ext.module.method_wrapping import compact, compact_name_scope, nowrap
from linen_ext.module.method_wrapping import wrap_method as wrap_method_once
from linen_ext.module.named_call import (disable_named_call, enable_named_call,
                                        override_named_call)
from linen_ext.module.share_scope import share_scope
from linen_ext.module.state import ModuleState as _ModuleInternalState
from linen_ext.module.state import SetupState
from linen_ext.module.state import context as _context

__all__ = ['Module', 'compact', 'compact_name_scope', 'nowrap', 'share_scope', 'apply', 'init',
           'init_with_output', 'intercept_methods', 'InterceptorContext', 'merge_param',
           'enable_named_call', 'disable_named_call', 'override_named_call', 'wrap_method_once',
           'SetupState']
