"""Pipeline parallelism over the layers of a `Stacked`: ``Stacked.pipeline``.

The schedule (notes/0006-pipeline.md): S stages, each holding ``repeats`` groups of
``L / (S * repeats)`` consecutive layers; M microbatches. At tick t, stage s runs
microbatch ``m = (t - s) mod M`` through its group ``r = (t - s) // M`` when
``0 <= t - s < M * repeats``, and idles otherwise; there are ``M * repeats + S - 1``
ticks. A tick is one `jax.vmap` over the stages (each on its rows of the variables), the
ticks one `lift.loops.run_scan` (so ``remat`` applies per tick), and the activations move
one stage per tick by a roll of the stage axis, which the SPMD partitioner turns into a
collective permute when that axis is sharded. Variables the layers write ride in the tick
carry (`pipeline_variables`); array arguments are read per microbatch (`pipeline_args`).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from lift import loops, rng_counters
from lift.axes import split_rng_groups
from lift.filters import in_filter
from lift.metadata import remove_group_axes
from lift.pack import pack

from linen_ext.describe import loop_name
from linen_ext.stacks import pipeline_checks as checks
from linen_ext.stacks import pipeline_variables as writes_of
from linen_ext.stacks.microbatch_rng import microbatch_keys
from linen_ext.stacks.pipeline_args import PipelineArgs

SCHEDULES = ('gpipe', 'circular')


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
  """The static shape of a pipelined run, validated by `pipeline_checks.plan`."""
  layers: int
  stages: int
  microbatches: int
  schedule: str
  repeats: int
  mesh_axis: str | None
  remat: Any = False

  @property
  def ticks(self) -> int:
    return self.microbatches * self.repeats + self.stages - 1

  @property
  def layers_per_group(self) -> int:
    return self.layers // (self.stages * self.repeats)


def schedule_table(stages: int, microbatches: int, repeats: int = 1) -> np.ndarray:
  """What each stage does at each tick: ``int[ticks, stages, 2]`` of (microbatch, group).

  The microbatch is -1 where the stage idles. ``repeats=1`` is the GPipe schedule;
  more repeats are the circular one (stage s runs group ``r`` = layers
  ``(r * S + s) * k`` to ``(r * S + s + 1) * k - 1``).

  Examples:
    >>> schedule_table(2, 3)[:, :, 0].tolist()   # microbatch per tick (rows) and stage
    [[0, -1], [1, 0], [2, 1], [-1, 2]]
  """
  ticks = microbatches * repeats + stages - 1
  work = np.arange(ticks)[:, None] - np.arange(stages)[None, :]
  busy = (work >= 0) & (work < microbatches * repeats)
  microbatch = np.where(busy, work % microbatches, -1)
  group = np.where(busy, work // microbatches, 0)
  return np.stack([microbatch, group], axis=-1).astype(np.int32)


def bubble_fraction(table: np.ndarray) -> float:
  """The share of (tick, stage) cells of a `schedule_table` in which the stage idles."""
  return float(np.mean(table[..., 0] < 0))


def circular_order(layers: int, stages: int, repeats: int) -> np.ndarray:
  """Row k of the circular layout holds layer ``order[k]`` of `Stacked`'s layout.

  Stage s's rows are contiguous (its groups s, S + s, 2S + s, ...), so sharding the
  leading axis over the stages gives each device its own groups.

  Examples:
    >>> circular_order(8, 2, 2).tolist()
    [0, 1, 4, 5, 2, 3, 6, 7]
  """
  per_group = layers // (stages * repeats)
  grid = np.arange(layers).reshape(repeats, stages, per_group)
  return grid.transpose(1, 0, 2).reshape(-1)


def take_rows(variables: Any, order: np.ndarray) -> Any:
  return jax.tree.map(lambda x: x[order], variables)


def stacked_to_circular(variables: Any, *, stages: int, repeats: int) -> Any:
  """`Stacked`'s variables (leading layer axis) in the circular schedule's row order.

  For ``Stacked.pipeline(..., schedule='circular', stages=, repeats=)``: row k holds
  layer ``circular_order(layers, stages, repeats)[k]``.

  Examples:
    >>> variables = {'params': {'w': jnp.arange(8.0)}}
    >>> nn.stacked_to_circular(variables, stages=2, repeats=2)['params']['w'].tolist()
    [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]
  """
  layers = jax.tree.leaves(variables)[0].shape[0]
  return take_rows(variables, circular_order(layers, stages, repeats))


def circular_to_stacked(variables: Any, *, stages: int, repeats: int) -> Any:
  """The inverse of `stacked_to_circular`: back to `Stacked`'s layer order.

  Examples:
    >>> variables = {'params': {'w': jnp.arange(8.0)}}
    >>> circular = nn.stacked_to_circular(variables, stages=2, repeats=2)
    >>> nn.circular_to_stacked(circular, stages=2, repeats=2)['params']['w'].tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
  """
  layers = jax.tree.leaves(variables)[0].shape[0]
  return take_rows(variables, np.argsort(circular_order(layers, stages, repeats)))


class _CounterReplay:
  """Every traced layer draws the keys a layer of `Stacked`'s loop draws.

  `lift.scan` traces a step once before its loop and rewinds later traces to where that
  first trace left the counters ('params' to where they stood before). The pipeline runs
  the same first trace (`jax.eval_shape`) and rewinds every later one the same way.
  """

  def __init__(self):
    self.nodes: list[Any] = []
    self.saved: list[Any] | None = None
    self.before: list[Any] = []

  def enter(self, scope: Any):
    if not self.nodes:
      self.nodes = rng_counters.counter_roots(scope)
      self.before = [rng_counters.snapshot(node) for node in self.nodes]
    elif self.saved is not None:
      for node, snap in zip(self.nodes, self.saved):
        rng_counters.restore(node, snap)

  def save(self):
    once = functools.partial(in_filter, 'params')
    self.saved = [rng_counters.per_stream(before, rng_counters.snapshot(node), once)
                  for before, node in zip(self.before, self.nodes)]


def _microbatched_rngs(rng_groups: Any, microbatch: Any, count: int) -> Any:
  return jax.tree.map(lambda key: microbatch_keys(key, microbatch, count), rng_groups)


def _rows_by_stage(tree: Any, plan: PipelinePlan) -> Any:
  """Leading layer axis (storage order) -> (stage, group, layer in group)."""
  shape = (plan.stages, plan.repeats, plan.layers_per_group)
  return jax.tree.map(lambda x: x.reshape(shape + x.shape[1:]), tree)


def _constrain(tree: Any, plan: PipelinePlan) -> Any:
  """The stage axis (axis 0) on ``mesh_axis``; the other axes as the partitioner likes."""
  if plan.mesh_axis is None:
    return tree

  def one(x):
    spec = PartitionSpec(plan.mesh_axis, *[PartitionSpec.UNCONSTRAINED] * (x.ndim - 1))
    return jax.lax.with_sharding_constraint(x, spec)
  return jax.tree.map(one, tree)


def _stage_rows(tree: Any, group: Any, repeats: int) -> Any:
  """Group ``group``'s rows. With one group (gpipe) the index is static: the rows of the
  fixed variables are then loop-invariant, and differentiation keeps them once rather
  than once per tick."""
  if repeats == 1:
    return jax.tree.map(lambda x: x[0], tree)
  return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, group, 0, keepdims=False), tree)


def _put_rows(tree: Any, rows: Any, group: Any, busy: Any) -> Any:
  """Row ``group`` of ``tree`` set to ``rows`` where the stage was ``busy``."""
  def one(x, new):
    old = jax.lax.dynamic_index_in_dim(x, group, 0, keepdims=False)
    return jax.lax.dynamic_update_index_in_dim(x, jnp.where(busy, new, old), group, 0)
  return jax.tree.map(one, tree, rows)


def _microbatches(x: Any, count: int) -> Any:
  """``[batch, ...]`` -> ``[count, batch / count, ...]``: microbatch m holds rows m,
  m + count, m + 2 * count, ... Each microbatch takes rows from every part of the batch,
  so a batch sharded over a data axis stays on its devices (contiguous microbatches would
  each live on one data shard, and the partitioner would gather them)."""
  def split(a):
    rows = a.reshape((a.shape[0] // count, count) + a.shape[1:])
    return jnp.swapaxes(rows, 0, 1)
  return jax.tree.map(split, x)


def _joined(microbatches: Any) -> Any:
  """The inverse of `_microbatches`: ``[count, rows, ...]`` -> ``[count * rows, ...]``."""
  return jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1).reshape((-1,) + a.shape[2:]),
                      microbatches)


def _by_layer(tree: Any, plan: PipelinePlan) -> Any:
  """(stage, group, layer in group, ...) -> the leading layer axis (storage order)."""
  return jax.tree.map(lambda a: a.reshape((plan.layers,) + a.shape[3:]), tree)


def _by_layer_and_microbatch(per_tick: Any, plan: PipelinePlan) -> Any:
  """Per-tick outputs ``[ticks, stages, layer in group, ...]`` -> ``[layers, M, ...]``.

  Stage s runs microbatch m of group r at tick ``r * M + m + s``: a gather per stage
  (a vmap over the stage axis, so a sharded stage axis stays local)."""
  groups, count = np.arange(plan.repeats), np.arange(plan.microbatches)
  ticks = (groups[:, None] * plan.microbatches + count[None, :])[None] + np.arange(
      plan.stages)[:, None, None]

  def one(a):
    rows = jax.vmap(lambda a_s, t_s: a_s[t_s], in_axes=(1, 0))(a, ticks)  # [S, R, M, k, ...]
    return _by_layer(jnp.moveaxis(rows, 3, 2), plan)
  return jax.tree.map(one, per_tick)


def _per_stage(tree: Any, plan: PipelinePlan) -> Any:
  """A copy of ``tree`` per stage (``[S, ...]``, the stage axis on ``mesh_axis``): each
  stage reads its own without communication, and gradients into it add up once, after
  the loop, rather than over the stages at every tick."""
  return _constrain(jax.tree.map(
      lambda a: jnp.broadcast_to(a, (plan.stages,) + a.shape), tree), plan)


def _feeds(plan: PipelinePlan) -> tuple[np.ndarray, np.ndarray]:
  """Per tick, the schedule ``[ticks, S, 2]`` and, for stage 0 and the last stage,
  ``[ticks, 3]``: the microbatch stage 0 takes, its group, and the microbatch whose last
  stage output the roll brings to stage 0 (-1: none). Separate from the table, whose stage
  axis is sharded, so reading them costs no collective."""
  table = schedule_table(plan.stages, plan.microbatches, plan.repeats)
  arrived = np.concatenate([[-1], table[:-1, -1, 0]])
  return table, np.stack([np.maximum(table[:, 0, 0], 0), table[:, 0, 1], arrived], axis=1)


def _collect(done: Any, arriving: Any, arrived: Any) -> Any:
  """A stage's record of finished microbatches with ``arriving``, the last stage's output
  for microbatch ``arrived`` (-1: none)."""
  return jax.tree.map(lambda d, a: jnp.where(
      arrived >= 0, d.at[jnp.maximum(arrived, 0)].set(a), d), done, arriving)


def _run(plan: PipelinePlan, layer: Callable[..., Any], per_layer: Any, state: Any, x: Any,
         per_example: Any) -> tuple[Any, Any, Any]:
  """The tick loop over microbatched ``x`` (and ``per_example`` arguments).

  ``layer(carry, per-layer row, state row, examples, m) -> (carry, state row, created)``,
  where ``per_layer`` holds the layer rows of the fixed variables, the rng keys and the
  `per_layer` arguments, and ``examples`` is microbatch m of ``per_example``.
  Returns the output, the carried ``state`` after the last microbatch (layer rows) and
  what the layers created (``[layers, M, ...]``). The last stage's outputs reach stage 0
  by the same roll as every hand-over, and stage 0 collects them (``done``): its input
  for a later repeat, and the output once the loop ends.
  """
  inputs = _per_stage(_microbatches(x, plan.microbatches), plan)  # [S, M, b, ...]
  examples = _per_stage(_microbatches(per_example, plan.microbatches), plan)
  stage_rows = _constrain(_rows_by_stage(per_layer, plan), plan)
  buffer = jax.tree.map(lambda a: jnp.zeros((plan.stages,) + a.shape[2:], a.dtype), inputs)
  done = jax.tree.map(jnp.zeros_like, inputs)
  first = jnp.arange(plan.stages) == 0

  def stage(rows, state, arriving, inputs, done, examples, microbatch, group, first, feeds):
    """One stage's tick. Every stage keeps a copy of the inputs and of the record of
    finished microbatches; stage 0's are the ones read, and reading them locally on every
    stage costs no communication."""
    feed, repeat, arrived = feeds
    done = _collect(done, arriving, arrived)
    entering = jax.tree.map(lambda x, d: jnp.where(repeat > 0, d[feed], x[feed]), inputs, done)
    carry = jax.tree.map(lambda e, a: jnp.where(first, e, a), entering, arriving)
    m = jnp.maximum(microbatch, 0)
    mine = jax.tree.map(lambda a: a[m], examples)

    def step(c, row):
      c, new_state, created = layer(c, *row, mine, m)
      return c, (new_state, created)
    carry, (new_state, created) = jax.lax.scan(step, carry,
                                               _stage_rows((rows, state), group, plan.repeats))
    return carry, _put_rows(state, new_state, group, microbatch >= 0), done, created

  def tick(carry, work):
    buffer, state, done = carry
    table, feeds = work
    arriving = _constrain(jax.tree.map(lambda s: jnp.roll(s, 1, axis=0), buffer), plan)
    outs, state, done, created = jax.vmap(
        stage, in_axes=(0,) * 9 + (None,), spmd_axis_name=plan.mesh_axis)(
        stage_rows, state, arriving, inputs, done, examples, table[:, 0], table[:, 1], first,
        feeds)
    return (_constrain(outs, plan), _constrain(state, plan), _constrain(done, plan)), created

  table, feeds = _feeds(plan)
  state = _constrain(_rows_by_stage(state, plan), plan)
  (outs, state, done), created = loops.run_scan(
      tick, (buffer, state, done), (jnp.asarray(table), jnp.asarray(feeds)), remat=plan.remat)
  last = jax.tree.map(lambda s: jnp.roll(s, 1, axis=0), outs)  # the final hand-over
  done = jax.vmap(_collect, in_axes=(0, 0, None))(done, last, int(table[-1, -1, 0]))
  # stage 0's record, as a sum over the stages (one all-reduce; its transpose, a broadcast)
  y = jax.tree.map(lambda d: jnp.sum(jnp.where(
      first.reshape((-1,) + (1,) * (d.ndim - 1)), d, jnp.zeros_like(d)), axis=0), done)
  return _joined(y), _by_layer(state, plan), _by_layer_and_microbatch(created, plan)


def lifted_pipeline(plan: PipelinePlan, make_block: Any, metadata_params: Any,
                    call: PipelineArgs) -> Callable[..., Any]:
  """The lifted pipeline: ``fn(scope, x, per_example, per_layer) -> y`` over the variables
  at the scope (arguments as `pipeline_args.split` gives them); mutable collections come
  back as `pipeline_variables` describes."""

  def inner(scope_fn, repack_fn, variable_groups, rng_groups, x, per_example, arg_rows):
    (variables,), = remove_group_axes(variable_groups, (0,), metadata_params)
    variables = writes_of.flat(variables)
    rngs = split_rng_groups(rng_groups, (True,), plan.layers)
    if plan.schedule == 'circular':
      order = circular_order(plan.layers, plan.stages, plan.repeats)
      rngs, arg_rows = take_rows(rngs, order), take_rows(arg_rows, order)
    replay = _CounterReplay()

    def run_layer(carry, variable_row, rng_row, arg_row, examples, microbatch):
      scope = scope_fn(((writes_of.unflat(variable_row),),),
                       _microbatched_rngs(rng_row, microbatch, plan.microbatches))
      replay.enter(scope)
      args, kwargs = call.for_layer(examples, arg_row)
      carry = checks.layer_result(carry, make_block(scope)(carry, *args, **kwargs))
      (written,), = repack_fn(scope)
      return carry, written

    row, rng_row, arg_row = jax.tree.map(lambda a: a[0], (variables, rngs, arg_rows))
    first_batch = jax.tree.map(lambda a: a[:a.shape[0] // plan.microbatches], (x, per_example))
    # a first trace, as lift.scan's: it fixes the rng counters and shows what is written
    written = jax.eval_shape(lambda c, e: run_layer(c, row, rng_row, arg_row, e, 0)[1],
                             *first_batch)
    replay.save()
    writes = writes_of.classify(row, written)

    def layer(carry, per_layer_row, state_row, examples, microbatch):
      fixed_row, rng_row, arg_row = per_layer_row
      carry, written = run_layer(carry, {**fixed_row, **state_row}, rng_row, arg_row,
                                 examples, microbatch)
      return (carry, *writes.split(written))

    state = {p: variables[p] for p in writes.carried}
    fixed = {p: v for p, v in variables.items() if p not in state}
    y, state, created = _run(plan, layer, (fixed, rngs, arg_rows), state, x, per_example)
    return y, ((writes_of.returned(state, created, metadata_params),),)

  return pack(inner, (True,), (True,), (True,),
              name=loop_name('Stacked.pipeline', make_block.block_cls))


__all__ = ['schedule_table', 'bubble_fraction', 'circular_order', 'stacked_to_circular',
           'circular_to_stacked', 'PipelinePlan']
