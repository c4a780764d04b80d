"""Rules for elementwise primitives and reductions over other axes."""
from __future__ import annotations

from lift import _compat
from lift.causal import forms
from lift.causal import rules_pairs
from lift.causal.interpreter import PAIR_RULES, Eqn, StepForm, register_scan_rule

BROADCAST_STREAM = (
    "operand {index} holds {length} element(s) along the scan axis {axis} "
    "and is broadcast to {want}; a stream cannot be broadcast along time."
)
REDUCES_TIME = (
    "it reduces over axes {axes}, which include the scan axis {axis}; every "
    "result would depend on the whole sequence. Reduce over other axes, or "
    "use a cumulative op (jnp.cumsum, lax.cummax) for a running reduction."
)

ELEMENTWISE = (
    "abs acos acosh add and asin asinh atan atan2 bessel_i0e bessel_i1e cbrt "
    "ceil clamp clz complex conj convert_element_type copy cos cosh digamma "
    "div eq erf erf_inv erfc exp exp2 expm1 floor ge gt igamma igamma_grad_a "
    "igammac imag integer_pow is_finite le lgamma log log1p logistic lt max "
    "min mul name ne neg nextafter not or polygamma population_count pow real "
    "reduce_precision regularized_incomplete_beta rem round rsqrt select_n "
    "shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt "
    "square stop_gradient sub tan tanh xor zeta"
).split()
REDUCTIONS = (
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or "
    "reduce_xor argmax argmin"
).split()


def elementwise_rule(eqn: Eqn, **params) -> StepForm:
  """Applies the primitive per element; unscanned operands are indexed.

  A rank-0 operand is a broadcast scalar; a size-1 axis broadcasts too.
  Streams along two different axes make a value with two time axes (see
  `rules_pairs`).
  """
  if len({op.axis for op in eqn.operands if op.stream is not None}) > 1:
    return rules_pairs.elementwise_rule(eqn, **params)
  axis = forms.common_axis(eqn)
  query_axis = rules_pairs.promoted_axis(eqn, axis)
  if query_axis is not None:
    return rules_pairs.elementwise_rule(eqn, query_axis, **params)
  want = eqn.out_avals[0].shape[axis]
  for index, op in enumerate(eqn.operands):
    if op.stream is not None and op.aval.shape[axis] != want:
      raise eqn.error(BROADCAST_STREAM.format(
          index=index, length=op.aval.shape[axis], axis=axis, want=want))
  axes = [None if op.aval.ndim == 0 else axis for op in eqn.operands]

  def fn(index, args):
    return forms.bind(eqn, forms.step_args(eqn, args, index, axes), params)

  return forms.stateless(eqn, [eqn.stream(axis)] * len(eqn.out_avals), fn)


def reduction_rule(eqn: Eqn, *, axes, **params) -> StepForm:
  """Reduces over axes other than the scan axis."""
  axis = forms.stream_axis(eqn.operands[0])
  if axis in axes:
    raise eqn.error(REDUCES_TIME.format(axes=tuple(axes), axis=axis))
  step_axes = forms.drop_dim(axes, axis)
  out_axis = axis - sum(a < axis for a in axes)

  def fn(index, args):
    return forms.bind(eqn, args, params, axes=step_axes)

  return forms.stateless(eqn, [eqn.stream(out_axis)], fn)


def sharding_constraint_rule(eqn: Eqn, **params) -> StepForm:
  """A sharding constraint on the whole value; steps pass through."""
  del params
  stream = eqn.operands[0].stream
  assert stream is not None, "its one operand varies along time"
  return forms.stateless(eqn, [stream], lambda i, a: a)


def _register_all() -> None:
  prims = _compat.scan_primitives
  for name in ELEMENTWISE:
    if hasattr(prims, f"{name}_p"):
      register_scan_rule(getattr(prims, f"{name}_p"), elementwise_rule)
      PAIR_RULES[getattr(prims, f"{name}_p")] = rules_pairs.elementwise_rule
  for name in REDUCTIONS:
    if hasattr(prims, f"{name}_p"):
      register_scan_rule(getattr(prims, f"{name}_p"), reduction_rule)
      PAIR_RULES[getattr(prims, f"{name}_p")] = rules_pairs.reduction_rule
  register_scan_rule(prims.sharding_constraint_p, sharding_constraint_rule)


_register_all()
