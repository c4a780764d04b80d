"""`tabulate`: rows per module call with shapes, variables and FLOPs; the text equals flax.linen's."""
import re

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn

X = jnp.ones((16, 9))
PLAIN = {'force_terminal': False, 'width': 200}


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


def test_rows_list_each_call_with_shapes_and_own_variables_and_depth_folds_them():
  table = make(nn).tabulate(jax.random.key(0), X, console_kwargs=PLAIN)
  assert total(table) == total(make(flax_nn).tabulate(jax.random.key(0), X)) == '264'
  rows = [line for line in table.splitlines() if line.startswith('│ ens') or '│ Block' in line]
  assert [row.split('│')[1].strip() for row in rows] == [
      'ens', 'ens/Dense_0', 'ens/BatchNorm_0', 'ens/Dense_1', 'Block_0', 'Block_0/Dense_0',
      'Block_0/BatchNorm_0', 'Block_0/Dense_1']
  assert 'kernel: float32[3,9,4]' in table  # the stacked ensemble kernel, at its own row
  assert table.index('params') < table.index('batch_stats')
  # depth=1 folds descendants into the shown ancestor
  table = nn.tabulate(make(nn), jax.random.key(0), depth=1, console_kwargs=PLAIN)(X)
  assert 'ens/Dense_0' not in table
  ens = next(line for line in table.splitlines() if line.startswith('│ ens'))
  assert '174 (696 B)' in ens and '24 (96 B)' in ens  # 3 x 58 params, 3 x 8 statistics
  assert total(table) == '264'


def mlp(lib):
  class Mlp(lib.Module):
    @lib.compact
    def __call__(self, x, train: bool = False):
      h = lib.Dropout(0.5, deterministic=not train)(lib.relu(lib.Dense(5)(x)))
      if train:
        self.sow('intermediates', 'h', h)
      return lib.Dense(3)(h), {'hidden': h, 'none': None}

    @lib.compact
    def encode(self, x):
      return lib.Dense(2, kernel_init=lib.with_partitioning(
          lib.initializers.lecun_normal(), ('embed', 'mlp')))(x)
  return Mlp()


def wrapped_layers(lib):
  class Recurrent(lib.Module):
    @lib.compact
    def __call__(self, x):
      scan = lib.scan(lib.LSTMCell, variable_broadcast='params', split_rngs={'params': False},
                      in_axes=1, out_axes=1)
      cell = scan(features=4, name='ScanLSTM')
      carry = cell.initialize_carry(jax.random.key(0), x[:, 0].shape)
      attention = lib.MultiHeadDotProductAttention(num_heads=2, qkv_features=4, out_features=4)
      return cell(carry, x)[1] + attention(x)
  return Recurrent()


def adopted_flax_modules(lib):
  class Adopter(lib.Module):
    @lib.compact
    def __call__(self, x):
      dense = flax_nn.Dense(4)
      if lib is nn:
        dense = nn.from_flax(dense)
      return dense(x)
  return Adopter()


CASES = {
    'from_flax': (adopted_flax_modules, X, dict(compute_flops=True)),
    'plain': (mlp, X, {}),
    'depth': (mlp, X, dict(depth=1)),
    'flops': (mlp, X, dict(compute_flops=True, compute_vjp_flops=True)),
    'kwargs': (mlp, X, dict(train=True, show_repeated=True)),
    'method and boxes': (mlp, X, dict(method='encode')),
    'flax submodules': (wrapped_layers, jnp.ones((2, 3, 4)), dict(compute_flops=True)),
    'flax submodules, depth': (wrapped_layers, jnp.ones((2, 3, 4)), dict(depth=1)),
}


@pytest.mark.parametrize('case', list(CASES))
def test_table_text_equals_flax(case):
  """Cells, markup, totals and FLOPs (wrapped flax layers list their own submodules)."""
  make_model, x, options = CASES[case]
  keys = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  ours = make_model(nn).tabulate(keys, x, **options)
  assert ours == make_model(flax_nn).tabulate(keys, x, **options)
  assert '\x1b[' in ours  # styled as Flax's, for a terminal


def test_sown_values_get_their_column_when_mutable():
  table = mlp(nn).tabulate({'params': jax.random.key(0), 'dropout': jax.random.key(1)}, X,
                           train=True, mutable=True, console_kwargs=PLAIN)
  header = table.splitlines()[3]
  assert header.index('params') < header.index('intermediates')  # Flax: either order
  assert 'h:' in table and '- float32[16,5]' in table


def test_console_options_reach_the_console():
  plain = mlp(nn).tabulate(jax.random.key(0), X, console_kwargs={'force_terminal': False})
  assert '\x1b[' not in plain and 'Total Parameters: 68 (272 B)' in plain


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


def test_boxed_inputs_show_their_axis_names_and_count_flops():
  """Flax fails here (it unboxes the recorded input); the row shows the box and its FLOPs."""
  class Use(nn.Module):
    @nn.compact
    def __call__(self, x, w):
      return x @ w.unbox()

  class Top(nn.Module):
    @nn.compact
    def __call__(self, x):
      init = nn.with_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
      return Use()(x, self.param('w', init, (9, 3), unbox=False))

  table = Top().tabulate(jax.random.key(0), X, compute_flops=True, console_kwargs=PLAIN)
  row = next(line for line in table.splitlines() if line.startswith('│ Use_0'))
  assert '│ 864 ' in row  # 16 x 9 x 3 multiply-adds
  assert "P(embed, mlp)" in table
