"""What a program's loops are and what their values hold, in the user's words.

`explain_scans` names a value by following it through the jaxpr: forward from
the traced function's inputs, by their pytree paths
(``variables/params/cell/ii/kernel``), and back from its outputs (a backward
loop's carry whose final value is an input's gradient). Loops are numbered when
first seen and keep their number through the rewrites, which keep each
equation's traceback. A loop JAX derived by transposing one (``transpose`` in
the name stack of the loop or of an equation holding it) is a backward loop,
paired with the forward loop traced at the same call site.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any

import jax

from lift import _compat

# Equations whose result holds the value of their first input (a copy, another
# layout or precision): a value keeps its name through them.
SAME_VALUE = frozenset({'convert_element_type', 'reshape', 'transpose', 'squeeze', 'expand_dims',
                        'broadcast_in_dim', 'copy', 'copy_p', 'reduce_precision'})
# Equations whose result sums its inputs: each input is a part of where the result goes.
SUMS = frozenset({'add', 'add_any'})
RECOMPUTED_SCOPE = 'rematted_computation'  # jax.checkpoint's name for a forward pass it repeats


@dataclasses.dataclass(frozen=True)
class Sink:
  """Where a value ends up: an output of the traced function, and the input
  with that output's pytree path (whose gradient it is, in a backward loop)."""
  output: str
  input: str | None = None


@dataclasses.dataclass(frozen=True)
class LoopInfo:
  """A loop of the program: where it was written and what role it plays."""
  number: int
  function: str  # the user's function that wrote the loop
  line: int
  where: str  # file:line:column (function)
  role: str  # 'forward', 'backward' or 'recomputed forward' (jax.checkpoint's)
  steps: int
  forward: int | None = None  # for a backward loop: the loop it differentiates
  parent: int | None = None  # the loop whose body holds this one
  scope: str = ''  # the innermost name scope it was traced in (a module's name)

  def role_text(self) -> str:
    """The role, with the loop it derives from: ``backward of loop 1``."""
    if self.forward and self.role == 'backward':
      return f'backward of loop {self.forward}'
    if self.role == 'recomputed forward':
      again = f' of loop {self.forward}' if self.forward else ''
      return f'forward{again}, recomputed in the backward pass'
    return self.role

  def title(self) -> str:
    nested = f', nested in loop {self.parent}' if self.parent else ''
    scope = f'{self.scope} in ' if self.scope else ''
    place = (f'{scope}{self.function}, line {self.line} ({self.where})' if self.function
             else f'{scope}no known line (JAX kept none)')
    return f'loop {self.number}, {self.role_text()}{nested}: {place}, {self.steps} steps'


@dataclasses.dataclass
class Names:
  """The named variables of one jaxpr: what they hold, where they go, which loop each scan is."""
  source: dict  # variable -> what it holds (an input's path, a loop's output)
  sink: dict  # variable -> Sink
  loops: dict  # id(scan equation) -> LoopInfo
  keys: dict  # (traceback, role, occurrence) -> LoopInfo: a loop keeps its number across rewrites


@dataclasses.dataclass
class Level:
  """A jaxpr being rewritten: what its inputs hold, where its outputs go."""
  inputs: list  # per input variable: a name or None
  outputs: list  # per output variable: a Sink or None
  loop: int | None = None  # the loop whose body it is
  backward: bool = False  # whether it is part of a backward pass
  names: Names = dataclasses.field(default_factory=lambda: Names({}, {}, {}, {}))  # `look_at`
  # The name stacks of the equations holding it inside its loop's body (or the traced
  # function), outermost first, and the innermost of them.
  transforms: tuple = ()
  scopes: tuple = ()
  within: Any = None


def argument_names(fn, args: tuple, kwargs: dict) -> tuple[list[str], list[tuple]]:
  """(name, pytree path in its argument) of each leaf of ``(args, kwargs)``:
  ``variables/params/cell/ii/kernel``, ``params[0]``, ``x``."""
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    params = []
  fixed = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)

  def arg_name(i: int) -> str:
    if i < len(fixed):
      return fixed[i]
    return f'{star}[{i - len(fixed)}]' if star else f'args[{i}]'
  names, paths = [], []
  for path, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]:
    part, key, *rest = path
    names.append(path_name(arg_name(key.idx) if part.idx == 0 else str(key.key), rest))
    paths.append((key, *rest))
  return names, paths


