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


@pytest.mark.parametrize('transform', sorted(TRANSFORMS))
def test_class_and_decorator_forms_agree(transform):
  transformed, decorated = block_classes(transform, TRANSFORMS[transform])
  args = (X, None) if transform == 'scan' else (X,)
  v_class, y_class = init_and_apply(transformed(name='block'), *args)
  v_method, y_method = init_and_apply(decorated(name='block'), *args)
  assert_same(v_class, v_method)
  assert_same(y_class, y_method)


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


def test_methods_list_and_per_method_options():
  class Pair(nn.Module):
    def setup(self):
      self.dense = nn.Dense(3)

    def encode(self, x):
      return self.dense(x)

    def __call__(self, x):
      return self.encode(x)

  axes = dict(variable_axes={'params': 0}, split_rngs={'params': True})
  by_list = nn.vmap(Pair, methods=['encode', '__call__'], **axes)
  by_dict = nn.vmap(Pair, methods={'encode': axes, '__call__': axes})
  v_list = by_list().init(KEY, X, method='encode')
  v_dict = by_dict().init(KEY, X, method='encode')
  assert_same(v_list, v_dict)
  assert v_list['params']['dense']['kernel'].shape == (2, 4, 3)


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


# -- jit: one trace per input structure ----------------------------------------------------


def test_jit_traces_once_per_input_structure():
  traces = []

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      traces.append(x.shape)
      return nn.Dense(4)(x)

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      block = nn.jit(Block)(name='block')
      for _ in range(3):
        x = block(x)  # the same instance, called repeatedly
      fresh = [nn.jit(Block)(name=f'fresh{i}')(x) for i in range(2)]  # same configuration
      return x + fresh[0] + fresh[1] + block(x[:1])

  model = Model()
  variables = model.init(KEY, X)
  at_init = len(traces)
  for _ in range(3):
    model.apply(variables, X)
  assert set(traces) == {(2, 4), (1, 4)}
  # 18 calls in 3 applies, same instance and fresh ones: one trace per input shape.
  assert len(traces) - at_init == 2


def test_jit_static_argnums_count_self_and_static_argnames_work():
  traces = []

  class Scale(nn.Module):
    @functools.partial(nn.jit, static_argnums=(2,), static_argnames=('power',))
    @nn.compact
    def __call__(self, x, factor, power=1):
      traces.append((factor, power))
      return nn.Dense(2)(x) * factor ** power

  variables = Scale().init(KEY, X, 2.0, power=2)
  y = Scale().apply(variables, X, 2.0, power=2)
  y3 = Scale().apply(variables, X, 3.0, power=2)
  np.testing.assert_allclose(y3 / 9.0, y / 4.0, rtol=1e-5)
  assert {t for t in traces} == {(2.0, 2), (3.0, 2)}



