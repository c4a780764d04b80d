"""The native ready-made layers against `flax.linen`, in three configurations each.

Oracle: the flax.linen layer of the same name and fields. For each configuration,
a parent calls the layer twice (the second call continues the draw counts), and
the program that computes init values, outputs, mutated collections and
gradients (with respect to the parameters and the input) must be the same jaxpr
as Flax's: the same program, hence bitwise-equal values on any backend, checked
without compiling 100 programs. Under `nn.vmap` and `nn.scan` with split rngs
the lifting differs from Flax's, so there the compiled values are compared, bit
for bit.
"""
import difflib
import functools

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn
from tests.helpers import check_linen_parity, run_compiled

RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
X = jnp.linspace(-1.0, 1.0, 24).reshape(2, 3, 4)
TOKENS = jnp.array([[0, 1, 2], [3, 4, 0]])
BF16 = jnp.bfloat16


def _normal(lib):
  return lib.initializers.normal(0.3)


CONFIGS = {
    'Dense': [lambda l: l.Dense(5, use_bias=False, kernel_init=_normal(l)),
              lambda l: l.Dense(5, dtype=BF16),
              lambda l: l.Dense(3, param_dtype=BF16, dtype=jnp.float32, precision='highest')],
    'DenseGeneral': [lambda l: l.DenseGeneral((2, 3), axis=(-2, -1)),
                     lambda l: l.DenseGeneral(4, use_bias=False, dtype=BF16),
                     lambda l: l.DenseGeneral((2, 2), axis=1)],
    'Einsum': [lambda l: l.Einsum((4, 5), 'abc,cd->abd'),
               lambda l: l.Einsum((4, 5), 'abc,cd->abd', use_bias=False, dtype=BF16),
               lambda l: l.Einsum((3, 4, 2), 'abc,bcd->ad')],
    'Conv': [lambda l: l.Conv(3, (2,), padding='CAUSAL'),
             lambda l: l.Conv(3, (3,), strides=2, use_bias=False, padding='CIRCULAR'),
             lambda l: l.Conv(4, (2,), feature_group_count=2, kernel_dilation=2, dtype=BF16)],
    'ConvTranspose': [lambda l: l.ConvTranspose(3, (2,), strides=(2,)),
                      lambda l: l.ConvTranspose(3, (3,), padding='VALID', use_bias=False),
                      lambda l: l.ConvTranspose(2, (2,), transpose_kernel=True)],
    'ConvLocal': [lambda l: l.ConvLocal(3, (2,)),
                  lambda l: l.ConvLocal(3, (2,), use_bias=False, padding='VALID'),
                  lambda l: l.ConvLocal(2, (3,), strides=2, dtype=BF16)],
    'LayerNorm': [lambda l: l.LayerNorm(use_bias=False),
                  lambda l: l.LayerNorm(epsilon=1e-3, use_scale=False),
                  lambda l: l.LayerNorm(reduction_axes=(-2, -1), feature_axes=(-2, -1))],
    'RMSNorm': [lambda l: l.RMSNorm(),
                lambda l: l.RMSNorm(use_scale=False, epsilon=1e-2),
                lambda l: l.RMSNorm(scale_init=_normal(l), use_fast_variance=False)],
    'GroupNorm': [lambda l: l.GroupNorm(num_groups=2),
                  lambda l: l.GroupNorm(num_groups=None, group_size=1, use_bias=False),
                  lambda l: l.GroupNorm(num_groups=1, epsilon=1e-3)],
    'InstanceNorm': [lambda l: l.InstanceNorm(use_scale=False),
                     lambda l: l.InstanceNorm(),
                     lambda l: l.InstanceNorm(use_fast_variance=False, epsilon=1e-3)],
    'BatchNorm': [lambda l: l.BatchNorm(use_running_average=False, momentum=0.5),
                  lambda l: l.BatchNorm(use_running_average=True),
                  lambda l: l.BatchNorm(use_running_average=False, use_bias=False, axis=1)],
    'Dropout': [lambda l: l.Dropout(0.5, deterministic=False),
                lambda l: l.Dropout(0.5, deterministic=True),
                lambda l: l.Dropout(0.3, broadcast_dims=(1,), deterministic=False)],
    'PReLU': [lambda l: l.PReLU(),
              lambda l: l.PReLU(negative_slope_init=0.2),
              lambda l: l.PReLU(param_dtype=BF16)],
    'MultiHeadDotProductAttention': [
        lambda l: l.MultiHeadDotProductAttention(num_heads=2, qkv_features=4, dropout_rate=0.5,
                                                 deterministic=False),
        lambda l: l.MultiHeadDotProductAttention(num_heads=1, out_features=3, normalize_qk=True),
        lambda l: l.MultiHeadDotProductAttention(num_heads=2, use_bias=False, dtype=BF16)],
    'MultiHeadAttention': [
        lambda l: l.MultiHeadAttention(num_heads=2, qkv_features=4),
        lambda l: l.MultiHeadAttention(num_heads=4, kernel_init=_normal(l)),
        lambda l: l.MultiHeadAttention(num_heads=2, dropout_rate=0.2, deterministic=False)],
}
CELLS = {
    'LSTMCell': [lambda l: l.LSTMCell(5), lambda l: l.LSTMCell(3, gate_fn=l.hard_sigmoid),
                 lambda l: l.LSTMCell(5, activation_fn=l.relu, kernel_init=_normal(l))],
    'GRUCell': [lambda l: l.GRUCell(5), lambda l: l.GRUCell(3, recurrent_kernel_init=_normal(l)),
                lambda l: l.GRUCell(5, gate_fn=l.hard_sigmoid)],
    'OptimizedLSTMCell': [lambda l: l.OptimizedLSTMCell(5),
                          lambda l: l.OptimizedLSTMCell(3, activation_fn=l.relu),
                          lambda l: l.OptimizedLSTMCell(5, bias_init=_normal(l))],
    'SimpleCell': [lambda l: l.SimpleCell(5), lambda l: l.SimpleCell(3, residual=True),
                   lambda l: l.SimpleCell(5, dtype=BF16, kernel_init=_normal(l))],
    'MGUCell': [lambda l: l.MGUCell(5), lambda l: l.MGUCell(3, reset_gate=False),
                lambda l: l.MGUCell(5, forget_bias_init=_normal(l))],
    'ConvLSTMCell': [lambda l: l.ConvLSTMCell(5, (2,)), lambda l: l.ConvLSTMCell(3, (3,)),
                     lambda l: l.ConvLSTMCell(2, (2,), use_bias=False)],
}
EMBEDS = [lambda l: l.Embed(5, 4), lambda l: l.Embed(5, 4, dtype=BF16),
          lambda l: l.Embed(5, 3, embedding_init=_normal(l))]


