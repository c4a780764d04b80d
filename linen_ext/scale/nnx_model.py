"""NNX models in the training step and the planner.

An `nnx.Module` (allocated, or abstract from `nnx.eval_shape`) is split once into its
graph definition and its `nnx.Param` state, and seen through Linen's ``init`` and
``apply``: ``init`` gives the parameters' shapes, each in a `Partitioned` box of its
``out_sharding`` names (`nnx.with_partitioning`), and ``apply`` calls
``nnx.merge(graphdef, params)``. The step, its shardings and its loss are then those of
a Linen model. `flax.nnx` is touched only when the model is one of its modules, so it
is loaded by then.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
from flax.core import meta

from linen_ext.errors import ModelStateError


def is_nnx_module(model: Any) -> bool:
  """Whether ``model`` is an `nnx.Module` (possible only once `flax.nnx` is loaded)."""
  nnx = sys.modules.get('flax.nnx')
  return nnx is not None and isinstance(model, nnx.Module)


def with_init_and_apply(model: Any) -> Any:
  """``model`` with Linen's ``init``/``apply``: an NNX model as an `NnxModel`, any other
  as it is."""
  return NnxModel.split(model) if is_nnx_module(model) else model


def _boxed_zeros(variable: Any) -> Any:
  names = variable.get_metadata().get('out_sharding')
  zeros = jnp.zeros(variable.shape, variable.dtype)
  return meta.Partitioned(zeros, names=tuple(names)) if names else zeros


@dataclasses.dataclass(frozen=True)
class NnxModel:
  """An NNX model's graph definition and parameters, with Linen's ``init`` and ``apply``
  (what a custom ``loss_fn`` of `compile_train_step` gets as its model).

  Attributes:
    graphdef: the model's `nnx.GraphDef`.
    params: its `nnx.Param` state (values or `jax.ShapeDtypeStruct`\\ s).
  """
  graphdef: Any
  params: Any

  @classmethod
  def split(cls, model: Any) -> NnxModel:
    """``model`` split into its graph definition and its `nnx.Param` state.

    Raises:
      ModelStateError: it holds other variables (the step would not update them).
    """
    nnx = importlib.import_module('flax.nnx')
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    others = nnx.to_flat_state(rest)
    if others:
      path, variable = others[0]
      where = '/'.join(str(key) for key in path)
      raise ModelStateError(
          f'{type(model).__name__} holds {len(others)} variables other than nnx.Param, '
          f'{where} ({type(variable).__name__}) first; the training step trains the '
          'nnx.Param ones and would not update the others (RNG streams, batch statistics). '
          'Fix: build the model for the step without them (nnx.Dropout(rate, '
          'deterministic=True) without rngs=, no BatchNorm), or compile your own step: '
          'jax.jit(...).lower(...) and nn.scale.compiled_stats.')
    return cls(graphdef, params)

  def init(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``{'params': zeros}`` in the parameters' shapes and boxes, whatever the arguments:
    for `jax.eval_shape`, which allocates nothing."""
    nnx = importlib.import_module('flax.nnx')
    return {'params': nnx.to_pure_dict(self.params, _boxed_zeros)}

  def apply(self, variables: Any, *args: Any, **kwargs: Any) -> Any:
    """The model with ``variables['params']``, called on ``args`` and ``kwargs``."""
    nnx = importlib.import_module('flax.nnx')
    params = jax.tree.map(lambda value: value, self.params)  # new variables to fill
    nnx.replace_by_pure_dict(params, variables['params'])
    return nnx.merge(self.graphdef, params)(*args, **kwargs)


__all__ = ['NnxModel', 'is_nnx_module', 'with_init_and_apply']
