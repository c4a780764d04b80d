"""Flax NNX both ways: the examples of Flax's bridge guide with `flax.linen` swapped for ours.

Oracle: the same code with `flax.linen` (``check_linen_parity``, bitwise). NNX modules
enter through ``bridge.to_linen``, made inline in a compact method (adopted as Flax
adopts it), in ``setup``, under ``nn.vmap`` of the ``ToLinen`` class, and inside the
blocks of ``nn.scan`` and ``nn.Stacked``; our modules leave through ``bridge.ToNNX``.
"""
import functools

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from flax.nnx import bridge

import linen_ext as nn
from tests.helpers import assert_trees_close, assert_trees_equal, check_linen_parity

X = jax.random.normal(jax.random.key(42), (4, 8))
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}


class NNXDot(nnx.Module):
  def __init__(self, in_dim: int, out_dim: int, rngs: nnx.Rngs):
    self.w = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (in_dim, out_dim)))

  def __call__(self, x):
    return x @ self.w


@nnx.register_variable_name('counts', overwrite=True)
class Count(nnx.Variable):
  pass


class NNXMultiCollections(nnx.Module):
  def __init__(self, din: int, dout: int, rngs: nnx.Rngs):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ('in', 'out'))
    self.w = nnx.Param(init(rngs.params(), (din, dout)))
    self.lora = nnx.LoRA(din, 3, dout, rngs=rngs)
    self.count = Count(jnp.array(0))
    self.drop = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    self.count[...] += 1
    return self.drop(x @ self.w[...] + self.lora(x))


@functools.cache
def outer(lib, where: str):
  """The guide's ``LinenOuter``: an NNX module in a Linen module, made inline or in setup."""
  if where == 'compact':
    class Outer(lib.Module):
      @lib.compact
      def __call__(self, x):
        dot = bridge.to_linen(NNXDot, x.shape[-1], 6)
        b = self.param('b', lib.initializers.lecun_normal(), (1, 6))
        return dot(x) + b
    return Outer()

  class SetupOuter(lib.Module):
    def setup(self):
      self.dot = bridge.to_linen(NNXDot, X.shape[-1], 6)
      self.b = self.param('b', lib.initializers.lecun_normal(), (1, 6))

    def __call__(self, x):
      return self.dot(x) + self.b
  return SetupOuter()


@pytest.mark.parametrize('where', ['compact', 'setup'])
def test_an_nnx_module_in_a_module_of_ours_is_flaxs(where):
  def build(lib):
    model = outer(lib, where)
    y, variables = model.init_with_output(jax.random.key(0), X)
    return variables, y, model.apply(variables, 2 * X)
  (variables, *_), _ = check_linen_parity(build)
  name = 'ToLinen_0' if where == 'compact' else 'dot'
  assert jax.tree.map(jnp.shape, variables) == {'params': {name: {'w': (8, 6)}, 'b': (1, 6)}}


def test_nnx_rngs_collections_and_partition_metadata_as_flax():
  """Dropout keys from ``apply``'s rngs, a registered collection counted in place, LoRA
  params and the sharding names `NNXMeta` carries."""
  def build(lib):
    class Model(lib.Module):
      @lib.compact
      def __call__(self, x):
        return bridge.to_linen(NNXMultiCollections, x.shape[-1], 3)(x)
    model = Model()
    with jax.set_mesh(jax.make_mesh((1, 1), ('in', 'out'))):  # NNX shards eagerly
      variables = model.init(RNGS, X)
      ys = [model.apply(variables, X, rngs={'dropout': jax.random.key(k)}, mutable=['counts'])
            for k in (1, 2)]
      return variables, ys, lib.get_partition_spec(variables)
  (variables, (y1, y2), specs), _ = check_linen_parity(build)
  assert sorted(variables) == ['LoRAParam', 'counts', 'params']
  assert type(variables['params']['ToLinen_0']['w']) is bridge.NNXMeta
  assert specs['params']['ToLinen_0']['w'] == jax.sharding.PartitionSpec('in', 'out')
  assert y1[1]['counts']['ToLinen_0']['count'] == 1
  assert not jnp.array_equal(y1[0], y2[0])  # another dropout key, another mask


def test_the_to_linen_class_under_nn_vmap_is_named_and_split_as_flax():
  def build(lib):
    class Vmapped(lib.Module):
      @lib.compact
      def __call__(self, x):
        inner = lib.vmap(bridge.ToLinen, variable_axes={'params': 0},
                         split_rngs={'params': True})(nnx.Linear, args=(x.shape[-1], 5))
        return inner(x)
    variables = Vmapped().init(jax.random.key(0), X)
    return variables, Vmapped().apply(variables, X)
  (variables, y), _ = check_linen_parity(build)
  assert variables['params']['VmapToLinen_0']['kernel'].shape == (4, 8, 5)
  assert y.shape == (4, 5)


class NNXBlock(nnx.Module):
  def __init__(self, d: int, rngs: nnx.Rngs):
    self.linear = nnx.Linear(d, d, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)

  def __call__(self, x):
    return self.drop(jnp.tanh(self.linear(x)))


@functools.cache
def block(lib):
  class Block(lib.Module):
    @lib.compact
    def __call__(self, x):
      return x + bridge.to_linen(NNXBlock, x.shape[-1])(x) + lib.Dense(x.shape[-1])(x)
  return Block


