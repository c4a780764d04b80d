"""Models written with `flax.linen` and with Flax NNX through `nn.compile_train_step` and
`nn.plan` for TPU v5e 2x2: FSDP divides their state over the chips as it does ours, the
planner's remat reaches a `flax.linen` model's own field, and an NNX model's step
computes what a hand-written NNX step does."""
from typing import Any

import flax.linen as fnn
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import linen_ext as nn
from linen_ext.scale.flops import jaxpr_flops
from linen_ext.scale.train_step import traced_train_step
from tests.helpers import assert_trees_close

# The sharded axis ('embed', over the 4 chips) is a whole 128-lane tile per chip, and no
# parameter is left replicated (no biases, norms without scales): per chip, the state's
# bytes are a quarter of its values'.
VOCAB, EMBED, MLP = 256, 512, 256
BATCH = {'inputs': jax.ShapeDtypeStruct((8, 128), jnp.int32),
         'targets': jax.ShapeDtypeStruct((8, 128), jnp.int32)}
RULES = [('batch', 'data'), ('embed', 'data'), ('mlp', None), ('vocab', None)]


pytestmark = pytest.mark.usefixtures('standard_promotion')


def linen_named(*names):
  return fnn.with_logical_partitioning(fnn.initializers.lecun_normal(), names)


class LinenBlock(fnn.Module):
  @fnn.compact
  def __call__(self, x):
    h = fnn.LayerNorm(use_scale=False, use_bias=False)(x)
    h = fnn.Dense(MLP, use_bias=False, kernel_init=linen_named('embed', 'mlp'))(h)
    return x + fnn.Dense(EMBED, use_bias=False, kernel_init=linen_named('mlp', 'embed'))(
        fnn.gelu(h))


class LinenLM(fnn.Module):
  remat: Any = False  # the planner's value: False, or a name ('full': fnn.remat)

  @fnn.compact
  def __call__(self, tokens):
    x = fnn.Embed(VOCAB, EMBED, embedding_init=linen_named('vocab', 'embed'))(tokens)
    block = fnn.remat(LinenBlock) if self.remat else LinenBlock
    for _ in range(2):
      x = block()(x)
    return fnn.Dense(VOCAB, use_bias=False, kernel_init=linen_named('embed', 'vocab'))(x)


def nnx_named(*names):
  return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