def test_jit_on_methods_of_an_unbound_module_as_flax():
  """Flax lets nn.jit wrap a method called on an unbound module (e.g. init_with_output)."""
  traces = []

  def make(nn):
    class Agent(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(3)(x)

      @nn.jit
      def init_with_output(self, rngs, *args, **kwargs):
        traces.append(nn.__name__)
        return super().init_with_output(rngs, *args, **kwargs)

      @functools.partial(nn.jit, static_argnums=(2,))
      def loss(self, variables, scale, x):
        assert isinstance(scale, float)  # static: self is argument 0
        return jnp.sum(self.apply(variables, x) ** 2) * scale
    return Agent

  Agent = make(nn)
  y, variables = Agent().init_with_output(KEY, X)
  assert_same((y, variables), make(flax_nn)().init_with_output(KEY, X))
  assert_same(Agent().init_with_output(KEY, X), (y, variables))  # same configuration
  assert traces == ['linen_ext', 'flax.linen']  # traced once each
  agent = Agent()
  expected = jnp.sum((X @ variables['params']['Dense_0']['kernel']
                      + variables['params']['Dense_0']['bias'][None]) ** 2) * 2.0
  np.testing.assert_allclose(agent.loss(variables, 2.0, X), expected, rtol=1e-5)
  grads = jax.grad(agent.loss)(variables, 2.0, X)
  assert jax.tree.structure(grads) == jax.tree.structure(variables)


def test_jit_traces_again_for_another_capture_filter():
  """Flax's nn.jit reuses the trace made for the first filter; ours captures as without jit."""
  def captured(jit, filters):
    class Block(nn.Module):
      @(nn.jit if jit else (lambda f: f))
      @nn.compact
      def __call__(self, x):
        return nn.Dense(3)(x)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return Block()(x)

    variables = Model().init(KEY, X)
    return [Model().apply(variables, X, capture_intermediates=f, mutable=['intermediates'])[1]
            for f in filters]

  @dataclasses.dataclass  # an unhashable filter object
  class OnlyClass:
    name: str

    def __call__(self, module, method):
      return type(module).__name__ == self.name

  filters = [True, OnlyClass('Dense'), OnlyClass('Block')]
  ours = captured(True, filters)
  assert_same(ours, captured(False, filters))
  assert list(ours[1]['intermediates']['Block_0']) == ['Dense_0']
  assert list(ours[2]['intermediates']['Block_0']) == ['__call__']


def test_checkpoint_static_argnums_count_self():
  class Block(nn.Module):
    @functools.partial(nn.checkpoint, static_argnums=(2,))
    @nn.compact
    def __call__(self, x, train):
      return nn.Dropout(0.5)(nn.Dense(4)(x), deterministic=not train)

  variables = Block().init(KEY, X, False)
  grad = jax.grad(lambda v: Block().apply(v, X, True, rngs={'dropout': KEY}).sum())(variables)
  assert grad['params']['Dense_0']['kernel'].shape == (4, 4)


# -- scan with state created inside during init --------------------------------------------


def test_scan_carries_batch_stats_created_inside_at_init():
  class Step(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      y = nn.BatchNorm(use_running_average=False, momentum=0.5)(nn.Dense(4)(x))
      return y, y.mean()

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      steps = nn.scan(Step, variable_broadcast='params', variable_carry='batch_stats',
                      split_rngs={'params': False}, length=3)
      return steps(name='steps')(x, None)

  variables = Net().init(KEY, X)
  assert variables['batch_stats']['steps']['BatchNorm_0']['mean'].shape == (4,)
  (y, means), updated = Net().apply(variables, X, mutable=['batch_stats'])
  assert means.shape == (3,)
  # The oracle: the same three steps, unrolled.
  class Unrolled(nn.Module):
    @nn.compact
    def __call__(self, x):
      step = Step(name='steps')
      for _ in range(3):
        x, _ = step(x, None)
      return x

  y_unrolled, updated_unrolled = Unrolled().apply(variables, X, mutable=['batch_stats'])
  # A loop body and its unrolled copy round differently: 3 Dense + BatchNorm layers.
  assert_trees_close((y, updated), (y_unrolled, updated_unrolled), depth=3)


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


def test_wrong_static_argnums_is_an_error_at_decoration():
  with pytest.raises(errors.StaticArgnumsError, match=r'position 3.*\[.self., .x., .train.\]'):
    class Block(nn.Module):  # noqa: F841
      @functools.partial(nn.jit, static_argnums=(3,))
      def __call__(self, x, train):
        return x
  with pytest.raises(errors.StaticArgnumsError, match='non-negative'):
    nn.checkpoint(nn.Dense, static_argnums=(-1,))


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


def test_shard_map_on_a_one_device_mesh_equals_the_plain_module():
  mesh = jax.make_mesh((1,), ('data',))
  sharded = nn.shard_map(nn.Dense, mesh, in_specs=P(), out_specs=P(),
                         variable_specs={'params': P()}, split_rngs={'params': False})
  variables = sharded(3, name='dense').init(KEY, X)
  assert_same(variables, nn.Dense(3, name='dense').init(KEY, X))
  assert_same(sharded(3).apply(variables, X), nn.Dense(3).apply(variables, X))


def test_jit_draws_the_keys_of_the_unjitted_model():
  def make(nn, jit):
    class Block(nn.Module):
      def setup(self):
        self.w = self.param('w', nn.initializers.normal(1.0), (4, 4))
        self.drop = nn.Dropout(0.5, deterministic=False)

      def __call__(self, x):
        noise = jax.random.normal(self.make_rng('dropout'), x.shape[-1:])
        return self.drop(x @ self.w) + noise[None]

    class Net(nn.Module):
      @nn.compact
      def __call__(self, x):
        block = (nn.jit(Block) if jit else Block)(name='block')
        return block(block(x))
    return Net()

  rngs = {'params': KEY, 'dropout': jax.random.key(1)}
  variables = make(flax_nn, False).init(rngs, X)
  assert_same(make(nn, True).init(rngs, X), variables)
  expected = make(flax_nn, False).apply(variables, X, rngs=rngs)
  assert_same(make(nn, True).apply(variables, X, rngs=rngs), expected)


def test_jit_of_a_module_with_an_unhashable_field():
  class Scaled(nn.Module):
    scale: jax.Array

    @nn.jit
    def __call__(self, x):
      return x * self.scale

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return Scaled(jnp.ones(4))(x)

  with pytest.raises(errors.UnhashableModuleError, match='field `Scaled.scale` is not hashable'):
    Model().init(KEY, X)


@dataclasses.dataclass  # eq without frozen: not hashable
class _Config:
  scale: float
  offsets: list


@pytest.mark.parametrize('field, doubled', [
    (np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([2.0, 4.0, 6.0, 8.0], np.float32)),
    (_Config(2.0, [1.0]), _Config(4.0, [2.0])),
    ({3.0, 1.0}, {6.0, 2.0}),
    ([np.ones(4, np.float32), {'a': [2.0]}], [np.full(4, 2.0, np.float32), {'a': [4.0]}]),
], ids=['numpy', 'dataclass', 'set', 'nested'])
def test_jit_fingerprints_unhashable_fields_by_value_as_flax(field, doubled):
  """Flax fingerprints fields item by item; a changed value compiles again."""
  def total(value):
    leaves = jax.tree.leaves(dataclasses.asdict(value) if isinstance(value, _Config) else
                             sorted(value) if isinstance(value, set) else value)
    return sum(float(np.sum(leaf)) for leaf in leaves)

  def make(nn):
    class Scaled(nn.Module):
      field: Any

      @nn.jit
      @nn.compact
      def __call__(self, x):
        return x * self.param('w', nn.initializers.ones, x.shape[-1:])[None] * total(self.field)

    class Model(nn.Module):
      field: Any

      @nn.compact
      def __call__(self, x):
        return Scaled(self.field)(x)
    return Model

  variables = make(nn)(field).init(KEY, X)
  assert_same(variables, make(flax_nn)(field).init(KEY, X))
  assert_same(make(nn)(field).apply(variables, X), make(flax_nn)(field).apply(variables, X))
  np.testing.assert_allclose(make(nn)(doubled).apply(variables, X),
                             2 * make(nn)(field).apply(variables, X), rtol=1e-6)


class _Registered:
  """A plain class known to flax.serialization, whose hash must not be used (as in Flax)."""

  def __init__(self, a):
    self.a = a

  def __hash__(self):
    raise RuntimeError('hashed')

  def __eq__(self, other):
    raise RuntimeError('compared')


serialization.register_serialization_state(
    _Registered, lambda node: {'a': node.a}, lambda node, state: _Registered(state['a']))


def test_jit_fingerprints_serializable_fields_by_state_dict():
  traces = []

  class Scaled(nn.Module):
    node: _Registered

    @nn.jit
    @nn.compact
    def __call__(self, x):
      traces.append(self.node.a)
      return self.node.a * nn.Dense(2)(x)

  variables = Scaled(_Registered(1.0)).init(KEY, X)
  traces.clear()
  y = Scaled(_Registered(1.0)).apply(variables, X)
  Scaled(_Registered(1.0)).apply(variables, X)
  y3 = Scaled(_Registered(3.0)).apply(variables, X)
  assert traces == [1.0, 3.0]  # an equal state dict reuses the trace, a changed one retraces
  np.testing.assert_allclose(y3, 3 * y, rtol=1e-6)


@pytest.mark.parametrize('transform', ['jit', 'remat'])
def test_variable_held_in_a_field_is_lifted_through_nested_transforms(transform):
  """As Flax's nested variable passing: a Variable given to a submodule's field, two levels down."""
  def make(nn, wrap):
    class Adder(nn.Module):
      var: nn.Variable

      @wrap
      @nn.compact
      def __call__(self, x):
        self.var.value += x
        return x

    class User(nn.Module):
      vars: tuple

      @wrap
      @nn.compact
      def __call__(self, x):
        return Adder(self.vars[0])(x)

    class Owner(nn.Module):
      @wrap
      @nn.compact
      def __call__(self, x):
        total = self.variable('state', 'total', jnp.zeros, x.shape)
        return User((total,))(x)
    return Owner()

  x = jnp.arange(2.0)
  theirs = make(flax_nn, getattr(flax_nn, transform))
  ours = make(nn, getattr(nn, transform))
  variables = ours.init(jax.random.key(0), x)
  assert_same(variables, theirs.init(jax.random.key(0), x))
  _, state = ours.apply(variables, x, mutable=['state'])
  np.testing.assert_allclose(state['state']['total'], 2 * x)
  assert_same(state, theirs.apply(variables, x, mutable=['state'])[1])


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
