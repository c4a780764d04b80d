"""Mistakes with layer stacks: `Stacked`, `BlockSeq`, `scan_layers`, `per_layer` and the
layout conversions `layers_to_stacked` / `stacked_to_layers`."""
from typing import Any

import flax.errors as flax_errors
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
from flax import struct
from flax.core import meta

import linen_ext as nn
from lift import errors as lift_errors
from lift import loops
from linen_ext import errors

from tests.linen_ext.stacks.test_scan_layers import Layers
from tests.misuse import both, case

KEY = jax.random.key(0)
N = 4
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
RNGS = {'params': KEY, 'dropout': jax.random.key(1)}


class Block(nn.Module):
  """A residual block: one Dense and a gate."""

  @nn.compact
  def __call__(self, x, scale=1.0):
    gate = self.param('gate', nn.initializers.normal(0.5), (4,))
    return x + scale * jnp.tanh(nn.Dense(4)(x)) * gate[None]


class ScanBlock(nn.Module):
  """A block for ``scan``: returns (carry, out)."""

  @nn.compact
  def __call__(self, x):
    y = Block()(x)
    return y, jnp.sum(y, axis=-1)


class Narrowing(nn.Module):
  """A block whose output is narrower than its input: no carry for a loop."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.LayerNorm()(x))


class Norm(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.LayerNorm()(x)


class DropBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dropout(0.5, deterministic=False)(x)


class Model(nn.Module):
  """A model with its blocks in a stack at ``/layers``, as users write stacks."""
  block: type

  @nn.compact
  def __call__(self, x):
    return nn.Stacked(self.block, 3, name='layers')(x)


def stacked_variables():
  return nn.Stacked(Block, N).init(KEY, X)


def layer_variables():
  return nn.stacked_to_layers(stacked_variables())['params']


def _partitioned_stack(nn):
  class PBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
      init = nn.with_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
      return jnp.tanh(x @ self.param('w', init, (4, 4)))

  if nn is flax_nn:  # Flax's stack of layers: vmap with split rngs
    return nn.vmap(PBlock, variable_axes={True: 0}, split_rngs={True: True}, in_axes=None,
                   axis_size=3)().init(KEY, X)
  return nn.Stacked(PBlock, 3).init(KEY, X)


class StubBox(struct.PyTreeNode, meta.AxisMetadata):
  """A box with sharding names whose ``add_axis`` is a stub (as Flax's `NNXMeta` has)."""
  value: Any
  names: tuple = struct.field(pytree_node=False)

  def unbox(self):
    return self.value

  def replace_boxed(self, val):
    return self.replace(value=val)

  def add_axis(self, index, params):
    return self

  def remove_axis(self, index, params):
    return self

  def get_partition_spec(self):
    return jax.sharding.PartitionSpec(*self.names)


class StubBoxBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param('w', lambda key, shape: StubBox(nn.initializers.lecun_normal()(key, shape),
                                                   ('embed', 'mlp')), (4, 4))
    return jnp.tanh(x @ w)


STACKED = [
    case('a block under Stacked changing the shape of its carry', lambda: Model(
        Narrowing).init(KEY, X), errors.LayerStackError, 'nn.Stacked(Narrowing) at "/layers"',
         'takes the carry float32[2, 4] and returns float32[2, 2]', 'nn.BlockSeq'),
    case('inputs wider than at init, under Stacked', lambda: Model(Norm).apply(
        Model(Norm).init(KEY, X), jnp.ones((2, 8))), lift_errors.ParamShapeError,
         '"/layers/LayerNorm_0 (in nn.Stacked(Norm))"', 're-initialise'),
    case('a dropout block under Stacked applied without a dropout key', lambda: Model(
        DropBlock).apply({}, X), lift_errors.UnknownRngError,
         '"/layers/Dropout_0 (in nn.Stacked(DropBlock))"', 'rngs={"dropout": key}'),
    case('Stacked of a module instance', lambda: nn.Stacked(Block(parent=None), N),
         errors.LayerStackError, 'Stacked: block', 'is not a Module class'),
    case('Stacked of a flax.linen class', lambda: nn.Stacked(flax_nn.Dense, 3),
         errors.LayerStackError, "<class 'flax.linen.linear.Dense'> is not a Module class"),
    case('Stacked of zero layers', lambda: nn.Stacked(Block, 0), errors.LayerStackError,
         'length=0 is not a positive int'),
    case('Stacked length given a string', lambda: nn.Stacked(Block, 'a'), errors.LayerStackError,
         "length='a' is not a positive int"),
    case('Stacked metadata_params given a number', lambda: nn.Stacked(Block, N, metadata_params=3),
         errors.LayerStackError, 'Stacked: metadata_params=3 is not a dict'),
    case('Stacked remat given an unknown policy', lambda: nn.Stacked(Block, N, remat='sometimes'),
         lift_errors.RematPolicyError, "remat='sometimes'"),
    case('Stacked with more nested blocks than layers', lambda: nn.Stacked(
        Block, N, remat=loops.ScanCheckpointPolicy(nested=5)), lift_errors.RematPolicyError,
         'nested=5 outer blocks for a loop of 4 steps'),
    case('BlockSeq remat given an unknown policy', lambda: nn.BlockSeq(Block, N, remat='sometimes'),
         lift_errors.RematPolicyError, "remat='sometimes'"),
    case('BlockSeq with more nested blocks than layers', lambda: nn.BlockSeq(
        Block, N, remat=loops.ScanCheckpointPolicy(nested=5)), lift_errors.RematPolicyError,
         'nested=5 outer blocks for a loop of 4 steps'),
    case('BlockSeq length disagreeing with its modules', lambda: nn.BlockSeq(
        [nn.Dense(6, parent=None), nn.Dense(3, parent=None)], 3), errors.LayerStackError,
         'length=3 but 2 modules'),
    case('BlockSeq of one module instance', lambda: nn.BlockSeq(nn.Dense(3, parent=None), 3),
         errors.LayerStackError, 'is neither a Module class nor a non-empty list of Modules'),
    case('Stacked.scan of a block returning one array', lambda: nn.Stacked(Block, N).apply(
        stacked_variables(), X, method='scan'), errors.LayerStackError, 'nn.Stacked(Block).scan',
         'scan needs a (carry, out) pair', 'fold_via/scan_via'),
    case('Stacked.fold of a block returning a pair', lambda: nn.Stacked(ScanBlock, N).init(KEY, X),
         errors.LayerStackError, 'nn.Stacked(ScanBlock).fold',
         'fold needs the structure of its carry'),
    case('per_layer rows for another number of layers', lambda: nn.Stacked(Block, N).apply(
        stacked_variables(), X, nn.per_layer(jnp.ones(3))), errors.LayerStackError,
         'leading axis 3', 'the stack has 4 layers'),
    case('per_layer of a scalar', lambda: nn.per_layer(jnp.float32(1.0)), errors.LayerStackError,
         'scalar'),
    both('a partitioned param in a stack without metadata_params', _partitioned_stack,
         lift_errors.PartitionNameError, flax_errors.PartitioningUnspecifiedError,
         '"partition_name" is not specified in metadata_params', 'variable params/w',
         'nn.PARTITION_NAME'),
    case('a metadata box whose add_axis is a stub, in a stack', lambda: nn.Stacked(
        StubBoxBlock, 3, metadata_params={nn.PARTITION_NAME: 'layers'}).init(KEY, X),
         lift_errors.AxisMetadataError, 'variable params/w', 'StubBox box names 2 axes',
         'array with 3', 'StubBox.add_axis'),
]

LAYOUTS = [
    case('layers_to_stacked of layers with different shapes', lambda: nn.layers_to_stacked(
        {'params': dict(layer_variables(), layers_2={**layer_variables()['layers_2'],
                                                     'gate': jnp.zeros(5)})}),
         errors.LayerMismatchError, 'layer 2', 'params/gate is shape (5,)', 'but shape (4,)'),
    case('layers_to_stacked with a layer missing', lambda: nn.layers_to_stacked({'params': {
        k: layer_variables()[k] for k in ('layers_0', 'layers_1', 'layers_3')}}),
         errors.LayerStackError, 'not 0..2 without gaps'),
    case('layers_to_stacked of a tree holding more than layers', lambda: nn.layers_to_stacked(
        {'params': dict(layer_variables(), head=jnp.ones(2))}), errors.LayerStackError,
         "holds ['head'] besides"),
]


# -- scan_layers ----------------------------------------------------------------------------

def _scan_layers(make, corrupt=lambda v: v):
  return lambda: Layers(make).apply(corrupt(Layers(make).init(KEY, X, method='loop')), X)


def _wrong_checkpoint(variables):
  variables['params']['layers_2']['Dense_0']['kernel'] = jnp.zeros((4, 5))
  return variables


class Scanned(nn.Module):
  remat: object = False

  def setup(self):
    self.layers = [Block() for _ in range(N)]

  def __call__(self, x, scales=None):
    args = () if scales is None else (nn.per_layer(scales),)
    return nn.scan_layers(self.layers, x, *args, remat=self.remat)


class SharedUser(nn.Module):
  """A layer that calls a module its parent owns and hands to every layer."""
  shared: nn.Module

  @nn.compact
  def __call__(self, x, train=False):
    return x + jnp.tanh(self.shared(nn.Dense(4)(x), train))


class Effect(nn.Module):
  """A shared module that counts its calls ('count') or draws dropout ('drop')."""
  kind: str

  @nn.compact
  def __call__(self, x, train=False):
    if self.kind == 'count':
      count = self.variable('counter', 'calls', jnp.zeros, (), jnp.int32)
      count.value += 0 if self.is_initializing() else 1
    return nn.Dropout(0.5, deterministic=self.kind != 'drop' or not train)(nn.Dense(4)(x))


class Holder(nn.Module):
  kind: str

  def setup(self):
    self.shared = Effect(self.kind)
    self.layers = [SharedUser(self.shared) for _ in range(N)]

  def __call__(self, x, train=False):
    return nn.scan_layers(self.layers, x, train=train)

  def loop(self, x, train=False):
    for layer in self.layers:
      x = layer(x, train)
    return x


def _shared_effect(kind, train, mutable):
  return lambda: Holder(kind).apply(Holder(kind).init(KEY, X, method='loop'), X, train,
                                    rngs={'dropout': KEY}, mutable=mutable)


class FlaxDropoutBlock(nn.Module):
  """A block whose dropout is a wrapped flax layer: flax hashes its keys in Python."""

  @nn.compact
  def __call__(self, x):
    return nn.from_flax(flax_nn.Dropout(0.5, deterministic=False))(nn.Dense(4)(x))


def _flax_dropout(jit):
  net = (nn.jit(Layers) if jit else Layers)(lambda: [FlaxDropoutBlock() for _ in range(3)])
  return lambda: net.apply(net.init(RNGS, X, method='loop'), X, rngs={'dropout': KEY})


SCAN_LAYERS = [
    case('scan_layers over layers with different variables', _scan_layers(
        lambda: [Block() for _ in range(3)], _wrong_checkpoint), errors.LayerMismatchError,
         'layer 2 does not match layer 0: variable params/Dense_0/kernel is shape (4, 5) dtype '
         'float32 in layer 2 but shape (4, 4) dtype float32 in layer 0'),
    case('scan_layers over layers with different fields', _scan_layers(
        lambda: [nn.Dense(4, precision=p) for p in (None, 'highest', None)]),
         errors.LayerMismatchError, "layer 1 runs other code than layer 0: field 'precision'"),
    case('scan_layers over layers closing over different values', _scan_layers(
        lambda: [nn.Dense(4, kernel_init=nn.initializers.normal(s)) for s in (0.02, 0.03)]),
         errors.LayerMismatchError, 'layer 1', 'kernel_init'),
    case('scan_layers at init over layers with different fields', lambda: Layers(lambda: [
        nn.Dense(4, precision=p) for p in (None, 'highest')]).init(KEY, X),
         errors.LayerMismatchError, "field 'precision'"),
    case('scan_layers at init over layers closing over different values', lambda: Layers(lambda: [
        nn.Dense(4, kernel_init=nn.initializers.normal(s)) for s in (0.02, 0.03)]).init(KEY, X),
         errors.LayerMismatchError, 'kernel_init'),
    case('scan_layers at init over one module listed twice', lambda: Layers(
        lambda: (lambda b: [b, b])(Block())).init(KEY, X), errors.LayerStackError,
         'layers 0 and 1 are the same module'),
    case('scan_layers over one module listed twice', _scan_layers(
        lambda: (lambda b: [b, b])(Block())), errors.LayerStackError,
         'layers 0 and 1 are the same module'),
    case('scan_layers over layers changing the carry dtype', _scan_layers(
        lambda: [nn.Dense(4, dtype=jnp.bfloat16) for _ in range(3)]), errors.LayerStackError,
         'bfloat16', 'dtype=x.dtype'),
    case('scan_layers remat given an unknown policy', lambda: nn.apply(
        lambda m: nn.scan_layers(m.layers, X, remat='sometimes'), Layers(list))({}),
         lift_errors.RematPolicyError, "remat='sometimes'"),
    case('scan_layers of a module instead of a list', lambda: nn.scan_layers(Block(), X),
         errors.LayerStackError, 'not a list'),
    case('scan_layers of unbound modules', lambda: nn.scan_layers([Block()], X),
         errors.LayerStackError, 'not a bound Module'),
    case('scan_layers of flax.linen modules', lambda: nn.scan_layers(
        [flax_nn.Dense(3), flax_nn.Dense(3)], X), errors.LayerStackError, 'is not a bound Module'),
    case('scan_layers with more nested blocks than layers', lambda: Scanned(
        remat=loops.ScanCheckpointPolicy(nested=5)).init(KEY, X), lift_errors.RematPolicyError,
         'nested=5 outer blocks for a loop of 4 steps'),
    case('scan_layers per_layer rows for another number of layers', lambda: Scanned().init(
        RNGS, X, jnp.ones(3)), errors.LayerStackError, 'has 4 layers'),
    case('a shared module writing a variable inside scan_layers', _shared_effect(
        'count', False, ['counter']), errors.LayerStackError,
         'writes variable "calls" of collection "counter"', '/shared'),
    case('a shared module drawing rngs inside scan_layers', _shared_effect('drop', True, False),
         errors.LayerStackError, 'draws from rng stream "dropout"', '/shared'),
    case('a wrapped flax layer drawing rngs inside scan_layers', _flax_dropout(False),
         errors.LayerStackError, 'flax layer at', 'layers_0/Dropout_0', 'nn.Dropout'),
    case('a wrapped flax layer drawing rngs inside a jitted scan_layers', _flax_dropout(True),
         errors.LayerStackError, 'flax layer at', 'layers_0/Dropout_0'),
]

CASES = STACKED + LAYOUTS + SCAN_LAYERS
