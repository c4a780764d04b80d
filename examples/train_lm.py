"""Train a decoder-only Transformer to add numbers, then decode with the step `as_scan` derives.

The main job of the project, end to end:

* the model is written once, for whole sequences, with `linen_ext`: token and
  position embeddings, an `nn.Stacked` of pre-LN blocks (one compiled loop over
  the layers, rematerialised by the policy ``--remat``), causal self-attention,
  an output head;
* a task it generates itself: ``"123+045="`` followed by the sum's digits,
  least significant first (``"8610"``), so that carries flow in the order the
  digits are generated; the loss is on the answer digits only;
* optax's AdamW with warmup and cosine decay and gradient clipping, in one
  `jax.jit` step; a `rich` progress bar with the live loss and tokens/s;
* evaluation by greedy decoding of held-out problems (never trained on) with
  `lift.generate`: the prompt prefilled in parallel, then the one-token step that
  `as_scan` derives from the training-mode model, checked against decoding by
  recomputing the full model on every prefix;
* orbax checkpoints every ``--checkpoint-every`` steps; ``--resume`` continues
  from the latest complete one with the same loss curve, on the same mesh or another
  (or starts at step 0 when there is none yet, as a restarted job needs); SIGTERM or
  SIGINT finishes the step under way, saves a checkpoint there on every process and
  exits 0 (a second signal exits at once); a NaN loss stops the run and keeps the last
  good checkpoint (examples/train_lm_checkpoints.py);
* on a device mesh (``--mesh data=4,model=2``: FSDP x tensor parallelism; or
  ``--mesh stage=4,data=2 --pipeline-stages 4 --microbatches 8``: the blocks as a
  pipeline, `Stacked.pipeline`, its stages over ``stage``, the same variables), with
  the variables created directly in their shards and the per-device memory of
  params + optimizer state printed; over several processes (``--processes 2``,
  `jax.distributed` on 127.0.0.1); examples/train_lm_mesh.py holds that part;
* a model summary (`nn.tabulate`) at start and a PNG of the loss and accuracy.

It ends with one line (both paths absolute):
``result: accuracy=<float> decode_matches_recompute=<bool> checkpoint=<dir> plot=<png>``.
Flags it cannot run with end it before anything is written, with one line that names the
flag to pass (``error: --pipeline-stages 3: ... Fix: --pipeline-stages 1, 2 or 4.``).

Run: python examples/train_lm.py [--help]   (its flags: examples/train_lm_flags.py)
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lift
import linen_ext as nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # its sibling modules
import command_line  # noqa: E402
import train_lm_checkpoints as checkpoints  # noqa: E402
import train_lm_mesh as mesh_lib  # noqa: E402
from train_lm_flags import check_mesh, parse_args  # noqa: E402
from command_line import UsageError  # noqa: E402

PLUS, EQUALS = 10, 11  # token ids; the digits are 0-9
VOCAB = 12


# ----------------------------------------------------------------------------- the task


@dataclasses.dataclass(frozen=True)
class Addition:
  """Problems ``a+b=`` with ``digits``-digit operands and the sum reversed."""
  digits: int

  @property
  def prompt_length(self) -> int:  # "123+045="
    return 2 * self.digits + 2

  @property
  def answer_length(self) -> int:  # the sum has at most digits + 1 digits
    return self.digits + 1

  @property
  def length(self) -> int:
    return self.prompt_length + self.answer_length

  def held_out(self, a, b):
    """About 1 problem in 20 is never trained on; evaluation draws from those."""
    return (a * 1009 + b * 917) % 20 == 0

  def encode(self, a, b):
    """Token rows for the problems ``a + b`` (integer arrays of one shape)."""
    xp = jnp if isinstance(a, jax.Array) else np
    def digits(n, count):  # most significant first
      return xp.stack([(n // 10 ** i) % 10 for i in reversed(range(count))], -1)
    plus = xp.full(a.shape + (1,), PLUS, a.dtype)
    equals = xp.full(a.shape + (1,), EQUALS, a.dtype)
    answer = digits(a + b, self.answer_length)[..., ::-1]
    return xp.concatenate([digits(a, self.digits), plus, digits(b, self.digits),
                           equals, answer], -1)

  def train_batch(self, key, batch: int) -> jax.Array:
    high = 10 ** self.digits
    a, b = jax.random.randint(key, (2, batch), 0, high)
    b = jnp.where(self.held_out(a, b), (b + 1) % high, b)  # b + 1 is never held out
    return self.encode(a, b)

  def eval_problems(self, count: int, seed: int = 1) -> np.ndarray:
    high = 10 ** self.digits
    a, b = np.random.default_rng(seed).integers(0, high, (2, 40 * count))
    keep = self.held_out(a, b)
    return self.encode(a[keep][:count], b[keep][:count])


# ----------------------------------------------------------------------------- the model


def named(init, *names):
  """``init`` whose variables carry logical axis names (the mesh's rules shard them)."""
  return nn.with_logical_partitioning(init, names)


DEFAULT_KERNEL, ZEROS = nn.initializers.lecun_normal(), nn.initializers.zeros_init()


class Block(nn.Module):
  """A pre-LN Transformer block: causal self-attention, then an MLP; computed in ``dtype``
  (the variables stay float32)."""
  d_model: int
  heads: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):  # [batch, length, d_model]
    h = nn.LayerNorm(dtype=self.dtype)(x)
    head_dim = self.d_model // self.heads
    q, k, v = (nn.DenseGeneral((self.heads, head_dim), name=name, dtype=self.dtype,
                               kernel_init=named(DEFAULT_KERNEL, 'embed', 'heads', 'kv'),
                               bias_init=named(ZEROS, 'heads', 'kv'))(h)
               for name in ('query', 'key', 'value'))
    attended = nn.causal_self_attention(q, k, v)  # as_scan turns it into a KV cache
    x = x + nn.DenseGeneral(self.d_model, axis=(-2, -1), name='out', dtype=self.dtype,
                            kernel_init=named(DEFAULT_KERNEL, 'heads', 'kv', 'embed'))(attended)
    h = nn.Dense(4 * self.d_model, dtype=self.dtype,
                 kernel_init=named(DEFAULT_KERNEL, 'embed', 'mlp'),
                 bias_init=named(ZEROS, 'mlp'))(nn.LayerNorm(dtype=self.dtype)(x))
    return x + nn.Dense(self.d_model, dtype=self.dtype,
                        kernel_init=named(DEFAULT_KERNEL, 'mlp', 'embed'))(nn.gelu(h))


