"""The optimizer update of a layer stack, one layer at a time.

With the optimizer state in host memory, updating it whole brings every moment to the
chip at once: for AdamW that is twice the parameters' bytes, the largest thing a chip
would hold. `update_layer_by_layer` updates the parameters that have a leading layer
axis in a loop over the layers instead, so that only one layer's moments visit the chip
at a time (the rest, embeddings and norms, are updated whole). Each moment crosses the
host link once each way per step, as in the whole update.

The loop applies the optimizer to each layer's slice on its own, which is the whole
update only when the optimizer treats parameters independently (SGD, Adam, AdamW, Lion:
element-wise). `check_layer_separable` runs both on tiny values and raises where they
differ, as they do under `optax.clip_by_global_norm`, which couples all parameters:
clip with ``clip_norm=`` of `compile_train_step` instead, before the loop.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from linen_ext.errors import OptimizerStreamError

_STACKED, _REST, _OTHER = 'stacked', 'rest', 'other'


def stacked_parameters(abstract_params: Any, layer_axis: str) -> Any:
  """A tree of booleans shaped as the parameters: whether a parameter's leading axis has
  the logical name ``layer_axis`` (a layer stack's, `nn.Stacked`'s ``PARTITION_NAME``)."""
  def is_box(x):
    return hasattr(x, 'names') and hasattr(x, 'value')
  return jax.tree.map(lambda x: bool(is_box(x) and x.names and x.names[0] == layer_axis),
                      abstract_params, is_leaf=is_box)


def _kinds(optimizer, state, stacked) -> list[str]:
  """Per leaf of ``state``: a stacked parameter's moment, another parameter's, or neither
  (a step count)."""
  kinds = optax.tree_map_params(optimizer, lambda _, s: _STACKED if s else _REST, state,
                                stacked, transform_non_params=lambda _: _OTHER)
  return jax.tree.leaves(kinds)


def _part(optimizer, state, stacked, keep_stacked: bool) -> Any:
  """The state of one part of the parameters (the others' moments ``None``)."""
  return optax.tree_map_params(
      optimizer, lambda v, s: v if s == keep_stacked else None, state, stacked)


def _only(tree, stacked, keep_stacked: bool):
  return jax.tree.map(lambda x, s: x if s == keep_stacked else None, tree, stacked)


def update_layer_by_layer(optimizer: optax.GradientTransformation, grads: Any, state: Any,
                          params: Any, stacked: Any, *,
                          to_chip: Callable[[Any], Any] = lambda x: x,
                          to_host: Callable[[Any], Any] = lambda x: x) -> tuple[Any, Any]:
  """The updated ``(params, state)``, the stacked parameters updated one layer at a time.

  Args:
    optimizer: the optax optimizer whose ``state`` this is.
    grads, state, params: the gradients, the optimizer state and the parameters.
    stacked: `stacked_parameters` of ``params``.
    to_chip: moves a value of the state to the chip (identity by default).
    to_host: moves one layer's slice of a moment back to the host (identity by default).

  Examples:
    >>> params = {'embed': jnp.ones(3), 'layers': jnp.ones((4, 3))}
    >>> stacked = {'embed': False, 'layers': True}
    >>> sgd = optax.sgd(0.5)
    >>> new, _ = update_layer_by_layer(sgd, params, sgd.init(params), params, stacked)
    >>> new['layers'][0]
    Array([0.5, 0.5, 0.5], dtype=float32)

  Not for an optimizer that couples parameters (`check_layer_separable` says).
  """
  kinds = _kinds(optimizer, state, stacked)
  layer_kinds = [k for k in kinds if k != _REST]
  leaves, treedef = jax.tree.flatten(state)
  others = [to_chip(x) for x, k in zip(leaves, kinds) if k == _OTHER]

  rest_state = jax.tree.map(to_chip, _part(optimizer, state, stacked, False))
  rest_params = _only(params, stacked, False)
  updates, new_rest = optimizer.update(_only(grads, stacked, False), rest_state, rest_params)
  new_rest_params = optax.apply_updates(rest_params, updates)

  layer_def = jax.tree.structure(_part(optimizer, state, stacked, True))
  stacked_grads = _only(grads, stacked, True)
  moments = [x for x, k in zip(leaves, kinds) if k == _STACKED]
  depth = next(x.shape[0] for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(stacked)) if s)

  def one_layer(i, carry):
    layer_params, moments = carry
    at = lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False)  # noqa: E731
    sliced, count = iter(to_chip(at(m)) for m in moments), iter(others)
    layer_state = jax.tree.unflatten(
        layer_def, [next(sliced) if k == _STACKED else next(count) for k in layer_kinds])
    p = jax.tree.map(at, layer_params)
    u, new_state = optimizer.update(jax.tree.map(at, stacked_grads), layer_state, p)
    put = lambda x, v: jax.lax.dynamic_update_index_in_dim(x, v, i, 0)  # noqa: E731
    layer_params = jax.tree.map(put, layer_params, optax.apply_updates(p, u))
    new = [v for v, k in zip(jax.tree.leaves(new_state), layer_kinds) if k == _STACKED]
    return layer_params, [put(m, to_host(v)) for m, v in zip(moments, new)]

  new_stacked, moments = jax.lax.fori_loop(
      0, depth, one_layer, (_only(params, stacked, True), moments))
  new_params = jax.tree.map(lambda s, a, b: b if s else a, stacked, new_rest_params,
                            new_stacked, is_leaf=lambda x: x is None)
  from_rest, from_loop = iter(jax.tree.leaves(new_rest)), iter(moments)
  return new_params, jax.tree.unflatten(
      treedef, [next(from_loop) if k == _STACKED else next(from_rest) for k in kinds])


def check_layer_separable(optimizer: optax.GradientTransformation, abstract_params: Any,
                          stacked: Any, argument: str = 'optimizer') -> None:
  """Raises `OptimizerStreamError` if updating layer by layer differs from the whole
  update, on tiny values of the parameters' structure (two layers, one element per other
  dimension; gradients large enough that any clipping acts)."""
  rng = np.random.default_rng(0)

  def tiny(x, s):
    shape = (2,) + (1,) * (np.ndim(x) - 1) if s else (1,) * np.ndim(x)
    return rng.standard_normal(shape).astype(np.float32)
  abstract_params = jax.tree.map(lambda x: getattr(x, 'value', x), abstract_params,
                                 is_leaf=lambda x: hasattr(x, 'names'))
  with jax.default_device(jax.devices('cpu')[0]):
    params = jax.tree.map(tiny, abstract_params, stacked)
    grads = jax.tree.map(lambda x, s: 100 * tiny(x, s), params, stacked)
    state = optimizer.init(params)
    updates, whole_state = optimizer.update(grads, state, params)
    whole = (optax.apply_updates(params, updates), whole_state)
    layered = update_layer_by_layer(optimizer, grads, state, params, stacked)
    same = jax.tree.map(lambda a, b: bool(jnp.allclose(a, b, rtol=1e-5, atol=1e-6)),
                        whole, layered)
  if not all(jax.tree.leaves(same)):
    raise OptimizerStreamError(argument)
