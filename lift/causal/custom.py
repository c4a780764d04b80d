"""`custom_causal`: mark a composite as causal and give its step form.

A decorated function binds one primitive, `custom_causal_call`, whose
parameters hold the traced original and the author's rules. Evaluating,
lowering, differentiating and batching it run the original, so gradients are
the original's; only `as_scan` looks at the author's rules.
"""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable

import jax
import jax.numpy as jnp

from lift import _compat
from lift.causal import forms
from lift.causal import frames
from lift.causal import rules_control
from lift.causal.interpreter import Eqn, StepForm, register_scan_rule

custom_causal_call_p = _compat.Primitive("custom_causal_call")


def _impl(*args, jaxpr, **params):
  del params
  return _compat.jaxpr_as_fun(jaxpr)(*args)


def _abstract_eval(*avals, jaxpr, **params):
  del avals, params
  return jaxpr.out_avals


def _jvp(primals, tangents, *, jaxpr, **params):
  del params
  return jax.jvp(_compat.jaxpr_as_fun(jaxpr), list(primals), list(tangents))


def _batch(args, dims, *, jaxpr, spmd_axis_name, **params):
  del params
  outs = jax.vmap(_compat.jaxpr_as_fun(jaxpr), in_axes=list(dims),
                  spmd_axis_name=spmd_axis_name)(*args)
  return outs, [0] * len(outs)


def define_jaxpr_primitive(primitive: _compat.Primitive) -> None:
  """Makes `primitive` evaluate, lower, differentiate and batch as its `jaxpr`
  parameter (a closed jaxpr of its operands) does."""
  _compat.define_primitive_rules(
      primitive, impl=_impl, abstract_eval=_abstract_eval, jvp=_jvp,
      batch=_batch, batch_takes_spmd_axis=True)


define_jaxpr_primitive(custom_causal_call_p)


class CustomCausal:
  """A function declared causal along `axis` of every input and output.

  Call it like the original. Under `as_scan`, when the scan axis of every
  varying input is `axis`, the author's rules run instead of the original:

  * `@f.def_init`: `init(*args) -> state`, args as `jax.ShapeDtypeStruct`s
    of the whole inputs (their length along `axis` is the number of steps).
  * `@f.def_step`: `step(state, index, *args) -> (state, outs)`; args and
    outs are one element (`axis` removed); `index` is the element's position.
  * `@f.def_prefill` (optional): `prefill(state, *args) -> (state, outs)` on
    the first elements at once, from the initial state. Without it the step
    is scanned over them.

  Without a step, `as_scan` keeps the whole input history and reruns the
  original on it every step (correct, but O(T) per step).
  """

  def __init__(self, fun: Callable, axis: int):
    functools.update_wrapper(self, fun)
    self.fun = fun
    self.axis = axis
    self.init: Callable | None = None
    self.step: Callable | None = None
    self.prefill: Callable | None = None

  def def_init(self, init: Callable) -> Callable:
    """Registers the initial state; returns `init` unchanged."""
    self.init = init
    return init

  def def_step(self, step: Callable) -> Callable:
    """Registers the one-element step; returns `step` unchanged."""
    self.step = step
    return step

  def def_prefill(self, prefill: Callable) -> Callable:
    """Registers the parallel prefill; returns `prefill` unchanged."""
    self.prefill = prefill
    return prefill

  def __call__(self, *args):
    shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), args)
    closed, out_shape = jax.make_jaxpr(self.fun, return_shape=True)(*shapes)
    jaxpr = _compat.ClosedJaxpr(
        _compat.convert_constvars_jaxpr(closed.jaxpr), ())
    leaves, in_tree = jax.tree.flatten(args)
    outs = custom_causal_call_p.bind(
        *closed.consts, *leaves, jaxpr=jaxpr, causal=self,
        num_consts=len(closed.consts), in_tree=in_tree,
        out_tree=jax.tree.structure(out_shape))
    return jax.tree.unflatten(jax.tree.structure(out_shape), outs)


def custom_causal(fun: Callable | None = None, *,
                  axis: int = 0) -> CustomCausal | Callable:
  """Marks `fun` as causal along `axis` of every array it takes and returns.

  Use it for composites that are causal as a whole but built from parts that
  are not (attention's all-pairs logits), then give the step form with
  `def_init` / `def_step` / `def_prefill`. Gradients and values are those of
  `fun`. Do not use it on functions that are not causal: `as_scan` trusts it.

  Examples:
    >>> @custom_causal
    ... def running_mean(xs):
    ...   n = jnp.arange(1, xs.shape[0] + 1, dtype=xs.dtype)
    ...   return jnp.cumsum(xs) / n
    >>> @running_mean.def_init
    ... def _(xs):
    ...   return jnp.zeros((), xs.dtype)
    >>> @running_mean.def_step
    ... def _(total, index, x):
    ...   total = total + x
    ...   return total, total / (index + 1).astype(x.dtype)
    >>> running_mean(jnp.array([1.0, 3.0]))
    Array([1., 2.], dtype=float32)
  """
  if fun is None:
    return functools.partial(custom_causal, axis=axis)
  return CustomCausal(fun, axis)


