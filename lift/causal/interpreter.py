"""The `as_scan` interpreter: one pass over a jaxpr, one rule per primitive.

Words used here and in `notes/0005-as-scan.md`:

* **stream**: a value that varies along the scan axis. The step holds one
  element of it at a time (the scan axis removed).
* **offset**: at global step `t` a stream's step value is its element
  `t + offset`. Offsets grow when a known piece is put in front of a stream
  (a prompt, a shift's padding) and shrink when elements are dropped.
* **prefix**: the elements `[0, offset)` of a stream, computed before the
  first step by the prefill pass.
* **unscanned**: a value that does not vary along the scan axis (weights,
  constants). When it is known at conversion time it is *hoisted*: computed
  once and closed over by the step.

Three passes, each a function below: `convert` (rules turn equations into
`StepForm`s), `run_prefill` (states after the prefixes) and `run_step` (one
element of every stream).
"""
from __future__ import annotations

from typing import Any, NamedTuple
from collections.abc import Callable, Sequence

import jax
from jax import lax

from lift import _compat
from lift.causal import frames
from lift.errors import ScanConversionError

FIX = (
    "Fix: make the function causal along the scan axis (e.g. pad a convolution on the left "
    "only, mask later steps out of an attention), or give a causal composite its step form "
    "with @lift.custom_causal.")
NO_RULE = (
    "as_scan has no rule for primitive `{name}` (at {where}), and its "
    "operands ({operands}) vary along time. Fix: if `{name}` is causal "
    "along that axis, register a rule with "
    "lift.register_scan_rule({name}_p, rule); if it is part of a causal "
    "composite, wrap the composite with @lift.custom_causal."
)
CANNOT_CONVERT = (
    "as_scan cannot convert `{name}` at {where}: {why}\n  operands: {operands}\n  " + FIX
)
NO_PAIR_RULE = (
    "as_scan cannot convert `{name}` at {where}: operand {index} has two time "
    "axes (query and key time, like attention scores; from {origin}), and `{name}` "
    "has no rule for such values.\n  operands: {operands}\n  Fix: reduce or "
    "contract the key-time axis first (softmax over keys, weights @ values), "
    "behind a causal mask; or wrap the attention with @lift.custom_causal."
)
PAIR_ELSEWHERE = (
    "as_scan cannot convert `{name}` at {where}: operand {index} has two time "
    "axes (from {origin}) and starts {ahead} element(s) after the other operands "
    "along time; a value with two time axes cannot be delayed."
)
NOT_CAUSAL_USE = "{message}\n  (used by `{name}` at {where})\n  " + FIX
BAD_RULE = (
    "the as_scan rule for `{name}` returned {got} results; the primitive has "
    "{want}. Fix: return one entry of StepForm.outs per result."
)
AHEAD = (
    "as_scan cannot convert `{name}` at {where}: element t of its result "
    "needs element t + {ahead} of its input, which comes later along the "
    "scan axis (anti-causal)."
)


class Stream(NamedTuple):
  """A value varying along its scan axis `axis`.

  At global step `t` the step holds element `t + offset`; the elements before
  `offset` form its prefix.
  """
  axis: int
  offset: int = 0


class NotCausal(NamedTuple):
  """A value no step can produce; only using it raises `message`."""
  message: str


# None: unscanned. A `pairs.Pair` (two time axes) is an info too; it is not
# named here to keep this module free of the pair analysis.
Info = Stream | NotCausal | Any | None


class Operand(NamedTuple):
  """One operand of an equation, as a rule sees it."""
  aval: Any  # type of the whole value, scan axis included
  stream: Stream | None  # None: it does not vary along the scan axis
  known: Any = None  # the whole value, when known at conversion time
  pair: Any = None  # a `pairs.Pair` when it has two time axes (then stream is None)

  @property
  def axis(self) -> int | None:
    return None if self.stream is None else self.stream.axis


class Eqn(NamedTuple):
  """One equation, as a rule sees it. Stream operands share `offset`."""
  primitive: _compat.Primitive
  operands: tuple[Operand, ...]
  out_avals: tuple[Any, ...]
  offset: int
  where: str

  def stream(self, axis: int, shift: int = 0) -> Stream:
    """A result on `axis`, `shift` elements ahead of the operands."""
    return Stream(int(axis), self.offset + shift)

  def error(self, why: str) -> ScanConversionError:
    """A `ScanConversionError` naming this primitive, its operands and why."""
    return ScanConversionError(CANNOT_CONVERT.format(
        name=self.primitive.name, where=self.where, why=why,
        operands=describe(self.operands)))