class TransformerLM(nn.Module):
  """Tokens ``[batch, length]`` to next-token logits ``[batch, length, vocab]``, computed in
  ``dtype`` (float32 or bfloat16; the variables stay float32)."""
  vocab: int
  max_length: int
  d_model: int = 64
  heads: int = 4
  depth: int = 2
  remat: str | bool = 'nested'
  pipeline_stages: int = 1  # > 1: the blocks run as a pipeline (Stacked.pipeline)
  microbatches: int = 1
  stage_axis: str | None = None  # the mesh axis the stages are spread over
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens):
    length = tokens.shape[-1]
    positions = self.param('positions', named(nn.initializers.normal(0.02), 'length', 'embed'),
                           (self.max_length, self.d_model))
    embed = nn.Embed(self.vocab, self.d_model, dtype=self.dtype,
                     embedding_init=named(nn.linear.default_embed_init, 'vocab', 'embed'))
    x = embed(tokens) + positions[None, :length].astype(self.dtype)
    blocks = nn.Stacked(Block, self.depth, remat=self.remat,
                        block_kwargs={'d_model': self.d_model, 'heads': self.heads,
                                      'dtype': self.dtype},
                        metadata_params={nn.PARTITION_NAME: 'layers'}, name='blocks')
    if self.pipeline_stages > 1:  # the same variables, so one checkpoint serves both
      x = blocks.pipeline(x, stages=self.pipeline_stages, microbatches=self.microbatches,
                          mesh_axis=self.stage_axis)
    else:
      x = blocks(x)
    head = nn.Dense(self.vocab, kernel_init=named(DEFAULT_KERNEL, 'embed', 'vocab'),
                    dtype=self.dtype, name='head')
    return head(nn.LayerNorm(dtype=self.dtype)(x))


