"""Rules for call-like primitives and `scan`: recursion into inner jaxprs."""
from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import jax
from jax import lax

from lift import _compat
from lift.causal import frames
from lift.causal import interpreter
from lift.causal.interpreter import (
    Eqn, NotCausal, StepForm, Stream, register_scan_rule)
from lift.causal.pairs import Pair

FINAL_CARRY = (
    "the final carry of the scan over time at {where} depends on the whole "
    "sequence; only the scan's stacked outputs can be computed step by step."
)
SCAN_BACKWARDS = (
    "the scan runs in reverse over the scan axis, so element t of its output "
    "depends on the elements after t (anti-causal)."
)
SCAN_CLOSES_OVER_TIME = (
    "the scan runs along the scan axis but operand {index} (a constant or "
    "initial carry of the scan) varies along time too; pass it to the scan "
    "as part of xs instead."
)
SCAN_MIXED_AXES = (
    "the scan runs along the scan axis for some xs but xs {index} varies "
    "along axis {axis}; put the time axis of every xs at axis 0."
)
SCAN_OVER_PAIR = (
    "operand {index} of the scan over time has two time axes (from {origin}); a scan "
    "along time steps one element at a time and cannot carry a value pairing every "
    "element with every other. Fix: reduce or contract the key-time axis before the "
    "scan, or pass the operands the value is built from instead."
)
CARRY_AXIS = (
    "carry {index} enters the loop as {before} and leaves it as {after}; "
    "the scan axis of a carry must stay where it is across iterations."
)


def _jaxpr_and_consts(closed) -> tuple[Any, Sequence[Any]]:
  if isinstance(closed, _compat.ClosedJaxpr):
    return closed.jaxpr, closed.consts
  return closed, ()


def inner_info(op) -> interpreter.Info:
  """What an operand is inside an inner jaxpr it is passed to whole."""
  return op.stream if op.pair is None else op.pair


def _row_info(eqn: Eqn, index: int) -> interpreter.Info:
  """What one row (along axis 0) of an xs operand of a scan over layers is."""
  op = eqn.operands[index]
  if op.pair is not None:
    first, second = op.pair.axes
    return op.pair._replace(axes=(first - 1, second - 1))
  return None if op.stream is None else Stream(op.stream.axis - 1, eqn.offset)


def _stacked_info(info: interpreter.Info) -> interpreter.Info:
  """What a scan over layers' stacked output is, from one row's info."""
  if isinstance(info, Stream):
    return Stream(info.axis + 1, info.offset)
  if isinstance(info, Pair):
    first, second = info.axes
    return info._replace(axes=(first + 1, second + 1))
  return info


def program_form(eqn: Eqn, program: interpreter.Program) -> StepForm:
  """The step form of a converted inner jaxpr run once per element."""

  def step(states, index, args):
    return interpreter.run_step(program, states, index - eqn.offset, args)

  def prefill(args):
    return interpreter.run_prefill(program, args)

  return StepForm(program.out_infos, step, prefill)


def call_rule(param: str):
  """A rule for a call-like primitive whose jaxpr is `params[param]`."""

  def rule(eqn: Eqn, **params) -> StepForm:
    jaxpr, consts = _jaxpr_and_consts(params[param])
    program = interpreter.convert(
        jaxpr, consts, [inner_info(op) for op in eqn.operands],
        [op.known for op in eqn.operands], where=eqn.where)
    return program_form(eqn, program)

  return rule


def scan_rule(eqn: Eqn, *, jaxpr, num_consts, num_carry, **params):
  """`scan` along time steps once per element; other scans run whole."""
  xs = eqn.operands[num_consts + num_carry:]
  if any(op.axis == 0 or (op.pair is not None and 0 in op.pair.axes) for op in xs):
    return _scan_along_time(eqn, jaxpr, num_consts, num_carry, **params)
  return _scan_per_element(eqn, jaxpr, num_consts, num_carry, **params)


def _split(values, num_consts, num_carry):
  return (list(values[:num_consts]),
          list(values[num_consts:num_consts + num_carry]),
          list(values[num_consts + num_carry:]))


