"""Lifted transforms for Modules (and `flax.linen.transforms`'s names: ``nn.transforms.vmap``).

Files: `lifting` (the mechanism: a Module's scopes into a `lift` transform and back),
`module_transforms` (``vmap``, ``scan``, ... on a class or as a method decorator),
`user_transforms` (``lift_transform``: a user's own `pack` transform), `method_transforms` (``cond``,
``switch``, ``while_loop``, ``vjp``, ... called inside a method with the module), and
`decoding` (``as_scan`` for a Module).

Of `flax.linen.transforms`' other names, Flax's plain helpers are Flax's own (imported from
where Flax defines them: this package imports nothing of Flax's lifting), and those of the
Module system are this package's (``Module``, ``Scope``, ``_is_module_class``,
``_check_field_is_hashable``); Flax's lifting internals are not
kept (docs/porting.md, "Every name of `flax.linen`").
"""
from flax.core.frozen_dict import FrozenDict
from flax.linen.module import _derive_profiling_name
from flax.linen.recurrent import CollectionFilter, PRNGSequenceFilter
from flax.typing import InOutAxis, InOutScanAxis

from lift.axes import broadcast
from lift.scope import Scope, Variable

from linen_ext.module import Module, _get_unbound_fn, wrap_method_once
from linen_ext.module.named_call import named_call
from linen_ext.transforms.decoding import as_scan
from linen_ext.transforms.lifting import check_field_is_hashable as _check_field_is_hashable
from linen_ext.transforms.lifting import is_module_class as _is_module_class
from linen_ext.transforms.method_transforms import (cond, custom_vjp, grad, jvp, switch,
                                                    value_and_grad, vjp, while_loop)
from linen_ext.transforms.module_transforms import (TransformSpec, add_metadata_axis,
                                                    checkpoint, fold_rngs, jit, map_variables,
                                                    remat, remat_scan, scan, shard_map, vmap)
from linen_ext.transforms.user_transforms import lift_transform

__all__ = ['TransformSpec', 'add_metadata_axis', 'as_scan', 'broadcast', 'checkpoint', 'cond',
           'custom_vjp', 'fold_rngs', 'grad', 'jit', 'jvp', 'lift_transform', 'map_variables',
           'named_call', 'remat', 'remat_scan', 'scan', 'shard_map', 'switch', 'value_and_grad', 'vjp', 'vmap',
           'while_loop']
