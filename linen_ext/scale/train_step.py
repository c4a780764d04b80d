"""A training step compiled ahead of time for a mesh of (abstract) devices.

`compile_train_step` builds the step the main job runs (value and gradients of a loss,
gradients in the layout of their parameters, an optax update), with every variable and
optimizer moment sharded by its logical axis names, and compiles it for the mesh's
devices from shapes alone: nothing is allocated, so a 70B model compiles for a TPU pod
on a laptop. Optionally the optimizer state lives in host memory (JAX memory kinds) and
visits the chips only for its update.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax
from flax.linen import logical_axis_rules, logical_to_mesh_axes
from jax.sharding import NamedSharding, PartitionSpec

from lift.sharding import spec_axes
from linen_ext.errors import BatchShardingError, MeshShapeError
from linen_ext.scale.compiled import CompiledStats, compiled_stats
from linen_ext.scale.flops import jaxpr_flops
from linen_ext.scale.layer_update import (check_layer_separable, stacked_parameters,
                                          update_layer_by_layer)
from linen_ext.scale.nnx_model import with_init_and_apply
from linen_ext.sharding import strip_boxes, variable_shardings

MESH_AXES = ('stage', 'data', 'model')
Rules = Sequence[tuple[str, Any]]

# XLA's bfloat16-propagation pass can turn a layer loop's per-layer cast of its float32
# parameters into one cast of the whole stack before the loop: a bfloat16 copy of every
# layer's parameters, live through the backward loop (up to half their bytes per chip:
# 2 GiB of LLaMA-2 70B on v5e-64). Without the pass each layer's cast stays in the loop,
# and other values may stay float32: which needs less depends on the program.
NO_BF16_PROPAGATION = {'xla_disable_hlo_passes': 'bfloat16-propagation'}


def make_mesh(devices: Sequence[Any], shape: Mapping[str, int]) -> jax.sharding.Mesh:
  """A mesh with axes ``stage``, ``data`` and ``model`` (absent ones have size 1) over
  ``devices`` in their order: ``stage`` outermost, so that with the devices ordered slice
  by slice (`tpu_topology`) it spans the slices, and ``model`` innermost, on neighbours.

  Raises:
    MeshShapeError: an axis other than the three, or sizes whose product is not the
      number of devices.
  """
  unknown = [axis for axis in shape if axis not in MESH_AXES]
  if unknown:
    raise MeshShapeError(
        f'mesh {dict(shape)}: unknown axis {unknown[0]!r}; the axes are {MESH_AXES}. Fix: '
        f"only those, e.g. {{'data': {len(devices)}}} (FSDP over every chip).")
  sizes = tuple(int(shape.get(axis, 1)) for axis in MESH_AXES)
  if math.prod(sizes) != len(devices) or min(sizes) < 1:
    raise MeshShapeError(
        f'mesh {dict(shape)} does not fit {len(devices)} chips: its sizes must be at least 1 '
        f'and multiply to {len(devices)} (they multiply to {math.prod(sizes)}). Fix: e.g. '
        f"{{'data': {len(devices)}}} (FSDP over every chip) or "
        f"{{'data': {max(len(devices) // 2, 1)}, 'model': 2}}.")
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  return jax.sharding.Mesh(np.asarray(devices, dtype=object).reshape(sizes), MESH_AXES,
                           axis_types=auto)


def _ways(entry: Any, mesh: jax.sharding.Mesh) -> int:
  """Into how many pieces a spec's ``entry`` splits its dimension on ``mesh``."""
  return math.prod(mesh.shape[name] for name in spec_axes(entry))


def batch_sharding(batch: Any, mesh: jax.sharding.Mesh, rules: Rules) -> Any:
  """Each leaf of ``batch`` split along its leading axis as the logical axis ``batch``
  maps (the data-parallel axes), the rest replicated.

  Raises:
    BatchShardingError: a leading dimension does not divide over those axes.
  """
  spec = logical_to_mesh_axes(('batch',), tuple(rules))
  axes = spec[0] if spec is not None else None
  names = spec_axes(axes)
  ways = _ways(axes, mesh)

  def one(path, leaf) -> NamedSharding:
    size = np.shape(leaf)[0] if np.ndim(leaf) else 1
    if size % ways:
      raise BatchShardingError(
          f'batch{jax.tree_util.keystr(path)}: its {size} examples do not divide over the '
          f'data axes {names} ({ways} ways). Fix: a multiple of {ways} examples (per-device '
          'batch x data-parallel chips), or fewer chips on those axes.')
    return NamedSharding(mesh, PartitionSpec(axes) if np.ndim(leaf) else PartitionSpec())
  return jax.tree_util.tree_map_with_path(one, batch)


