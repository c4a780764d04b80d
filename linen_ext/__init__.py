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
from flax.linen import initializers
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
from flax.linen import activation, dtypes, fp8_ops, meta, pooling, spmd

from lift.filters import DenyList
from lift.scope import Scope, Variable

from linen_ext import attention, errors, linear, partitioning, stochastic
from linen_ext.entry import apply, capture_call_intermediates, init, init_with_output
from linen_ext.flax_adapter import FlaxModule, from_flax
from linen_ext.layers import (BatchNorm, Conv, ConvLocal, ConvLSTMCell, ConvTranspose,
                              Dense, DenseGeneral, Dropout, Einsum, Embed, FlaxLayer,
                              Fp8DirectDotGeneralOp, Fp8DotGeneral, Fp8DotGeneralOp,
                              Fp8Einsum, GroupNorm, GRUCell, InstanceNorm, LayerNorm,
                              LSTMCell, MGUCell, MultiHeadAttention,
                              MultiHeadDotProductAttention, NANOOFp8DotGeneralOp,
                              OptimizedLSTMCell, PReLU, RMSNorm, SelfAttention, Sequential,
                              SimpleCell)
from linen_ext.method_wrapping import compact, compact_name_scope, nowrap
from linen_ext.module import Module
from linen_ext.share_scope import share_scope
from linen_ext.interception import InterceptorContext, intercept_methods
from linen_ext.named_call import disable_named_call, enable_named_call, override_named_call
from linen_ext.normalization import SpectralNorm, WeightNorm
from linen_ext.summary import tabulate
from linen_ext.recurrent import RNN, Bidirectional, RNNCellBase, flip_sequences
from linen_ext.variables_api import tuple_init, tuple_reduce
from linen_ext.direct import (cond, custom_vjp, grad, jvp, switch, value_and_grad, vjp,
                              while_loop)
from linen_ext.transforms import (add_metadata_axis, checkpoint, fold_rngs, jit,
                                  lift_transform, map_variables, remat, remat_scan, scan,
                                  shard_map, vmap)
from lift.scan import broadcast
from lift.causal import causal_self_attention
from linen_ext.stacks import BlockSeq, Stacked
from linen_ext.stack_layout import layers_to_stacked, per_layer, stacked_to_layers
from linen_ext.layer_scan import scan_layers
from linen_ext.decoding import as_scan
from lift import tracing

tracing.hide_from_tracebacks(__file__)
