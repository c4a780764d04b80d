"""Lifted `scan`: a loop whose steps see carried, scanned and broadcast variables.

A step is ``fn(scope, carry, *xs) -> (carry, ys)``. Per collection, variables
are *scanned* (``variable_axes``: step ``i`` sees slice ``i``; what it writes is
stacked), *carried* (``variable_carry``: step ``i`` sees what step ``i - 1``
wrote) or *broadcast* (``variable_broadcast``: shared by every step). The loop
itself is `lift.loops.run_scan`, so ``remat`` means what it means for every
loop of the project.

Before the loop, a pre-pass traces one step without running it
(``make_jaxpr``). From that trace, what the step writes to broadcast
collections (and outputs with ``out_axes=broadcast``) is checked not to depend
on the loop and is computed once, running only the equations it needs; and
carry variables that the step creates (as during init) make the first step run
on its own before the loop, exactly as in the unrolled Python loop. Where a
second trace would make the same program (no variables created, the same rng
keys drawn), the loop runs the pre-pass's trace: the step is traced once.
notes/0002-lifted-transforms.md states the semantics as equations.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import PyTreeDef
from lift._compat import Var

from lift import _compat, errors, loops, rng_counters
from lift.filters import Filter, in_filter
from lift.metadata import add_group_axes, move_axis, remove_group_axes
from lift.pack import pack
from lift.rng import RngCounters
from lift.scope import Scope
from lift.axes import (MappedAxes, MappedLeaf, broadcast, check_axis_leaves, check_keyword_arrays,
                       check_size, check_split_rngs, check_variable_axes, infer_axis_size,
                       is_unmapped, leaf_axes, leaf_axis_size, mapped_arguments, mapped_variables,
                       path_text, split_rng_groups)

_NOT_A_PAIR = (
    '{name} at "{path}": the body returned {got}, but a scan body returns a pair (carry, ys): '
    'the next carry (the structure, shapes and dtypes of the carry it received) and '
    'the step\'s outputs (None for none). Fix: return `(carry, y)`; to scan a module '
    'whose __call__ returns one value, wrap it in one that returns `(y, None)` or `(y, y)`.')
_CARRY_CHANGED = (
    '{name}: the body takes the carry {before} and returns the carry {after}. The '
    'carry keeps one structure, shape and dtype from step to step. Fix: return a '
    'carry like the one received (cast or reshape it), and put values that grow '
    'or change shape in ys.')
_KEYWORDS_UNSCANNED = (
    '{transform}: no argument after the carry is scanned, and keyword arguments never are: '
    'they reach every step whole ({keywords}). The length of the loop would come from the '
    'variables alone (at init there are none yet), and every step would compute on the '
    'whole {first!r}, not on its slice. Fix: pass {first!r} positionally after the carry to '
    'scan it along in_axes, e.g. model(carry, xs); if every step should get it whole, say '
    'so with length=N.')
_DEPENDS_ON_LOOP = (
    '{name}: these values are loop-invariant (a broadcast variable, or an output '
    'with out_axes=lift.broadcast) but depend on the carry, on the scanned '
    'inputs or on a split rng stream:\n{labels}\nA loop-invariant value is '
    'computed once for all steps, so it cannot change from step to step. Fix: '
    'compute it from values outside the loop only (for parameters created '
    "inside: split_rngs={{'params': False}}); or give its collection a per-step "
    "rule (variable_carry=['name'] or variable_axes={{'name': 0}}); or give the "
    'output an out axis.')


@dataclasses.dataclass(frozen=True)
class ScanConfig(MappedAxes):
  """`MappedAxes` (``size`` is ``length``) and how the loop runs."""
  reverse: bool = False
  unroll: int | bool = 1
  data_transform: Callable[..., Any] | None = None
  remat: Any = False
  split_transpose: bool = False
  optimize: Any = False
  draw_once: Filter = False
  name: str = 'scan'  # in messages and scope paths: a client's loop says what it is


class LoopCarry(NamedTuple):
  """What a step passes to the next: carried variable groups and the user's carry."""
  variables: Any
  carry: Any


class Invariant(NamedTuple):
  """What a step writes that is the same at every step: broadcast collections and
  outputs with ``out_axes=broadcast``."""
  variables: Any
  ys: Any


class StepInputs(NamedTuple):
  """One step's slices: scanned variable groups, split rng groups, scanned arguments."""
  variables: tuple[Any, ...]
  rngs: tuple[Any, ...]
  args: tuple[Any, ...]


