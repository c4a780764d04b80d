"""`plan`: compile a model's training step in several configurations for a topology and
choose the fastest that fits.

Which remat policy and which mesh factoring fit a model on a pod is usually found by
trial runs on the pod. Here each candidate is compiled ahead of time for the target's
(abstract) chips, and XLA's memory analysis says exactly what each chip would hold:
the plan is the candidate whose modelled step time (`step_time`: compute, HBM, host
transfers, collectives) is least among those that fit under the memory limit with a
margin. Candidates that cannot win are not compiled (`search`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import optax

from lift.errors import LiftError
from linen_ext.errors import ModelStateError, OptimizerStreamError, PlanError
from linen_ext.scale.candidates import (REMATS, Candidate, Trial, candidates, parameter_bytes,
                                        remat_value, trial_text)
from linen_ext.scale.compiled import CompiledStats, size_text
from linen_ext.scale.flops import jaxpr_flops
from linen_ext.scale.nnx_model import is_nnx_module
from linen_ext.scale.search import needs_no_less, next_to_compile, precedes
from linen_ext.scale.step_time import Chip, chip_of, compute_floor, modelled_time
from linen_ext.scale.topology import Topology, tpu_topology
from linen_ext.scale.train_step import (NO_BF16_PROPAGATION, compile_traced,
                                        make_mesh, next_token_loss, traced_train_step)


@dataclasses.dataclass(frozen=True)
class Plan:
  """The chosen candidate and the table of every trial (`str(plan)` prints it).

  Attributes:
    best: the chosen candidate.
    stats: the chosen candidate's `CompiledStats`.
    trials: every candidate tried, with its stats or why it did not compile.
    memory_limit: the bytes of memory of each chip.
    margin: the fraction of ``memory_limit`` left free, for what the stats do not see.
    chip: the chip's published figures the step times are modelled with (``None``: not
      a known TPU; the plan ranks by FLOPs).
    model_flops: the fewest FLOPs per chip of any candidate traced (no recomputation):
      MFU's numerator.
  """
  best: Candidate
  stats: CompiledStats
  trials: tuple[Trial, ...]
  memory_limit: int
  margin: float
  chip: Chip | None = None
  model_flops: float = 0.0

  def configure(self, model: Any) -> Any:
    """``model`` set up as the plan says (its ``remat`` and pipeline fields, where the
    plan varied them)."""
    return _configured(model, self.best)

  def __str__(self) -> str:
    budget = self.memory_limit * (1 - self.margin)
    compiled = sum(t.stats is not None or t.too_big(budget) for t in self.trials)
    lines = [f'{len(self.trials)} candidates ({compiled} compiled), limit '
             f'{size_text(self.memory_limit).strip()} per chip ({size_text(budget).strip()} '
             f'with a {self.margin:.0%} margin); step time and MFU modelled, not measured:']
    for trial in self.trials:
      mark = '*' if trial.candidate == self.best else ' '
      lines.append(f'{mark} {trial.candidate.describe():<50} '
                   f'{trial_text(trial, budget, self.chip, self.model_flops)}')
    return '\n'.join(lines)


def _configured(model: Any, candidate: Candidate) -> Any:
  stages = dict(candidate.mesh).get('stage', 1)
  fields = {} if candidate.remat is None else {'remat': remat_value(candidate.remat)}
  if stages > 1:
    fields.update(pipeline_stages=stages, microbatches=candidate.microbatches,
                  stage_axis='stage')
  if fields and is_nnx_module(model):
    raise PlanError(f'nn.plan varies the model\'s fields {list(fields)}, and '
                    f'{type(model).__name__}, an NNX model, is built once: it has no fields '
                    'to vary. Fix: remat=None (plan the mesh and the optimizer state\'s '
                    'place for the model as built) and stages=(1,).')
  missing = [name for name in fields if not hasattr(model, name)]
  if missing:
    raise PlanError(f'nn.plan varies the model\'s fields {missing}, which '
                    f'{type(model).__name__} does not have. Fix: give the model a `remat` '
                    'field passed to its nn.Stacked (and `pipeline_stages`, `microbatches`, '
                    '`stage_axis` to plan pipelines), or remat=None to keep its own.')
  return model.clone(**fields) if fields else model


def _trace(model, batch, devices, candidate, rules, optimizer, loss_fn, clip_norm=None):
  """The candidate's traced step and FLOPs per chip, or the `Trial` of why it fails."""
  mesh = make_mesh(devices, dict(candidate.mesh))
  try:
    traced = traced_train_step(
        _configured(model, candidate), batch, mesh=mesh,
        rules=rules(dict(candidate.mesh)) if callable(rules) else rules, optimizer=optimizer,
        loss_fn=loss_fn, offload_optimizer=candidate.offload_optimizer, clip_norm=clip_norm)
  except (PlanError, ModelStateError, OptimizerStreamError):
    raise
  except (LiftError, ValueError) as error:  # a shape that does not divide, say
    return Trial(candidate, None, str(error).splitlines()[0][:160])
  return traced, mesh, jaxpr_flops(traced.jaxpr) / mesh.size