def _scan_along_time(eqn: Eqn, jaxpr, num_consts, num_carry, *, reverse,
                     **params) -> StepForm:
  if reverse:
    raise eqn.error(SCAN_BACKWARDS)
  for index, op in enumerate(eqn.operands):
    if op.pair is not None:
      raise eqn.error(SCAN_OVER_PAIR.format(index=index, origin=op.pair.link.origin))
    if op.stream is not None and index < num_consts + num_carry:
      raise eqn.error(SCAN_CLOSES_OVER_TIME.format(index=index))
    if op.stream is not None and op.axis != 0:
      raise eqn.error(SCAN_MIXED_AXES.format(index=index, axis=op.axis))
  body = _compat.jaxpr_as_fun(jaxpr)
  final = NotCausal(FINAL_CARRY.format(where=eqn.where))
  xs_ops = _split(eqn.operands, num_consts, num_carry)[2]

  def step(carry, index, args):
    consts, _, xs = _split(args, num_consts, num_carry)
    xs = [x if op.stream is not None else frames.step_slice(x, 0, index)
          for op, x in zip(xs_ops, xs)]
    outs = body(*consts, *carry, *xs)
    return tuple(outs[:num_carry]), [None] * num_carry + list(outs[num_carry:])

  def prefill(args):
    consts, carry, xs = _split(args, num_consts, num_carry)
    if eqn.offset == 0:
      return tuple(carry), [None] * num_carry + [
          frames.empty_prefix(aval, 0) for aval in eqn.out_avals[num_carry:]]
    xs = [x if op.stream is not None else frames.prefix_slice(x, 0, eqn.offset)
          for op, x in zip(xs_ops, xs)]

    def scan_body(c, x):
      outs = body(*consts, *c, *x)
      return tuple(outs[:num_carry]), outs[num_carry:]

    carry, ys = lax.scan(scan_body, tuple(carry), xs, length=eqn.offset)
    return carry, [None] * num_carry + list(ys)

  outs = [final] * num_carry + [eqn.stream(0)] * (len(eqn.out_avals) -
                                                   num_carry)
  return StepForm(tuple(outs), step, prefill)


def _carry_infos(eqn: Eqn, jaxpr, num_consts, num_carry):
  """Carry infos at their fixed point: a carry the body makes a stream is a
  stream from the start (its unscanned initial value is indexed per step)."""
  consts, carry, xs = _split(eqn.operands, num_consts, num_carry)
  infos = [inner_info(op) for op in carry]
  rows = [_row_info(eqn, i) for i in range(num_consts + num_carry, len(eqn.operands))]
  for _ in range(2):
    in_infos = [inner_info(op) for op in consts] + infos + rows
    known = [op.known for op in consts] + [None] * (len(carry) + len(xs))
    program = interpreter.convert(
        jaxpr.jaxpr, jaxpr.consts, in_infos, known,
        [i.offset if isinstance(i, Stream) else None for i in infos] + [None] * (
            len(jaxpr.jaxpr.outvars) - num_carry), where=eqn.where)
    after = list(program.out_infos[:num_carry])
    if after == infos:
      return infos, program
    infos = [a if b is None and isinstance(a, Stream) else b
             for a, b in zip(after, infos)]
  index = next(i for i, (a, b) in enumerate(zip(after, infos)) if a != b)
  raise eqn.error(CARRY_AXIS.format(index=index, before=infos[index],
                                    after=after[index]))


def _scan_per_element(eqn: Eqn, jaxpr, num_consts, num_carry, *, length,
                      reverse, unroll, **params) -> StepForm:
  del params
  infos, program = _carry_infos(eqn, jaxpr, num_consts, num_carry)
  carry_ops = _split(eqn.operands, num_consts, num_carry)[1]
  promoted = [op.stream is None and op.pair is None and info is not None
              for op, info in zip(carry_ops, infos)]

  def step(states, index, args):
    consts, carry, xs = _split(args, num_consts, num_carry)
    carry = [frames.step_slice(c, info.axis, index) if p else c
             for c, info, p in zip(carry, infos, promoted)]
    t = index - eqn.offset

    def body(c, x_and_state):
      x, state = x_and_state
      state, outs = interpreter.run_step(program, state, t, consts + c + x)
      return outs[:num_carry], (outs[num_carry:], state)

    carry, (ys, states) = lax.scan(body, carry, (xs, states), length=length,
                                   reverse=reverse, unroll=unroll)
    return states, list(carry) + list(ys)

  def prefill(args):
    consts, carry, xs = _split(args, num_consts, num_carry)
    carry = [frames.prefix_slice(c, info.axis, eqn.offset) if p else c
             for c, info, p in zip(carry, infos, promoted)]

    def body(c, x):
      states, outs = interpreter.run_prefill(program, consts + c + x)
      return outs[:num_carry], (outs[num_carry:], states)

    carry, (ys, states) = lax.scan(body, carry, xs, length=length,
                                   reverse=reverse)
    return states, list(carry) + list(ys)

  ys = [_stacked_info(info) for info in program.out_infos[num_carry:]]
  return StepForm(tuple(infos) + tuple(ys), step, prefill)


BRANCHES_DIFFER = (
    "its branches give results that vary along time differently ({infos}); "
    "every branch must return each result with the same time axis and shift."
)
PREDICATE_OVER_TIME = (
    "the loop's condition varies along time: each element would run its own "
    "number of iterations of a whole-sequence body."
)
LOOP_STATE = (
    "its body keeps state along time (a cumulative op, a shift, a cache); "
    "each iteration would need its own. Only a body acting on each element "
    "alone (elementwise ops, per-element matmuls) converts."
)