# -- rng counters ------------------------------------------------------------------

class _CounterReplay:
  """Makes every trace of a step after the first start from the counters the first one left.

  The first trace (the pre-pass) draws like any step, then every later trace
  (the first step run on its own, the loop body, retraces by the engine)
  rewinds, so all of them draw the same keys. After the scan the counters stand
  where two steps leave them: `flax.core.lift.scan` also traces its body twice,
  so both give the same keys.

  Streams in ``draw_once`` rewind to where they stood before the first trace
  instead: the loop draws from them what one traced step (and `lift.vmap`)
  draws.
  """

  def __init__(self, draw_once: Filter = False):
    self.draw_once = draw_once
    self.nodes: list[RngCounters] = []
    self.before: list[rng_counters.CountSnapshot] = []
    self.saved: list[rng_counters.CountSnapshot] | None = None

  def enter(self, scope_tree: Any):
    if self.saved is None:
      self.nodes = rng_counters.counter_roots(scope_tree)
      self.before = [rng_counters.snapshot(node) for node in self.nodes]
      return
    for node, snap in zip(self.nodes, self.saved):
      rng_counters.restore(node, snap)

  def save(self):
    once = functools.partial(in_filter, self.draw_once)
    self.saved = [rng_counters.per_stream(before, rng_counters.snapshot(node), once)
                  for before, node in zip(self.before, self.nodes)]

  def replays_first(self) -> bool:
    """Whether a later trace draws exactly the keys of the first one."""
    assert self.saved is not None, 'save() runs after the first trace'
    return all(rng_counters.frozen(a) == rng_counters.frozen(b) for a, b in zip(self.saved, self.before))


# -- one step ----------------------------------------------------------------------

def _merge_roots(consts: Sequence[dict], carried: Sequence[dict]) -> tuple[dict, ...]:
  return tuple({**c, **v} for c, v in zip(consts, carried))


def _split_ys(ys: Any, out_axes: Any) -> tuple[Any, Any]:
  """``ys`` as (scanned leaves, broadcast leaves), each with None in the other's places."""
  axes = leaf_axes('scan', 'out_axes', out_axes, ys, is_unmapped, 'outputs ys')
  treedef: PyTreeDef
  leaves, treedef = jax.tree.flatten(ys)
  scanned = [None if is_unmapped(a) else x for a, x in zip(axes, leaves)]
  invariant = [x if is_unmapped(a) else None for a, x in zip(axes, leaves)]
  return treedef.unflatten(scanned), treedef.unflatten(invariant)


@dataclasses.dataclass(eq=False)  # lax.scan hashes its body
class _Step:
  """``step(LoopCarry, StepInputs) -> (LoopCarry, (scanned ys, scanned variable groups))``."""
  fn: Callable[..., Any]
  config: ScanConfig
  scope_fn: Callable[..., Any]
  repack_fn: Callable[..., Any]
  broadcast_variables: Any
  carry_consts: tuple[dict, ...]
  rng_consts: tuple[Any, ...]
  arg_leaves: list[Any]
  arg_axes: list[Any]
  arg_treedef: Any
  kwargs: dict[str, Any]
  replay: _CounterReplay

  def _args(self, scanned: Iterable[Any]) -> Any:
    scanned = iter(scanned)
    leaves = [x if a is None else next(scanned) for x, a in zip(self.arg_leaves, self.arg_axes)]
    return self.arg_treedef.unflatten(leaves)

  def _scope(self, carry: LoopCarry, x: StepInputs) -> Any:
    carry_group = _merge_roots(self.carry_consts, carry.variables)
    variable_groups = (self.broadcast_variables, carry_group) + tuple(x.variables)
    rng_groups = tuple(s if split else c for s, c, split in
                       zip(x.rngs, self.rng_consts, self.config.rng_splits))
    if self.config.data_transform is not None:
      variable_groups, rng_groups = self.config.data_transform(variable_groups, rng_groups)
    scope = self.scope_fn(variable_groups, rng_groups)
    self.replay.enter(scope)
    return scope

  def run(self, carry: LoopCarry, x: StepInputs) -> tuple[LoopCarry, Any, Invariant]:
    """One step: the next carry, the scanned outputs (ys and variable groups), the invariant ones."""
    scope = self._scope(carry, x)
    out = self.fn(scope, carry.carry, *self._args(x.args), **self.kwargs)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
      got = jax.tree.map(lambda a: jax.typeof(a).str_short(), out)
      where = jax.tree.leaves(scope, is_leaf=lambda s: isinstance(s, Scope))[0].path_text
      raise errors.ScanBodyError(_NOT_A_PAIR.format(name=self.config.name, path=where, got=got))
    c, ys = out
    broadcast_out, carry_out, *scanned_out = self.repack_fn(scope)
    scanned_ys, invariant_ys = _split_ys(ys, self.config.out_axes)
    return (LoopCarry(carry_out, c), (scanned_ys, tuple(scanned_out)),
            Invariant(broadcast_out, invariant_ys))

  def __call__(self, carry: LoopCarry, x: StepInputs) -> tuple[LoopCarry, Any]:
    carry, scanned, _ = self.run(carry, x)
    return carry, scanned