def _compile(candidate, traced, mesh, chip: Chip | None) -> Trial:
  options = None if candidate.bf16_propagation else NO_BF16_PROPAGATION
  try:
    step = compile_traced(traced, mesh, options)
  except jax.errors.JaxRuntimeError as error:  # the compiler's own "does not fit"
    if 'RESOURCE_EXHAUSTED' not in str(error):
      raise
    return Trial(candidate, None, 'RESOURCE_EXHAUSTED: '
                 + str(error).split('RESOURCE_EXHAUSTED: ')[-1][:140])
  time = modelled_time(step.stats, chip) if chip else None
  return Trial(candidate, step.stats, time=time, parameter_bytes=parameter_bytes(step))


def _rank(trial: Trial) -> tuple:
  stats = trial.stats
  assert stats is not None
  return (trial.time.total if trial.time else stats.flops, stats.flops, stats.host_bytes,
          stats.device_bytes)


def choose(trials: Sequence[Trial], memory_limit: int, margin: float) -> Trial:
  """The fitting trial with the least modelled step time (FLOPs without a chip model),
  never one that another fitting trial precedes (`search.precedes`: it cannot be
  faster, whatever the model's rounding).

  Raises:
    PlanError: no trial fits, or none compiled.
  """
  budget = memory_limit * (1 - margin)
  compiled = [t for t in trials if t.stats is not None]
  fitting = [t for t in compiled if t.fits(budget)]
  undominated = [t for t in fitting if not any(
      o is not t and precedes(o.candidate, t.candidate) for o in fitting)]
  if undominated:
    return min(undominated, key=_rank)
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
         clip_norm: float | None = None,
         rules: Sequence[tuple[str, Any]] | Callable[[dict[str, int]], Any],
         remat: Sequence[str] | None = REMATS, tensor: Sequence[int] = (1,),
         stages: Sequence[int] = (1,), microbatches: Sequence[int] = (1,),
         offload_optimizer: Sequence[bool] = (False, True),
         log: Callable[[str], None] | None = None) -> Plan:
  """Chooses how to run ``model``'s training step on ``topology``: the candidate with the
  least modelled step time that fits ``memory_limit`` per chip with ``margin`` to spare.

  Candidates: ``remat`` x mesh (``stage x data x model`` from ``stages`` and ``tensor``,
  the rest on ``data``) x ``microbatches`` x ``offload_optimizer``, compiled one at a
  time by `compile_train_step` (nothing runs), except those the results so far show
  cannot be chosen (`search`); ranked by `step_time`. ``str(plan)`` is the table. A
  candidate that misses the limit by less than half its parameters' bytes is compiled
  again without XLA's bfloat16 propagation (`NO_BF16_PROPAGATION`), and the smaller kept.
  Ctrl-C stops between compiles (``KeyboardInterrupt``, after ``log`` says what was
  compiled). The candidates set the model's ``remat`` field (`remat_value`), which a
  `flax.linen` module applies itself; an NNX model has no fields: plan it with
  ``remat=None`` and one stage.

  Args:
    model: a module with a ``remat`` field passed to its `nn.Stacked` (and
      ``pipeline_stages``, ``microbatches``, ``stage_axis`` to plan pipelines); with
      ``remat=None``, any model, an NNX one included.
    batch: one step's batch (arrays or `jax.ShapeDtypeStruct`s), a dict with
      ``'inputs'`` (what ``model.init`` takes) and what ``loss_fn`` reads.
    topology: a TPU topology name (`tpu_topology`), a `Topology`, or real devices.
    memory_limit: bytes per chip; default: the topology's HBM.
    margin: the fraction of ``memory_limit`` kept free.
    optimizer: default ``optax.adamw(1e-4)``.
    loss_fn: ``loss_fn(params, model, batch)``; next-token cross-entropy by default.
    clip_norm: the global norm the gradients are clipped to (`compile_train_step`).
    rules: logical axis rules over the mesh axes ``stage``, ``data``, ``model``, or a
      function of the candidate's mesh shape returning them.
    remat: the stack's remat policies to try, any of ``'none'`` (no checkpointing),
      ``'dots'`` (the products' results kept), ``'full'``, ``'offload'`` and ``'nested'``
      (the loop engine's policies, `lift.loops.resolve_remat`); default: all five
      (`REMATS`). ``None``: the model's own.
    tensor: sizes of the ``model`` (tensor-parallel) mesh axis to try.
    stages: sizes of the ``stage`` (pipeline) mesh axis to try.
    microbatches: the pipeline's microbatch counts to try (with ``stages`` > 1).
    offload_optimizer: whether to keep the optimizer state in host memory, to try.
    log: called with a line as each candidate is traced, compiled or skipped (``print``
      to follow a long plan); default: silent.

  Returns:
    A `Plan`: ``plan.best``, ``plan.configure(model)``, ``plan.stats``, ``str(plan)``.

  Raises:
    PlanError: nothing fits (the message names the smallest need and its candidate),
      or the model lacks a field the candidates vary (an NNX model has none).
    ModelStateError: an NNX model holds variables other than `nnx.Param` ones.
    OptimizerStreamError: the optimizer couples layers (pass the clipping as
      ``clip_norm``).
    TopologyError: an unknown topology name, or libtpu missing.

  Examples:
    >>> chosen = nn.plan(model, batch, 'v5e-256', rules=rules)  # doctest: +SKIP
    >>> print(chosen)  # the table  # doctest: +SKIP
    >>> chosen = nn.plan(nnx_model, batch, 'v5e-256', rules=rules,  # doctest: +SKIP
    ...                  remat=None, tensor=(1, 2))

  Not for tuning speed: the step time is modelled from published chip figures, not
  measured; time the chosen configuration's step on the pod.
  """
  devices, memory_limit = _devices_and_limit(topology, memory_limit)
  optimizer = optimizer or optax.adamw(1e-4)
  found = candidates(len(devices), remat=remat, tensor=tensor, stages=stages,
                     microbatches=microbatches, offload_optimizer=offload_optimizer)
  if not found:
    raise PlanError(f'nn.plan: no mesh of tensor {tuple(tensor)} x stages {tuple(stages)} '
                    f'divides {len(devices)} chips. Fix: sizes that divide it.')
  trace = lambda c: _trace(model, batch, devices, c, rules, optimizer, loss_fn,  # noqa: E731
                           clip_norm)
  trials, model_flops = _search(found, trace, memory_limit * (1 - margin), chip_of(devices),
                                log or (lambda line: None))
  best = choose(trials, memory_limit, margin)
  assert best.stats is not None
  return Plan(best.candidate, best.stats, trials, memory_limit, margin, chip_of(devices),
              model_flops)


