"""The checks of `Stacked.pipeline`'s arguments and of the block's carry.

Each error names the argument and the fix (docs/errors.md lists them).
"""
from __future__ import annotations

from typing import Any

import jax
from flax.core import meta

from linen_ext import errors

_NOT_POSITIVE = (
    'Stacked.pipeline: {name}={value!r} is not a positive int. Fix: e.g. '
    'stack.pipeline(x, stages=4, microbatches=8).')
_SCHEDULE = (
    "Stacked.pipeline: schedule={value!r} is not one of {names}. Fix: schedule='gpipe' "
    "(repeats=1) or schedule='circular' with repeats >= 1.")
_GPIPE_REPEATS = (
    "Stacked.pipeline: repeats={repeats} needs schedule='circular'; the gpipe schedule "
    "runs each stage's layers once. Fix: schedule='circular', or repeats=1.")
_STAGES = (
    'Stacked.pipeline: stages={stages}{times} does not divide the {layers} layers of '
    'the stack: each stage holds an equal share. Fix: choose stages (times repeats) '
    'among the divisors of {layers}: {divisors}.')
_MICROBATCHES = (
    'Stacked.pipeline: microbatches={count} does not divide the batch: input {path} has '
    '{rows} rows (leading axis). Fix: a divisor of {rows} (e.g. {example}), or pad the '
    'batch to a multiple of {count}.')
_OTHER_BATCH = (
    'Stacked.pipeline: argument {path} has {rows} rows (leading axis), but the batch (x) '
    'has {batch}. An array argument is per example, like x: its leading axis is the batch, '
    'split into the same microbatches. Fix: give it a row per example; for an array every '
    'example shares, broadcast it to the batch: jnp.broadcast_to(a, ({batch},) + a.shape).')
_CIRCULAR_FEW = (
    "Stacked.pipeline: microbatches={count} is fewer than stages={stages} under "
    "schedule='circular': a microbatch comes back to stage 0 only after passing all "
    'stages. Fix: microbatches >= {stages}, or the gpipe schedule.')
_NO_MESH = (
    "Stacked.pipeline: mesh_axis={axis!r} but {detail}. Fix: run under "
    "jax.set_mesh(mesh) with a mesh axis {axis!r} of size {stages} (= stages), or "
    'leave mesh_axis=None.')
_UNNAMED = (
    "Stacked.pipeline: mesh_axis={axis!r} but the stack does not name its layer axis, so "
    "nn.variable_shardings would replicate every layer's variables on every device. Fix: "
    "Stacked(..., metadata_params={{nn.PARTITION_NAME: {axis!r}}}) (or a logical name your "
    "axis rules map to {axis!r}), and create the variables with it (init).")
_CARRY = (
    'Stacked.pipeline: the block takes the carry {before} and returns {after}. A '
    'pipeline passes one activation buffer from stage to stage, so every layer returns '
    'a carry like the one it receives. Fix: keep the carry\'s structure, shape and '
    'dtype (cast or project it back inside the block), or run the stack unpipelined '
    '(fold) if its layers change the shape.')

CARRY_UNDER_INIT = (
    'Stacked.pipeline (under init, which runs the stack as fold): {error} A pipeline passes '
    'one activation buffer from stage to stage. Fix: keep the carry\'s structure, shape and '
    'dtype inside the block, or run the stack unpipelined (fold).')

def _positive(name: str, value: Any) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    cls = errors.MicrobatchError if name == 'microbatches' else errors.StageCountError
    raise cls(_NOT_POSITIVE.format(name=name, value=value))
  return value


def check_stages(layers: int, stages: Any, schedule: Any, repeats: Any) -> None:
  """``stages``, ``schedule`` and ``repeats`` against the stack's ``layers``."""
  if schedule not in ('gpipe', 'circular'):
    raise errors.StageCountError(_SCHEDULE.format(value=schedule,
                                                  names="'gpipe', 'circular'"))
  _positive('stages', stages)
  _positive('repeats', repeats)
  if schedule == 'gpipe' and repeats != 1:
    raise errors.StageCountError(_GPIPE_REPEATS.format(repeats=repeats))
  if layers % (stages * repeats):
    divisors = [d for d in range(1, layers + 1) if layers % d == 0]
    times = f' x repeats={repeats}' if repeats != 1 else ''
    raise errors.StageCountError(_STAGES.format(stages=stages, times=times, layers=layers,
                                                divisors=divisors))


def check_microbatches(inputs: dict[str, Any], count: Any, stages: int,
                       schedule: str) -> None:
  """``microbatches`` against the leading axis of every leaf of the per-example
  ``inputs`` (``x`` and the array arguments, by name)."""
  _positive('microbatches', count)
  batch = None
  for name, tree in inputs.items():
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
      rows = leaf.shape[0] if getattr(leaf, 'ndim', 0) else 0
      where = f'{name}{jax.tree_util.keystr(path)}'
      batch = rows if batch is None else batch
      if name != 'x' and rows != batch:
        raise errors.MicrobatchError(_OTHER_BATCH.format(path=where, rows=rows, batch=batch))
      if not rows or rows % count:
        example = max(d for d in range(1, max(rows, 1) + 1) if rows % d == 0 and d <= count)
        raise errors.MicrobatchError(_MICROBATCHES.format(count=count, path=where, rows=rows,
                                                          example=example))
  if schedule == 'circular' and count < stages:
    raise errors.MicrobatchError(_CIRCULAR_FEW.format(count=count, stages=stages))


def check_mesh_axis(axis: str | None, stages: int, metadata_params: Any) -> None:
  """``mesh_axis`` is an axis of the current mesh of size ``stages`` (or None), and the
  stack names its layer axis (else its variables would be replicated on every device)."""
  if axis is None:
    return
  if meta.PARTITION_NAME not in (metadata_params or {}):
    raise errors.PipelineMeshError(_UNNAMED.format(axis=axis))
  mesh = jax.sharding.get_abstract_mesh()
  names = tuple(getattr(mesh, 'axis_names', ()))
  if axis not in names:
    detail = (f'the current mesh has the axes {names}' if names else 'no mesh is set')
    raise errors.PipelineMeshError(_NO_MESH.format(axis=axis, detail=detail, stages=stages))
  if mesh.shape[axis] != stages:
    detail = f'that axis of the current mesh has size {mesh.shape[axis]}, not stages={stages}'
    raise errors.PipelineMeshError(_NO_MESH.format(axis=axis, detail=detail, stages=stages))


def _types(tree: Any) -> Any:
  return jax.tree.map(lambda a: jax.typeof(a).str_short(), tree)


def layer_result(carry: Any, result: Any) -> Any:
  """The block's result if it is a carry like ``carry``; else `PipelineCarryError`."""
  if jax.tree.structure(result) != jax.tree.structure(carry) or any(  # type: ignore[operator]
      jax.typeof(a).shape != jax.typeof(b).shape or jax.typeof(a).dtype != jax.typeof(b).dtype
      for a, b in zip(jax.tree.leaves(carry), jax.tree.leaves(result))):
    raise errors.PipelineCarryError(_CARRY.format(before=_types(carry), after=_types(result)))
  return result
