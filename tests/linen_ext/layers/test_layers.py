"""Flax layers inside linen_ext modules: the ready-made classes and `from_flax`.

Oracle: the same model with flax.linen modules. Variables, rng keys (dropout
masks), mutable collections and captured intermediates must be identical,
also inside lifted transforms.
"""
import inspect

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn
from tests.helpers import assert_trees_equal as assert_same
from tests.helpers import assert_trees_close, check_linen_parity

KEY = jax.random.key(0)
RNGS = {'params': KEY, 'dropout': jax.random.key(1), 'noise': jax.random.key(2)}
X = jnp.linspace(-1.0, 1.0, 24).reshape(2, 3, 4)


def check(make, *args, mutable=False, **kwargs):
  """``make(nn)`` for linen_ext and flax.linen: same variables, outputs and updates."""
  def build(lib):
    model = make(lib)
    variables = model.init(RNGS, *args, **kwargs)
    return variables, model.apply(variables, *args, rngs=RNGS, mutable=mutable, **kwargs)
  return check_linen_parity(build)[0][0]


def in_parent(nn, make_layer, calls=2):
  """A parent module calling one layer ``calls`` times (its variables sit at 'Layer_0')."""
  class Parent(nn.Module):
    @nn.compact
    def __call__(self, x):
      layer = make_layer(nn)
      return tuple(layer(x) for _ in range(calls))
  return Parent()


LAYERS = {  # every layer's parity with flax: test_native_parity.py
    'Dropout': lambda nn: nn.Dropout(0.5, deterministic=False),
    'MultiHeadDotProductAttention': lambda nn: nn.MultiHeadDotProductAttention(
        num_heads=2, qkv_features=4, dropout_rate=0.5, deterministic=False),
}


def test_every_exported_layer_is_named_as_flax():
  """A layer's automatic name is its class name: an alias would move its variables."""
  for name in dir(nn):
    ours, theirs = getattr(nn, name), getattr(flax_nn, name, None)
    if inspect.isclass(ours) and issubclass(ours, nn.Module) and inspect.isclass(theirs):
      assert ours.__name__ == theirs.__name__, name  # Fp8DotGeneral is an alias in both


def test_repeated_calls_draw_fresh_keys_and_a_root_dropout_draws_flax_keys():
  for name in ('Dropout', 'MultiHeadDotProductAttention'):  # Flax parity: above
    model = in_parent(nn, LAYERS[name])
    first, second = model.apply(model.init(RNGS, X), X, rngs=RNGS)
    assert not np.array_equal(first, second), name
  check_linen_parity(lambda nn: nn.Dropout(0.5).apply({}, X, deterministic=False, rngs=RNGS))


def test_mha_decode_cache_follows_mutability():
  def make(nn):
    class Decoder(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=4, decode=True)(x)
    return Decoder()

  def build(nn):
    variables = make(nn).init(RNGS, X)
    return variables, make(nn).apply(variables, X[:, :1], mutable=['cache'])

  variables, (_, updated) = check_linen_parity(build)[0]
  assert variables['cache']['MultiHeadDotProductAttention_0']['cache_index'] == 0
  assert updated['cache']['MultiHeadDotProductAttention_0']['cache_index'] == 1


# -- from_flax: any flax module -------------------------------------------------------------


class FlaxBlock(flax_nn.Module):
  """A composite flax module: children, dropout, batch statistics and sow."""
  features: int = 4

  @flax_nn.compact
  def __call__(self, x, train: bool = True):
    h = flax_nn.Dense(self.features)(x)
    h = flax_nn.BatchNorm(use_running_average=not train)(h)
    self.sow('intermediates', 'hidden', h)
    h = flax_nn.Dropout(0.3, deterministic=not train)(h)
    return flax_nn.Dense(self.features, name='out')(flax_nn.relu(h))


class FlaxCustom(flax_nn.Module):
  """A flax module with a variable of its own collection and an rng stream of its own."""
  @flax_nn.compact
  def __call__(self, x):
    count = self.variable('stats', 'n', jnp.zeros, ())
    if not self.is_initializing():
      count.value += 1
    noise = jax.random.uniform(self.make_rng('noise'))
    return flax_nn.GroupNorm(num_groups=2)(flax_nn.Dense(4)(x)) + noise


def wrap(nn, module):
  return nn.from_flax(module) if nn is not flax_nn else module


def test_from_flax_composite_module_matches_native_flax():
  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x, train=True):
        x = wrap(nn, FlaxBlock())(x, train)
        return wrap(nn, FlaxBlock(name='second'))(x, train)
    return Model()

  variables = check(make, X, mutable=['batch_stats', 'intermediates'])
  assert set(variables['params']) == {'FlaxBlock_0', 'second'}
  check_linen_parity(lambda nn: make(nn).apply(variables, X, rngs=RNGS, mutable=['batch_stats'],
                                               capture_intermediates=True))
  # Immutable batch_stats in eval mode: no update is asked for, none is made.
  check(make, X, train=False)