def cond_rule(eqn: Eqn, *, branches, **params) -> StepForm:
  """`cond`/`switch` with an unscanned index: each branch converted, the
  step runs the chosen one and keeps every branch's state."""
  del params
  ops = eqn.operands[1:]

  def convert(out_offsets=None):
    programs = []
    for branch in branches:
      jaxpr, consts = _jaxpr_and_consts(branch)
      programs.append(interpreter.convert(
          jaxpr, consts, [inner_info(op) for op in ops],
          [op.known for op in ops], out_offsets, where=eqn.where))
    return programs

  programs = convert()
  # A branch whose result runs ahead (a shift) is delayed to the others' offset.
  offsets = [min((getattr(info, "offset", 0) for info in column), default=0)
             for column in zip(*(p.out_infos for p in programs))]
  programs = convert([o if any(isinstance(i, Stream) for i in column) else None
                      for o, column in zip(offsets, zip(*(p.out_infos for p in programs)))])
  infos = [p.out_infos for p in programs]
  if any(i != infos[0] for i in infos):
    raise eqn.error(BRANCHES_DIFFER.format(infos=infos))

  def step(states, index, args):
    def run(k):
      def branch(states, rest):
        state, outs = interpreter.run_step(programs[k], states[k], index - eqn.offset,
                                           rest)
        return states[:k] + (state,) + states[k + 1:], outs
      return branch
    return lax.switch(args[0], [run(k) for k in range(len(programs))], states,
                      list(args[1:]))

  def prefill(args):
    results = [interpreter.run_prefill(p, list(args[1:])) for p in programs]
    states = tuple(state for state, _ in results)
    outs = lax.switch(args[0], [lambda k=k: results[k][1] for k in range(len(results))])
    return states, list(outs)

  return StepForm(programs[0].out_infos, step, prefill)


def while_rule(eqn: Eqn, *, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts
               ) -> StepForm:
  """`while_loop` over values varying along time, with a condition that does
  not: the loop runs whole for each element."""
  cond_ops = eqn.operands[:cond_nconsts]
  body_ops = eqn.operands[cond_nconsts:cond_nconsts + body_nconsts]
  carry_ops = eqn.operands[cond_nconsts + body_nconsts:]
  carry = [inner_info(op) for op in carry_ops]
  for _ in range(2):
    body = interpreter.convert(
        body_jaxpr.jaxpr, body_jaxpr.consts, [inner_info(op) for op in body_ops] + carry,
        [op.known for op in body_ops] + [None] * len(carry), where=eqn.where)
    after = list(body.out_infos)
    if after == carry:
      break
    carry = [a if b is None and isinstance(a, Stream) else b for a, b in zip(after, carry)]
  if after != carry:
    raise eqn.error(CARRY_AXIS.format(index=0, before=carry, after=after))
  cond = interpreter.convert(
      cond_jaxpr.jaxpr, cond_jaxpr.consts, [inner_info(op) for op in cond_ops] + carry,
      [op.known for op in cond_ops] + [None] * len(carry), where=eqn.where)
  if cond.out_infos[0] is not None:
    raise eqn.error(PREDICATE_OVER_TIME)
  promoted = [op.stream is None and op.pair is None and info is not None
              for op, info in zip(carry_ops, carry)]

  def split(args):
    return (list(args[:cond_nconsts]), list(args[cond_nconsts:cond_nconsts + body_nconsts]),
            list(args[cond_nconsts + body_nconsts:]))

  def loop(states, args, t, runner, values):
    cond_consts, body_consts, init = split(args)
    init = [values(c, info) if p else c for c, info, p in zip(init, carry, promoted)]
    return lax.while_loop(
        lambda c: runner(cond, states[0], t, cond_consts + list(c))[1][0],
        lambda c: tuple(runner(body, states[1], t, body_consts + list(c))[1]), tuple(init))

  def step(states, index, args):
    def run(program, state, t, inputs):
      return interpreter.run_step(program, state, t, inputs)
    return states, list(loop(states, args, index - eqn.offset, run,
                             lambda c, info: frames.step_slice(c, info.axis, index)))

  def prefill(args):
    cond_consts, body_consts, init = split(args)
    init = [frames.prefix_slice(c, info.axis, eqn.offset) if isinstance(info, Stream) and p
            else c for c, info, p in zip(init, carry, promoted)]
    states = (interpreter.run_prefill(cond, cond_consts + init)[0],
              interpreter.run_prefill(body, body_consts + init)[0])
    if jax.tree.leaves(states):
      raise eqn.error(LOOP_STATE)
    outs = loop(states, args, None, lambda p, s, t, inputs: interpreter.run_prefill(p, inputs),
                lambda c, info: frames.prefix_slice(c, info.axis, eqn.offset))
    return states, list(outs)

  return StepForm(tuple(carry), step, prefill)


def _register_all() -> None:
  prims = _compat.scan_primitives
  for prim, param in ((prims.jit_p, "jaxpr"), (prims.closed_call_p, "call_jaxpr"),
                      (prims.call_p, "call_jaxpr"), (prims.remat_p, "jaxpr"),
                      (prims.custom_jvp_call_p, "call_jaxpr"),
                      (prims.custom_vjp_call_p, "call_jaxpr")):
    register_scan_rule(prim, call_rule(param))
    interpreter.PAIR_RULES[prim] = call_rule(param)  # values with two time axes pass in
  for prim, rule in ((prims.scan_p, scan_rule), (prims.cond_p, cond_rule),
                     (prims.while_p, while_rule)):
    register_scan_rule(prim, rule)
    interpreter.PAIR_RULES[prim] = rule


_register_all()