def _search(found: list[Candidate], trace: Callable, budget: float, chip: Chip | None,
            log: Callable[[str], None]) -> tuple[tuple[Trial, ...], float]:
  """Compiles the candidates in `next_to_compile`'s order, each traced just before (its
  FLOPs), skipping what the results so far settle; the trials, and the model's FLOPs:
  the fewest of the candidates that recompute least on each mesh, traced first."""
  results: dict[Candidate, Trial] = {}
  traced: dict[Candidate, Any] = {}

  def traced_step(candidate: Candidate) -> Any:
    if candidate not in traced:
      traced[candidate] = trace(candidate)
      if isinstance(traced[candidate], Trial):
        results[candidate] = traced[candidate]
        log(f'  {candidate.describe()}: could not trace: {traced[candidate].error}')
    return traced[candidate]

  least = [c for c in found if not any(o != c and precedes(o, c) for o in found)]
  model_flops = min((t[2] for t in map(traced_step, least) if not isinstance(t, Trial)),
                    default=0.0)
  log(f'{len(found)} candidates; compiling those that can be chosen:')
  undecided = [c for c in found if c not in results]
  try:
    while undecided:
      candidate = undecided.pop(next_to_compile(undecided))
      step = traced_step(candidate)
      if isinstance(step, Trial):
        continue
      results[candidate] = _decide(candidate, step, results, budget, chip, model_flops, log)
      _settle(results[candidate], undecided, results, budget, log)
  except KeyboardInterrupt:
    done = [t for t in results.values() if t.stats is not None]
    log(f'stopped (Ctrl-C) after {len(done)} compiled: ' + '; '.join(
        f'{t.candidate.describe()} {size_text(t.stats.device_bytes).strip()}'
        for t in done if t.stats))
    raise
  return tuple(results[c] for c in found), model_flops


