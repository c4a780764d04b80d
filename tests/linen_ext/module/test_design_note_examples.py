"""The design note's Linen examples, run verbatim with ``import linen_ext as nn``.

Departures from the note's text, each forced by the note itself: ``jax.tree_map``
(removed from JAX) is ``jax.tree_util.tree_map``; ``LinenStatefulVmapMLP`` takes a
required ``train`` argument, so its ``init`` passes one, and applying it in
training mode needs the ``'batch'`` axis that its BatchNorm reduces over.
"""
import jax
import pytest
from jax import numpy as jnp
from jax import random

import linen_ext as nn
from tests.helpers import assert_trees_close


class MLP(nn.Module):
  @nn.compact
  def __call__(self, xs):
    h = nn.Dense(4, name='hidden')(xs)
    h = nn.relu(h)
    return nn.Dense(1, name='out')(h)


class NaiveVmapMLP(nn.Module):
  @nn.compact
  def __call__(self, xs):
    mlp = MLP()
    return jax.vmap(lambda mlp, x: mlp(x))(mlp, xs)  # fails


class ManualVmapMLP(nn.Module):
  @nn.compact
  def __call__(self, xs):
    mlp = MLP(parent=None)
    init_fn = lambda rng, xs: jax.vmap(mlp.init, in_axes=0)(random.split(rng, xs.shape[0]), xs)['params']
    apply_fn = jax.vmap(mlp.apply, in_axes=0)
    mlp_params = self.param('mlp', init_fn, xs)
    return apply_fn({'params': mlp_params}, xs)


class LinenVmapMLP(nn.Module):
  @nn.compact
  def __call__(self, xs):
    VmapMLP = nn.vmap(MLP, variable_axes={'params': 0}, split_rngs={'params': True}, in_axes=0)
    return VmapMLP(name='mlp')(xs)


class StatefulMLP(nn.Module):
  @nn.compact
  def __call__(self, x, *, train):
    h = nn.Dense(4, name='hidden')(x)
    h = nn.BatchNorm(axis_name='batch')(h, use_running_average=not train)
    h = nn.relu(h)
    return nn.Dense(1, name='out')(h)


class LinenStatefulVmapMLP(nn.Module):
  @nn.compact
  def __call__(self, xs, *, train):
    VmapMLP = nn.vmap(StatefulMLP, variable_axes={'params': 0, 'batch_stats': 0}, split_rngs={'params': True}, in_axes=0)
    return VmapMLP(name='mlp')(xs, train=train)


xs = jnp.ones((3, 4))
SHAPES = {'mlp': {'hidden': {'bias': (3, 4), 'kernel': (3, 4, 4)},
                  'out': {'bias': (3, 1), 'kernel': (3, 4, 1)}}}


def test_mlp():
  variables = MLP().init(random.PRNGKey(0), xs)
  assert jax.tree_util.tree_map(jnp.shape, variables['params']) == {
      'hidden': {'bias': (4,), 'kernel': (4, 4)}, 'out': {'bias': (1,), 'kernel': (4, 1)}}


def test_naive_vmap_fails_with_a_clear_error():
  # Flax's message: modules print in its layout, 'MLP()' for one without fields.
  with pytest.raises(TypeError, match=r"Argument 'MLP\(\)' .*is not a valid JAX type"):
    NaiveVmapMLP().init(random.PRNGKey(0), xs)


def test_manual_and_linen_vmap_shapes_as_printed_and_equal_outputs():
  manual = ManualVmapMLP().init(random.PRNGKey(0), xs)
  assert jax.tree_util.tree_map(jnp.shape, manual['params']) == SHAPES
  variables = LinenVmapMLP().init(random.PRNGKey(0), xs)
  assert jax.tree_util.tree_map(jnp.shape, variables['params']) == SHAPES
  assert_trees_close(LinenVmapMLP().apply({'params': manual['params']}, xs),
                     ManualVmapMLP().apply(manual, xs), depth=2)


def test_linen_stateful_vmap():
  variables = LinenStatefulVmapMLP().init(random.PRNGKey(0), xs, train=False)
  assert jax.tree_util.tree_map(jnp.shape, variables['batch_stats']) == {
      'mlp': {'BatchNorm_0': {'mean': (3, 4), 'var': (3, 4)}}}
  y, updates = LinenStatefulVmapMLP().apply(variables, xs, train=False, mutable=['batch_stats'])
  assert y.shape == (3, 1)

  class TrainedStatefulVmapMLP(nn.Module):
    @nn.compact
    def __call__(self, xs, *, train):
      VmapMLP = nn.vmap(StatefulMLP, variable_axes={'params': 0, 'batch_stats': 0},
                        split_rngs={'params': True}, in_axes=0, axis_name='batch')
      return VmapMLP(name='mlp')(xs, train=train)

  y, updates = TrainedStatefulVmapMLP().apply(variables, xs * jnp.arange(3.0)[:, None],
                                              train=True, mutable=['batch_stats'])
  mean = updates['batch_stats']['mlp']['BatchNorm_0']['mean']
  # Statistics are averaged over the 'batch' axis, so every member stores the same mean.
  assert jnp.allclose(mean, mean[:1]) and not jnp.allclose(mean, 0.0)
