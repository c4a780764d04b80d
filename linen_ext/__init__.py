"""linen_ext: a Linen-style Module system on `lift`; port a Flax model by changing the import.

>>> import linen_ext as nn
>>> class Mlp(nn.Module):
...   @nn.compact
...   def __call__(self, x):
...     return nn.Dense(1)(nn.relu(nn.Dense(4)(x)))
>>> variables = Mlp().init(jax.random.key(0), jnp.ones((2, 3)))
"""
# Activations, initializers, axis metadata, FrozenDict and BatchApply are Flax's own (pure
# functions, boxes, a container, a reshaping wrapper of any callable).
from flax.core import FrozenDict
from flax.linen import BatchApply
from flax.linen import (PARTITION_NAME, LogicallyPartitioned, Partitioned,
                        get_logical_axis_rules, get_partition_spec, get_sharding,
                        logical_axis_rules, logical_to_mesh, logical_to_mesh_axes,
                        logical_to_mesh_sharding, set_logical_axis_rules, unbox,
                        with_logical_constraint, with_logical_partitioning,
                        with_partitioning)
from flax.linen import (celu, elu, gelu, glu, hard_sigmoid, hard_silu, hard_swish,
                        hard_tanh, leaky_relu, log_sigmoid, log_softmax, logsumexp,
                        normalize, one_hot, relu, relu6, selu, sigmoid, silu,
                        soft_sign, softmax, softplus, standardize, swish, tanh)
from flax.linen import (avg_pool, combine_masks, dot_product_attention,
                        dot_product_attention_weights, make_attention_mask,
                        make_causal_mask, max_pool, merge_param, ones, ones_init,
                        pool, zeros, zeros_init)
from flax.linen import meta

import importlib as _importlib
import typing as _typing

from lift import tracing as _tracing
from lift.filters import DenyList
from lift.axes import broadcast
from lift.scope import Scope, Variable

from linen_ext import (activation, attention, batch_apply, combinators, dtypes, errors, fp8_ops,
                       initializers, kw_only_dataclasses, linear, module, normalization,
                       partitioning, pooling, recurrent, sharding, spmd, stochastic, transforms)
from linen_ext.layers import (RNN, BatchNorm, Bidirectional, Conv, ConvLocal, ConvLSTMCell,
                              ConvTranspose, Dense, DenseGeneral, Dropout, Einsum, Embed,
                              FlaxLayer, FlaxModule, Fp8DirectDotGeneralOp, Fp8DotGeneral,
                              Fp8DotGeneralOp, Fp8Einsum, GroupNorm, GRUCell, InstanceNorm,
                              LayerNorm, LSTMCell, MGUCell, MultiHeadAttention,
                              MultiHeadDotProductAttention, NANOOFp8DotGeneralOp, NativeLayer,
                              OptimizedLSTMCell, PReLU, RMSNorm, RNNCellBase, SelfAttention,
                              Sequential, SimpleCell, SpectralNorm, WeightNorm, flip_sequences,
                              from_flax)
from linen_ext.module import (InterceptorContext, Module, apply, compact, compact_name_scope,
                              init, init_with_output, intercept_methods, nowrap, share_scope)
from linen_ext.module.init_apply import capture_call_intermediates
from linen_ext.module.named_call import (disable_named_call, enable_named_call, named_call,
                                        override_named_call)
from linen_ext.module.variables import tuple_init, tuple_reduce
from linen_ext.sharding import init_sharded, variable_shardings
from linen_ext.stacks import (BlockSeq, Stacked, circular_to_stacked, layers_to_stacked,
                              per_layer, scan_layers, stacked_to_circular, stacked_to_layers)
from linen_ext.summary import tabulate
from linen_ext.transforms import (add_metadata_axis, as_scan, checkpoint, cond, custom_vjp,
                                  fold_rngs, grad, jit, jvp, lift_transform, map_variables,
                                  remat, remat_scan, scan, shard_map, switch, value_and_grad,
                                  vjp, vmap, while_loop)

if _typing.TYPE_CHECKING:  # loaded on first use, below; named here for type checkers and the API pages
  from lift.causal import causal_self_attention
  from linen_ext import scale
  from linen_ext.scale import compile_train_step, plan, tpu_topology

# At-scale compilation and planning (linen_ext.scale) import optax and, for TPU targets,
# libtpu; the causal attention brings `lift.causal`'s rules: loaded on first use, so
# `import linen_ext` does not pay for them.
_SCALE_NAMES = ('scale', 'plan', 'compile_train_step', 'tpu_topology')


def __getattr__(name: str):
  if name in _SCALE_NAMES:
    scale = _importlib.import_module('linen_ext.scale')
    return scale if name == 'scale' else getattr(scale, name)
  if name == 'causal_self_attention':
    return _importlib.import_module('lift.causal').causal_self_attention
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_SCALE_NAMES) | {'causal_self_attention'})


_tracing.hide_from_tracebacks(__file__)
