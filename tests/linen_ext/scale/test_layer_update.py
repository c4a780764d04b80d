"""An optimizer state in host memory, updated one layer of the stack at a time: the whole
update for optimizers that treat parameters independently, refused for ones that couple
them, and on a TPU target only one layer's moments on the chip at once."""
import importlib
import pathlib
import sys

import jax
import jax.numpy as jnp
import optax
import pytest

import linen_ext as nn
from linen_ext.errors import OptimizerStreamError
from linen_ext.scale import layer_update
from tests.helpers import assert_trees_close

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / 'examples'))
llama = importlib.import_module('llama')
at_scale = importlib.import_module('train_lm_at_scale')

pytestmark = pytest.mark.usefixtures('standard_promotion')
LAYERS = 3
STACKED = {'embed': False, 'blocks': {'w': True, 'b': True}, 'head': False}


def _tree(seed, scale=1.0):
  keys = iter(jax.random.split(jax.random.key(seed), 4))
  draw = lambda shape: scale * jax.random.normal(next(keys), shape)  # noqa: E731
  return {'embed': draw((5, 4)), 'blocks': {'w': draw((LAYERS, 4, 4)), 'b': draw((LAYERS, 4))},
          'head': draw((4,))}


SEPARABLE = {
    'adamw, scheduled': optax.adamw(optax.linear_schedule(1e-2, 1e-3, 3), weight_decay=0.1),
    'sgd, nesterov momentum': optax.sgd(0.1, momentum=0.9, nesterov=True),
    'lion': optax.lion(1e-3),
    'chain': optax.chain(optax.add_decayed_weights(0.01), optax.scale_by_rms(),
                         optax.scale(-0.1)),
}


@pytest.mark.parametrize('name', SEPARABLE)
def test_updating_layer_by_layer_is_the_whole_update(name):
  """Three steps (the schedules read the step count): the same parameters and state, to
  the rounding of differently fused programs."""
  optimizer = SEPARABLE[name]

  @jax.jit
  def both(params, grads, whole, layered):
    updates, whole_state = optimizer.update(grads, whole[1], whole[0])
    new = layer_update.update_layer_by_layer(optimizer, grads, layered[1], layered[0],
                                             STACKED)
    return (optax.apply_updates(whole[0], updates), whole_state), new
  params = _tree(0)
  whole = layered = (params, optimizer.init(params))
  for step in range(3):
    whole, layered = both(params, _tree(step + 1), whole, layered)
    params = whole[0]
  assert_trees_close(layered, whole, depth=3)  # one update per step, fused differently


def test_an_optimizer_that_couples_layers_is_refused():
  clipped = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
  with pytest.raises(OptimizerStreamError, match='clip_by_global_norm.*clip_norm='):
    layer_update.check_layer_separable(clipped, _tree(0), STACKED)
  for optimizer in SEPARABLE.values():
    layer_update.check_layer_separable(optimizer, _tree(0), STACKED)


CONFIG = llama.Config(64, 32, LAYERS, 4, 2, 8, 64)


def _cpu_step(optimizer, **options):
  tokens = jax.random.randint(jax.random.key(1), (2, 17), 0, CONFIG.vocab)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:]}
  model = llama.LM(CONFIG, attention='xla', dtype=jnp.float32)
  mesh = nn.scale.make_mesh(jax.devices()[:1], {})
  return model, batch, nn.compile_train_step(
      model, batch, mesh=mesh, rules=at_scale.axis_rules({}), optimizer=optimizer,
      loss_fn=llama.next_token_loss, **options)


def test_the_offloaded_step_is_the_hand_written_clipped_step():
  """On this CPU (where host memory is the device's): two steps of the compiled step with
  the state offloaded and ``clip_norm``, against `jax.value_and_grad` and
  ``optax.chain(clip_by_global_norm, adamw)``; a coupling optimizer is refused before
  anything compiles."""
  optimizer = optax.adamw(1e-2, weight_decay=0.1)
  model, batch, step = _cpu_step(optimizer, offload_optimizer=True, clip_norm=0.05)
  with pytest.raises(OptimizerStreamError, match='`optimizer`'):
    _cpu_step(optax.chain(optax.clip_by_global_norm(0.05), optimizer), offload_optimizer=True)
  oracle = optax.chain(optax.clip_by_global_norm(0.05), optimizer)

  @jax.jit
  def oracle_step(params, opt_state):
    loss, grads = jax.value_and_grad(llama.next_token_loss)(params, model, batch)
    updates, opt_state = oracle.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  params = nn.unbox(model.init(jax.random.key(0), batch['inputs']))['params']
  state = {'params': params, 'opt_state': optimizer.init(params)}
  want = (params, oracle.init(params))
  for _ in range(2):
    state, loss = step.compiled(jax.tree.map(jnp.copy, state), batch)
    *want, want_loss = oracle_step(*want)
    assert_trees_close((loss, state['params']), (want_loss, want[0]), depth=2 * LAYERS)
  assert_trees_close(state['opt_state'], want[1][1], depth=2 * LAYERS)


def test_one_layer_s_moments_visit_the_chip_at_a_time(chips):
  """For v5e:2x2: the step needs less than the parameters and the stack's moments
  together, which a program holding every moment on the chip at once needs at least; the
  host holds the moments. Without XLA's bfloat16 propagation it needs less still (no
  bfloat16 copy of the whole stack before the layer loops)."""
  config = llama.Config(512, 512, 4, 4, 2, 128, 1024)
  batch = {'inputs': jax.ShapeDtypeStruct((4, 128), jnp.int32),
           'targets': jax.ShapeDtypeStruct((4, 128), jnp.int32)}
  mesh = nn.scale.make_mesh(chips.devices, {'data': 4})

  def compiled(options=None):  # as --plan's choice for 70B on v5e-64
    return nn.compile_train_step(
        llama.LM(config, remat='offload'), batch, mesh=mesh, rules=at_scale.axis_rules({}),
        optimizer=llama.optimizer(), loss_fn=llama.next_token_loss, clip_norm=llama.CLIP_NORM,
        offload_optimizer=True, compiler_options=options).stats
  streamed, unpropagated = compiled(), compiled(nn.scale.NO_BF16_PROPAGATION)
  abstract = nn.unbox(jax.eval_shape(llama.LM(config).init, jax.random.key(0),
                                     batch['inputs']))['params']
  per_chip = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)) / 4  # noqa: E731
  moments = 2 * per_chip(abstract['blocks'])
  assert streamed.host_bytes >= moments
  assert streamed.device_bytes < per_chip(abstract) + moments
  assert unpropagated.device_bytes < streamed.device_bytes