def path_name(prefix: str, path) -> str:
  """`prefix` followed by the keys of a pytree path: ``/key`` or ``[index]``."""
  text = prefix
  for key in path:
    if isinstance(key, jax.tree_util.DictKey):
      text += f'/{key.key}'
    elif isinstance(key, jax.tree_util.GetAttrKey):
      text += f'/{key.name}'
    else:
      text += f'[{getattr(key, "idx", getattr(key, "key", key))}]'
  return text


def output_sinks(out_paths: list, out_avals: list, in_names: list, in_paths: list, in_avals: list
                 ) -> list[Sink]:
  """A Sink per output: its path, and the input whose path it ends with (same
  type; the one matching most keys, if one does)."""
  sinks = []
  for path, aval in zip(out_paths, out_avals):
    scores = [_score(tuple(path), tuple(p), a == aval) for p, a in zip(in_paths, in_avals)]
    best = max(scores, default=-1)
    match = in_names[scores.index(best)] if best >= 0 and scores.count(best) == 1 else None
    sinks.append(Sink(path_name('output', path), match))
  return sinks


def _score(out_path: tuple, in_path: tuple, same_type: bool) -> int:
  """How many keys of the input's path (argument position first) end the
  output's path; -1 if its keys inside the argument do not."""
  arg, rest = in_path[:1], in_path[1:]
  if not same_type or (rest and out_path[-len(rest):] != rest):
    return -1
  return len(rest) + (out_path[-len(in_path):] == arg + rest)


