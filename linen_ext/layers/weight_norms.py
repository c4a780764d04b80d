"""Weight reparametrisations that wrap another layer: `WeightNorm`, `SpectralNorm`.

Each wraps ``layer_instance`` (any module, native or a ready-made flax layer)
and runs it through `map_variables`, which rewrites its parameters on the way
in: the layer's own variables stay where they are and keep their raw values;
what the wrapper adds (scales, power-iteration state) lives under the
wrapper, named by the path of the parameter it belongs to
(``Dense_1/kernel/scale``). Variable trees, values and rng draws are those of
`flax.linen.WeightNorm` and `flax.linen.SpectralNorm`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
from flax.linen import dtypes

from linen_ext import errors
from linen_ext.module.method_wrapping import compact
from linen_ext.module.core import Module
from linen_ext.transforms.module_transforms import map_variables




def _l2_normalize(x: jax.Array, axis: Any = None, eps: float = 1e-12) -> jax.Array:
  return x * jax.lax.rsqrt((x * x).sum(axis=axis, keepdims=True) + eps)


def _feature_axes(ndim: int, axes: Any) -> tuple[int, ...]:
  if axes is None:
    return ()
  axes = axes if isinstance(axes, Iterable) else (axes,)
  return tuple(sorted({a % ndim for a in axes}))


def _run_mapped(wrapper: Module, rewrite: Callable[[str, jax.Array], jax.Array],
                args: tuple, kwargs: dict, mutable: bool) -> Any:
  """``wrapper.layer_instance(*args, **kwargs)`` with every parameter ``p`` at path
  ``name/...`` replaced by ``rewrite(name/..., p)``."""
  prefix = wrapper.layer_instance.name

  def rewrite_all(variables):
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: rewrite(
            prefix + '/' + jax.tree_util.keystr(path[1:], simple=True, separator='/'),
            jnp.asarray(leaf)),
        variables)

  return map_variables(lambda layer: layer(*args, **kwargs), trans_in_fn=rewrite_all,
                       init=wrapper.is_initializing(), mutable=mutable)(wrapper.layer_instance)


class WeightNorm(Module):
  """L2 weight normalisation of ``layer_instance``'s parameters, as `flax.linen.WeightNorm`.

  A parameter whose path contains a name in ``variable_filter`` is divided by
  its L2 norm over the axes other than ``feature_axes`` (and multiplied by a
  learned per-feature ``scale`` with ``use_scale``). Not for normalising
  activations: use `LayerNorm`.

  Examples:
    >>> variables = nn.WeightNorm(nn.Dense(2)).init(jax.random.key(0), jnp.ones((1, 3)))
    >>> jax.tree.map(jnp.shape, variables['params'])
    {'layer_instance': {'bias': (2,), 'kernel': (3, 2)}, 'layer_instance/kernel/scale': (2,)}
  """
  layer_instance: Module
  epsilon: float = 1e-12
  dtype: Any = None
  param_dtype: Any = jnp.float32
  use_scale: bool = True
  scale_init: Callable[..., Any] = jax.nn.initializers.ones
  feature_axes: Any = -1
  variable_filter: Iterable[str] | None = dataclasses.field(default_factory=lambda: {'kernel'})

  @compact
  def __call__(self, *args, **kwargs):
    return _run_mapped(self, self._normalize, args, kwargs, mutable=False)

  def _normalize(self, path: str, value: jax.Array) -> jax.Array:
    if self.variable_filter and not any(name in path for name in self.variable_filter):
      return value
    features = _feature_axes(value.ndim, self.feature_axes)
    reduce = tuple(i for i in range(value.ndim) if i not in features)
    normalized = _l2_normalize(value, axis=reduce, eps=self.epsilon)
    parts = [value]
    if self.use_scale:
      feature_shape = [value.shape[a] if a in features else 1 for a in range(value.ndim)]
      scale = self.param(f'{path}/scale', self.scale_init,
                         [value.shape[a] for a in features], self.param_dtype)
      normalized = normalized * scale.reshape(feature_shape)
      parts.append(scale)
    return jnp.asarray(normalized, dtypes.canonicalize_dtype(*parts, dtype=self.dtype))


class SpectralNorm(Module):
  """Divides ``layer_instance``'s matrices by their largest singular value (Flax's SpectralNorm).

  The singular value comes from ``n_steps`` of power iteration from a vector
  ``u`` kept in ``collection_name`` (with the last ``sigma``); with
  ``update_stats=True`` both are written back. Tensors of rank above 2 are
  flattened to matrices over their leading axes (or refused with
  ``error_on_non_matrix``); scalars and vectors pass unchanged. As
  `flax.linen.SpectralNorm`. Each call runs power iterations: not for layers
  that need no Lipschitz bound.

  Examples:
    >>> layer, x = nn.SpectralNorm(nn.Dense(2)), jnp.ones((1, 3))
    >>> variables = layer.init(jax.random.key(0), x, update_stats=True)
    >>> y, updates = layer.apply(variables, x, update_stats=True, mutable=['batch_stats'])
    >>> jax.tree.map(jnp.shape, updates)
    {'batch_stats': {'layer_instance/kernel/sigma': (), 'layer_instance/kernel/u': (1, 2)}}
  """
  layer_instance: Module
  n_steps: int = 1
  epsilon: float = 1e-12
  dtype: Any = None
  param_dtype: Any = jnp.float32
  error_on_non_matrix: bool = False
  collection_name: str = 'batch_stats'

  @compact
  def __call__(self, *args, update_stats: bool, **kwargs):
    def rewrite(path, value):
      return self._normalize(path, value, update_stats)
    return _run_mapped(self, rewrite, args, kwargs, mutable=True)

  def _normalize(self, path: str, value: jax.Array, update_stats: bool) -> jax.Array:
    if value.ndim <= 1 or self.n_steps < 1:
      return value
    if value.ndim > 2 and self.error_on_non_matrix:
      raise errors.LayerArgumentError(
          f'Input is {value.ndim}D but error_on_non_matrix is True: SpectralNorm '
          f'parameter "{path}" is not a matrix. Fix: set '
          'error_on_non_matrix=False to flatten its leading axes.')
    matrix = value.reshape(-1, value.shape[-1])
    u_name = f'{path}/u'
    key = None if self.has_variable(self.collection_name, u_name) else self.make_rng('params')
    u_var = self.variable(self.collection_name, u_name, jax.random.normal, key,
                          (1, matrix.shape[-1]), self.param_dtype)
    sigma_var = self.variable(self.collection_name, f'{path}/sigma', jnp.ones, (),
                              self.param_dtype)
    u = u_var.value
    for _ in range(self.n_steps):
      v = _l2_normalize(u @ matrix.T, eps=self.epsilon)
      u = _l2_normalize(v @ matrix, eps=self.epsilon)
    u, v = jax.lax.stop_gradient(u), jax.lax.stop_gradient(v)
    sigma = (v @ matrix @ u.T)[0, 0]
    normalized = (matrix / jnp.where(sigma != 0, sigma, 1)).reshape(value.shape)
    if update_stats:
      u_var.value, sigma_var.value = u, sigma
    return jnp.asarray(normalized, dtypes.canonicalize_dtype(value, u, v, sigma, dtype=self.dtype))


__all__ = ['WeightNorm', 'SpectralNorm']