StepFn = Callable[[Any, jax.Array, list], tuple[Any, list]]
PrefillFn = Callable[[list], tuple[Any, list]]


class StepForm(NamedTuple):
  """The step form of one equation; what a rule returns.

  Attributes:
    outs: per result, a `Stream` (or `NotCausal`).
    step: `step(state, index, args) -> (state, outs)`, one element. `index`
      is the element index `t + offset`; stream args are that element (scan
      axis removed), unscanned args are whole.
    prefill: `prefill(args) -> (state, outs)`: the state after the prefix
      and the results' prefixes; stream args are prefixes (length `offset`
      along their axis), unscanned args are whole.
  """
  outs: tuple[Info, ...]
  step: StepFn
  prefill: PrefillFn


# Turns one equation into its `StepForm`: `rule(eqn, **params)`, `params`
# being the equation's. Rules name the parameters they read as keyword-only
# arguments, which no Protocol with `**params` admits, hence `...`.
ScanRule = Callable[..., StepForm]


SCAN_RULES: dict[_compat.Primitive, ScanRule] = {}
# Rules for equations with an operand that has two time axes (a `pairs.Pair`),
# filled by `rules_pairs`; an equation without one uses `SCAN_RULES`.
PAIR_RULES: dict[_compat.Primitive, ScanRule] = {}


def register_scan_rule(primitive: _compat.Primitive, rule: ScanRule) -> None:
  """Registers `rule` as the `as_scan` rule of `primitive`.

  A registered rule replaces the previous one for every later `as_scan`
  call. Not for a causal composite of several primitives (attention): mark
  the composite with `lift.custom_causal` and give its step there.

  Args:
    primitive: a JAX primitive, e.g. `jax.extend.core.primitives.sin_p`.
    rule: `rule(eqn: Eqn, **params) -> StepForm`.

  Examples:
    >>> from jax.extend.core import primitives
    >>> from lift.causal.rules_elementwise import elementwise_rule
    >>> register_scan_rule(primitives.sin_p, elementwise_rule)  # sin's own rule
    >>> SCAN_RULES[primitives.sin_p] is elementwise_rule
    True
  """
  SCAN_RULES[primitive] = rule


def describe(operands: Sequence[Operand]) -> str:
  """`f32[8,3] scan axis 0, f32[3] unscanned`, for messages."""
  return ", ".join(
      f"{op.aval.str_short()} " + (
          ("unscanned" if op.stream is None else f"scan axis {op.axis}")
      if op.pair is None else f"time axes {op.pair.axes}")
      for op in operands)


class Instr(NamedTuple):
  """One converted equation of a `Program`."""
  eqn: _compat.JaxprEqn
  form: StepForm | None  # None: unscanned, evaluated as written
  delays: tuple[tuple[int, int], ...]  # (operand, steps) to delay it by
  axes: tuple[int | None, ...]  # per operand, its scan axis
  offset: int


class Program(NamedTuple):
  """A converted jaxpr: what `run_prefill` and `run_step` execute."""
  jaxpr: _compat.Jaxpr
  instrs: tuple[Instr, ...]
  known: dict
  out_infos: tuple[Info, ...]
  out_delays: tuple[int, ...]


class _Env:
  """Values (or infos) by variable; literals read as their value."""

  def __init__(self, init: dict | None = None):
    self.values = dict(init or {})

  def read(self, var):
    if isinstance(var, _compat.Literal):
      return var.val
    return self.values.get(var)

  def write(self, variables, values) -> None:
    for var, value in zip(variables, values, strict=True):
      if not isinstance(var, _compat.DropVar):
        self.values[var] = value


def _is_pair(info: Info) -> bool:
  return hasattr(info, "link")


def _info(var, infos: _Env) -> Info:
  return None if isinstance(var, _compat.Literal) else infos.read(var)