# ----------------------------------------------------------------------------- training


def make_optimizer(args) -> optax.GradientTransformation:
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, args.learning_rate, args.warmup, args.steps,
      end_value=args.learning_rate / 20)
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b2=0.98, weight_decay=0.01))


def answer_loss(params, model, tokens, task: Addition):
  """Cross-entropy of the answer digits, each predicted from the tokens before it."""
  logits = model.apply({'params': params}, tokens[:, :-1]).astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
  return losses[:, task.prompt_length - 1:].mean()


def make_train_step(model, optimizer, task: Addition, batch: int, data_key, mesh, shardings):
  """The jitted step; its state keeps ``shardings``, its batch is split over ``data``."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  @functools.partial(jax.jit, in_shardings=(shardings, replicated),
                     out_shardings=(shardings, replicated))
  def train_step(state, step):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # the pipeline's stage axis
      return _train_step(state, step)

  def _train_step(state, step):
    tokens = task.train_batch(jax.random.fold_in(data_key, step), batch)
    tokens = jax.lax.with_sharding_constraint(tokens, mesh_lib.batch_sharding(mesh))
    loss, grads = jax.value_and_grad(answer_loss)(state['params'], model, tokens, task)
    # Gradients in the layout of their params: reduce-scattered over the data axis (FSDP).
    grads = jax.lax.with_sharding_constraint(grads, shardings['params'])
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    return {'params': params, 'opt_state': opt_state}, loss
  return train_step


# ----------------------------------------------------------------------------- decoding


@functools.partial(jax.jit, static_argnums=(0, 3))
def decode(model, params, prompt, answer_length: int):
  """Greedy decoding by `lift.generate`: the prompt prefilled in parallel, then the step
  `as_scan` derives from the training-mode model, one token at a time."""
  return lift.generate(lambda tokens: model.apply({'params': params}, tokens), prompt,
                       max_new_tokens=answer_length).tokens


@functools.partial(jax.jit, static_argnums=(0, 3))
def decode_by_recomputing(model, params, prompt, answer_length: int):
  """The reference: the full training-mode model on the whole prefix, once per token."""
  tokens = prompt
  for _ in range(answer_length):
    logits = model.apply({'params': params}, tokens)
    tokens = jnp.concatenate([tokens, jnp.argmax(logits[:, -1:], axis=-1)], axis=1)
  return tokens[:, prompt.shape[1]:]


def evaluate(model, params, problems: np.ndarray, task: Addition, check: int):
  """Exact-match accuracy, and whether the derived step decodes as recomputation does."""
  prompt, answer = problems[:, :task.prompt_length], problems[:, task.prompt_length:]
  decoded = np.asarray(decode(model, params, jnp.asarray(prompt), task.answer_length))
  accuracy = float(np.mean(np.all(decoded == answer, axis=1)))
  if not check:
    return accuracy, True
  reference = decode_by_recomputing(model, params, jnp.asarray(prompt[:check]),
                                    task.answer_length)
  return accuracy, bool(np.array_equal(decoded[:check], np.asarray(reference)))


# ----------------------------------------------------------------------------- reporting


def progress_bar():
  from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
  return Progress(TextColumn('[bold]train'), BarColumn(), MofNCompleteColumn(),
                  TextColumn('loss {task.fields[loss]:.4f}'),
                  TextColumn('{task.fields[rate]:,.0f} tokens/s'),
                  TextColumn('accuracy {task.fields[accuracy]}'), TimeRemainingColumn())


def plot(history: dict, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
  left.plot(np.arange(1, len(history['loss']) + 1), history['loss'], linewidth=0.8)
  left.set(xlabel='step', ylabel='answer loss', yscale='log', title='training loss')
  steps, accuracy = zip(*history['accuracy']) if history['accuracy'] else ((), ())
  right.plot(steps, accuracy, marker='o')
  right.set(xlabel='step', ylabel='exact match', ylim=(0, 1.02),
            title='held-out accuracy (derived decode step)')
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  plt.close(figure)


# ----------------------------------------------------------------------------- the job


def build(args):
  task = Addition(args.digits)
  model = TransformerLM(VOCAB, task.length, d_model=args.width, heads=args.heads,
                        depth=args.depth, remat=False if args.remat == 'none' else args.remat,
                        dtype=jnp.dtype(args.dtype))
  return task, model


def pipelined(model, args, mesh):
  """The model the training step runs: as a pipeline with ``--pipeline-stages`` > 1 (its
  stages over the mesh's ``stage`` axis, if any); evaluation and decoding run it whole."""
  if args.pipeline_stages == 1:
    return model
  stage_axis = 'stage' if 'stage' in mesh.axis_names else None
  return model.clone(pipeline_stages=args.pipeline_stages, microbatches=args.microbatches,
                     stage_axis=stage_axis)


def train(args, task, model, state, history, manager, mesh, shardings) -> tuple[dict, dict]:
  optimizer = make_optimizer(args)
  train_step = make_train_step(pipelined(model, args, mesh), optimizer, task, args.batch,
                               jax.random.key(args.seed + 1), mesh, shardings)
  print(mesh_lib.memory_report(train_step.lower(state, 0).compile(), state))
  problems = task.eval_problems(args.eval_problems)
  first, last = len(history['loss']), min(args.steps, args.stop_after or args.steps)
  tokens_per_step = args.batch * (task.length - 1)
  preemption = checkpoints.Preemption()
  with progress_bar() as bar, preemption.installed():
    shown = bar.add_task('train', total=args.steps, completed=first, loss=float('nan'),
                         rate=0.0, accuracy='-')
    started = time.perf_counter()
    for step in range(first, last):
      state, loss = train_step(state, step)
      done = step + 1
      check_finite(float(loss), done, manager)
      history['loss'].append(float(loss))
      if (done % args.eval_every == 0 or done == args.steps) and jax.process_count() == 1:
        params = mesh_lib.local_params(state['params'])
        accuracy, _ = evaluate(model, params, problems, task, check=0)
        history['accuracy'].append([done, accuracy])
        bar.update(shown, accuracy=f'{accuracy:.3f}')
      periodic = done % args.checkpoint_every == 0 or done == last
      if periodic:
        checkpoints.save(manager, done, state, history)  # written in the background
      fault_hooks(args, done, preemption)
      if preemption.agreed():
        if not periodic:
          checkpoints.save(manager, done, state, history, force=True)
        manager.wait_until_finished()
        print(f'stopped after step {done} ({preemption.describe()}): checkpoint {done} is in '
              f'{manager.directory}; continue with --resume')
        raise SystemExit(0)
      rate = (done - first) * tokens_per_step / (time.perf_counter() - started)
      bar.update(shown, completed=done, loss=history['loss'][-1], rate=rate)
  manager.wait_until_finished()
  return state, history


def check_finite(loss: float, step: int, manager) -> None:
  """A NaN or infinite loss ends the run, before it reaches a checkpoint."""
  if not math.isfinite(loss):
    manager.wait_until_finished()
    raise SystemExit(f'step {step}: the loss is {loss}, so training stops here; the latest '
                     f'complete checkpoint, step {manager.latest_step()} in {manager.directory}, '
                     'is kept. Fix: a lower --learning-rate or longer --warmup, then --resume.')


def fault_hooks(args, step: int, preemption) -> None:
  """Hidden flags for the tests: a worker lost after a step; a pause of the last process
  (until a signal arrives) in which a test signals or kills it."""
  last = args.process_id in (None, args.processes - 1)
  if step == args.crash_after_step and last:
    os._exit(3)  # as a lost machine would: no clean shutdown
  if step == args.pause_after_step and last:
    print(f'paused after step {step} (pid {os.getpid()})', flush=True)
    deadline = time.monotonic() + args.pause_seconds
    while time.monotonic() < deadline and preemption.received is None:
      time.sleep(0.02)


def main(argv: Sequence[str] | None = None) -> dict | None:
  """Runs the job on ``argv`` (default: the command line); returns its results, or None in
  the launcher of ``--processes`` and in every process but the first. Flags it cannot run
  with end it before anything is written, with one line naming the flag to pass (exit
  status 2)."""
  try:
    args = parse_args(argv)
    if args.processes > 1 and args.process_id is None:
      mesh_lib.launch(__file__, list(sys.argv[1:] if argv is None else argv), args.processes,
                      args.process_timeout)
      return None
    if args.process_id is not None:
      mesh_lib.initialize_worker(args)
      if args.crash_after_step == 0 and args.process_id == args.processes - 1:
        os._exit(3)  # as a lost machine would: no clean shutdown
    sizes = mesh_lib.parse_mesh(args.mesh)
    check_mesh(args, sizes)
  except UsageError as error:
    command_line.fail(str(error))
  return run(args, mesh_lib.make_mesh(sizes))


def run(args: argparse.Namespace, mesh: jax.sharding.Mesh) -> dict | None:
  """The job on ``mesh``, its flags checked; the paths it prints are absolute."""
  task, model = build(args)
  out = args.out.resolve()
  out.mkdir(parents=True, exist_ok=True)
  manager = checkpoints.checkpoint_manager(out / 'checkpoints', args.checkpoint_every)
  rules = mesh_lib.axis_rules(mesh, args.heads)
  example = jnp.zeros((1, task.length - 1), jnp.int32)
  state, shardings = mesh_lib.create_state(model, make_optimizer(args), example,
                                           jax.random.key(args.seed), mesh, rules)
  print(f'mesh: {dict(mesh.shape)} over {jax.process_count()} process(es)')
  history = {'loss': [], 'accuracy': []}
  restored = checkpoints.restore(manager, state) if args.resume else None
  if restored is not None:
    step, state, history = restored
    print(f'resumed from step {step}')
  else:
    if args.resume:  # a scheduler restarts a job with the same command line
      print(f'--resume: no complete checkpoint in {manager.directory} yet; starting at step 0')
    summary = nn.tabulate(model, jax.random.key(args.seed), compute_flops=True, depth=1,
                          console_kwargs={'width': 120, 'force_terminal': sys.stdout.isatty()})
    print(summary(jnp.zeros((1, task.length - 1), jnp.int32)))
  state, history = train(args, task, model, state, history, manager, mesh, shardings)
  params = mesh_lib.local_params(state['params'])  # every process takes part in the gather
  if jax.process_index() != 0:  # the first process evaluates and writes the outputs
    return None
  accuracy, matches = evaluate(model, params, task.eval_problems(args.eval_problems), task,
                               check=16)
  (out / 'history.json').write_text(json.dumps(history))
  png = out / 'train_lm.png'
  plot(history, png)
  print(f'result: accuracy={accuracy:.4f} decode_matches_recompute={matches} '
        f'checkpoint={manager.directory} plot={png}')
  return {'accuracy': accuracy, 'decode_matches_recompute': matches, 'history': history,
          'checkpoint': manager.directory, 'plot': png}


if __name__ == '__main__':
  main()
