"""The rule of a folded `lax.associative_scan` (`associative.py`): a running step.

`lax.associative_scan(fn, elems, axis=a)` is `[e0, fn(e0, e1), fn(fn(e0, e1), e2),
...]` along `a`. When `a` is the scan axis, the step keeps the last result `c`
(every leaf of it) and computes `c_t = fn(c_(t-1), e_t)`, `c_0 = e_0`: one `fn`
per element. `fn` is `combine`, the call's own application of `fn` to the scan so
far and the next elements, converted like any function along time: it must act
on each element alone (as `lax.associative_scan` asks), so its conversion keeps no
state. Over another axis, the call's equations are converted as they are (slices
along other axes run per element).
"""
from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

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


def associative_scan_rule(eqn: Eqn, *, jaxpr, combine, axis, perms, elems,
                          leaves) -> StepForm:
  """A running step along the scan's axis; over other axes, the call's equations."""
  leaf_ops = [eqn.operands[i] for i in elems]
  const_ops = eqn.operands[max(elems) + 1:]
  along = [op.axis == perm[axis] for op, perm in zip(leaf_ops, perms) if op.stream is not None]
  if not along or not all(along) or any(op.stream is not None for op in const_ops):
    return rules_control.call_rule("jaxpr")(eqn, jaxpr=jaxpr)
  layout = _Layout(axis, perms)
  return _running_form(eqn, _element_combine(eqn, combine, layout, const_ops), layout,
                       elems, leaves)


class _Layout:
  """Where each leaf's axes are: the elements' order, and the results' (`axis` on time).

  Under `jax.vmap` a leaf's results may hold its axes in another order: axis `i` of
  the results is axis `perms[leaf][i]` of the leaf.
  """

  def __init__(self, axis: int, perms):
    self.axis, self.perms = axis, perms
    self.elem_axes = [perm[axis] for perm in perms]

  def element_order(self, leaf: int) -> list[int]:
    """Axis `j` of a result's element is axis `order[j]` of the leaf's element."""
    perm, time = self.perms[leaf], self.elem_axes[leaf]
    return [p - (p > time) for i, p in enumerate(perm) if i != self.axis]

  def to_result(self, leaf: int, element):
    return jnp.transpose(element, self.element_order(leaf))

  def to_leaf(self, leaf: int, element):
    return jnp.transpose(element, [int(i) for i in np.argsort(self.element_order(leaf))])


def _element_combine(eqn: Eqn, combine, layout: _Layout, const_ops):
  """`fn` on one element of each leaf: `apply(scan, elements, consts) -> scan`."""
  axes = [layout.axis] * len(layout.perms) + layout.elem_axes  # scan so far, then elements
  program = interpreter.convert(
      combine.jaxpr, combine.consts, [Stream(a, 0) for a in axes] + [None] * len(const_ops),
      [None] * len(axes) + [op.known for op in const_ops], where=eqn.where)
  for index, info in enumerate(program.out_infos):
    if info != Stream(layout.axis, 0):
      raise eqn.error(NOT_ELEMENTWISE.format(axis=layout.axis, why=(
          f"its result {index} is not the element of its operands along the axis")))
  empty = [frames.empty_prefix(v.aval, a) for v, a in zip(combine.jaxpr.invars, axes)]
  const_avals = [jax.ShapeDtypeStruct(op.aval.shape, op.aval.dtype) for op in const_ops]
  states = jax.eval_shape(
      lambda consts: interpreter.run_prefill(program, empty + list(consts))[0], const_avals)
  if jax.tree.leaves(states):
    raise eqn.error(NOT_ELEMENTWISE.format(
        axis=layout.axis, why="it keeps state along the axis: a shift, a cumulative op or a cache"))

  def apply(scan, elements, consts):
    return interpreter.run_step(program, states, jnp.int32(0),
                                [*scan, *elements, *consts])[1]

  return apply


def _running_form(eqn: Eqn, apply, layout: _Layout, elems, leaves) -> StepForm:
  leaf_ops = [eqn.operands[i] for i in elems]
  first_const = max(elems) + 1
  init = [jnp.zeros([op.aval.shape[p] for i, p in enumerate(perm) if i != layout.axis],
                    op.aval.dtype) for op, perm in zip(leaf_ops, layout.perms)]
  outs = [eqn.stream(layout.axis)] * len(leaves)

  def step(state, index, args):
    xs = [args[i] if op.stream is not None else frames.step_slice(args[i], axis, index)
          for i, op, axis in zip(elems, leaf_ops, layout.elem_axes)]
    combined = apply(state, xs, args[first_const:])
    state = [jnp.where(index == 0, layout.to_result(k, x), c)
             for k, (x, c) in enumerate(zip(xs, combined))]
    return state, [state[leaf] for leaf in leaves]

  def prefill(args):
    if eqn.offset == 0:
      return init, forms.empty_outs(eqn, outs)
    consts = args[first_const:]
    prefix = [jnp.transpose(args[i] if op.stream is not None
                            else frames.prefix_slice(args[i], axis, eqn.offset), perm)
              for i, op, axis, perm in zip(elems, leaf_ops, layout.elem_axes, layout.perms)]

    def combine_results(scan, later):  # both in the results' order
      return apply(scan, [layout.to_leaf(k, x) for k, x in enumerate(later)], consts)

    pairwise = jax.vmap(combine_results, in_axes=layout.axis, out_axes=layout.axis)
    scanned = lax.associative_scan(pairwise, prefix, axis=layout.axis)
    state = [lax.index_in_dim(s, eqn.offset - 1, layout.axis, keepdims=False)
             for s in scanned]
    return state, [scanned[leaf] for leaf in leaves]

  return StepForm(tuple(outs), step, prefill)


register_scan_rule(associative.associative_scan_call_p, associative_scan_rule)
