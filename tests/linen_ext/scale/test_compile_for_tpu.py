"""Compiling for TPU topologies on this machine: a tiny LLaMA's training step for v5e
2x2 (FSDP divides the state over the chips; the flash kernel is what runs), the
planner's choice and refusal, and the errors raised before anything compiles."""
import dataclasses
import importlib
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import linen_ext as nn
from linen_ext.errors import BatchShardingError, MeshShapeError, PlanError, TopologyError
from linen_ext.scale import planner, topology

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / 'examples'))
llama = importlib.import_module('llama')
at_scale = importlib.import_module('train_lm_at_scale')

# TPU arrays are stored in tiles of 8 x 128: dimensions of whole tiles per chip keep the
# per-chip bytes those of the values.
WIDE = llama.Config(512, 512, 2, 4, 2, 128, 1024)
BATCH = {'inputs': jax.ShapeDtypeStruct((4, 128), jnp.int32),
         'targets': jax.ShapeDtypeStruct((4, 128), jnp.int32)}
# Long enough sequences that activations, not parameters, decide the memory.
DEEP = llama.Config(256, 128, 2, 4, 2, 32, 256)
LONG_BATCH = {'inputs': jax.ShapeDtypeStruct((8, 1024), jnp.int32),
              'targets': jax.ShapeDtypeStruct((8, 1024), jnp.int32)}


pytestmark = pytest.mark.usefixtures('standard_promotion')


def test_fsdp_divides_the_state_over_the_chips_and_the_flash_kernel_runs(chips):
  model = llama.LM(WIDE)  # the attention's default: the kernel, for a TPU target
  mesh = nn.scale.make_mesh(chips.devices, {'data': 4})
  step = nn.compile_train_step(model, BATCH, mesh=mesh, rules=at_scale.axis_rules({}),
                               optimizer=optax.adamw(1e-3), loss_fn=llama.next_token_loss)
  abstract = jax.eval_shape(model.init, jax.random.key(0), BATCH['inputs'])
  state = 3 * sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nn.unbox(abstract)))
  batch = 2 * BATCH['inputs'].size * 4 // 4
  # Per chip: a quarter of the params and of AdamW's two moments (and a replicated step
  # count), and the chip's quarter of the batch; replicated, the state alone is 4x that.
  assert step.stats.argument_bytes == pytest.approx(state / 4 + batch, rel=0.01)
  assert step.stats.flops > 0
  assert step.stats.collectives['all-gather'] > 0  # FSDP gathers each layer's weights
  assert 'tpu_custom_call' in step.compiled.as_text()  # the Pallas kernel, not XLA's scores
  on_cpu = jax.jit(model.apply).lower(jax.eval_shape(model.init, jax.random.key(0),
                                                     BATCH['inputs']), BATCH['inputs'])
  assert 'tpu_custom_call' not in on_cpu.as_text()  # the same model, the XLA form here


@pytest.fixture(scope='module')
def every_trial(chips):
  """Every candidate of remat none/full/offload x optimizer on chip/host, compiled: the
  oracle the planner's pruning is checked against."""
  chip = nn.scale.step_time.chip_of(chips.devices)
  found = planner.candidates(4, remat=('none', 'full', 'offload'))
  # XLA's attention: the flash kernel's fixed buffers outweigh this model's activations,
  # where saving more can need more memory (the order the search assumes, notes/0008).
  traced = {c: planner._trace(llama.LM(DEEP, attention='xla'), LONG_BATCH, chips.devices, c,
                              at_scale.axis_rules, optax.adamw(1e-3), llama.next_token_loss)
            for c in found}
  return {c: planner._compile(c, t[0], t[1], chip) for c, t in traced.items()}, traced


@pytest.fixture(scope='module')
def tiny_plan(every_trial, chips):
  trials, _ = every_trial
  chosen = planner.choose(tuple(trials.values()), 2 ** 30, 0.0)
  return nn.scale.Plan(chosen.candidate, chosen.stats, tuple(trials.values()), 2 ** 30, 0.0,
                       nn.scale.step_time.chip_of(chips.devices),
                       min(t.stats.flops for t in trials.values()))


def _by(trials, remat, offload=False):
  return next(t for t in trials if (t.candidate.remat, t.candidate.offload_optimizer)
              == (remat, offload))