# -- before the loop ---------------------------------------------------------------

def _step_shape(x: Any) -> jax.ShapeDtypeStruct:
  aval = jax.typeof(x)
  return jax.ShapeDtypeStruct(aval.shape[1:], aval.dtype, weak_type=aval.weak_type)


def _depends_on_inputs(jaxpr: Any, count: int) -> list[bool]:
  """For each of the first ``count`` outputs of ``jaxpr``: whether it reads an input.

  Equation by equation first; outputs that seem to depend on the loop are
  then pruned out of the jaxpr, nested ones included: a step under
  ``remat`` or ``jit`` is one equation whose other outputs read the carry.
  """
  tainted = set(jaxpr.jaxpr.invars)
  for eqn in jaxpr.jaxpr.eqns:
    if any(isinstance(v, Var) and v in tainted for v in eqn.invars):
      tainted.update(eqn.outvars)
  seen = [isinstance(v, Var) and v in tainted for v in jaxpr.jaxpr.outvars[:count]]
  if not any(seen) or not _reads_inputs(jaxpr, seen):
    return [False] * count
  return [dep and _reads_inputs(jaxpr, [j == i for j in range(count)])
          for i, dep in enumerate(seen)]


def _reads_inputs(jaxpr: Any, outputs: list[bool]) -> bool:
  used = outputs + [False] * (len(jaxpr.jaxpr.outvars) - len(outputs))
  return any(_compat.prune_jaxpr(jaxpr, used)[1])


def _evaluate_outputs(jaxpr: Any, count: int) -> list[Any]:
  """The first ``count`` outputs of ``jaxpr``, running only what they need.

  They must not depend on its inputs (see :func:`_depends_on_inputs`), so no
  input is read: what runs is what Flax's partial evaluation runs before its
  loop, typically just the initializers of broadcast parameters.
  """
  used = [True] * count + [False] * (len(jaxpr.jaxpr.outvars) - count)
  pruned, _ = _compat.prune_jaxpr(jaxpr, used)
  return list(_compat.jaxpr_as_fun(pruned)())


def _invariant_labels(invariant: Invariant) -> list[str]:
  labels = [f'broadcast variable {path_text(p[1:])[1:]}'
            for p, _ in jax.tree_util.tree_flatten_with_path(invariant.variables)[0]]
  return labels + [f'output ys{jax.tree_util.keystr(p)}'
                   for p, _ in jax.tree_util.tree_flatten_with_path(invariant.ys)[0]]


def _check_invariant(name: str, jaxpr: Any, invariant: Invariant):
  labels = _invariant_labels(invariant)
  bad = [label for label, dep in zip(labels, _depends_on_inputs(jaxpr, len(labels))) if dep]
  if bad:
    raise errors.LoopInvariantError(_DEPENDS_ON_LOOP.format(
        name=name, labels='\n'.join(f'  * {label}' for label in bad)))


def _invariant_first(step: _Step, carry: LoopCarry, x: StepInputs):
  carry, scanned, invariant = step.run(carry, x)
  return invariant, carry, scanned


def _check_carry_types(name: str, init: Any, out: Any):
  # Shapes and dtypes only: lax.scan itself reconciles weak types.
  types = lambda tree: jax.tree.map(lambda a: f'{jnp.result_type(a).name}{list(np.shape(a))}', tree)
  # jaxlib ships no type stubs: mypy cannot resolve PyTreeDef, nor its comparison.
  if (jax.tree.structure(init) != jax.tree.structure(out)  # type: ignore[operator]
      or types(init) != types(out)):
    raise errors.ScanBodyError(_CARRY_CHANGED.format(name=name, before=types(init),
                                                     after=types(out)))