def next_token_loss(params: Any, model: Any, batch: Mapping[str, jax.Array]) -> jax.Array:
  """Mean cross-entropy of ``batch['targets']`` under ``model`` on ``batch['inputs']``."""
  logits = model.apply({'params': params}, batch['inputs'])
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype('float32'), batch['targets']).mean()


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  """A training step compiled for a mesh: the `jax.stages.Compiled` (call it on a real
  mesh) and its per-chip `CompiledStats`.

  Attributes:
    compiled: the compiled step, ``(state, batch) -> (state, loss)``.
    stats: its bytes, FLOPs and collectives on each chip.
  """
  compiled: jax.stages.Compiled
  stats: CompiledStats


def _specs(values: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(np.shape(v), v.dtype, sharding=s),
                      values, shardings)


def _in_memory(shardings: Any, kind: str) -> Any:
  return jax.tree.map(lambda s: s.with_memory_kind(kind), shardings)


def _train_step(model, optimizer, loss_fn, rules, shardings, offload: bool, clip_norm,
                stacked):
  device_opt = _in_memory(shardings['opt_state'], 'device') if offload else None
  streamed = offload and any(jax.tree.leaves(stacked))

  def update(grads, opt_state, params):
    if streamed:  # one layer's moments on the chip at a time
      return update_layer_by_layer(
          optimizer, grads, opt_state, params, stacked,
          to_chip=lambda x: jax.device_put(x, jax.memory.Space.Device),
          to_host=lambda x: jax.device_put(x, jax.memory.Space.Host))
    if offload:  # to the chips for the update, and back
      opt_state = jax.device_put(opt_state, device_opt)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    if offload:
      opt_state = jax.device_put(opt_state, shardings['opt_state'])
    return optax.apply_updates(params, updates), opt_state

  def step(state, batch):
    with logical_axis_rules(tuple(rules)):
      loss, grads = jax.value_and_grad(loss_fn)(state['params'], model, batch)
      grads = jax.lax.with_sharding_constraint(grads, shardings['params'])
      if clip_norm is not None:
        grads, _ = optax.clip_by_global_norm(clip_norm).update(grads, optax.EmptyState())
      params, opt_state = update(grads, state['opt_state'], state['params'])
      return {'params': params, 'opt_state': opt_state}, loss
  return step


def _abstract_state(model, optimizer, batch, mesh) -> Any:
  """The shapes (and boxes) of ``{'params', 'opt_state'}``; nothing is allocated."""
  key = jax.random.key(0)  # made outside the mesh: no eager op runs on abstract devices

  def create(key):
    params = model.init(key, batch['inputs'])['params']
    return {'params': params, 'opt_state': optimizer.init(params)}
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # no rules: they are the step's
    return jax.eval_shape(create, key)


