"""Module transforms: class and decorator forms, naming, setup inside, jit caching, misuse.

Oracles: flax.linen on the same model source (variable trees and values), and
the class form against the decorator form of the same transform.
"""
import dataclasses
import functools
from typing import Any

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization
from jax.sharding import PartitionSpec as P

import lift
import linen_ext as nn
from linen_ext import errors
from tests.helpers import assert_trees_close, tolerance

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


def assert_same(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


def init_and_apply(model, *args, **kwargs):
  variables = model.init(KEY, *args, **kwargs)
  return variables, model.apply(variables, *args, **kwargs)


# -- the same model, transformed as a class and through a decorated method ---------------

TRANSFORMS = {
    'vmap': dict(variable_axes={'params': 0}, split_rngs={'params': True}),
    'scan': dict(variable_axes={'params': 0}, split_rngs={'params': True}, length=3),
    'checkpoint': dict(prevent_cse=False),
    'jit': dict(),
    'map_variables': dict(mapped_collections='params', init=True,
                          trans_in_fn=lambda v: jax.tree_util.tree_map(lambda a: 2 * a, v),
                          trans_out_fn=lambda v: jax.tree_util.tree_map(lambda a: a / 2, v)),
    'remat_scan': dict(lengths=(2, 2)),
    'fold_rngs': dict(),
    'shard_map': dict(mesh=jax.make_mesh((1,), ('data',)), in_specs=P(),
                      out_specs=P(), variable_specs={'params': P()},
                      split_rngs={'params': False}),
}
STEP = {'scan': lambda y: (y, y.sum()), 'remat_scan': lambda y: y}


def block_classes(transform, options):
  step = STEP.get(transform, lambda y: y)

  class Block(nn.Module):
    def setup(self):
      self.dense = nn.Dense(4)

    def __call__(self, x, *rest):
      return step(nn.tanh(self.dense(x)))

  class Decorated(nn.Module):
    def setup(self):
      self.dense = nn.Dense(4)

    @functools.partial(getattr(nn, transform), **options)
    def __call__(self, x, *rest):
      return step(nn.tanh(self.dense(x)))

  return getattr(nn, transform)(Block, **options), Decorated


def test_transformed_class_names_follow_flax():
  def make(nn):
    class Dense2(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(2)(x)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        y = nn.vmap(Dense2, variable_axes={'params': 0}, split_rngs={'params': True})()(x)
        y = nn.remat(Dense2)()(y) + nn.jit(Dense2)()(y)
        return nn.map_variables(Dense2, 'params', init=True)()(y)
    return Model()

  ours, theirs = make(nn).init(KEY, X), make(flax_nn).init(KEY, X)
  assert set(ours['params']) == set(theirs['params']) == {
      'VmapDense2_0', 'CheckpointDense2_0', 'JitDense2_0', 'Map_variablesDense2_0'}
  assert nn.vmap(nn.Dense).__name__ == 'VmapDense'


def test_setup_submodules_and_field_modules_inside_transforms_match_flax():
  def make(nn):
    class Shared(nn.Module):
      head: nn.Module  # created by the parent, lifted with this module's scope

      def setup(self):
        self.body = nn.Dense(4)

      @functools.partial(nn.vmap, variable_axes={'params': 0}, split_rngs={'params': True})
      def __call__(self, x):
        return self.head(nn.relu(self.body(x)))

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return Shared(nn.Dense(2, name='head'))(x)
    return Model()

  ours, theirs = make(nn).init(KEY, X), make(flax_nn).init(KEY, X)
  assert_same(ours, theirs)
  assert ours['params']['head']['kernel'].shape == (2, 4, 2)
  assert_same(make(nn).apply(ours, X), make(flax_nn).apply(theirs, X))


def test_modules_and_variables_passed_as_arguments_are_lifted():
  class Apply(nn.Module):
    @functools.partial(nn.vmap, variable_axes={'params': None}, split_rngs={'params': False},
                       in_axes=(0, None))
    def __call__(self, x, layer):
      return layer(x)

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      layer = nn.Dense(3)
      return Apply()(x[None].repeat(2, 0), layer)

  variables, y = init_and_apply(Model(), X)
  kernel = variables['params']['Dense_0']['kernel']
  assert kernel.shape == (4, 3)
  np.testing.assert_allclose(y[0], X @ kernel, rtol=1e-6)


# -- misuse ---------------------------------------------------------------------------------


def test_transforming_an_instance_is_an_error():
  with pytest.raises(errors.TransformTargetError, match=r'Module class or a method.*nn.vmap'):
    nn.vmap(nn.Dense(3), variable_axes={'params': 0})


def test_returning_a_module_from_a_transformed_method_is_an_error():
  class Leaky(nn.Module):
    @nn.jit
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2)

  class Leaky2(nn.Module):
    @functools.partial(nn.checkpoint)
    @nn.compact
    def __call__(self, x):
      return x, self.variable('state', 'v', jnp.zeros, ())

  with pytest.raises(errors.TransformedReturnError, match=r'"__call__".*nn.jit.*returned a Dense'):
    Leaky().init(KEY, X)
  with pytest.raises(errors.TransformedReturnError, match='returned a Variable'):
    Leaky2().init(KEY, X)


def test_bad_methods_argument():
  with pytest.raises(errors.TransformMethodsError, match='methods must be None'):
    nn.jit(nn.Dense, methods='__call__')
  with pytest.raises(errors.NotAMethodError, match='"encode"'):
    nn.jit(nn.Dense, methods=['encode'])


def test_calling_a_transformed_method_outside_apply():
  with pytest.raises(errors.UnboundModuleError, match='nn.vmap'):
    nn.vmap(nn.Dense, variable_axes={'params': 0}, split_rngs={'params': True})(2)(X)
  # jit runs an unbound module's method unbound (as Flax): the layer itself then refuses.
  with pytest.raises(errors.UnboundModuleError, match='unbound module `Dense`'):
    nn.jit(nn.Dense)(2)(X)


def test_fold_rngs_draws_flax_keys():
  def make(nn):
    class Noisy(nn.Module):
      @nn.compact
      def __call__(self, x):
        noise = jax.random.normal(self.make_rng('dropout'), x.shape)
        return nn.Dropout(0.5, deterministic=False)(nn.Dense(4)(x)) + noise

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.fold_rngs(Noisy)(name='noisy')(x)
    return Model()

  rngs = {'params': KEY, 'dropout': jax.random.key(1)}
  variables = make(flax_nn).init(rngs, X)
  assert_same(make(nn).init(rngs, X), variables)
  assert_same(make(nn).apply(variables, X, rngs=rngs), make(flax_nn).apply(variables, X, rngs=rngs))


def test_functools_partial_of_a_compact_method_is_transformed_as_flax():
  def make(nn):
    class Foo(nn.Module):
      @nn.compact
      def inner(self, x):
        return nn.Dense(2, use_bias=False)(x)

      def __call__(self, x):
        return nn.vmap(functools.partial(Foo.inner), variable_axes={'params': 0},
                       split_rngs={'params': True})(self, x)
    return Foo()

  x = jnp.ones((3, 4, 4))
  variables = make(nn).init(jax.random.key(0), x)
  assert_same(variables, make(flax_nn).init(jax.random.key(0), x))
  assert_same(make(nn).apply(variables, x), make(flax_nn).apply(variables, x))


# -- lift_transform: a user's scope-level transform on Modules -------------------------


def lift_scale(fn, factor, collection='params'):
  """Runs ``fn`` on ``factor`` times the variables of ``collection``."""
  def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
    scaled, rest = variable_groups
    scaled = jax.tree_util.tree_map(lambda v: v * factor, scaled)
    scope = scope_fn((scaled, rest), rng_groups)
    return fn(scope, *args, **kwargs), repack_fn(scope)
  return lift.pack(inner, (collection, True), (nn.DenyList(collection),), (True,))


def test_lift_transform_on_a_class_runs_the_transform_on_its_scopes():
  Scaled = nn.lift_transform(lift_scale, nn.Dense, 3.0)
  assert Scaled.__name__ == 'LiftScaleDense' and issubclass(Scaled, nn.Dense)
  variables = nn.Dense(2).init(KEY, X)
  kernel, bias = variables['params']['kernel'], variables['params']['bias']
  tol = tolerance(jnp.float32, depth=1)  # one Dense, against its hand-written form
  np.testing.assert_allclose(Scaled(2).apply(variables, X), X @ (3 * kernel) + 3 * bias[None],
                             rtol=tol, atol=tol)
  # Its keyword arguments reach the transform: scaling another collection leaves params.
  Unscaled = nn.lift_transform(lift_scale, nn.Dense, 3.0, collection='stats')
  np.testing.assert_allclose(Unscaled(2).apply(variables, X), nn.Dense(2).apply(variables, X))


def test_lift_transform_decorates_a_method_and_picks_methods_of_a_class():
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2, name='head')(x)

    @functools.partial(nn.lift_transform, lift_scale, factor=0.0)
    @nn.compact
    def zeroed(self, x):
      return nn.Dense(2, name='head')(x)

  variables = Model().init(KEY, X)
  assert not np.any(Model().apply(variables, X, method='zeroed'))
  assert np.any(Model().apply(variables, X))
  Zeroed = nn.lift_transform(lift_scale, Model, 0.0, methods=['__call__'])
  assert not np.any(Zeroed().apply(variables, X))


def test_lift_transform_gives_one_class_per_transform_and_arguments():
  assert nn.lift_transform(lift_scale, nn.Dense, 2.0) is nn.lift_transform(lift_scale, nn.Dense, 2.0)
  assert nn.lift_transform(lift_scale, nn.Dense, 2.0) is not nn.lift_transform(lift_scale, nn.Dense, 5.0)

  def other(fn, factor):  # another transform under the same name: never the cached class
    return lift_scale(fn, -factor)
  other.__name__ = 'lift_scale'
  variables = nn.Dense(2).init(KEY, X)
  mine = nn.lift_transform(lift_scale, nn.Dense, 2.0)(2).apply(variables, X)
  theirs = nn.lift_transform(other, nn.Dense, 2.0)(2).apply(variables, X)
  np.testing.assert_array_equal(theirs, -mine)  # one program, the sign of its factor flipped


def test_lift_transform_rejects_an_instance():
  with pytest.raises(errors.TransformTargetError, match=r'nn\.lift_transform\(lift_scale\)'):
    nn.lift_transform(lift_scale, nn.Dense(2), 2.0)