class _Plan(NamedTuple):
  """What the pre-pass learned about the loop."""
  carried: tuple[dict, ...]  # carry collections the steps write: the loop's carried state
  consts: tuple[dict, ...]  # carry collections the steps only read
  invariant: Invariant  # the values of the loop-invariant writes
  peel: bool  # whether the first step creates carry variables
  body: _Step | _TracedStep  # the loop body: the step, or the pre-pass's trace of it


def _plan(step: _Step, carry_variables: tuple[dict, ...], init: Any, xs: StepInputs) -> _Plan:
  """The pre-pass: traces one step, checks and computes its invariant writes, finds the carry."""
  jaxpr, (invariant, out_carry, scanned) = jax.make_jaxpr(
      functools.partial(_invariant_first, step), return_shape=True,
  )(LoopCarry(carry_variables, init), jax.tree.map(_step_shape, xs))
  step.replay.save()
  _check_invariant(step.config.name, jaxpr, invariant)
  treedef: PyTreeDef
  leaves, treedef = jax.tree.flatten(invariant)
  invariant = treedef.unflatten(_evaluate_outputs(jaxpr, len(leaves)))
  _check_carry_types(step.config.name, init, out_carry.carry)
  returned = out_carry.variables
  carried = tuple({c: t for c, t in group.items() if c in out}
                  for group, out in zip(carry_variables, returned))
  consts = tuple({c: t for c, t in group.items() if c not in out}
                 for group, out in zip(carry_variables, returned))
  # jaxlib ships no type stubs: mypy cannot resolve PyTreeDef, nor its comparison.
  peel = jax.tree.structure(carried) != jax.tree.structure(returned)  # type: ignore[operator]
  body: _Step | _TracedStep = step
  if not peel and not jax.tree.leaves(invariant.variables) and step.replay.replays_first():
    body = _TracedStep(jaxpr, len(leaves), jax.tree.structure((out_carry, scanned)), consts)
  return _Plan(carried, consts, invariant, peel, body)


@dataclasses.dataclass(eq=False)  # lax.scan hashes its body
class _TracedStep:
  """The loop body as the pre-pass traced it, where tracing the step again would give
  the same program: it creates no variables and draws the same keys as the pre-pass.
  This halves the tracing of a scan (Flax traces twice, once with
  ``check_constancy_invariants=False``)."""
  jaxpr: Any  # of (LoopCarry, StepInputs) -> (Invariant, LoopCarry, scanned)
  n_invariant: int  # leading outputs computed before the loop, left out here
  out_tree: Any  # of (LoopCarry, scanned)
  carry_consts: tuple[dict, ...]

  def __post_init__(self):
    used = [False] * self.n_invariant + [True] * (len(self.jaxpr.jaxpr.outvars) - self.n_invariant)
    self.jaxpr, self.used_inputs = _compat.prune_jaxpr(self.jaxpr, used)

  def __call__(self, carry: LoopCarry, x: StepInputs) -> tuple[LoopCarry, Any]:
    full = LoopCarry(_merge_roots(self.carry_consts, carry.variables), carry.carry)
    inputs = [a for a, used in zip(jax.tree.leaves((full, x)), self.used_inputs) if used]
    return self.out_tree.unflatten(_compat.jaxpr_as_fun(self.jaxpr)(*inputs))


# -- the loop ----------------------------------------------------------------------

def _run_loop(step: _Step | _TracedStep, config: ScanConfig, carry: LoopCarry,
              xs: StepInputs, length: int):
  return loops.run_scan(step, carry, xs, length=length, reverse=config.reverse,
                        unroll=config.unroll, remat=config.remat,
                        split_transpose=config.split_transpose, optimize=config.optimize)


def _peeled_loop(step: _Step | _TracedStep, config: ScanConfig, carry: LoopCarry, xs: StepInputs,
                 length: int):
  """The first step on its own (it creates variables), then a loop over the others."""
  reverse = config.reverse
  first = -1 if reverse else 0
  carry, first_y = step(carry, jax.tree.map(lambda x: x[first], xs))
  first_y = jax.tree.map(lambda y: y[None], first_y)
  if length == 1:
    return carry, first_y
  rest = jax.tree.map(lambda x: x[:-1] if reverse else x[1:], xs)
  carry, ys = _run_loop(step, config, carry, rest, length - 1)
  parts = (ys, first_y) if reverse else (first_y, ys)
  return carry, jax.tree.map(lambda a, b: jnp.concatenate([a, b]), *parts)


