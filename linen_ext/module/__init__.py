"""The Module class and what runs it: method wrapping, the variables API, ``init``/``apply``,
method interception, profiling names (and `flax.linen.module`'s names: ``nn.module.Module``).

Files: `core` (the `Module` class: dataclass fields, parents, names, setup, binding),
`method_wrapping` (``compact``, ``nowrap``), `variables` (``param``, ``variable``, ``sow``...),
`init_apply` (``init``, ``apply``, ``bind``), `interception`, `named_call`, `share_scope`,
`state` (per-module and per-thread state).

Every module-level name of `flax.linen.module` is here (docs/porting.md, "Every name of
`flax.linen`" lists the few that are not): Flax's own object for a plain helper
(``merge_param``, ``_freeze_attr``), this package's counterpart where the name belongs to the
Module system: ``Scope``, ``Variable`` and ``DenyList`` are `lift`'s; ``_context`` (its
``module_stack[-1]`` is the module whose method runs), ``_get_unbound_fn``, ``_Sentinel``
(the type of an unspecified ``parent``), ``_ModuleInternalState`` (the type of a module's
``_state``), ``SetupState`` and ``wrap_method_once`` mean what they mean in Flax.
"""
from flax.linen.module import (Args, CollectionFilter, Descriptor, FrozenDict,
                               FrozenVariableDict, Interceptor, Kwargs, NextGetter, PRNGKey,
                               RNGSequences, ThreadLocalStack, VariableDict, config, merge_param)
from flax.linen.module import _UNDEFINED_COPY_PICKLE_METHODS
from flax.linen.module import (_derive_profiling_name, _freeze_attr, _get_fn_name,
                               _get_local_descriptor_names, _get_local_method_names,
                               _get_suffix_value_pairs, _indent, _map_over_modules_in_tree,
                               _sorted_items)

from lift.filters import DenyList, union_filters
from lift.scope import Scope, Variable

from linen_ext.describe import _attr_repr
from linen_ext.module.core import UNSPECIFIED as _unspecified_parent
from linen_ext.module.core import CompactNameScope, Module
from linen_ext.module.core import _ParentRef as ParentDescriptor
from linen_ext.module.core import _unbound_only_hash as _wrap_hash
from linen_ext.module.core import _Unspecified as _Sentinel
from linen_ext.module.init_apply import apply, capture_call_intermediates, init, init_with_output
from linen_ext.module.init_apply import unbound_fn as _get_unbound_fn
from linen_ext.module.interception import InterceptorContext, intercept_methods
from linen_ext.module.method_wrapping import compact, compact_name_scope, nowrap
from linen_ext.module.method_wrapping import wrap_method as wrap_method_once
from linen_ext.module.named_call import (disable_named_call, enable_named_call,
                                        override_named_call)
from linen_ext.module.share_scope import share_scope
from linen_ext.module.state import UNINITIALIZED as _uninitialized_module_internal_state
from linen_ext.module.state import ModuleState as _ModuleInternalState
from linen_ext.module.state import SetupState
from linen_ext.module.state import _Context as _DynamicContext
from linen_ext.module.state import context as _context
from linen_ext.module.variables import tuple_init, tuple_reduce

__all__ = ['Module', 'compact', 'compact_name_scope', 'nowrap', 'share_scope', 'apply', 'init',
           'init_with_output', 'intercept_methods', 'InterceptorContext', 'merge_param',
           'enable_named_call', 'disable_named_call', 'override_named_call', 'wrap_method_once',
           'SetupState']
