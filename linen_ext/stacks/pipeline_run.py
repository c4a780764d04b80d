"""`Stacked.pipeline`'s entry: checks the arguments, then runs the lifted pipeline.

Under ``init`` the stack runs as ``fold`` (the same function; it creates the variables
in `Stacked`'s layout, or in the circular order through `lift.map_variables`).
"""
from __future__ import annotations

from typing import Any

import lift
from lift import errors as lift_errors

from linen_ext import errors
from linen_ext.stacks import pipeline_args
from linen_ext.stacks import pipeline_checks as checks
from linen_ext.stacks.layout import check_rows
from linen_ext.stacks.pipeline import (PipelinePlan, circular_order, lifted_pipeline,
                                       take_rows)


def _init_circular(stack: Any, plan: PipelinePlan, x: Any, args: tuple, kwargs: dict) -> Any:
  order = circular_order(plan.layers, plan.stages, plan.repeats)
  inverse = order.argsort()

  def fold(scope, x):
    return stack.clone(parent=scope).fold(x, *args, **kwargs)

  mapped = lift.map_variables(fold, True, map_in_fn=lambda v: take_rows(v, inverse),
                              map_out_fn=lambda v: take_rows(v, order), init=True,
                              mutable=True)
  return mapped(stack._bound_scope('Calling Stacked.pipeline'), x)


def run_pipeline(stack: Any, x: Any, args: tuple, kwargs: dict, *, stages: int,
                 microbatches: int, schedule: str, repeats: int, mesh_axis: str | None) -> Any:
  """``stack.fold(x, *args, **kwargs)`` run as a pipeline; see `Stacked.pipeline`."""
  checks.check_stages(stack.length, stages, schedule, repeats)
  call, per_example, layer_args = pipeline_args.split(args, kwargs)
  checks.check_microbatches({'x': x, **dict(zip(call.names, per_example))}, microbatches,
                            stages, schedule)
  check_rows(layer_args, stack.length, 'Stacked.pipeline')
  checks.check_mesh_axis(mesh_axis, stages, stack.metadata_params)
  plan = PipelinePlan(stack.length, stages, microbatches, schedule, repeats, mesh_axis,
                      stack.remat)
  if stack.is_initializing():
    try:
      if schedule == 'circular':
        return _init_circular(stack, plan, x, args, kwargs)
      return stack.fold(x, *args, **kwargs)
    except (lift_errors.ScanBodyError, errors.LayerStackError) as error:
      if isinstance(error, errors.PipelineError) or 'carry' not in str(error):
        raise
      detail = str(error).split(' Fix:')[0]
      raise errors.PipelineCarryError(checks.CARRY_UNDER_INIT.format(error=detail)) from None
  run = lifted_pipeline(plan, stack._factory(), stack.metadata_params, call)
  return run(stack._bound_scope('Calling Stacked.pipeline'), x, per_example, layer_args.rows)