class NnxBlock(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.norm = nnx.LayerNorm(EMBED, use_scale=False, use_bias=False, rngs=rngs)
    self.up = nnx.Linear(EMBED, MLP, use_bias=False, kernel_init=nnx_named('embed', 'mlp'),
                         rngs=rngs)
    self.down = nnx.Linear(MLP, EMBED, use_bias=False,
                           kernel_init=nnx_named('mlp', 'embed'), rngs=rngs)

  def __call__(self, x):
    return x + self.down(nnx.gelu(self.up(self.norm(x))))


class NnxLM(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, EMBED, rngs=rngs, embedding_init=nnx.with_partitioning(
        nnx.initializers.normal(), ('vocab', 'embed')))
    self.blocks = nnx.List([NnxBlock(rngs) for _ in range(2)])
    self.head = nnx.Linear(EMBED, VOCAB, use_bias=False, kernel_init=nnx_named('embed', 'vocab'),
                           rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    for block in self.blocks:
      x = block(x)
    return self.head(x)


def nnx_lm(abstract: bool) -> NnxLM:
  """The NNX model, allocated or only its shapes (as a model too large for this machine
  is made); its names are logical, for the step's rules, not placed on a mesh here."""
  with nnx.use_eager_sharding(False):
    return nnx.eval_shape(lambda: NnxLM(nnx.Rngs(0))) if abstract else NnxLM(nnx.Rngs(0))


def size(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def check_fsdp(stats, params_bytes):
  """Per chip: a quarter of the params and of AdamW's two moments (and a replicated step
  count), and the chip's quarter of the batch; replicated, the state alone is 4x that."""
  batch = size(BATCH) // 4
  assert stats.argument_bytes == pytest.approx(3 * params_bytes / 4 + batch, rel=1e-3)
  assert stats.flops > 0


@pytest.fixture(scope='module')
def fsdp(chips):
  return nn.scale.make_mesh(chips.devices, {'data': 4})


def test_a_flax_linen_model_compiles_with_its_state_divided_over_the_chips(fsdp):
  model = LinenLM()
  step = nn.compile_train_step(model, BATCH, mesh=fsdp, rules=RULES,
                               optimizer=optax.adamw(1e-3))
  abstract = jax.eval_shape(model.init, jax.random.key(0), BATCH['inputs'])
  check_fsdp(step.stats, size(fnn.unbox(abstract)))


def test_an_abstract_nnx_model_compiles_with_its_state_divided_over_the_chips(fsdp):
  model = nnx_lm(abstract=True)
  step = nn.compile_train_step(model, BATCH, mesh=fsdp, rules=RULES,
                               optimizer=optax.adamw(1e-3))
  check_fsdp(step.stats, size(nnx.state(model, nnx.Param)))


def test_the_planner_sets_a_flax_linen_model_s_remat_field(fsdp, chips):
  """`fnn.remat` recomputes the blocks: the plan's FLOPs with remat 'full' are those of
  the model built with it, more than without."""
  none, full = (jaxpr_flops(traced_train_step(LinenLM(remat), BATCH, mesh=fsdp, rules=RULES,
                                              optimizer=optax.adamw(1e-3)).jaxpr) / 4
                for remat in (False, 'full'))
  assert full > none
  chosen = nn.plan(LinenLM(), BATCH, chips, rules=RULES, remat=('full',),
                   offload_optimizer=(False,))
  assert chosen.stats.flops == full and chosen.configure(LinenLM()).remat == 'full'


def test_the_planner_varies_an_nnx_model_s_mesh_and_keeps_it_as_built(chips):
  model = nnx_lm(abstract=True)
  chosen = nn.plan(model, BATCH, chips, rules=RULES, remat=None, tensor=(1, 2),
                   offload_optimizer=(False,))
  meshes = [dict(t.candidate.mesh) for t in chosen.trials if t.stats is not None]
  assert meshes == [{'stage': 1, 'data': 4, 'model': 1}, {'stage': 1, 'data': 2, 'model': 2}]
  assert chosen.best.remat is None and 'remat=' not in str(chosen)
  assert chosen.configure(model) is model
  fsdp = next(t for t in chosen.trials if dict(t.candidate.mesh)['data'] == 4)
  check_fsdp(fsdp.stats, size(nnx.state(model, nnx.Param)))


def test_an_nnx_model_s_step_is_a_hand_written_nnx_step():
  """On this CPU: the compiled step's loss and updated parameters are those of
  `jax.value_and_grad` of the loss of `nnx.merge(graphdef, params)` and AdamW's update."""
  model = nnx_lm(abstract=False)
  tokens = jax.random.randint(jax.random.key(1), (8, 129), 0, VOCAB)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:]}
  mesh = nn.scale.make_mesh(jax.devices()[:1], {})
  optimizer = optax.adamw(1e-2)
  step = nn.compile_train_step(model, batch, mesh=mesh, rules=RULES, optimizer=optimizer)
  graphdef, state = nnx.split(model)

  def loss(state):
    logits = nnx.merge(graphdef, state)(batch['inputs'])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets']).mean()
  want_loss, grads = jax.jit(jax.value_and_grad(loss))(state)
  params = nnx.to_pure_dict(state)
  updates, _ = optimizer.update(nnx.to_pure_dict(grads), optimizer.init(params), params)
  want = optax.apply_updates(params, updates)
  donated = jax.tree.map(jnp.copy, {'params': params, 'opt_state': optimizer.init(params)})
  got, got_loss = step.compiled(donated, batch)
  assert_trees_close((got_loss, got['params']), (want_loss, want), depth=8)