class Naming:
  """The loops seen so far, and the names of the jaxprs being rewritten (a stack
  of `Level`s: the traced function's jaxpr, then those nested in it)."""

  def __init__(self, top: Level | None = None):
    self.top = top or Level([], [])
    self.levels: list[Level] = []
    self.loops: list[LoopInfo] = []
    self._sites: dict[int, tuple] = {}  # loop number -> (call site, the user's part of it)
    self._reverse: dict[int, bool] = {}  # loop number -> whether it runs backwards
    self._tracebacks: dict[int, Any] = {}  # loop number -> its equation's traceback
    self._paired: set[int] = set()  # forward loops given a backward loop

  @contextlib.contextmanager
  def level(self, closed, within=None):
    """Names `closed` while it is rewritten: the top jaxpr, or one nested in equation `within`."""
    self.levels.append(self.top if within is None else self._inner(within, closed))
    try:
      self.look_at(closed)
      yield
    finally:
      self.levels.pop()

  def look_at(self, closed) -> None:
    """Names the current jaxpr of the innermost level (after a rewrite changed it)."""
    level = self.levels[-1]
    loops, keys = self._loops(closed.jaxpr, level)
    source = sources(closed.jaxpr, level.inputs, loops)
    level.names = Names(source, sinks(closed.jaxpr, level.outputs), loops, keys)

  def loop(self, eqn) -> LoopInfo:
    """The loop a scan equation of the current jaxpr is."""
    return self.levels[-1].names.loops[id(eqn)]

  def current(self) -> Names:
    """The names of the current jaxpr."""
    return self.levels[-1].names

  def body(self, eqn) -> Names:
    """The names inside a loop's body (its scans not numbered)."""
    inner = self._inner(eqn, eqn.params['jaxpr'])
    jaxpr = eqn.params['jaxpr'].jaxpr
    return Names(sources(jaxpr, inner.inputs, {}), sinks(jaxpr, inner.outputs), {}, {})

  def _inner(self, eqn, closed) -> Level:
    outer = self.levels[-1]
    names = outer.names
    inputs = [names.source.get(v) if isinstance(v, _compat.Var) else None for v in eqn.invars]
    outputs = [names.sink.get(v) for v in eqn.outvars]
    info = names.loops.get(id(eqn))
    if info is not None:  # a loop's body: its carries are the loop's own state
      n_consts, n_carry = eqn.params['num_consts'], eqn.params['num_carry']
      inputs[n_consts:n_consts + n_carry] = [f'carry {k} of loop {info.number}' for k in range(n_carry)]
      return Level(inputs, outputs, info.number, info.role == 'backward')
    jaxpr = getattr(closed, 'jaxpr', closed)
    if eqn.primitive.name == 'cond':  # the branches read all but the index
      inputs = inputs[1:]
    transforms, scopes = _compat.name_stack_parts(eqn)
    return Level(_fit(inputs, len(jaxpr.invars)), _fit(outputs, len(jaxpr.outvars)), outer.loop,
                 outer.backward or 'transpose' in transforms,
                 transforms=outer.transforms + transforms, scopes=outer.scopes + scopes, within=eqn)

  def _loops(self, jaxpr, level: Level) -> tuple[dict, dict]:
    """The loops of `jaxpr`, numbered as when last seen: the same traceback
    and role as a loop of the level's previous jaxpr (the n-th such), or as a
    loop that was nested in one of them (a rewrite moved it out); else new."""
    previous = level.names.keys
    found: list = []
    seen: dict = {}
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'scan':
        kind = (eqn.source_info.traceback, self._role(eqn, level))
        found.append((eqn, (*kind, seen.setdefault(kind, 0))))
        seen[kind] += 1
    here = {previous[key].number for _, key in found if key in previous}
    loops, keys = {}, {}
    for eqn, key in found:
      info = (previous.get(key) or self.nested(here, eqn, key[1])
              or self._register(eqn, key[1], level))
      loops[id(eqn)] = keys[key] = info
    return loops, keys

  def _role(self, eqn, level: Level) -> str:
    """'forward', 'backward' or 'recomputed forward'. In a backward pass, a loop that
    JAX did not transpose itself (``transpose`` not in its name stack: the loops of a
    transposed loop's body, or of a hand-written backward pass such as nested remat's)
    is a forward loop run again if it runs in the direction of the forward loop it
    comes from, a backward loop if against it (JAX transposes a loop into a reversed one)."""
    transforms, scopes = _compat.name_stack_parts(eqn)
    transforms = level.transforms + transforms
    if not (level.backward or 'transpose' in transforms):
      return 'forward'
    if RECOMPUTED_SCOPE in level.scopes + scopes:
      return 'recomputed forward'
    if 'transpose' in transforms:
      return 'backward'
    original, _ = self._origin(eqn, level, ('forward',), unpaired=False)
    same_way = original is not None and self._reverse[original.number] == eqn.params['reverse']
    return 'recomputed forward' if same_way else 'backward'

  def _origin(self, eqn, level: Level, roles: tuple, unpaired: bool) -> tuple:
    """(the last loop of `roles` and `eqn`'s length, traced where `eqn` was, or None;
    the equation whose site matched). Where: the call site of `eqn`, else its user's
    part (a custom VJP's backward runs in other library frames), else those of the
    equation holding `eqn` (JAX gave some derived loops the traceback of an outer one)."""
    for origin in [e for e in (eqn, level.within) if e is not None]:
      for kind, site in enumerate((_compat.call_site(origin), _compat.user_site(origin))):
        if kind and not site:  # no user frame: every library loop would match
          continue
        for wanted in roles:
          found = [i for i in self.loops if i.role == wanted and i.steps == eqn.params['length']
                   and self._sites[i.number][kind] == site
                   and not (unpaired and i.number in self._paired)]
          if found:
            return found[-1], origin
    return None, eqn

  def _register(self, eqn, role: str, level: Level) -> LoopInfo:
    forward, origin = None, eqn
    if role != 'forward':  # a backward loop pairs with a forward loop not yet paired
      roles = ('forward',) if role == 'recomputed forward' else ('forward', 'recomputed forward')
      forward, origin = self._origin(eqn, level, roles, unpaired=role == 'backward')
      if forward and role == 'backward':
        self._paired.add(forward.number)
    frame = _compat.user_frame(origin)
    scopes = [s for s in level.scopes + _compat.name_stack_parts(eqn)[1] if s != RECOMPUTED_SCOPE]
    scope = ''.join(scopes[-1:]).partition('._')[0]  # Stacked_0._loop, a private method: Stacked_0
    info = LoopInfo(len(self.loops) + 1, frame.function_name if frame else '',
                    frame.start_line if frame else 0, _location(frame) if frame else '', role,
                    eqn.params['length'], forward.number if forward else None, level.loop, scope)
    self.loops.append(info)
    self._sites[info.number] = (_compat.call_site(origin), _compat.user_site(origin))
    self._reverse[info.number] = eqn.params['reverse']
    self._tracebacks[info.number] = eqn.source_info.traceback
    return info

  def nested(self, parents, eqn, role: str) -> LoopInfo | None:
    """The loop nested in one of the loops numbered `parents` that `eqn` (a
    scan with `role`) comes from: the same traceback."""
    return next((i for i in self.loops if i.parent in parents and i.role == role
                 and self._tracebacks[i.number] is eqn.source_info.traceback), None)


