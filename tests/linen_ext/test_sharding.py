"""`nn.variable_shardings`: the `NamedSharding` of each variable, through every transform.

Oracle: the spec written out by hand for each model: a kernel declared with logical names
``('embed', 'mlp')`` keeps them through every transform, and every transform or stack that
adds an axis adds its ``metadata_params`` name; the rules turn the names into mesh axes in
Flax's order (`nn.logical_to_mesh_axes`). The mesh is abstract (shapes only), so no
devices are needed; tests/linen_ext/test_sharding_multidevice.py uses real ones.
"""
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import linen_ext as nn

KEY = jax.random.key(0)
X = jnp.ones((2, 8))
MESH = AbstractMesh((2, 4), ('data', 'model'))
RULES = (('layers', None), ('ens', 'data'), ('embed', 'data'), ('mlp', 'model'))
LAYERS = {nn.PARTITION_NAME: 'layers'}
KERNEL_INIT = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(8, kernel_init=KERNEL_INIT, use_bias=False)(x)


class CarryBlock(Block):
  def __call__(self, x):
    return super().__call__(x), None


class ScanLayers(nn.Module):
  def setup(self):
    self.layers = [Block() for _ in range(2)]

  def __call__(self, x):
    return nn.scan_layers(self.layers, x)


LAYER_AXIS = (('layers', 'embed', 'mlp'), P(None, 'data', 'model'))
PER_LAYER = (('embed', 'mlp'), P('data', 'model'))
SPLIT = dict(variable_axes={'params': 0}, split_rngs={'params': True})
TRANSFORMS = {
    'vmap': (lambda: nn.vmap(Block, in_axes=None, axis_size=2, metadata_params={
        nn.PARTITION_NAME: 'ens'}, **SPLIT)(), (('ens', 'embed', 'mlp'), P('data', None, 'model'))),
    'scan': (lambda: nn.scan(CarryBlock, length=2, metadata_params=LAYERS, **SPLIT)(), LAYER_AXIS),
    'remat_scan': (lambda: nn.remat_scan(Block, lengths=(2, 2), metadata_params=LAYERS)(),
                   (('layers', None, 'embed', 'mlp'), P(None, None, 'data', 'model'))),
    'Stacked': (lambda: nn.Stacked(Block, 2, metadata_params=LAYERS), LAYER_AXIS),
    'Stacked remat nested': (lambda: nn.Stacked(Block, 4, remat='nested', metadata_params=LAYERS),
                             LAYER_AXIS),
    'BlockSeq': (lambda: nn.BlockSeq(Block, 2), PER_LAYER),
    'scan_layers': (ScanLayers, PER_LAYER),
    'map_variables': (lambda: nn.map_variables(Block, 'params', lambda t: t, init=True)(),
                      PER_LAYER),
    'jit': (lambda: nn.jit(Block)(), PER_LAYER),
    'remat': (lambda: nn.remat(Block)(), PER_LAYER),
}


def kernels(tree):
  return [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(
      tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))
          if 'kernel' in jax.tree_util.keystr(path)]


@pytest.mark.parametrize('name', list(TRANSFORMS))
def test_the_kernel_keeps_its_names_and_gains_each_stacked_axis_name(name):
  make, (names, mesh_spec) = TRANSFORMS[name]
  abstract = jax.eval_shape(make().init, KEY, X)
  assert {box.names for box in kernels(abstract)} == {names}
  assert set(kernels(nn.get_partition_spec(abstract))) == {P(*names)}
  shardings = nn.variable_shardings(abstract, MESH, RULES)
  assert {s.spec for s in kernels(shardings)} == {mesh_spec}
  with nn.logical_axis_rules(RULES):  # the active rules, as Flax's helpers use them
    assert nn.variable_shardings(abstract, MESH) == shardings
    assert kernels(nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), MESH)) == \
        kernels(shardings)


def test_optimizer_state_shards_as_its_params_and_counts_are_replicated():
  abstract = jax.eval_shape(nn.Stacked(Block, 2, metadata_params=LAYERS).init, KEY, X)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
  opt_state = nn.variable_shardings(jax.eval_shape(tx.init, abstract['params']), MESH, RULES)
  params = nn.variable_shardings(abstract, MESH, RULES)['params']
  adam = opt_state[1][0]
  assert adam.mu == params and adam.nu == params
  assert adam.count.spec == P()


def test_mesh_axis_names_without_rules_and_plain_leaves_replicated():
  init = nn.with_partitioning(nn.initializers.lecun_normal(), (None, 'model'))
  abstract = jax.eval_shape(nn.Dense(8, kernel_init=init).init, KEY, X)
  shardings = nn.variable_shardings(abstract, MESH)
  assert shardings['params']['kernel'].spec == P(None, 'model')
  assert shardings['params']['bias'].spec == P()
  assert nn.variable_shardings({'a': None}, MESH) == {'a': None}