def test_the_plan_is_the_fastest_candidate_that_fits(tiny_plan):
  none, full = _by(tiny_plan.trials, 'none'), _by(tiny_plan.trials, 'full')
  assert full.stats.flops > none.stats.flops  # the forward pass, recomputed
  assert full.stats.temp_bytes < none.stats.temp_bytes
  assert tiny_plan.best.remat == 'none'  # everything fits 1 GiB: the fastest wins
  between = (full.stats.device_bytes + none.stats.device_bytes) // 2
  assert planner.choose(tiny_plan.trials, between, 0.0).candidate.remat == 'full'
  text = str(tiny_plan)
  assert 'remat=full' in text and 'fits' in text and 'modelled, not measured' in text
  assert tiny_plan.configure(llama.LM(DEEP)).remat is False


def test_the_step_time_model_orders_what_is_certain(tiny_plan):
  """More recomputation, and more host traffic, never model faster."""
  time = {(t.candidate.remat, t.candidate.offload_optimizer): t.time.total
          for t in tiny_plan.trials}
  assert time['none', False] < time['full', False] < time['offload', False]
  for remat in ('none', 'full', 'offload'):
    assert time[remat, False] < time[remat, True]  # the optimizer state over the host link
  offloaded = _by(tiny_plan.trials, 'offload')
  assert offloaded.time.host > 0
  # In host memory: each layer's input, in the dtype the blocks compute in (bfloat16), for
  # the chip's 2 sequences; not the layer's parameters, which stay where they are.
  assert offloaded.stats.host_bytes == DEEP.depth * 2 * 1024 * DEEP.d_model * 2
  assert _by(tiny_plan.trials, 'none').stats.collective_bytes > 0  # FSDP's gathers


def test_pruning_never_skips_what_compiling_everything_would_choose(every_trial, monkeypatch):
  """For limits between every two candidates' needs, the search (fed the compiled
  results) chooses what choosing among all of them does, compiling fewer."""
  trials, traced = every_trial
  # a second compile without bfloat16 propagation gives the first's figures here
  monkeypatch.setattr(planner, '_compile',
                      lambda c, *_: trials[dataclasses.replace(c, bf16_propagation=True)])
  needs = sorted({t.stats.device_bytes for t in trials.values()})
  compiled = []
  for budget in [needs[0] - 1] + [n + 1 for n in needs]:
    try:
      want = planner.choose(tuple(trials.values()), budget, 0.0).candidate
    except PlanError:
      want = None
    lines = []
    searched, _ = planner._search(list(trials), traced.get, budget,
                                  nn.scale.step_time.CHIPS['v5e'], lines.append)
    skipped = [t.candidate for t in searched if t.skipped]
    assert want not in skipped, (budget, lines)
    if want is not None:
      assert planner.choose(searched, budget, 0.0).candidate == want, (budget, lines)
    compiled.append(len(trials) - len(skipped))
  assert min(compiled) < len(trials) and max(compiled) < len(trials), compiled


