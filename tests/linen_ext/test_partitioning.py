"""Flax's legacy logical-axis API (`linen_ext.partitioning`) against `flax.linen.partitioning`.

Oracle: the same model written with flax.linen and flax.linen.partitioning:
same variables, axis metadata and values for the same key, under scan and
vmap too; `get_axis_names` gives the same logical specs.
"""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest
from flax.linen import partitioning as flax_partitioning

import linen_ext as nn
from linen_ext import partitioning
from tests.helpers import assert_trees_equal as assert_same
from tests.helpers import check_linen_parity

RULES = (('embed', None), ('mlp', 'model'), ('layers', None), ('batch', 'data'))
X = jnp.linspace(-1.0, 1.0, 24).reshape(3, 8)


def models(lib, part, depth=3):
  class Block(lib.Module):
    @lib.compact
    def __call__(self, x):
      w1 = part.param_with_axes('w1', lib.initializers.lecun_normal(), (8, 16),
                                axes=('embed', 'mlp'))
      w2 = part.param_with_axes('w2', lib.initializers.lecun_normal(), (16, 8),
                                axes=('mlp', 'embed'))
      y = jnp.tanh(x @ w1) @ w2
      stats = part.variable_with_axes('stats', 'last', jnp.zeros, y.shape,
                                      axes=('batch', 'embed'))
      stats.value = y
      part.variable_with_axes('cache', 'k', jnp.zeros, y.shape, axes=('batch', 'embed'))
      return y, None

  class Layers(lib.Module):
    @lib.compact
    def __call__(self, x):
      scanned = part.scan_with_axes(
          Block, variable_axes={'params': 0, 'stats': 0, 'cache': 0}, split_rngs={'params': True},
          length=depth, axis_name='layers', axes_collections=('params', 'stats', 'cache'))
      return scanned(name='layers')(x)[0]

  class Heads(lib.Module):
    @lib.compact
    def __call__(self, x):
      heads = part.vmap_with_axes(
          Block, variable_axes={'params': 1, 'stats': 0, 'cache': 0}, split_rngs={'params': True},
          in_axes=None, axis_size=2, partitioning_axis_names={'params': 'heads'})
      return heads(name='heads')(x)[0]

  return Block(), Layers(), Heads()


@pytest.mark.parametrize('which', [0, 1, 2], ids=['module', 'scan_with_axes', 'vmap_with_axes'])
def test_variables_axis_metadata_and_values_match_flax(which):
  ours = models(nn, partitioning)[which]
  theirs = models(flax_nn, flax_partitioning)[which]
  with partitioning.axis_rules(RULES):
    v_ours = ours.init(jax.random.key(0), X)
    v_theirs = theirs.init(jax.random.key(0), X)
    assert_same(v_ours, v_theirs)
    out_ours = ours.apply(v_ours, X, mutable=['stats'])
    assert_same(out_ours, theirs.apply(v_theirs, X, mutable=['stats']))
  for collection in [c for c in v_theirs if c.endswith('_axes')]:
    assert partitioning.get_axis_names(v_ours[collection]) == \
        flax_partitioning.get_axis_names(v_theirs[collection])


def flax_functions_block(lib, explicit):
  """A block of ported code that kept `from flax.linen import partitioning`."""
  class Block(lib.Module):
    @lib.compact
    def __call__(self, x):
      module = {'module': self} if explicit else {}
      w = flax_partitioning.param_with_axes('w', lib.initializers.lecun_normal(), (8, 16),
                                            axes=('embed', 'mlp'), **module)
      stats = flax_partitioning.variable_with_axes('stats', 'last', jnp.zeros, (3, 16),
                                                   axes=('batch', 'mlp'), **module)
      stats.value = x @ w
      return stats.value
  return Block()


@pytest.mark.parametrize('explicit', [True, False], ids=['module=self', 'found on the stack'])
def test_flax_partitioning_functions_give_flax_variables(explicit):
  """Flax's functions find the running module of ours without ``module=``, as in Flax."""
  def build(lib):
    block = flax_functions_block(lib, explicit)
    variables = block.init(jax.random.key(0), X)
    return variables, block.apply(variables, X, mutable=['stats'])
  check_linen_parity(build)


def test_scan_with_axes_puts_the_layer_axis_first():
  variables = models(nn, partitioning)[1].init(jax.random.key(0), X)
  names = partitioning.get_axis_names(variables['params_axes'])['layers']
  assert names == {'w1': jax.sharding.PartitionSpec('layers', 'embed', 'mlp'),
                   'w2': jax.sharding.PartitionSpec('layers', 'mlp', 'embed')}
  assert variables['params']['layers']['w1'].shape == (3, 8, 16)


def test_remat_static_argnums_do_not_count_self():
  def model(lib, part):
    class Scaled(lib.Module):
      @lib.compact
      def __call__(self, x, double):
        y = lib.Dense(2)(x)
        return 2 * y if double else y

    class Top(lib.Module):
      @lib.compact
      def __call__(self, x):
        return part.remat(Scaled, static_argnums=(1,))()(x, True)
    return Top()

  def build(lib):
    top = model(lib, partitioning if lib is nn else flax_partitioning)
    v = top.init(jax.random.key(0), X)
    return v, jax.grad(lambda v: jnp.sum(top.apply(v, X) ** 2))(v)
  check_linen_parity(build)