def _cases(table):
  return [pytest.param(name, i, id=f'{name}-{i}') for name in sorted(table)
          for i in range(len(table[name]))]


def _twice(lib, make_layer):
  class Parent(lib.Module):
    @lib.compact
    def __call__(self, x):
      layer = make_layer(lib)
      return layer(x), layer(x)
  return Parent()


def _cell_steps(lib, make_cell):
  class Steps(lib.Module):
    @lib.compact
    def __call__(self, x):
      cell = make_cell(lib)
      inputs = x if cell.num_feature_axes == 2 else x[:, 0]
      carry = cell.initialize_carry(jax.random.key(5), inputs.shape)
      for _ in range(2):
        carry, y = cell(carry, inputs)
      return carry, y
  return Steps()


def _embed_and_attend(lib, make_embed):
  class Model(lib.Module):
    @lib.compact
    def __call__(self, tokens):
      embed = make_embed(lib)
      return embed.attend(embed(tokens)[:, 0].astype(jnp.float32))
  return Model()


def _everything(model, x):
  """Init, outputs with updates, and gradients with respect to params and input (one jit:
  eager dispatch of each op would cost seconds per case)."""
  return run_compiled(lambda x: _everything_eager(model, x), x)


def _everything_eager(model, x):
  variables = model.init(RNGS, x)
  out = model.apply(variables, x, rngs=RNGS, mutable=['batch_stats'])

  def loss(params, x):
    y, _ = model.apply({**variables, 'params': params}, x, rngs=RNGS, mutable=['batch_stats'])
    return sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(y))
  argnums = (0, 1) if jnp.issubdtype(x.dtype, jnp.floating) else 0
  return variables, out, jax.grad(loss, argnums)(variables.get('params', {}), x)


def check_same_program(build, x):
  """``build(lib)`` traces to the same jaxpr with linen_ext and flax.linen."""
  ours, theirs = (str(jax.make_jaxpr(functools.partial(_everything_eager, build(lib)))(x))
                  for lib in (nn, flax_nn))
  diff = difflib.unified_diff(ours.splitlines(), theirs.splitlines(), 'ours', 'flax', n=1)
  assert ours == theirs, '\n'.join(list(diff)[:40])


@pytest.mark.parametrize('name, i', _cases(CONFIGS))
def test_layer_is_flax_program(name, i):
  check_same_program(lambda lib: _twice(lib, CONFIGS[name][i]), X)


@pytest.mark.parametrize('name, i', _cases(CELLS))
def test_cell_is_flax_program(name, i):
  check_same_program(lambda lib: _cell_steps(lib, CELLS[name][i]), X)


@pytest.mark.parametrize('i', range(len(EMBEDS)))
def test_embed_and_attend_are_flax_program(i):
  check_same_program(lambda lib: _embed_and_attend(lib, EMBEDS[i]), TOKENS)


def test_a_layer_program_compiles_to_flax_values():
  """The jaxpr comparison above is not vacuous: the compiled values agree too."""
  check_linen_parity(lambda lib: _everything(_twice(lib, CONFIGS['BatchNorm'][0]), X))


def _lifted(lib, transform):
  """Every layer (its first configuration, after a Dense) in one lifted transform of 2 copies
  with split rngs: one compiled program per library."""
  class Inner(lib.Module):
    @lib.compact
    def __call__(self, x, _):
      h = lib.Dense(4)(x)
      return x, [CONFIGS[name][0](lib)(h) for name in sorted(CONFIGS)]

  axes, rngs = {'params': 0, 'batch_stats': 0}, {'params': True, 'dropout': True}
  if transform == 'vmap':
    lifted = lib.vmap(Inner, variable_axes=axes, split_rngs=rngs, in_axes=None, axis_size=2)
  else:
    lifted = lib.scan(Inner, variable_axes=axes, split_rngs=rngs, length=2)

  class Outer(lib.Module):
    @lib.compact
    def __call__(self, x):
      return lifted()(x, None)[1]
  return Outer()


@pytest.mark.parametrize('transform', ['vmap', 'scan'])
def test_layers_under_vmap_and_scan_equal_flax(transform):
  check_linen_parity(lambda lib: _everything(_lifted(lib, transform), X))