def test_a_near_miss_is_compiled_again_without_bf16_propagation(every_trial, monkeypatch):
  """A candidate that misses the limit by less than half its parameters' bytes (the
  bfloat16 copy XLA's propagation can keep) is compiled once more without the pass, and
  that compile is the trial where it needs less; a wider miss is not compiled again."""
  trials, traced = every_trial
  first = _by(trials.values(), 'offload')
  need, parameters = first.stats.device_bytes, first.parameter_bytes
  assert parameters > 0
  smaller = dataclasses.replace(first.stats, temp_bytes=first.stats.temp_bytes - parameters // 4)
  compiled = []

  def fake(candidate, *_):
    compiled.append(candidate)
    if candidate.bf16_propagation:
      return first
    return planner.Trial(candidate, smaller, parameter_bytes=parameters)
  monkeypatch.setattr(planner, '_compile', fake)
  lines = []
  trial = planner._decide(first.candidate, traced[first.candidate], {},
                          need - parameters // 8, None, 0.0, lines.append)
  assert [c.bf16_propagation for c in compiled] == [True, False]
  assert trial.candidate.describe().endswith('no bf16 propagation') and trial.stats == smaller
  args = at_scale.build_parser().parse_args(['--compile-for', 'v5e-4', '--plan'])
  assert at_scale.plan_flags(args, trial.candidate).endswith('--no-bf16-propagation')
  compiled.clear()
  planner._decide(first.candidate, traced[first.candidate], {}, need - parameters // 2 - 1,
                  None, 0.0, lines.append)
  assert [c.bf16_propagation for c in compiled] == [True]


def test_ctrl_c_stops_the_search_between_compiles_and_says_what_was_compiled(every_trial,
                                                                             monkeypatch):
  trials, traced = every_trial
  compiled = []

  def compile_then_interrupt(candidate, *_):
    if compiled:
      raise KeyboardInterrupt  # what Python raises once the compile in progress returns
    compiled.append(candidate)
    return trials[candidate]
  monkeypatch.setattr(planner, '_compile', compile_then_interrupt)
  lines = []
  with pytest.raises(KeyboardInterrupt):
    planner._search(list(trials), traced.get, 2 ** 30, None, lines.append)
  assert lines[-1].startswith(f'stopped (Ctrl-C) after 1 compiled: {compiled[0].describe()} ')


def test_the_planner_refuses_when_nothing_fits_and_names_the_smallest_need(tiny_plan):
  smallest = min(t.stats.device_bytes for t in tiny_plan.trials)
  need = nn.scale.compiled.size_text(smallest).strip()
  smallest_by = min(tiny_plan.trials, key=lambda t: t.stats.device_bytes).candidate
  with pytest.raises(PlanError, match=rf'smallest need is {need}, by {smallest_by.describe()}'):
    planner.choose(tiny_plan.trials, smallest - 1, 0.0)


def test_bad_requests_fail_before_compiling(chips, monkeypatch):
  with pytest.raises(TopologyError, match="unknown TPU topology 'v5e-3'. Known: v5e-4, "):
    nn.tpu_topology('v5e-3')
  with pytest.raises(MeshShapeError, match=r"mesh \{'data': 3\} does not fit 4 chips"):
    nn.scale.make_mesh(chips.devices, {'data': 3})
  mesh = nn.scale.make_mesh(chips.devices, {'data': 4})
  odd = {'inputs': jnp.zeros((6, 8), jnp.int32)}
  with pytest.raises(BatchShardingError, match=r"batch\['inputs'\]: its 6 examples do not "
                                               r"divide over the data axes \('data',\)"):
    nn.scale.batch_sharding(odd, mesh, at_scale.axis_rules({}))
  monkeypatch.setattr(topology, '_libtpu_present', lambda: False)
  with pytest.raises(TopologyError, match=r"needs libtpu .* pip install 'libtpu"):
    nn.tpu_topology('v5e-4')


def test_the_model_must_have_the_fields_the_plan_varies(chips):
  with pytest.raises(PlanError, match=r"fields \['remat'\], which Dense does not have"):
    nn.plan(nn.Dense(4), {'inputs': np.zeros((4, 2))}, chips, rules=())


def test_the_flash_trained_model_decodes_with_the_step_as_scan_derives():
  """The kernel is the training step's; decoding steps the KV cache (of the key/value
  heads only) that `as_scan` derives from the same model."""
  config = llama.PRESETS['tiny']
  model = llama.LM(config, attention='flash', dtype=jnp.float32)
  tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, config.vocab)
  reference = model.clone(attention=None)  # the same variables; runs on this CPU
  variables = reference.init(jax.random.key(0), tokens)
  step, carry = nn.as_scan(model, variables, tokens, time_axis=1)
  carry, logits = jax.lax.scan(step, carry, tokens.T)
  want = reference.apply(variables, tokens)
  np.testing.assert_allclose(jnp.swapaxes(logits, 0, 1), want, rtol=1e-4, atol=1e-4)
  caches = [x.shape for x in jax.tree.leaves(carry) if x.ndim == 5]
  assert caches and all(shape[2] == config.kv_heads for shape in caches)


@pytest.mark.parametrize('flags', [[], ['--offload-optimizer']], ids=['', 'optimizer on host'])
def test_a_pipeline_over_two_slices_sends_only_permutes_between_them_in_its_ticks(capsys,
                                                                                   flags):
  """With the optimizer state on the host too: a stack split over the stages is updated
  whole, not in a loop that would gather each layer's moments across the slices."""
  result = at_scale.main(['--compile-for', 'v5e-4', '--num-slices', '2', '--model', 'tiny',
                          '--pipeline-stages', '2', '--microbatches', '2',
                          '--seq-length', '128', *flags])
  printed = capsys.readouterr().out
  assert result['mesh'] == {'stage': 2, 'data': 4, 'model': 1} and result['fits']
  assert result['attention'] == 'flash'  # the default, per shard inside the pipeline's stages
  assert re.search(r"inside loops \(a pipeline's ticks\): collective-permute \d+\n", printed)
  assert printed.count('between slices:') == 1 and 'result: model=tiny' in printed