def _location(frame) -> str:
  column = f':{frame.start_column}' if frame.start_column else ''
  return f'{frame.file_name}:{frame.start_line}{column}'


def _fit(names: list, count: int) -> list:
  return names if len(names) == count else [None] * count


def sources(jaxpr, inputs: list, loops: dict) -> dict:
  """What each variable of `jaxpr` holds, where known: an input's name, kept
  through copies and layout changes, or an output of a numbered loop."""
  source = {v: n for v, n in zip(jaxpr.invars, inputs) if n is not None}
  for eqn in jaxpr.eqns:
    first = eqn.invars[0] if eqn.invars else None
    if eqn.primitive.name in SAME_VALUE and isinstance(first, _compat.Var) and first in source:
      source[eqn.outvars[0]] = source[first]
    elif id(eqn) in loops:
      number, n_carry = loops[id(eqn)].number, eqn.params['num_carry']
      for j, v in enumerate(eqn.outvars):
        source[v] = (f'final carry {j} of loop {number}' if j < n_carry
                     else f'stacked output {j - n_carry} of loop {number}')
  return source


def sinks(jaxpr, outputs: list) -> dict:
  """Where each variable of `jaxpr` goes, where known: the output it becomes,
  through copies, layout changes and sums."""
  sink = {v: s for v, s in zip(jaxpr.outvars, outputs) if s is not None and isinstance(v, _compat.Var)}
  for eqn in reversed(jaxpr.eqns):
    name = eqn.primitive.name
    out = sink.get(eqn.outvars[0]) if eqn.outvars else None
    if out is None or name not in SAME_VALUE | SUMS:
      continue
    for v in (eqn.invars if name in SUMS else eqn.invars[:1]):
      if isinstance(v, _compat.Var):
        sink.setdefault(v, out)
  return sink


def describe(naming: Naming, loop: Any, kind: str, index: int) -> str:
  """Input or output `index` of `loop` of kind 'constant', 'carry', 'sequence'
  or 'output' (stacked), with its type and what it holds: ``carry 0 f32[3,8]
  (gradient of variables/params/cell/ii/kernel)``."""
  eqn, names = loop.eqn, naming.current()
  consts, init, xs = loop.split_inputs(eqn.invars)
  final, ys = loop.split_outputs(eqn.outvars)
  var = {'constant': consts, 'carry': init, 'sequence': xs, 'output': ys}[kind][index]
  what = names.source.get(var) if isinstance(var, _compat.Var) else None
  if kind == 'carry':
    what = _carry(naming.loop(eqn), names.sink.get(final[index]), what)
  elif kind == 'output':
    sink = names.sink.get(var)
    what = sink and sink.output
  return f'{kind} {index} {var.aval.str_short(short_dtypes=True)}' + (f' ({what})' if what else '')


def _carry(info: LoopInfo, sink: Sink | None, source: str | None) -> str:
  if sink is not None and sink.input and info.role == 'backward':
    return f'gradient of {sink.input}'
  if sink is not None:
    return sink.output
  if source:
    return f'starts as {source}'
  if info.role == 'backward' and info.forward:
    return f'gradient carried back through loop {info.forward}'
  return f"loop {info.number}'s own state"


def operand(names: Names, var) -> str:
  """A body value by what it holds, else by its type."""
  name = names.source.get(var) if isinstance(var, _compat.Var) else None
  return name or var.aval.str_short(short_dtypes=True)


def top_level(fn, args: tuple, kwargs: dict, closed, out_tree) -> Level:
  """The traced function's jaxpr: its inputs named by argument and pytree path,
  its outputs by their paths (and the input each is the gradient of, if any)."""
  in_names, in_paths = argument_names(fn, args, kwargs)
  in_avals = [v.aval for v in closed.jaxpr.invars]
  positions = jax.tree.unflatten(out_tree, list(range(out_tree.num_leaves)))
  out_paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(positions)[0]]
  out_avals = [v.aval for v in closed.jaxpr.outvars]
  return Level(in_names, output_sinks(out_paths, out_avals, in_names, in_paths, in_avals))
