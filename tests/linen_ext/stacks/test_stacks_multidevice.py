"""Layer stacks trained on a (data, model) mesh of 8 simulated CPU devices.

A `Stacked` model and a `scan_layers` model with partitioned kernels are
initialized and trained under `jax.jit` with the shardings that
`nn.get_partition_spec` gives: the loss and the updated parameters must equal
the single-device step's, and every parameter must come back with its spec
(the stack's layer axis added by `metadata_params`); with the layer axis
unsharded, no kernel is all-gathered whole (the stacking of `scan_layers`
keeps the per-layer shardings). JAX fixes the device count
when it starts, so the check runs in a child interpreter.
"""
import re

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import linen_ext as nn
from tests.helpers import assert_trees_close, cheap_jit, run_in_child

MARK = 'STACKS_ON_8_DEVICES_OK'
DEPTH = 4
X = jnp.linspace(-1.0, 1.0, 8 * 16).reshape(8, 16)


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    up = nn.Dense(32, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(),
                                                       (None, 'model')))
    down = nn.Dense(16, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(),
                                                         ('model', None)))
    return x + down(nn.gelu(up(nn.LayerNorm()(x))))


class Layers(nn.Module):
  def setup(self):
    self.layers = [Block() for _ in range(DEPTH)]

  def __call__(self, x):
    return nn.scan_layers(self.layers, x, remat=True)


def _models():
  return {
      'Stacked': nn.Stacked(Block, DEPTH, metadata_params={nn.PARTITION_NAME: None}),
      'Stacked, layers on data': nn.Stacked(Block, DEPTH,
                                            metadata_params={nn.PARTITION_NAME: 'data'}),
      'scan_layers': Layers(),
  }


def _train_step(model):
  def step(variables, x):
    def loss(params):
      return jnp.mean(model.apply({**variables, 'params': params}, x) ** 2)
    value, grads = jax.value_and_grad(loss)(variables['params'])
    params = jax.tree.map(lambda p, g: p - 0.1 * g, variables['params'], grads)
    return value, {**variables, 'params': params}
  return step


# (up kernel, down kernel) specs of each model's parameters
EXPECTED_SPECS = {
    'Stacked': (P(None, None, 'model'), P(None, 'model', None)),
    'Stacked, layers on data': (P('data', None, 'model'), P('data', 'model', None)),
    'scan_layers': (P(None, 'model'), P('model', None)),
}


def run_check():
  """In the child: sharded init and training step equal the single-device ones."""
  assert jax.device_count() == 8
  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(auto, auto))
  batch = NamedSharding(mesh, P('data', None))
  for name, model in _models().items():
    boxed = model.init(jax.random.key(0), X)
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), nn.get_partition_spec(boxed))
    variables = nn.unbox(boxed)
    sharded = jax.jit(lambda key: nn.unbox(model.init(key, X)), out_shardings=shardings)(
        jax.random.key(0))
    step = _train_step(model)
    sharded_step = cheap_jit(step, in_shardings=(shardings, batch),
                             out_shardings=(None, shardings))
    loss, updated = sharded_step(sharded, X)
    if 'layers on data' not in name:  # a kernel is never gathered whole: (layers,) 16 x 32
      hlo = sharded_step.lower(sharded, X).compile().as_text()
      gathered = re.findall(r'f32\[(?:\d+,)?(?:16,32|32,16)\]\S* all-gather\(', hlo)
      assert not gathered, (name, gathered)
    expected_loss, expected = cheap_jit(step)(variables, X)
    assert_trees_close((loss, updated), (expected_loss, expected), depth=3)  # sharded vs not
    kernels = [(path, leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(updated)
               if 'kernel' in jax.tree_util.keystr(path)]
    up_spec, down_spec = EXPECTED_SPECS[name]
    for path, leaf in kernels:
      spec = up_spec if 'Dense_0' in jax.tree_util.keystr(path) else down_spec
      assert leaf.sharding.spec == spec, (name, jax.tree_util.keystr(path), leaf.sharding.spec)
  print(MARK)


def test_stacks_train_sharded_as_on_one_device():
  proc = run_in_child('linen_ext.stacks.test_stacks_multidevice.run_check')
  assert MARK in proc.stdout, f'rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}'
