"""The rule of a folded `lax.associative_scan` (`associative.py`): a running step.

`lax.associative_scan(fn, elems, axis=a)` is `[e0, fn(e0, e1), fn(fn(e0, e1), e2),
...]` along `a`. When `a` is the scan axis, the step keeps the last result `c`
(every leaf of it) and computes `c_t = fn(c_{t-1}, e_t)`, `c_0 = e_0`: one `fn`
per element. `fn` is `combine`, the call's first `fn(elems[0::2], elems[1::2])`,
converted like any function along time: it must act on each element alone (as
`lax.associative_scan` asks), so its conversion keeps no state. Over another
axis, the call's equations are converted as they are (slices along other axes
run per element).
"""
from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from lift.causal import associative
from lift.causal import forms
from lift.causal import frames
from lift.causal import interpreter
from lift.causal import rules_control
from lift.causal.interpreter import Eqn, StepForm, Stream, register_scan_rule

NOT_ELEMENTWISE = (
    "lax.associative_scan along the scan axis {axis}: its fn is not applied to each "
    "element alone along that axis ({why}), so it has no step c_t = fn(c_(t-1), x_t). "
    "Fix: make fn elementwise over the axis, as lax.associative_scan requires (e.g. "
    "jax.vmap an elementwise function), or scan with lax.scan."
)


def associative_scan_rule(eqn: Eqn, *, jaxpr, combine, axis, elems,
                          leaves) -> StepForm:
  """A running step along `axis`; over other axes, the call's equations."""
  leaf_ops = [eqn.operands[i] for i in elems]
  const_ops = eqn.operands[max(elems) + 1:]
  along = [op.stream is not None and op.axis == axis for op in leaf_ops]
  if not any(along) or any(op.stream is not None or op.pair is not None
                           for op in const_ops):
    return rules_control.call_rule("jaxpr")(eqn, jaxpr=jaxpr)
  return _running_form(eqn, _element_combine(eqn, combine, axis, len(elems), const_ops),
                       axis, elems, leaves)


def _element_combine(eqn: Eqn, combine, axis: int, count: int, const_ops):
  """`fn` on one element of each leaf: `apply(left, right, consts) -> leaves`."""
  program = interpreter.convert(
      combine.jaxpr, combine.consts, [Stream(axis, 0)] * (2 * count) + [None] * len(const_ops),
      [None] * (2 * count) + [op.known for op in const_ops], where=eqn.where)
  for index, info in enumerate(program.out_infos):
    if info != Stream(axis, 0):
      raise eqn.error(NOT_ELEMENTWISE.format(axis=axis, why=(
          f"its result {index} is not the element of its operands along the axis")))
  empty = [frames.empty_prefix(v.aval, axis) for v in combine.jaxpr.invars[:2 * count]]
  const_avals = [jax.ShapeDtypeStruct(op.aval.shape, op.aval.dtype) for op in const_ops]
  states = jax.eval_shape(
      lambda consts: interpreter.run_prefill(program, empty + list(consts))[0], const_avals)
  if jax.tree.leaves(states):
    raise eqn.error(NOT_ELEMENTWISE.format(
        axis=axis, why="it keeps state along the axis: a shift, a cumulative op or a cache"))

  def apply(left, right, consts):
    return interpreter.run_step(program, states, jnp.int32(0),
                                [*left, *right, *consts])[1]

  return apply


def _running_form(eqn: Eqn, apply, axis: int, elems, leaves) -> StepForm:
  leaf_ops = [eqn.operands[i] for i in elems]
  first_const = max(elems) + 1
  init = [jnp.zeros(forms.drop_entry(op.aval.shape, axis), op.aval.dtype)
          for op in leaf_ops]
  outs = [eqn.stream(axis)] * len(leaves)

  def step(state, index, args):
    xs = [args[i] if op.stream is not None else frames.step_slice(args[i], axis, index)
          for i, op in zip(elems, leaf_ops)]
    combined = apply(state, xs, args[first_const:])
    state = [jnp.where(index == 0, x, c) for x, c in zip(xs, combined)]
    return state, [state[leaf] for leaf in leaves]

  def prefill(args):
    if eqn.offset == 0:
      return init, forms.empty_outs(eqn, outs)
    prefix = [args[i] if op.stream is not None
              else frames.prefix_slice(args[i], axis, eqn.offset)
              for i, op in zip(elems, leaf_ops)]
    pairwise = jax.vmap(apply, in_axes=(axis, axis, None), out_axes=axis)
    consts = args[first_const:]
    scanned = lax.associative_scan(lambda a, b: pairwise(a, b, consts), prefix, axis=axis)
    state = [lax.index_in_dim(s, eqn.offset - 1, axis, keepdims=False) for s in scanned]
    return state, [scanned[leaf] for leaf in leaves]

  return StepForm(tuple(outs), step, prefill)


register_scan_rule(associative.associative_scan_call_p, associative_scan_rule)