def compile_train_step(model: Any, batch: Any, *, mesh: jax.sharding.Mesh, rules: Rules,
                       optimizer: optax.GradientTransformation,
                       loss_fn: Callable[..., jax.Array] = next_token_loss,
                       offload_optimizer: bool = False, clip_norm: float | None = None,
                       layer_axis: str = 'layers',
                       compiler_options: Mapping[str, Any] | None = None) -> CompiledStep:
  """Compiles ``model``'s training step for ``mesh`` from shapes alone.

  The step takes ``{'params', 'opt_state'}`` (donated: the update writes in place) and
  ``batch``, and returns the updated state and the loss. Variables are created by
  ``model.init(key, batch['inputs'])``; their shardings come from their logical axis
  names through ``rules``; the batch is split along its leading axis over the axes
  ``batch`` maps to.

  A `flax.linen` module is taken as ours is. An NNX model (abstract from
  `nnx.eval_shape`) becomes its `nnx.Param` state ``params`` (``nnx.to_pure_dict``'s
  form) and an `NnxModel` whose ``apply({'params': params}, x)`` merges and calls it.

  Args:
    model: a `linen_ext` module, a `flax.linen` one, or an `nnx.Module` holding only
      `nnx.Param` variables.
    batch: the step's batch: arrays or `jax.ShapeDtypeStruct`s, a dict with ``'inputs'``.
    mesh: the mesh (of real devices, or a `tpu_topology`'s abstract ones).
    rules: logical axis rules, ``[(logical name, mesh axes or None), ...]``.
    optimizer: an optax optimizer.
    loss_fn: ``loss_fn(params, model, batch) -> scalar``; next-token cross-entropy by
      default.
    offload_optimizer: keep the optimizer state in host memory (``pinned_host``); a
      layer stack's parameters (leading axis ``layer_axis``, not split over the mesh)
      are then updated one layer at a time (`update_layer_by_layer`).
    clip_norm: clip the gradients to this global norm before the update (as
      ``optax.clip_by_global_norm``, which a layer-by-layer update cannot run).
    layer_axis: the logical name of a layer stack's leading axis.
    compiler_options: XLA's options, e.g. `NO_BF16_PROPAGATION` (which can keep a
      bfloat16 copy of a whole layer stack's parameters out of memory); default none.

  Returns:
    A `CompiledStep`.

  Raises:
    BatchShardingError: the batch does not divide over the data axes.
    ShardingError: a variable does not divide over the mesh axes its names map to.
    ModelStateError: an NNX model holds variables other than `nnx.Param` ones.
    OptimizerStreamError: with ``offload_optimizer``, the optimizer couples layers.

  Examples:
    >>> step = compile_train_step(model, batch, mesh=mesh, rules=rules,  # doctest: +SKIP
    ...                           optimizer=optax.adamw(1e-4))
    >>> step.stats.device_bytes  # doctest: +SKIP
    >>> abstract = nnx.eval_shape(lambda: NnxLM(nnx.Rngs(0)))  # an NNX model  # doctest: +SKIP
    >>> step = compile_train_step(abstract, batch, mesh=mesh, rules=rules,  # doctest: +SKIP
    ...                           optimizer=optax.adamw(1e-4))

  Not for steps of another form (several optimizers, a custom update): compile
  your own `jax.jit(...).lower(...)` and read it with `compiled_stats`.
  """
  traced = traced_train_step(model, batch, mesh=mesh, rules=rules, optimizer=optimizer,
                             loss_fn=loss_fn, offload_optimizer=offload_optimizer,
                             clip_norm=clip_norm, layer_axis=layer_axis)
  return compile_traced(traced, mesh, compiler_options)


def traced_train_step(model: Any, batch: Any, *, mesh: jax.sharding.Mesh, rules: Rules,
                      optimizer: optax.GradientTransformation,
                      loss_fn: Callable[..., jax.Array] = next_token_loss,
                      offload_optimizer: bool = False, clip_norm: float | None = None,
                      layer_axis: str = 'layers') -> jax.stages.Traced:
  """The step `compile_train_step` compiles, traced but not compiled (seconds, where the
  compile of a large model takes minutes): its jaxpr gives the FLOPs."""
  model = with_init_and_apply(model)
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), batch)
  batch_shardings = batch_sharding(batch, mesh, rules)
  abstract = _abstract_state(model, optimizer, batch, mesh)
  shardings = variable_shardings(abstract, mesh, rules)
  # A layer axis split over the mesh (a pipeline's, over stage) is updated whole: a loop
  # over it would gather every layer's moments onto each chip.
  stacked = jax.tree.map(lambda s, sharding: s and _ways(next(iter(sharding.spec), None),
                                                          mesh) == 1,
                         stacked_parameters(abstract['params'], layer_axis),
                         shardings['params'])
  if offload_optimizer:
    shardings['opt_state'] = _in_memory(shardings['opt_state'], 'pinned_host')
    if any(jax.tree.leaves(stacked)):
      check_layer_separable(optimizer, abstract['params'], stacked)
  state = _specs(strip_boxes(abstract), shardings)
  step = jax.jit(_train_step(model, optimizer, loss_fn, rules, shardings, offload_optimizer,
                             clip_norm, stacked),
                 in_shardings=(shardings, batch_shardings),
                 out_shardings=(shardings, NamedSharding(mesh, PartitionSpec())),
                 donate_argnums=0)
  with jax.set_mesh(mesh):
    return step.trace(state, _specs(batch, batch_shardings))


def compile_traced(traced: jax.stages.Traced, mesh: jax.sharding.Mesh,
                   compiler_options: Mapping[str, Any] | None = None) -> CompiledStep:
  """Compiles a `traced_train_step` for ``mesh`` with XLA's ``compiler_options``, with
  its per-chip stats."""
  with jax.set_mesh(mesh):
    lowered = traced.lower()
    started = time.perf_counter()
    compiled = lowered.compile(compiler_options=dict(compiler_options or {}))
  flops = jaxpr_flops(traced.jaxpr) / mesh.size
  return CompiledStep(compiled, compiled_stats(compiled, flops, time.perf_counter() - started))


__all__ = ['CompiledStep', 'MESH_AXES', 'NO_BF16_PROPAGATION', 'batch_sharding',
           'compile_train_step', 'make_mesh', 'next_token_loss']
