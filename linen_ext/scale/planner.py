"""`plan`: compile a model's training step in several configurations for a topology and
choose the cheapest that fits.

Which remat policy and which mesh factoring fit a model on a pod is usually found by
trial runs on the pod. Here each candidate is compiled ahead of time for the target's
(abstract) chips, and XLA's memory analysis says exactly what each chip would hold:
the plan is the candidate with the fewest FLOPs per step (the recomputation a policy
adds) whose need fits under the memory limit with a margin.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax

from lift.errors import LiftError
from linen_ext.errors import PlanError
from linen_ext.scale.compiled import CompiledStats, size_text
from linen_ext.scale.topology import Topology, tpu_topology
from linen_ext.scale.train_step import compile_train_step, make_mesh, next_token_loss

REMATS = ('none', 'dots', 'full', 'offload', 'nested')


def remat_value(name: str) -> Any:
  """A planner's remat name as the value of a stack's ``remat=``: ``'none'`` is no
  checkpointing, ``'dots'`` keeps the products' results
  (``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``), and the others are the
  loop engine's own policies."""
  if name == 'none':
    return False
  if name == 'dots':
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  return name


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One configuration: the stack's remat policy, the mesh, the pipeline's microbatches,
  and whether the optimizer state lives in host memory.

  Attributes:
    remat: the remat policy of the model's stack (a `lift.loops.resolve_remat` name).
    mesh: the mesh as ``(axis name, size)`` pairs.
    microbatches: the pipeline's microbatches (with a ``'stage'`` axis over 1).
    offload_optimizer: whether the optimizer state lives in host memory.

  Examples:
    >>> Candidate('nested', (('stage', 1), ('data', 64), ('model', 2)), 1, True).describe()
    'remat=nested, data 64 x model 2, optimizer in host memory'
  """
  remat: str
  mesh: tuple[tuple[str, int], ...]
  microbatches: int = 1
  offload_optimizer: bool = False

  def describe(self) -> str:
    mesh = ' x '.join(f'{axis} {size}' for axis, size in self.mesh if size > 1) or 'one chip'
    parts = [f'remat={self.remat}', mesh]
    if dict(self.mesh).get('stage', 1) > 1:
      parts.append(f'{self.microbatches} microbatches')
    if self.offload_optimizer:
      parts.append('optimizer in host memory')
    return ', '.join(parts)


@dataclasses.dataclass(frozen=True)
class Trial:
  """A candidate and what compiling it gave: its stats, or why it could not compile."""
  candidate: Candidate
  stats: CompiledStats | None
  error: str | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
  """The chosen candidate and the table of every trial (`str(plan)` prints it).

  Attributes:
    best: the chosen candidate.
    stats: the chosen candidate's `CompiledStats`.
    trials: every candidate tried, with its stats or why it did not compile.
    memory_limit: the bytes of memory of each chip.
    margin: the fraction of ``memory_limit`` left free, for what the stats do not see.
  """
  best: Candidate
  stats: CompiledStats
  trials: tuple[Trial, ...]
  memory_limit: int
  margin: float

  def configure(self, model: Any) -> Any:
    """``model`` set up as the plan says (its ``remat`` and pipeline fields)."""
    return _configured(model, self.best)

  def __str__(self) -> str:
    budget = self.memory_limit * (1 - self.margin)
    lines = [f'{len(self.trials)} candidates, limit {size_text(self.memory_limit).strip()} '
             f'per chip ({size_text(budget).strip()} with a {self.margin:.0%} margin):']
    for trial in self.trials:
      mark = '*' if trial.candidate == self.best else ' '
      what = trial.stats.row() if trial.stats else f'could not compile: {trial.error}'
      fits = '' if trial.stats is None else (
          '  fits' if trial.stats.device_bytes <= budget else '  too big')
      lines.append(f'{mark} {trial.candidate.describe():<58} {what}{fits}')
    return '\n'.join(lines)


def _configured(model: Any, candidate: Candidate) -> Any:
  stages = dict(candidate.mesh).get('stage', 1)
  fields = {'remat': remat_value(candidate.remat)}
  if stages > 1:
    fields.update(pipeline_stages=stages, microbatches=candidate.microbatches,
                  stage_axis='stage')
  missing = [name for name in fields if not hasattr(model, name)]
  if missing:
    raise PlanError(f'nn.plan varies the model\'s fields {missing}, which '
                    f'{type(model).__name__} does not have. Fix: give the model a `remat` '
                    'field passed to its nn.Stacked (and `pipeline_stages`, `microbatches`, '
                    '`stage_axis` to plan pipelines), or plan only what it has.')
  return model.clone(**fields)


def candidates(chips: int, *, remat: Sequence[str] = REMATS, tensor: Sequence[int] = (1,),
               stages: Sequence[int] = (1,), microbatches: Sequence[int] = (1,),
               offload_optimizer: Sequence[bool] = (False, True)) -> list[Candidate]:
  """Every combination, on meshes of ``stage x data x model = chips`` (those that do not
  divide ``chips`` are left out)."""
  unknown = [name for name in remat if name not in REMATS]
  if unknown:
    raise PlanError(f'nn.plan: unknown remat {unknown}; it takes {REMATS}.')
  found = []
  for s, t, r, m, o in itertools.product(stages, tensor, remat, microbatches, offload_optimizer):
    if chips % (s * t) or (s == 1 and m != microbatches[0]):
      continue
    mesh = (('stage', s), ('data', chips // (s * t)), ('model', t))
    found.append(Candidate(r, mesh, m if s > 1 else 1, o))
  return found


def _try(model, batch, devices, candidate, rules, optimizer, loss_fn) -> Trial:
  try:
    step = compile_train_step(
        _configured(model, candidate), batch, mesh=make_mesh(devices, dict(candidate.mesh)),
        rules=rules(dict(candidate.mesh)) if callable(rules) else rules, optimizer=optimizer,
        loss_fn=loss_fn, offload_optimizer=candidate.offload_optimizer)
  except PlanError:
    raise
  except (LiftError, ValueError) as error:  # a shape that does not divide, say
    return Trial(candidate, None, str(error).splitlines()[0][:160])
  except jax.errors.JaxRuntimeError as error:  # the compiler's own "does not fit"
    if 'RESOURCE_EXHAUSTED' not in str(error):
      raise
    return Trial(candidate, None, str(error).split('RESOURCE_EXHAUSTED: ')[-1][:160])
  return Trial(candidate, step.stats)


def choose(trials: Sequence[Trial], memory_limit: int, margin: float) -> Trial:
  budget = memory_limit * (1 - margin)
  compiled = [t for t in trials if t.stats is not None]
  fitting = [t for t in compiled if t.stats.device_bytes <= budget]  # type: ignore[union-attr]
  if fitting:
    return min(fitting, key=lambda t: (t.stats.flops,  # type: ignore[union-attr]
                                       t.stats.host_bytes,  # type: ignore[union-attr]
                                       t.stats.device_bytes))  # type: ignore[union-attr]
  if not compiled:
    raise PlanError('nn.plan: no candidate compiled: ' + '; '.join(
        f'{t.candidate.describe()}: {t.error}' for t in trials))
  smallest = min(compiled, key=lambda t: t.stats.device_bytes)  # type: ignore[union-attr]
  need = smallest.stats.device_bytes  # type: ignore[union-attr]
  raise PlanError(
      f'nn.plan: nothing fits {size_text(memory_limit).strip()} per chip '
      f'({size_text(budget).strip()} with the {margin:.0%} margin): the smallest need is '
      f'{size_text(need).strip()}, by '
      f'{smallest.candidate.describe()}. Fix: more chips, a smaller per-device batch, '
      'more candidates (remat=\'offload\' or \'nested\', offload_optimizer, pipeline '
      'stages), or a smaller margin.')


def _devices_and_limit(topology: Any, memory_limit: int | None) -> tuple[tuple, int]:
  """The chips to compile for and their memory (a `Topology`'s HBM by default)."""
  if isinstance(topology, str):
    topology = tpu_topology(topology)
  if isinstance(topology, Topology):
    return topology.devices, memory_limit or topology.hbm_bytes
  if memory_limit is None:
    raise PlanError('nn.plan: memory_limit is required with devices other than a Topology '
                    '(their memory is not known). Fix: memory_limit=16 * 2**30, say.')
  return tuple(topology), memory_limit


def plan(model: Any, batch: Any, topology: str | Topology | Sequence[Any], *,
         memory_limit: int | None = None, margin: float = 0.1,
         optimizer: optax.GradientTransformation | None = None,
         loss_fn: Callable[..., jax.Array] = next_token_loss,
         rules: Sequence[tuple[str, Any]] | Callable[[dict[str, int]], Any],
         remat: Sequence[str] = REMATS, tensor: Sequence[int] = (1,),
         stages: Sequence[int] = (1,), microbatches: Sequence[int] = (1,),
         offload_optimizer: Sequence[bool] = (False, True)) -> Plan:
  """Chooses how to run ``model``'s training step on ``topology``: the candidate with the
  fewest FLOPs per step that fits ``memory_limit`` per chip with ``margin`` to spare.

  Every combination of ``remat`` x mesh (``stage x data x model`` from ``stages`` and
  ``tensor``; the rest of the chips on ``data``, FSDP) x ``microbatches`` x
  ``offload_optimizer`` is compiled ahead of time by `compile_train_step` and measured
  by XLA's memory and cost analyses; nothing runs. ``str(plan)`` is the table.

  Args:
    model: a module with a ``remat`` field passed to its `nn.Stacked` (and
      ``pipeline_stages``, ``microbatches``, ``stage_axis`` to plan pipelines).
    batch: one step's batch (arrays or `jax.ShapeDtypeStruct`s), a dict with
      ``'inputs'`` (what ``model.init`` takes) and what ``loss_fn`` reads.
    topology: a TPU topology name (`tpu_topology`), a `Topology`, or real devices.
    memory_limit: bytes per chip; default: the topology's HBM.
    margin: the fraction of ``memory_limit`` kept free.
    optimizer: default ``optax.adamw(1e-4)``.
    loss_fn: ``loss_fn(params, model, batch)``; next-token cross-entropy by default.
    rules: logical axis rules over the mesh axes ``stage``, ``data``, ``model``, or a
      function of the candidate's mesh shape returning them.
    remat: the stack's remat policies to try, among `REMATS`.
    tensor: sizes of the ``model`` (tensor-parallel) mesh axis to try.
    stages: sizes of the ``stage`` (pipeline) mesh axis to try.
    microbatches: the pipeline's microbatch counts to try (with ``stages`` > 1).
    offload_optimizer: whether to keep the optimizer state in host memory, to try.

  Returns:
    A `Plan`: ``plan.best``, ``plan.configure(model)``, ``plan.stats``, ``str(plan)``.

  Raises:
    PlanError: nothing fits (the message names the smallest need and its candidate),
      or the model lacks a field the candidates vary.
    TopologyError: an unknown topology name, or libtpu missing.

  Examples:
    >>> chosen = nn.plan(model, batch, 'v5e-256', rules=rules)  # doctest: +SKIP
    >>> print(chosen)  # the table  # doctest: +SKIP

  Not for tuning speed: FLOPs count recomputation, not the time collectives or host
  transfers take; measure the chosen configuration's step time on the pod.
  """
  devices, memory_limit = _devices_and_limit(topology, memory_limit)
  optimizer = optimizer or optax.adamw(1e-4)
  found = candidates(len(devices), remat=remat, tensor=tensor, stages=stages,
                     microbatches=microbatches, offload_optimizer=offload_optimizer)
  if not found:
    raise PlanError(f'nn.plan: no mesh of tensor {tuple(tensor)} x stages {tuple(stages)} '
                    f'divides {len(devices)} chips. Fix: sizes that divide it.')
  trials = tuple(_try(model, batch, devices, c, rules, optimizer, loss_fn) for c in found)
  best = choose(trials, memory_limit, margin)
  assert best.stats is not None
  return Plan(best.candidate, best.stats, trials, memory_limit, margin)


__all__ = ['Candidate', 'Plan', 'REMATS', 'Trial', 'candidates', 'choose', 'plan', 'remat_value']