def _place_ys(scanned: Any, invariant: Any, out_axes: Any) -> Any:
  """Merges the two halves of the outputs; scanned ones move from axis 0 to their out axis."""
  ys = jax.tree.map(lambda s, i: i if s is None else s, scanned, invariant,
                    is_leaf=lambda x: x is None)
  axes = leaf_axes('scan', 'out_axes', out_axes, ys, is_unmapped, 'outputs ys')
  treedef: PyTreeDef
  paths, treedef = jax.tree_util.tree_flatten_with_path(ys)
  placed = []
  for (path, y), axis in zip(paths, axes):
    if not is_unmapped(axis):
      label = f'output ys{jax.tree_util.keystr(path)} (stacked)'
      leaf_axis_size('scan', 'out_axes', MappedLeaf(label, np.shape(y), axis))
      y = jnp.moveaxis(y, 0, axis)
    placed.append(y)
  return treedef.unflatten(placed)


def _scanned_inputs(fn, config: ScanConfig, variable_groups, rng_groups, args, kwargs):
  """The variables, rngs and arguments that the loop slices, all moved to axis 0, and the length."""
  in_axes = cast(tuple[int, ...], config.variable_axes.in_axes)  # scan's axes are never None
  groups = remove_group_axes(variable_groups, in_axes, config.metadata_params)
  arg_axes = [None if is_unmapped(a) else a for a in leaf_axes(
      config.name, 'in_axes', config.in_axes, args, is_unmapped, 'scanned arguments')]
  arguments = mapped_arguments(fn, args, arg_axes, skip=2)
  check_keyword_arrays(kwargs, arguments, config.size, _KEYWORDS_UNSCANNED, transform=config.name)
  length = infer_axis_size(config.name, 'length', arguments + mapped_variables(groups, in_axes),
                           config.size)
  rngs = split_rng_groups(rng_groups, config.rng_splits, length)
  xs = StepInputs(
      tuple(move_axis(g, a, 0) for g, a in zip(groups, in_axes)),
      tuple(r if split else None for r, split in zip(rngs, config.rng_splits)),
      tuple(jnp.moveaxis(x, a, 0) for x, a in zip(jax.tree.leaves(args), arg_axes)
            if a is not None))
  return xs, arg_axes, length


def _scan_groups(fn, config: ScanConfig, scope_fn, repack_fn, variable_groups,
                 rng_groups, init, *args, **kwargs):
  broadcast_variables, carry_variables, *scanned_groups = variable_groups
  xs, arg_axes, length = _scanned_inputs(fn, config, scanned_groups, rng_groups, args, kwargs)
  step = _Step(fn, config, scope_fn, repack_fn, broadcast_variables,
               tuple({} for _ in carry_variables), rng_groups, jax.tree.leaves(args),
               arg_axes, jax.tree.structure(args), kwargs, _CounterReplay(config.draw_once))
  plan = _plan(step, carry_variables, init, xs)
  step.carry_consts = plan.consts
  step.broadcast_variables = _merge_roots(broadcast_variables, plan.invariant.variables)
  loop = _peeled_loop if plan.peel else _run_loop
  carry, (scanned_ys, scanned_groups) = loop(plan.body, config, LoopCarry(plan.carried, init), xs,
                                                length)
  ys = _place_ys(scanned_ys, plan.invariant.ys, config.out_axes)
  out_axes = cast(tuple[int, ...], config.variable_axes.out_axes)  # scan's axes are never None
  scanned_groups = tuple(move_axis(g, 0, a) for g, a in zip(scanned_groups, out_axes))
  scanned_groups = add_group_axes(scanned_groups, out_axes, config.metadata_params)
  out_groups = (plan.invariant.variables, carry.variables) + scanned_groups
  return (carry.carry, ys), out_groups


def build_scan(fn: Callable[..., Any], variable_broadcast: Filter, variable_carry: Filter,
               split_rngs: Mapping[Filter, bool], config: ScanConfig) -> Callable[..., Any]:
  shared = (variable_broadcast, variable_carry)
  rng_filters, _ = check_split_rngs('scan', split_rngs)
  inner = functools.partial(_scan_groups, fn, config)
  functools.update_wrapper(inner, fn)
  return pack(inner, shared + config.variable_axes.in_filters,
              shared + config.variable_axes.out_filters, rng_filters, name=config.name)


