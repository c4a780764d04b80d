"""Module transforms: class, decorator and methods= forms, naming, setup inside.

Oracles: flax.linen on the same model source (variable trees and values); where Flax
has no such transform or form, the same model without it or Flax's class form.
"""
import functools

import flax
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import lift
import linen_ext as nn
from tests.helpers import assert_trees_close, assert_trees_equal, check_linen_parity, tolerance

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


# -- the same model, transformed as a class, through a decorated method, with methods= -----

TRANSFORMS = {
    'vmap': dict(variable_axes={'params': 0}, split_rngs={'params': True}),
    'scan': dict(variable_axes={'params': 0}, split_rngs={'params': True}, length=3),
    'checkpoint': dict(prevent_cse=False), 'remat': {}, 'jit': {},
    'map_variables': dict(mapped_collections='params', init=True,
                          trans_in_fn=lambda v: jax.tree.map(lambda a: 2 * a, v),
                          trans_out_fn=lambda v: jax.tree.map(lambda a: a / 2, v)),
    'remat_scan': dict(lengths=(2, 2)), 'fold_rngs': {},
    'add_metadata_axis': dict(variable_axes={'params': 0}, metadata_params={}),
    'shard_map': dict(mesh=jax.make_mesh((1,), ('data',)), in_specs=P(), out_specs=P(),
                      variable_specs={'params': P()}, split_rngs={'params': False}),
}
FORMS = ['class', 'method', 'methods=']


def transformed(nn, transform, form):
  """``transform`` (None: no transform) applied in ``form``; a Module named 'block'."""
  tr = getattr(nn, transform) if transform else (lambda target, **_: target)
  options = TRANSFORMS.get(transform, {})
  step = (lambda y: (y, y.sum())) if transform == 'scan' else (lambda y: y)

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, *rest):
      return step(nn.tanh(nn.Dense(4)(x)))

    def other(self, x, *rest):
      return self(x, *rest)

  class Decorated(nn.Module):  # a setup module with a decorated method
    def setup(self):
      self.dense = nn.Dense(4)

    @functools.partial(tr, **options)
    def __call__(self, x, *rest):
      return step(nn.tanh(self.dense(x)))

  if form == 'method':
    return Decorated(name='block')
  return tr(Block, **options, **({'methods': ['other']} if form == 'methods=' else {}))(name='block')


@pytest.mark.parametrize('form', FORMS)
@pytest.mark.parametrize('transform', sorted(TRANSFORMS))
def test_transform_forms_match_flax(transform, form):
  args = (X, None) if transform == 'scan' else (X,)
  method = 'other' if form == 'methods=' else None

  def run(nn, transform, form):
    model = transformed(nn, transform, form)
    y, variables = model.init_with_output(KEY, *args, method=method)
    return y, variables, model.apply(variables, *args, method=method)

  ours = run(nn, transform, form)
  if transform in ('jit', 'shard_map'):  # the oracle: the same model untransformed
    assert_trees_equal(ours, run(nn, None, form))
    if transform == 'jit':  # Flax's jit draws other keys for wrapped layers: shapes only
      assert (jax.tree.map(jnp.shape, ours) == jax.tree.map(jnp.shape, run(flax_nn, 'jit', form)))
  elif form == 'methods=' and transform in ('fold_rngs', 'add_metadata_axis', 'remat_scan'):
    assert_trees_equal(ours, run(flax_nn, transform, 'class'))  # Flax has no methods= here
  else:
    assert_trees_equal(ours, run(flax_nn, transform, form))


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


def test_setup_submodules_and_modules_in_fields_or_arguments_inside_transforms_match_flax():
  def make(nn):
    class Shared(nn.Module):
      head: nn.Module  # created by the parent, lifted with this module's scope

      def setup(self):
        self.body = nn.Dense(4)

      @functools.partial(nn.vmap, variable_axes={'params': 0}, split_rngs={'params': True})
      def __call__(self, x):
        return self.head(nn.relu(self.body(x)))

    class Apply(nn.Module):  # a module passed as an argument, its params shared
      @functools.partial(nn.vmap, variable_axes={'params': None}, split_rngs={'params': False},
                         in_axes=(0, None))
      def __call__(self, x, layer):
        return layer(x)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return Shared(nn.Dense(2, name='head'))(x), Apply()(x[None].repeat(2, 0), nn.Dense(3))
    return Model()

  variables = make(flax_nn).init(KEY, X)
  ours, _ = check_linen_parity(lambda nn: (make(nn).init(KEY, X), make(nn).apply(variables, X)))
  assert ours[0]['params']['head']['kernel'].shape == (2, 4, 2)
  dense = ours[0]['params']['Dense_0']
  assert dense['kernel'].shape == (4, 3)
  np.testing.assert_allclose(ours[1][1][0], X @ dense['kernel'] + dense['bias'][None],
                             rtol=tolerance(jnp.float32, 1), atol=tolerance(jnp.float32, 1))


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
  check_linen_parity(lambda nn: (make(nn).init(rngs, X), make(nn).apply(variables, X, rngs=rngs)))


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
  variables = make(flax_nn).init(KEY, x)
  check_linen_parity(lambda nn: (make(nn).init(KEY, x), make(nn).apply(variables, x)))


# -- map_variables --------------------------------------------------------------------------


