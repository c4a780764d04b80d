"""lift: lifted JAX transformations over stateful scopes.

>>> import lift
>>> def dense(scope, x, features):
...   kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
...   return x @ kernel
>>> y, variables = lift.init(dense)(jax.random.key(0), jax.numpy.ones((2, 3)), 4)
"""
import importlib as _importlib
import typing as _typing

from lift import _compat, errors, loops
from lift.errors import (CacheLengthError, DecodeArgumentError, InvalidScopeError, LiftError,
                         ModelLengthError, ScanRewriteError, ScanConversionError)
from lift.filters import (CollectionFilter, DenyList, Filter, PRNGSequenceFilter,
                          group_collections, in_filter, intersect_filters,
                          is_filter_empty, subtract_filters, union_filters)
from lift.functional import apply, bind, init
from lift.pack import pack
from lift.rng import RngStream
from lift.scope import Scope, Variable
from lift.remat_scan import remat_scan
from lift.axes import broadcast
from lift.scan import scan
from lift.vmap import In, Out, vmap
from lift.shard_map import shard_map
from lift.autodiff import custom_vjp, jvp, value_and_grad, vjp
from lift.checkpoint import checkpoint, remat
from lift.control_flow import cond, switch, while_loop
from lift.fold_rngs import fold_rngs
from lift.jit import jit
from lift.map_variables import map_variables, swap_collection

if _typing.TYPE_CHECKING:  # loaded on first use, below; named here for type checkers and the API pages
  from lift.causal import (AttentionChoice, as_scan, as_scan_with_prefill, causal_self_attention,
                           choose_attention, custom_causal, register_scan_rule)
  from lift.causal.generate import Generated, Sampling, generate
  from lift.scan_rewrites import ScanReport, explain_scans, optimize_scans

# Decoding (`as_scan`, `generate`: the causal rules) and the scan rewrites (their passes)
# load on first use, so `import lift` pays only for the scopes and the transforms.
_LAZY_MODULES = ('causal', 'scan_rewrites')
_LAZY = {
    **{name: 'lift.causal' for name in (
        'AttentionChoice', 'Generated', 'Sampling', 'as_scan', 'as_scan_with_prefill',
        'causal_self_attention', 'choose_attention', 'custom_causal', 'generate',
        'register_scan_rule')},
    **{name: 'lift.scan_rewrites' for name in ('ScanReport', 'explain_scans', 'optimize_scans')},
}


def __getattr__(name: str):
  if name in _LAZY_MODULES:
    return _importlib.import_module(f'lift.{name}')
  if name in _LAZY:
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))


_compat.hide_from_tracebacks(__file__)