# Private parameters: _split_transpose as lax.scan's; _draw_once, streams that draw in the loop
# what the pre-pass draws (as vmap); _name, what the loop is in messages and scope paths.
def scan(fn: Callable[..., Any], variable_axes: Mapping[Filter, int] = {},  # noqa: B006
         variable_broadcast: Filter = False, variable_carry: Filter = False,
         split_rngs: Mapping[Filter, bool] = {}, in_axes: Any = 0,  # noqa: B006
         out_axes: Any = 0, length: int | None = None, reverse: bool = False,
         unroll: int | bool = 1, _split_transpose: bool = False,
         data_transform: Callable[..., Any] | None = None,
         metadata_params: Mapping[Any, Any] = {},  # noqa: B006 (Flax's defaults)
         check_constancy_invariants: bool = True, remat: Any = False, optimize: Any = False,
         _draw_once: Filter = False, _name: str = 'scan') -> Callable[..., Any]:
  """Lifted ``lax.scan`` of ``fn(scope, carry, *xs) -> (carry, ys)``.

  Args:
    fn: the step.
    variable_axes: ``{collection filter: axis}``: step ``i`` sees slice ``i`` along
      ``axis`` (negative counts from the end); variables created inside are stacked
      along it. ``In(axis)``/``Out(axis)`` lift in/out only (as in Flax).
    variable_broadcast: collections every step shares. What a step writes to
      them (parameters created at init) is computed once, before the loop; it
      must not depend on the carry, the scanned inputs or a split stream.
    variable_carry: collections carried from step to step, like ``carry`` (a step
      that creates them first runs once on its own, as the unrolled loop).
    split_rngs: ``{stream filter: bool}``; step ``i`` of a split stream draws from
      ``split(key, length)[i]``; streams no filter matches are unavailable inside.
    in_axes: axis of each ``xs`` leaf (a tree prefix); ``lift.broadcast`` (or
      None) passes an input whole to every step. Keyword arguments too.
    out_axes: axis of each ``ys`` leaf; ``lift.broadcast`` (or None) returns
      an output computed once (it must not depend on the loop).
    length: number of steps; inferred from the scanned inputs and variables.
    reverse: as ``lax.scan``'s: the steps run from the last to the first.
    unroll: as ``lax.scan``'s: steps per loop iteration.
    data_transform: ``(variable_groups, rng_groups) -> (variable_groups,
      rng_groups)`` applied inside each step before the scope is rebuilt.
    metadata_params: passed to the ``AxisMetadata`` boxes of scanned collections.
    check_constancy_invariants: False draws Flax's keys for it; it runs either way.
    remat: each step's checkpoint policy, as ``lift.loops.resolve_remat`` takes it.
    optimize: ``lift.optimize_scans`` the loop: True (cost model) or rewrite names.

  Not for loops of unknown length: use ``while_loop``.

  Examples:
    >>> def layer(scope, x, _):
    ...   return jnp.tanh(x @ scope.param('w', jax.nn.initializers.ones, (3, 3))), None
    >>> stack = scan(layer, variable_axes={'params': 0}, split_rngs={'params': True}, length=5)
    >>> (y, _), variables = lift.init(stack)(jax.random.key(0), jnp.ones((2, 3)), None)
    >>> variables['params']['w'].shape
    (5, 3, 3)
  """
  axes = check_variable_axes('scan', variable_axes, allow_none=False,
                             hint=', or variable_broadcast for collections shared by every step')
  _, splits = check_split_rngs('scan', split_rngs)
  loops.resolve_remat(remat)
  if not isinstance(optimize, bool):  # rewrite names, checked by the rewrites (loaded on first use)
    importlib.import_module('lift.scan_rewrites').check_optimize(optimize)
  config = ScanConfig(  # MappedAxes' fields, then the loop's
      axes, splits, check_axis_leaves('scan', 'in_axes', in_axes, is_unmapped, 'lift.broadcast'),
      check_axis_leaves('scan', 'out_axes', out_axes, is_unmapped, 'lift.broadcast'),
      check_size('scan', 'length', length), dict(metadata_params), reverse, unroll,
      data_transform, remat, _split_transpose, optimize,
      _draw_once if check_constancy_invariants else True, _name)
  return build_scan(fn, variable_broadcast, variable_carry, split_rngs, config)


__all__ = ['scan', 'broadcast']