def test_bare_flax_modules_in_setup_and_fields_are_wrapped_as_flax_places_them():
  def make(nn):
    class Model(nn.Module):
      encoder: flax_nn.Module

      def setup(self):  # a flax module, a list and a dict of them, all unwrapped
        self.block = FlaxBlock()
        self.layers = [flax_nn.Dense(3), flax_nn.Dense(4)]
        self.heads = {'a': flax_nn.Dense(2)}

      def __call__(self, x, train=True):
        h = self.layers[1](self.layers[0](self.block(self.encoder(x), train)))
        return self.heads['a'](h)
    return Model(flax_nn.LayerNorm())

  variables = check(make, X, mutable=['batch_stats', 'intermediates'])
  assert set(variables['params']) == {'encoder', 'block', 'layers_0', 'layers_1', 'heads_a'}


def test_from_flax_custom_module_with_its_own_collection_and_rng_stream():
  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return (nn.from_flax(FlaxCustom(), name='c') if nn is not flax_nn
                else FlaxCustom(name='c'))(x)
    return Model()

  assert set(check(make, X, mutable=['stats'])['params']) == {'c'}


def test_from_flax_inside_vmap_and_scan_matches_flax_transforms():
  """nn.scan traces its step twice; the wrapped layers' counters continue as flax's do."""
  def make(nn):
    class Member(nn.Module):
      @nn.compact
      def __call__(self, x):
        return wrap(nn, FlaxBlock())(x)

    class Cell(nn.Module):
      @nn.compact
      def __call__(self, carry, x):
        return wrap(nn, flax_nn.SimpleCell(4, name='cell'))(carry, x)

    class Step(nn.Module):
      @nn.compact
      def __call__(self, c, _):
        return c + wrap(nn, FlaxBlock())(c), None

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        ensemble = nn.vmap(Member, variable_axes={'params': 0, 'batch_stats': 0},
                           split_rngs={'params': True, 'dropout': True}, axis_size=2,
                           in_axes=None)
        y = ensemble()(x).sum(0)
        cell = nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False},
                       in_axes=1, out_axes=1)()
        stack = nn.scan(Step, variable_axes={'params': 0, 'batch_stats': 0},
                        split_rngs={'params': True, 'dropout': True}, length=3)
        return cell(jnp.zeros((2, 4)), y)[1] + stack()(x, None)[0]
    return Model()

  variables = check(make, X, mutable=['batch_stats'])
  assert variables['params']['ScanStep_0']['FlaxBlock_0']['Dense_0']['kernel'].shape[0] == 3


def test_from_flax_and_ready_made_layers_names_and_arguments():  # misuse: tests/misuse/
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      a = nn.from_flax(flax_nn.Dense(2))(x)
      b = nn.from_flax(flax_nn.Dense(2, name='named'))(x)
      c = nn.from_flax(flax_nn.Dense(2), name='renamed')(x)
      d = nn.from_flax(flax_nn.Embed(3, 2)).call_method('attend', x[..., :2])
      return a + b + c + d.sum()

  variables = Model().init(KEY, X)
  assert set(variables['params']) == {'Dense_0', 'named', 'renamed', 'Embed_0'}
  # The ready-made layers keep Flax's constructor arguments.
  dense = nn.Dense(3, use_bias=False, name='d')
  assert dense.to_flax() == flax_nn.Dense(3, use_bias=False)
  assert (dense.features, dense.use_bias, dense.name) == (3, False, 'd')
  with pytest.raises(TypeError):
    nn.Conv(3)  # kernel_size is required, as in flax


def test_axis_metadata_helpers_are_flax_boxes_and_vmap_adds_the_axis_name():
  def make(nn):
    class Layer(nn.Module):
      @nn.compact
      def __call__(self, x):
        init = nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'mlp'))
        return nn.Dense(3, kernel_init=init)(x)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        init = nn.with_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
        y = nn.Dense(3, kernel_init=init)(x)
        w = self.param('w', nn.with_logical_partitioning(nn.initializers.ones, ('mlp',)), (3,))
        stack = nn.vmap(Layer, variable_axes={'params': 0}, split_rngs={'params': True},
                        in_axes=None, axis_size=2, metadata_params={nn.PARTITION_NAME: 'layers'})
        return y * w[None] + stack()(x).sum(0)
    return Model()

  variables = check_linen_parity(lambda nn: make(nn).init(KEY, X[0]))[0]
  kernel = variables['params']['Dense_0']['kernel']
  assert isinstance(kernel, nn.Partitioned) and kernel.names == ('embed', 'mlp')
  assert nn.get_partition_spec(variables)['params']['Dense_0']['kernel'] == \
      jax.sharding.PartitionSpec('embed', 'mlp')
  with nn.logical_axis_rules([('mlp', 'model')]):
    assert nn.logical_to_mesh_axes(('mlp',)) == jax.sharding.PartitionSpec('model')
  assert variables['params']['VmapLayer_0']['Dense_0']['kernel'].names == ('layers', None, 'mlp')