def convert(jaxpr: _compat.Jaxpr, consts: Sequence[Any],
            in_infos: Sequence[Info], in_known: Sequence[Any],
            out_offsets: Sequence[int | None] | None = None,
            where: str = "") -> Program:
  """Converts `jaxpr` into a `Program`, applying one rule per equation.

  Args:
    jaxpr: an open jaxpr; `consts` bind its constvars (known, unscanned).
    in_infos: per invar, its `Stream` or None.
    in_known: per invar, its value when known at conversion time, else None.
    out_offsets: per output, the offset it must have (later results are
      delayed, earlier ones raise), or None to keep its own.
    where: the location to report for equations without a user location
      (those inside library functions): the enclosing call's.
  """
  jaxpr = _compat.without_dead_code(jaxpr)  # values computed for their shape alone
  infos, known = _Env(), _Env(dict(zip(jaxpr.constvars, consts)))
  from_literals: set = set()
  infos.write(jaxpr.invars, in_infos)
  known.write(jaxpr.invars, in_known)
  instrs = []
  for eqn in jaxpr.eqns:
    op_infos = [_info(v, infos) for v in eqn.invars]
    eqn_where = _compat.source_summary(eqn) or where
    _check_no_poison(eqn, op_infos, eqn_where)
    if all(info is None for info in op_infos):
      instrs.extend(_convert_unscanned(eqn, infos, known, from_literals))
    else:
      instrs.append(_convert_stream(eqn, op_infos, infos, known, eqn_where))
  out_infos = [_info(v, infos) for v in jaxpr.outvars]
  out_infos, out_delays = _align_outputs(out_infos, out_offsets)
  return Program(jaxpr, tuple(instrs), known.values, out_infos, out_delays)


def _check_no_poison(eqn, op_infos, where: str) -> None:
  for info in op_infos:
    if isinstance(info, NotCausal):
      raise ScanConversionError(NOT_CAUSAL_USE.format(
          message=info.message, name=eqn.primitive.name, where=where))


def _convert_unscanned(eqn, infos: _Env, known: _Env,
                       from_literals: set) -> list[Instr]:
  infos.write(eqn.outvars, [None] * len(eqn.outvars))
  args = [known.read(v) for v in eqn.invars]
  if any(arg is None for arg in args):
    return [Instr(eqn, None, (), (), 0)]
  # Concrete inputs (literals, values built from them, concrete arrays passed
  # in, such as a mask reaching an inner jit) give concrete results.
  concrete = all(isinstance(v, _compat.Literal) or v in from_literals
                 or not isinstance(arg, _compat.Tracer)
                 for v, arg in zip(eqn.invars, args))
  known.write(eqn.outvars, hoist(eqn, args, concrete))
  if concrete:
    from_literals.update(eqn.outvars)
  return []


def hoist(eqn, args: list, concrete: bool) -> list:
  """Evaluates an unscanned equation at conversion time.

  With `concrete` (inputs built from literals alone: iota masks, zeros) the
  results are concrete even under `jit`, so rules can inspect them; other
  values (weights) are staged as usual, not compiled one op at a time.
  """
  if not concrete:
    return _compat.bind_equation(eqn, args)
  with jax.ensure_compile_time_eval():
    return _compat.bind_equation(eqn, args)


def _convert_stream(eqn, op_infos, infos: _Env, known: _Env,
                    where: str) -> Instr:
  offset = min(info.offset for info in op_infos if info is not None)
  operands = tuple(_operand(v, i, offset, known) for v, i in zip(eqn.invars, op_infos))
  view = Eqn(eqn.primitive, operands, tuple(v.aval for v in eqn.outvars),
             offset, where)
  rule = _rule(view, op_infos)
  form = rule(view, **eqn.params)
  if len(form.outs) != len(eqn.outvars):
    raise ScanConversionError(BAD_RULE.format(
        name=eqn.primitive.name, got=len(form.outs), want=len(eqn.outvars)))
  infos.write(eqn.outvars, [_poison_if_ahead(view, o) for o in form.outs])
  delays = tuple((i, info.offset - offset) for i, info in enumerate(op_infos)
                 if info is not None and info.offset > offset)
  axes = tuple(op.axis for op in operands)
  return Instr(eqn, form, delays, axes, offset)


def _operand(var, info: Info, offset: int, known: _Env) -> Operand:
  if info is None:
    return Operand(var.aval, None, known.read(var))
  if _is_pair(info):
    return Operand(var.aval, None, known.read(var), info)
  assert isinstance(info, Stream), "poisoned operands raise before"
  return Operand(var.aval, Stream(info.axis, offset), known.read(var))


