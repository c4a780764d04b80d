"""`tabulate`: rows per module call with shapes and variables; totals equal flax.linen's."""
import re

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn

X = jnp.ones((16, 9))


def make(lib):
  class Block(lib.Module):
    @lib.compact
    def __call__(self, x, train=False):
      h = lib.BatchNorm(use_running_average=not train)(lib.Dense(4)(x))
      return lib.Dense(2)(lib.relu(h))

  class Top(lib.Module):
    @lib.compact
    def __call__(self, x):
      ensemble = lib.vmap(Block, variable_axes={'params': 0, 'batch_stats': 0},
                          split_rngs={'params': True}, in_axes=None, axis_size=3)
      return ensemble(name='ens')(x).mean(0) + Block()(x)
  return Top()


def total(table: str) -> str:
  return re.search(r'Total Parameters: ([\d,]+)', table).group(1)


def test_rows_list_each_call_with_shapes_and_own_variables():
  table = make(nn).tabulate(jax.random.key(0), X)
  assert total(table) == total(make(flax_nn).tabulate(jax.random.key(0), X)) == '264'
  rows = [line for line in table.splitlines() if line.startswith('│ ens') or '│ Block' in line]
  assert [row.split('│')[1].strip() for row in rows] == [
      'ens', 'ens/Dense_0', 'ens/BatchNorm_0', 'ens/Dense_1', 'Block_0', 'Block_0/Dense_0',
      'Block_0/BatchNorm_0', 'Block_0/Dense_1']
  assert 'kernel: float32[3,9,4]' in table  # the stacked ensemble kernel, at its own row
  assert table.index('params') < table.index('batch_stats')


def test_depth_folds_descendants_into_the_shown_ancestor():
  table = nn.tabulate(make(nn), jax.random.key(0), depth=1)(X)
  assert 'ens/Dense_0' not in table
  ens = next(line for line in table.splitlines() if line.startswith('│ ens'))
  assert '174 (696 B)' in ens and '24 (96 B)' in ens  # 3 x 58 params, 3 x 8 statistics
  assert total(table) == '264'


def test_flop_counting_is_refused_with_a_pointer():
  with pytest.raises(NotImplementedError, match='cost_analysis'):
    make(nn).tabulate(jax.random.key(0), X, compute_flops=True)


def test_module_paths_equal_flax():
  ours = make(nn).module_paths(jax.random.key(0), X)
  theirs = make(flax_nn).module_paths(jax.random.key(0), X)
  assert list(ours) == list(theirs)
  assert [type(m).__name__ for m in ours.values()] == [type(m).__name__ for m in theirs.values()]
  assert ours['Block_0/Dense_0'].features == 4 and ours['Block_0/Dense_0'].scope is None


def test_tabulate_sees_inside_a_jitted_submodule_already_compiled():
  class Block(nn.Module):
    @nn.jit
    @nn.compact
    def __call__(self, x):
      return nn.Dense(3)(x)

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return Block()(x)

  Model().init(jax.random.key(0), X)  # compiles Block's jit without interceptors
  assert 'Block_0/Dense_0' in Model().tabulate(jax.random.key(0), X)
