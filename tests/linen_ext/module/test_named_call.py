"""Module calls run under `jax.named_scope` (Flax's named call), for profiles and HLO dumps.

Oracle: the name stacks of the equations of the same model's `apply` under flax.linen.
"""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn

X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


def model(lib, kind):
  class Block(lib.Module):
    @lib.compact
    def __call__(self, x):
      return lib.relu(lib.Dense(4)(x))

    def double(self, x):
      return 2 * x

  class Model(lib.Module):
    @lib.compact
    def __call__(self, x):
      if kind == 'method':
        block = Block()
        return block.double(block(lib.LayerNorm()(x)))
      if kind == 'remat':
        return lib.remat(Block)()(x)
      if kind == 'vmap':
        return lib.vmap(Block, variable_axes={'params': 0},
                        split_rngs={'params': True})()(jnp.stack([x, x]))
      if kind == 'jit':
        return lib.jit(Block)()(x)
      return lib.MultiHeadDotProductAttention(num_heads=2, qkv_features=4)(x[None])
  return Model()


def name_stacks(lib, kind):
  m = model(lib, kind)
  variables = m.init(jax.random.key(0), X)
  jaxpr = jax.make_jaxpr(lambda v: m.apply(v, X))(variables)
  found = set()

  def walk(j):
    for eqn in j.eqns:
      found.add(str(eqn.source_info.name_stack))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jaxpr.jaxpr)
  return found


@pytest.mark.parametrize('kind', ['method', 'remat', 'vmap', 'jit', 'flax_layer'])
def test_name_stacks_as_flax(kind):
  ours = name_stacks(nn, kind)
  assert ours == name_stacks(flax_nn, kind)
  assert any(name.endswith('Dense_0') or name.endswith('query') for name in ours)


def test_override_and_disable():
  with nn.override_named_call(False), flax_nn.override_named_call(False):
    assert name_stacks(nn, 'method') == name_stacks(flax_nn, 'method') == {''}
  nn.disable_named_call()
  try:
    assert not [name for name in name_stacks(nn, 'flax_layer') if 'MultiHead' in name]
  finally:
    nn.enable_named_call()
  assert 'Model/Block_0.double' in name_stacks(nn, 'method')