# -- flax layers holding flax submodules (RNN's cell, Sequential's layers) -------------------


def _combinators(fnn):
  return {
      'RNN': lambda: fnn.RNN(fnn.LSTMCell(4)),
      'Sequential': lambda: fnn.Sequential([fnn.Dense(4), fnn.Dropout(0.5, deterministic=False),
                                            fnn.relu, fnn.Dense(4)]),
      'WeightNorm': lambda: fnn.WeightNorm(fnn.Dense(4)),
  }


def _combinator_model(nn, name, in_setup, wrap=lambda m: m):
  make = _combinators(flax_nn)[name]
  adapt = nn.from_flax if nn is not flax_nn else (lambda m: m)

  class Model(nn.Module):
    if in_setup:
      def setup(self):
        self.layer = adapt(make())

      def __call__(self, x):
        return self.layer(x) + self.layer(x)
    else:
      @nn.compact
      def __call__(self, x):
        layer = adapt(make())  # the submodules flax binds beside it, then a native one
        return layer(x) + layer(x) + adapt(flax_nn.Dense(4))(x)

  class Outer(nn.Module):
    @nn.compact
    def __call__(self, x):
      return wrap(Model)(name='model')(x)
  return Outer()


def _vmap_remat(lib):
  return lambda m: lib.vmap(lib.remat(m), variable_axes={'params': 0},
                            split_rngs={'params': True, 'dropout': True})


@pytest.mark.parametrize('name, in_setup, lifted', [
    *((name, in_setup, False) for name in ['RNN', 'Sequential', 'WeightNorm']
      for in_setup in [False, True]), ('Sequential', False, True)])
def test_flax_combinators_place_their_submodules_as_flax(name, in_setup, lifted):
  """compact: LSTMCell_0 / Dense_0, Dense_1 beside the wrapper; setup: under it (layer/cell).
  Lifted (nn.vmap of nn.remat): the wrapper and the submodules beside it are lifted together."""
  x = jnp.ones((2, 3, 4)) if name != 'Sequential' else X
  if lifted:
    x = jnp.stack([X, -X])

  def build(lib):
    model = _combinator_model(lib, name, in_setup, _vmap_remat(lib) if lifted else lambda m: m)
    variables = model.init(RNGS, x)
    loss = lambda p: jnp.sum(model.apply({'params': p}, x, rngs=RNGS) ** 2)
    return variables, model.apply(variables, x, rngs=RNGS), jax.grad(loss)(variables['params'])
  check_linen_parity(build)


@pytest.mark.parametrize('name', ['RNN', 'Sequential', 'WeightNorm'])
def test_flax_combinator_as_the_root_module_as_flax(name):
  """The wrapped module is flax's root: its held submodules adopt flax's keys (rnn/cell)."""
  x = jnp.ones((2, 3, 4)) if name != 'Sequential' else X
  def build(lib):
    model = wrap(lib, _combinators(flax_nn)[name]())
    variables = model.init(RNGS, x)
    return variables, model.apply(variables, x, rngs=RNGS)
  check_linen_parity(build)


def test_flax_combinators_as_scan_layers_layers_give_the_loop_values():
  """scan_layers lifts each layer as a root scope: the flax layer runs at the layer's path."""
  class Model(nn.Module):
    use_scan: bool

    def setup(self):
      self.layers = [nn.from_flax(flax_nn.WeightNorm(flax_nn.Dense(4))) for _ in range(3)]

    def __call__(self, x):
      if self.use_scan:
        return nn.scan_layers(self.layers, x)
      for layer in self.layers:
        x = layer(x)
      return x

  class Flax(flax_nn.Module):
    def setup(self):
      self.layers = [flax_nn.WeightNorm(flax_nn.Dense(4)) for _ in range(3)]

    def __call__(self, x):
      for layer in self.layers:
        x = layer(x)
      return x

  variables = Model(False).init(KEY, X)
  assert_same(variables, Flax().init(KEY, X))
  assert_trees_close(Model(True).apply(variables, X), Flax().apply(variables, X), depth=6)
  grads = [jax.grad(lambda v, m=m: jnp.sum(m.apply(v, X) ** 2))(variables)
           for m in (Model(True), Flax())]
  assert_trees_close(*grads, depth=12)  # scan vs the unrolled loop


def test_batch_apply_merges_leading_axes_around_a_native_module():
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.BatchApply(nn.Dense(3))(x)

  x = jnp.linspace(-1, 1, 40).reshape(2, 5, 4)
  variables = Model().init(jax.random.key(0), x)
  kernel, bias = variables['params']['Dense_0']['kernel'], variables['params']['Dense_0']['bias']
  assert_trees_close(Model().apply(variables, x), x @ kernel + bias[None, None], depth=1)
