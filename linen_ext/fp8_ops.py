"""`flax.linen.fp8_ops`: Flax's fp8 functions, with this package's fp8 layers.

>>> from linen_ext.fp8_ops import Fp8Einsum, OVERWRITE_WITH_GRADIENT
>>> Fp8Einsum is nn.Fp8Einsum, OVERWRITE_WITH_GRADIENT
(True, '_overwrite_with_gradient')
"""
from flax.linen.fp8_ops import (CAN_USE_EARRAY, OVERWRITE_WITH_GRADIENT, DType, DTypeLike,
                                Fp8MetaTyRules, compute_amax_history, compute_scale, custom_jvp,
                                custom_vjp, dequantize, dot_general_transpose_lhs,
                                dot_general_transpose_rhs, dot_general_with_precision,
                                dot_general_with_precision_jvp, fm32, fp32_max_grad,
                                fp8_meta_dtype, fp8_meta_dtype_wrapper, fp8_scaled_dot_general,
                                get_fp8_max, in_q, in_q_bwd, in_q_fwd, in_qdq, in_qdq_bwd,
                                in_qdq_fwd, out_dq, out_dq_bwd, out_dq_fwd, out_qdq, out_qdq_bwd,
                                out_qdq_fwd, qdq, quantize, quantize_dequantize_update,
                                quantized_dot, quantized_dot_bwd, quantized_dot_fwd,
                                update_fp8_meta)
from flax.linen.fp8_ops import _fm32_to_float32 as _fm32_to_float32
from flax.linen.fp8_ops import _parse_dot_inputs as _parse_dot_inputs

from linen_ext.layers.ready_made import (Fp8DirectDotGeneralOp, Fp8DotGeneral,
                                         Fp8DotGeneralBase, Fp8DotGeneralOp, Fp8Einsum,
                                         NANOOFp8DotGeneralOp)

__all__ = ['CAN_USE_EARRAY', 'DType', 'DTypeLike', 'Fp8DirectDotGeneralOp', 'Fp8DotGeneral',
           'Fp8DotGeneralBase', 'Fp8DotGeneralOp', 'Fp8Einsum', 'Fp8MetaTyRules',
           'NANOOFp8DotGeneralOp', 'OVERWRITE_WITH_GRADIENT', 'compute_amax_history',
           'compute_scale', 'custom_jvp', 'custom_vjp', 'dequantize',
           'dot_general_transpose_lhs', 'dot_general_transpose_rhs',
           'dot_general_with_precision', 'dot_general_with_precision_jvp', 'fm32',
           'fp32_max_grad', 'fp8_meta_dtype', 'fp8_meta_dtype_wrapper',
           'fp8_scaled_dot_general', 'get_fp8_max', 'in_q', 'in_q_bwd', 'in_q_fwd', 'in_qdq',
           'in_qdq_bwd', 'in_qdq_fwd', 'out_dq', 'out_dq_bwd', 'out_dq_fwd', 'out_qdq',
           'out_qdq_bwd', 'out_qdq_fwd', 'qdq', 'quantize', 'quantize_dequantize_update',
           'quantized_dot', 'quantized_dot_bwd', 'quantized_dot_fwd', 'update_fp8_meta']