def test_an_nnx_module_inside_nn_scan_splits_params_and_dropout_as_flax():
  def build(lib):
    class Step(block(lib)):
      def __call__(self, x, _):
        return super().__call__(x), None
    stack = lib.scan(Step, variable_axes={'params': 0}, split_rngs={'params': True,
                                                                   'dropout': True}, length=3)
    apply = lambda v, x: stack().apply(v, x, None, rngs={'dropout': jax.random.key(2)})[0]
    variables = stack().init(RNGS, X, None)
    return variables, apply(variables, X), jax.grad(lambda v: apply(v, X).sum())(variables)
  check_linen_parity(build)


def test_an_nnx_module_inside_stacked_inits_as_flax_vmap_and_runs_as_flax_scan():
  stack = nn.Stacked(block(nn), 3, remat='nested')
  variables = stack.init(RNGS, X)
  theirs = flax_nn.vmap(block(flax_nn), variable_axes={True: 0}, split_rngs={True: True},
                        axis_size=3, in_axes=None)
  assert_trees_equal(variables, theirs().init(RNGS, X))

  class Step(block(flax_nn)):
    def __call__(self, x):
      return super().__call__(x), None
  scan = flax_nn.scan(Step, variable_axes={True: 0}, split_rngs={True: True}, length=3)
  drop = {'dropout': jax.random.key(2)}
  assert_trees_close(stack.apply(variables, X, rngs=drop),
                     scan().apply(variables, X, rngs=drop)[0], depth=3)


@functools.cache
def linen_dot(lib):
  class LinenDot(lib.Module):
    out_dim: int

    @lib.compact
    def __call__(self, x):
      w = self.param('w', lib.initializers.lecun_normal(), (x.shape[-1], self.out_dim))
      self.sow('intermediates', 'dot_sum', jnp.sum(x @ w))
      return lib.Dropout(0.5, deterministic=False)(x @ w)
  return LinenDot


def test_a_module_of_ours_as_nnx_trains_with_nnx_as_flaxs():
  """``bridge.ToNNX``: lazy init, sown intermediates, reseeded dropout, `nnx.grad`."""
  def build(lib):
    model = bridge.lazy_init(bridge.ToNNX(linen_dot(lib)(5), rngs=nnx.Rngs(0, dropout=1)), X)
    y = model(X, mutable=True)
    nnx.reseed(model, dropout=1)
    grads = nnx.grad(lambda m: m(X).sum())(model)
    return model.w[...], y, model.dot_sum.get_value(), nnx.state(grads, nnx.Param)['w'][...]
  check_linen_parity(build)


class NNXSharded(nnx.Module):
  def __init__(self, d: int, rngs: nnx.Rngs):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ('in', 'out'))
    self.w = nnx.Param(init(rngs.params(), (d, d)))

  def __call__(self, x):
    return jnp.tanh(x @ self.w[...])


def nnx_layers(lib, how: str):
  """Three `NNXSharded` layers under ``lib``'s vmap, scan (layers axis 0 or 1) or Stacked."""
  class Layer(lib.Module):
    @lib.compact
    def __call__(self, x, *_):
      y = bridge.to_linen(NNXSharded, x.shape[-1])(x)
      return (y, None) if how.startswith('scan') else y
  named = {lib.PARTITION_NAME: 'layers'}
  if how == 'Stacked':
    return lib.Stacked(Layer, 3, metadata_params=named)
  if how == 'vmap':
    return lib.vmap(Layer, variable_axes={'params': 0}, split_rngs={'params': True},
                    in_axes=None, axis_size=3, metadata_params=named)()
  return lib.scan(Layer, variable_axes={'params': int(how[-1])}, split_rngs={'params': True},
                  length=3, metadata_params=named)()


@pytest.mark.parametrize('how', ['vmap', 'scan0', 'scan1', 'Stacked'])
def test_nnx_sharding_names_gain_the_transforms_axis(how):
  """Flax's `NNXMeta` leaves ``add_axis`` a stub (google/flax#5589); here the variable's
  sharding gains the axis name where the transform put the axis, and loses it inside."""
  args = (X,) if how in ('vmap', 'Stacked') else (X, None)
  theirs = nnx_layers(flax_nn, 'vmap' if how == 'Stacked' else how)
  with jax.set_mesh(jax.make_mesh((1, 1, 1), ('layers', 'in', 'out'))):  # NNX shards eagerly
    model = nnx_layers(nn, how)
    variables = model.init(RNGS, *args)
    y = model.apply(variables, *args)
    spec = nn.get_partition_spec(variables)['params']
    their_variables = theirs.init(RNGS, *args)
    if how == 'Stacked':  # Flax has no Stacked: its vmap inits, its scan runs
      theirs = nnx_layers(flax_nn, 'scan0')
      their_y = theirs.apply(their_variables, X, None)[0]
    else:
      their_y = theirs.apply(their_variables, *args)
    flax_made = model.apply(their_variables, *args)
  spec = jax.tree.leaves(spec, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
  names = ['in', 'out']
  names.insert(1 if how == 'scan1' else 0, 'layers')
  assert spec == [jax.sharding.PartitionSpec(*names)]
  assert_trees_equal(nn.unbox(variables), flax_nn.unbox(their_variables))
  assert_trees_close(y, their_y, depth=3)
  assert_trees_close(flax_made, their_y, depth=3)  # Flax's variables (no layers name) run here