@pytest.mark.parametrize('init, mutable', [(True, True), (True, False), (False, True)])
def test_map_variables_init_and_mutable_match_flax(init, mutable):
  def make(nn, init, mutable):
    double = lambda tree: jax.tree.map(lambda a: 2.0 * a, tree)
    halve = lambda tree: jax.tree.map(lambda a: a / 2.0, tree)
    return nn.map_variables(nn.Dense, 'params', double, halve, init=init, mutable=mutable)(3)

  variables = make(flax_nn, True, False).init(KEY, X)
  ours, _ = check_linen_parity(lambda nn: (make(nn, init, mutable).init_with_output(KEY, X),
                                           make(nn, init, mutable).apply(variables, X)))
  kernel, bias = variables['params']['kernel'], variables['params']['bias']
  assert_trees_close(ours[1], X @ (2 * kernel) + 2 * bias[None], depth=1)


def leaf(nn):
  """A Dense, a count in 'cache', a 'stats' offset drawn from 'params', and dropout."""
  class Leaf(nn.Module):
    @nn.compact
    def __call__(self, x):
      count = self.variable('cache', 'count', jnp.zeros, (), jnp.int32)
      if self.is_mutable_collection('cache'):
        count.value += 1
      offset = self.variable('stats', 'offset',
                             lambda: jax.random.normal(self.make_rng('params'), (3,)))
      return nn.Dropout(0.5, deterministic=False)(nn.Dense(3)(x)) + offset.value[None]
  return Leaf


LEAF_RNGS = {'params': KEY, 'dropout': jax.random.key(1)}


def test_map_variables_init_over_cache_gives_flax_initial_values():
  """Flax's init pass draws the first keys; the main pass creates the Dense again after them."""
  def build(nn):
    model = nn.map_variables(leaf(nn), 'cache', init=True)()
    y, variables = model.init_with_output(LEAF_RNGS, X)
    return y, variables, model.apply(variables, X, rngs=LEAF_RNGS, mutable='cache')
  (_, ours, _), (_, theirs, _) = check_linen_parity(build)
  kernel = ours['params']['Dense_0']['kernel']
  assert_trees_equal(kernel, theirs['params']['Dense_0']['kernel'])
  plain = leaf(nn)().init(LEAF_RNGS, X)['params']['Dense_0']['kernel']
  assert not jnp.array_equal(kernel, plain)  # not the untransformed module's kernel


def test_map_variables_init_over_params_gives_flax_initial_values():
  """The params are the init pass's (untransformed) ones; 'stats' and dropout draw after it."""
  def build(nn):
    double = lambda tree: jax.tree.map(lambda a: 2.0 * a, tree)
    halve = lambda tree: jax.tree.map(lambda a: a / 2.0, tree)
    model = nn.map_variables(leaf(nn), 'params', double, halve, init=True)()
    y, variables = model.init_with_output(LEAF_RNGS, X)
    return y, variables, model.apply(variables, X, rngs=LEAF_RNGS)
  (_, ours, _), _ = check_linen_parity(build)
  plain = leaf(nn)().init(LEAF_RNGS, X)
  assert_trees_equal(jax.tree.map(lambda a: 2.0 * a, ours['params']), plain['params'])
  assert not jnp.array_equal(ours['stats']['offset'], plain['stats']['offset'])


def test_map_variables_on_batch_stats_and_a_list_filter_match_flax():
  def build(nn):
    shift = lambda d: lambda v: jax.tree.map(lambda a: a + d, v)
    norm = nn.map_variables(nn.BatchNorm, 'batch_stats', shift(1.0), shift(-1.0), init=True,
                            mutable=True)(use_running_average=False)
    negated = nn.map_variables(nn.Dense, ['params'], trans_in_fn=lambda v: jax.tree.map(
        lambda a: -a, v), init=True)(4, name='d')
    y, variables = norm.init_with_output(KEY, X)
    z, negated_variables = negated.init_with_output(KEY, X)
    return (y, variables, norm.apply(variables, X, mutable=['batch_stats']), z, negated_variables,
            negated.apply(negated_variables, X))
  check_linen_parity(build)


# -- differences the audit found, now as Flax ------------------------------------------------


def private_and_compact_methods(nn):
  class Model(nn.Module):
    def setup(self):
      self.d = nn.Dense(3)
      self.table, self.items = {'a': [1, 2]}, [1, 2]  # frozen as Flax freezes them

    def _private(self, x):
      return x + 1.0

    def __call__(self, x):
      return self._private(self.d(x))

    def containers(self):
      return type(self.table).__name__, type(self.table['a']).__name__, type(self.items).__name__

  class TwoCompact(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2)(x) + self.other(x)

    @nn.compact
    def other(self, x):
      return nn.Dense(2)(x)

  variables = Model().init(KEY, X)
  return (Model().apply(variables, X, capture_intermediates=lambda m, n: True,
                        mutable=['intermediates']),
          Model().apply({}, method='containers'),
          TwoCompact().init_with_output(KEY, X), TwoCompact().init(KEY, X, method='other'))


def test_private_methods_containers_and_two_compact_methods_as_flax():
  ours, _ = check_linen_parity(private_and_compact_methods)
  assert '_private' in ours[0][1]['intermediates']
  assert ours[1] == ('FrozenDict', 'tuple', 'tuple')


def test_flax_denylist_as_a_mutable_filter():
  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        count = self.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))
        count.value += 1
        self.sow('intermediates', 'x', x)
        return nn.Dense(2)(x)
    return Model()
  variables = make(flax_nn).init(KEY, X)
  ours, _ = check_linen_parity(lambda nn: make(nn).apply(
      variables, X, mutable=flax.core.DenyList('intermediates')))
  assert set(ours[1]) == {'params', 'counter'}


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