def custom_causal_rule(eqn: Eqn, *, jaxpr, causal, num_consts, in_tree,
                       out_tree, **params) -> StepForm:
  """The author's step form when time is the declared axis, else recursion."""
  consts, args = eqn.operands[:num_consts], eqn.operands[num_consts:]
  axes = [causal.axis % op.aval.ndim for op in args]
  along_axis = all(op.stream is None for op in consts) and all(
      op.stream is None or op.axis == axis for op, axis in zip(args, axes))
  if not along_axis:
    return rules_control.call_rule("jaxpr")(eqn, jaxpr=jaxpr, **params)
  layout = _Layout(eqn, causal, num_consts, axes, in_tree, out_tree)
  if causal.step is None:
    return _history_form(layout, jaxpr)
  return _author_form(layout)


class _Layout:
  """How the primitive's flat operands map to the author's arguments."""

  def __init__(self, eqn, causal, num_consts, axes, in_tree, out_tree):
    self.eqn, self.causal, self.num_consts = eqn, causal, num_consts
    self.axes, self.in_tree, self.out_tree = axes, in_tree, out_tree
    self.out_axes = [causal.axis % a.ndim for a in eqn.out_avals]
    self.outs = [eqn.stream(axis) for axis in self.out_axes]

  def at(self, args: list, index) -> Any:
    """The author's arguments at element `index`."""
    return self._pick(args, lambda arg, axis: frames.step_slice(
        arg, axis, index))

  def prefix(self, args: list) -> Any:
    """The author's arguments on the prefix."""
    return self._pick(args, lambda arg, axis: frames.prefix_slice(
        arg, axis, self.eqn.offset))

  def _pick(self, args: list, unscanned: Callable) -> Any:
    ops = self.eqn.operands[self.num_consts:]
    picked = [arg if op.stream is not None else unscanned(arg, axis)
              for op, arg, axis in zip(ops, args[self.num_consts:], self.axes)]
    return jax.tree.unflatten(self.in_tree, picked)

  def whole_shapes(self) -> Any:
    return jax.tree.unflatten(self.in_tree, [
        jax.ShapeDtypeStruct(op.aval.shape, op.aval.dtype)
        for op in self.eqn.operands[self.num_consts:]])


def _author_form(layout: _Layout) -> StepForm:
  causal, eqn = layout.causal, layout.eqn
  init = () if causal.init is None else causal.init(*layout.whole_shapes())

  def step(state, index, args):
    frames.read_by_position()  # the author's state may hold the example's length
    state, outs = causal.step(state, index, *layout.at(args, index))
    return state, layout.out_tree.flatten_up_to(outs)

  form = forms.stateful(eqn, layout.outs, init, step)
  if causal.prefill is None:
    return form

  def prefill(args):
    if eqn.offset == 0:
      return init, forms.empty_outs(eqn, layout.outs)
    state, outs = causal.prefill(init, *layout.prefix(args))
    return state, layout.out_tree.flatten_up_to(outs)

  return form._replace(prefill=prefill)


def _history_form(layout: _Layout, jaxpr) -> StepForm:
  """Keeps every input element so far and reruns the original per step."""
  eqn, num_consts = layout.eqn, layout.num_consts
  ops = eqn.operands[num_consts:]
  fun = _compat.jaxpr_as_fun(jaxpr)

  def step(history, index, args):
    frames.read_by_position()
    elements = jax.tree.leaves(layout.at(args, index))
    history = [jax.lax.dynamic_update_index_in_dim(h, x, index, axis)
               for h, x, axis in zip(history, elements, layout.axes)]
    outs = fun(*args[:num_consts], *history)
    return history, [jax.lax.dynamic_index_in_dim(out, index, axis, False)
                     for out, axis in zip(outs, layout.out_axes)]

  def prefill(args):
    prefix = jax.tree.leaves(layout.prefix(args))
    history = [
        jax.lax.dynamic_update_slice_in_dim(
            jnp.zeros(op.aval.shape, op.aval.dtype), x, 0, axis)
        for op, x, axis in zip(ops, prefix, layout.axes)]
    if eqn.offset == 0:
      return history, forms.empty_outs(eqn, layout.outs)
    outs = layout.causal.fun(*jax.tree.unflatten(layout.in_tree, prefix))
    return history, layout.out_tree.flatten_up_to(outs)

  return StepForm(tuple(layout.outs), step, prefill)


register_scan_rule(custom_causal_call_p, custom_causal_rule)
