"""The planner's candidates: one configuration each (`Candidate`), what compiling it gave
(`Trial`), the remat policies it varies and how a trial reads in the plan's table."""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import jax

from linen_ext.errors import PlanError
from linen_ext.scale.compiled import CompiledStats
from linen_ext.scale.step_time import Chip, StepTime
from linen_ext.scale.train_step import CompiledStep

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
  whether the optimizer state lives in host memory, and whether XLA propagates bfloat16.

  Attributes:
    remat: the remat policy of the model's stack (a `lift.loops.resolve_remat` name), or
      ``None``: the model's own, not varied.
    mesh: the mesh as ``(axis name, size)`` pairs.
    microbatches: the pipeline's microbatches (with a ``'stage'`` axis over 1).
    offload_optimizer: whether the optimizer state lives in host memory.
    bf16_propagation: whether XLA's bfloat16-propagation pass runs (`plan` turns it
      off, `NO_BF16_PROPAGATION`, for a candidate that misses the limit by less than
      the bfloat16 copy of the parameters the pass can keep).

  Examples:
    >>> Candidate('nested', (('stage', 1), ('data', 64), ('model', 2)), 1, True).describe()
    'remat=nested, data 64 x model 2, optimizer in host memory'
  """
  remat: str | None
  mesh: tuple[tuple[str, int], ...]
  microbatches: int = 1
  offload_optimizer: bool = False
  bf16_propagation: bool = True

  def describe(self) -> str:
    mesh = ' x '.join(f'{axis} {size}' for axis, size in self.mesh if size > 1) or 'one chip'
    parts = ([] if self.remat is None else [f'remat={self.remat}']) + [mesh]
    if dict(self.mesh).get('stage', 1) > 1:
      parts.append(f'{self.microbatches} microbatches')
    if self.offload_optimizer:
      parts.append('optimizer in host memory')
    if not self.bf16_propagation:
      parts.append('no bf16 propagation')
    return ', '.join(parts)


@dataclasses.dataclass(frozen=True)
class Trial:
  """A candidate and what compiling it gave: its stats and modelled step time, or why it
  could not compile, or why it was not compiled (``skipped``)."""
  candidate: Candidate
  stats: CompiledStats | None
  error: str | None = None
  time: StepTime | None = None
  skipped: str | None = None
  parameter_bytes: int = 0

  def fits(self, budget: float) -> bool:
    return self.stats is not None and self.stats.device_bytes <= budget

  def too_big(self, budget: float) -> bool:
    return (self.stats is not None and not self.fits(budget)) or (
        self.error is not None and self.error.startswith('RESOURCE_EXHAUSTED'))


def trial_text(trial: Trial, budget: float, chip: Chip | None, model_flops: float) -> str:
  """One trial's figures: its stats, modelled time, MFU and whether it fits; or why it
  was not compiled."""
  if trial.skipped:
    return f'skipped: {trial.skipped}'
  if trial.stats is None:
    return f'could not compile: {trial.error}'
  text = trial.stats.row()
  if trial.time is not None and chip is not None:
    mfu = model_flops / (trial.time.total * chip.peak_flops)
    seconds = trial.time.total
    text += (f'  {seconds:7.2f} s ' if seconds >= 1 else f'  {seconds * 1e3:7.2f} ms')
    text += f'  {mfu:4.0%} MFU'
  return text + ('  fits' if trial.fits(budget) else '  too big')


def candidates(chips: int, *, remat: Sequence[str] | None = REMATS,
               tensor: Sequence[int] = (1,), stages: Sequence[int] = (1,),
               microbatches: Sequence[int] = (1,),
               offload_optimizer: Sequence[bool] = (False, True)) -> list[Candidate]:
  """Every combination, on meshes of ``stage x data x model = chips`` (those that do not
  divide ``chips`` are left out); ``remat=None``: the model's own in each."""
  unknown = [name for name in remat or () if name not in REMATS]
  if unknown:
    raise PlanError(f'nn.plan: unknown remat {unknown}; it takes {REMATS}, or None.')
  remats: Sequence[str | None] = (None,) if remat is None else remat
  found = []
  for s, t, r, m, o in itertools.product(stages, tensor, remats, microbatches, offload_optimizer):
    if chips % (s * t) or (s == 1 and m != microbatches[0]):
      continue
    mesh = (('stage', s), ('data', chips // (s * t)), ('model', t))
    found.append(Candidate(r, mesh, m if s > 1 else 1, o))
  return found


def parameter_bytes(step: CompiledStep) -> int:
  """The bytes of the step's parameters on each chip (``state['params']``'s shards)."""
  (state, _), _ = step.compiled.input_shardings
  (infos, _), _ = step.compiled.args_info
  return sum(math.prod(sharding.shard_shape(info.shape)) * info.dtype.itemsize
             for info, sharding in zip(jax.tree.leaves(infos['params']),
                                       jax.tree.leaves(state['params'])))


__all__ = ['Candidate', 'REMATS', 'Trial', 'candidates', 'parameter_bytes', 'remat_value',
           'trial_text']