def _decide(candidate, traced, results, budget, chip, model_flops, log) -> Trial:
  _, _, flops = traced
  best = min((t.time.total for t in results.values() if t.time and t.fits(budget)),
             default=None)
  if chip is not None and best is not None and compute_floor(flops, chip) > best:
    reason = (f'its FLOPs alone take {compute_floor(flops, chip):.2f} s, more than the '
              f'{best:.2f} s modelled for a candidate that fits')
    log(f'  {candidate.describe()}: skipped: {reason}')
    return Trial(candidate, None, skipped=reason)
  log(f'  {candidate.describe()}: compiling ...')
  trial = _compile(candidate, traced[0], traced[1], chip)
  log(f'  {candidate.describe()}: {trial_text(trial, budget, chip, model_flops)}')
  if trial.stats is None or trial.fits(budget) or (
      trial.stats.device_bytes - trial.parameter_bytes / 2 > budget):
    return trial
  # It misses by less than the bfloat16 copy of the parameters XLA's bfloat16 propagation
  # can keep (half their float32 bytes): without the pass, it may fit.
  variant = dataclasses.replace(candidate, bf16_propagation=False)
  log(f'  {variant.describe()}: compiling ...')
  second = _compile(variant, traced[0], traced[1], chip)
  log(f'  {variant.describe()}: {trial_text(second, budget, chip, model_flops)}')
  smaller = second.stats is not None and second.stats.device_bytes < trial.stats.device_bytes
  return second if smaller else trial


def _settle(trial: Trial, undecided: list, results: dict, budget: float, log) -> None:
  """Skips the undecided candidates ``trial``'s outcome settles."""
  name = trial.candidate.describe()
  if trial.fits(budget):
    settled = [c for c in undecided if precedes(trial.candidate, c)]
    reason = f'saves more than {name}, which fits'
  elif trial.too_big(budget):
    settled = [c for c in undecided if needs_no_less(c, trial.candidate)]
    reason = f'saves less than {name}, which does not fit'
  else:
    return
  for candidate in settled:
    undecided.remove(candidate)
    results[candidate] = Trial(candidate, None, skipped=reason)
    log(f'  {candidate.describe()}: skipped: {reason}')


__all__ = ['Candidate', 'Plan', 'REMATS', 'Trial', 'candidates', 'choose', 'plan', 'remat_value']