def _rule(eqn: Eqn, op_infos) -> ScanRule:
  """The rule for `eqn`: a pair rule when an operand has two time axes."""
  paired = [i for i, info in enumerate(op_infos) if _is_pair(info)]
  name = eqn.primitive.name
  for index in paired:
    pair = op_infos[index]
    if pair.offset > eqn.offset:
      raise ScanConversionError(PAIR_ELSEWHERE.format(
          name=name, where=eqn.where, index=index, origin=pair.link.origin,
          ahead=pair.offset - eqn.offset))
  if paired:
    rule = PAIR_RULES.get(eqn.primitive)
    if rule is None:
      raise ScanConversionError(NO_PAIR_RULE.format(
          name=name, where=eqn.where, index=paired[0],
          origin=op_infos[paired[0]].link.origin, operands=describe(eqn.operands)))
    return rule
  rule = SCAN_RULES.get(eqn.primitive)
  if rule is None:
    raise ScanConversionError(NO_RULE.format(
        name=name, where=eqn.where, operands=describe(eqn.operands)))
  return rule


def _poison_if_ahead(eqn: Eqn, info: Info) -> Info:
  if isinstance(info, Stream) and info.offset < 0:
    return NotCausal(AHEAD.format(
        name=eqn.primitive.name, where=eqn.where, ahead=-info.offset))
  return info


def _align_outputs(out_infos, out_offsets):
  if out_offsets is None:
    return tuple(out_infos), (0,) * len(out_infos)
  aligned, delays = [], []
  for i, (info, want) in enumerate(zip(out_infos, out_offsets)):
    delay = 0
    if isinstance(info, Stream) and want is not None:
      if info.offset < want:
        raise ScanConversionError(AHEAD.format(
            name="the function", where=f"output {i}",
            ahead=want - info.offset) + " " + FIX)
      delay, info = info.offset - want, Stream(info.axis, want)
    aligned.append(info)
    delays.append(delay)
  return tuple(aligned), tuple(delays)


def _evaluate(program: Program, inputs: Sequence[Any], run_form) -> list:
  """The program's outputs: unconverted equations bound as they are, each converted
  one's outputs from ``run_form(instr, args)``."""
  env = _Env(program.known)
  env.write(program.jaxpr.invars, inputs)
  for instr in program.instrs:
    args = [env.read(v) for v in instr.eqn.invars]
    if instr.form is None:
      env.write(instr.eqn.outvars, _compat.bind_equation(instr.eqn, args))
    else:
      env.write(instr.eqn.outvars, run_form(instr, args))
  return [env.read(v) for v in program.jaxpr.outvars]


def run_prefill(program: Program, inputs: Sequence[Any]):
  """States after the inputs' prefixes, and the outputs' prefixes.

  Stream inputs are prefixes (length `offset` along the scan axis), unscanned
  inputs whole. Returns `(states, outputs)`.
  """
  states = []

  def prefill(instr, args):
    buffers = []
    for i, delay in instr.delays:
      axis = instr.axes[i]
      assert axis is not None, "only stream operands are delayed"
      buffers.append(frames.delay_prefill(args[i], axis, instr.offset, delay))
      args[i] = lax.slice_in_dim(args[i], 0, instr.offset, axis=axis)
    state, outs = instr.form.prefill(args)
    states.append((tuple(buffers), state))
    return outs

  outs = _evaluate(program, inputs, prefill)
  out_buffers = []
  for i, (info, delay) in enumerate(zip(program.out_infos, program.out_delays)):
    if delay:
      assert isinstance(info, Stream), "only stream outputs are delayed"
      out_buffers.append(frames.delay_prefill(
          outs[i], info.axis, info.offset, delay))
      outs[i] = lax.slice_in_dim(outs[i], 0, info.offset, axis=info.axis)
  return (tuple(states), tuple(out_buffers)), outs


def run_step(program: Program, states, t: jax.Array, inputs: Sequence[Any]):
  """One global step `t`: the outputs' step values and the new states.

  Stream inputs are their step values, unscanned inputs whole.
  """
  instr_states, out_buffers = states
  instr_states = iter(instr_states)
  new_states = []

  def step(instr, args):
    buffers, state = next(instr_states)
    index = t + instr.offset if instr.offset else t
    buffers = list(buffers)
    for b, (i, _) in enumerate(instr.delays):
      buffers[b], args[i] = frames.delay_step(buffers[b], index, args[i])
    state, outs = instr.form.step(state, index, args)
    new_states.append((tuple(buffers), state))
    return outs

  outs = _evaluate(program, inputs, step)
  out_buffers = list(out_buffers)
  delayed = [i for i, d in enumerate(program.out_delays) if d]
  for b, i in enumerate(delayed):
    info = program.out_infos[i]
    assert isinstance(info, Stream), "only stream outputs are delayed"
    index = t + info.offset
    out_buffers[b], outs[i] = frames.delay_step(out_buffers[b], index,
                                                outs[i])
  return (tuple(new_states), tuple(out_buffers)), outs
