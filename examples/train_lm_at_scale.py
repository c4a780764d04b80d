"""Compile the training step of a 7B-70B model for a TPU pod on this machine, and read
what each chip would hold.

The model is examples/llama.py (LLaMA-2 or Gemma shapes: `nn.Stacked` blocks, logical
axis names, grouped-query attention, rotary positions); the step is the main job's:
value and gradients of the next-token loss, gradients laid out as their parameters,
optax AdamW, the state donated. `nn.compile_train_step` compiles it ahead of time for
the abstract chips of a named topology (libtpu's compiler; no TPU needed), FSDP over
``data`` and tensor parallelism over ``model``, optionally a pipeline over ``stage``
(across slices with ``--num-slices 2``), and prints XLA's per-chip memory, FLOPs and
collectives. On a TPU target the attention is JAX's Pallas flash-attention kernel.

``--plan`` compiles every candidate (remat policy x mesh x optimizer state on host or
not) and picks the one with the fewest FLOPs that fits the chip's HBM with a margin.

Run: python examples/train_lm_at_scale.py --compile-for v5e-256 --model llama2-7b
(`pip install -e '.[tpu]'` first: it installs libtpu, the compiler.)
It ends with one line: ``result: model=... topology=... fits=<bool> total_gib=<float> ...``.
"""
from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp

import linen_ext as nn
from linen_ext.errors import TopologyError

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import command_line  # noqa: E402
import llama  # noqa: E402
import train_lm_at_scale_flags as flags  # noqa: E402
from command_line import UsageError  # noqa: E402

GIB = 2 ** 30


def axis_rules(mesh_shape: dict[str, int]) -> tuple[tuple[str, str | None], ...]:
  """The model's logical axes on the mesh (MaxText's FSDP x tensor layout): the batch and
  (FSDP) every parameter's ``embed`` dimension over ``data``; the MLP, the heads and the
  vocabulary over ``model``; the stack's layers over ``stage``."""
  del mesh_shape  # the same names for every mesh; sizes that do not divide are errors
  return (('batch', 'data'), ('embed', 'data'), ('mlp', 'model'), ('heads', 'model'),
          ('kv_heads', 'model'), ('kv', None), ('vocab', 'model'), ('length', None),
          ('layers', 'stage'))


def example_batch(args, chips: int) -> dict[str, jax.ShapeDtypeStruct]:
  shape = (args.per_device_batch * chips // args.pipeline_stages * args.pipeline_stages,
           args.seq_length)
  return {'inputs': jax.ShapeDtypeStruct(shape, jnp.int32),
          'targets': jax.ShapeDtypeStruct(shape, jnp.int32)}


def build_model(args) -> llama.LM:
  return llama.LM(llama.PRESETS[args.model], remat=nn.scale.planner.remat_value(args.remat),
                  attention=None if args.attention == 'auto' else args.attention,
                  pipeline_stages=args.pipeline_stages, microbatches=args.microbatches,
                  stage_axis='stage' if args.pipeline_stages > 1 else None,
                  dtype=jnp.dtype(args.dtype))


def report(args, topology, mesh: dict, stats, attention: str | None = None) -> dict:
  """Prints the per-chip figures (and which attention the program runs, if known);
  returns them."""
  hbm = args.hbm * GIB if args.hbm else topology.hbm_bytes
  fits = stats.device_bytes <= hbm
  collectives = ', '.join(f'{kind} {n}' for kind, n in stats.collectives.items()) or 'none'
  size, flops = nn.scale.compiled.size_text, nn.scale.compiled.flops_text
  print(f'per chip: arguments {size(stats.argument_bytes).strip()}, temporaries '
        f'{size(stats.temp_bytes).strip()}, total {size(stats.device_bytes).strip()} of '
        f'{size(hbm).strip()} HBM ({stats.device_bytes / hbm:.0%}); host memory '
        f'{size(stats.host_bytes).strip()}')
  print(f'compiled in {stats.compile_seconds:.0f} s; {flops(stats.flops).strip()} per chip '
        f'per step; collectives in the program: {collectives}')
  if stats.cross_slice:
    looped = ', '.join(f'{k} {n}' for k, n in stats.cross_slice_in_loops.items()) or 'none'
    every = ', '.join(f'{k} {n}' for k, n in stats.cross_slice.items())
    print(f'between slices: {every}; inside loops (a pipeline\'s ticks): {looped}')
  result = {'model': args.model, 'topology': topology.name, 'mesh': mesh, 'fits': fits,
            'total_gib': stats.device_bytes / GIB, 'arguments_gib': stats.argument_bytes / GIB,
            'temporaries_gib': stats.temp_bytes / GIB, 'host_gib': stats.host_bytes / GIB,
            'tflop': stats.flops / 1e12}
  if attention:
    result['attention'] = attention
  print('result: ' + ' '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}'
                              for k, v in result.items() if k != 'mesh'))
  return result


def build_parser() -> command_line.Parser:
  """The script's flags (``--help`` shows them with their defaults)."""
  parser = command_line.Parser(description=(
      'Compiles the training step of a LLaMA-2 or Gemma model ahead of time for a named TPU '
      "topology on this machine (libtpu's compiler; no TPU needed) and prints what each chip "
      "would hold: XLA's per-chip memory, FLOPs and collectives."))
  parser.add_argument('--compile-for', required=True, metavar='TOPOLOGY',
                      help='the TPU topology to compile for: one of '
                      f'{", ".join(nn.scale.KNOWN_TOPOLOGIES)}; or kind:shape, e.g. v5e:16x16')
  parser.add_argument('--num-slices', type=command_line.positive, default=1,
                      help='slices of that topology joined by the data-center network')
  parser.add_argument('--model', default='llama2-7b', choices=sorted(llama.PRESETS),
                      help="the model's shapes (examples/llama.py; tiny compiles in seconds)")
  parser.add_argument('--mesh', default=None,
                      help='axis sizes stage=N,data=N,model=N that multiply to the chips; '
                      'without it, every chip on data (FSDP)')
  parser.add_argument('--remat', default='full', choices=nn.scale.planner.REMATS,
                      help="the stack's checkpoint policy")
  parser.add_argument('--attention', default='auto', choices=['auto', 'flash', 'xla'],
                      help="auto: nn.causal_self_attention's default (the Pallas flash kernel "
                      'on a TPU target, XLA elsewhere)')
  parser.add_argument('--per-device-batch', type=command_line.positive, default=1,
                      help='sequences per chip in a step (the batch is this times the chips)')
  parser.add_argument('--seq-length', type=command_line.positive, default=2048,
                      help='tokens per sequence')
  parser.add_argument('--dtype', default='bfloat16', choices=['bfloat16', 'float32'],
                      help='compute dtype (variables and optimizer state stay float32)')
  parser.add_argument('--pipeline-stages', type=command_line.positive, default=1,
                      help='run the blocks as a pipeline of this many stages over stage')
  parser.add_argument('--microbatches', type=command_line.positive, default=1,
                      help='microbatches of a pipelined step, each divided over data')
  parser.add_argument('--offload-optimizer', action='store_true',
                      help='keep the optimizer state in host memory (updated on the chips '
                      'one layer at a time)')
  parser.add_argument('--no-bf16-propagation', action='store_true',
                      help="compile without XLA's bfloat16-propagation pass (which can keep a "
                      "bfloat16 copy of all the stack's parameters; --plan tries it where it "
                      'could make a candidate fit)')
  parser.add_argument('--hbm', type=float, default=None,
                      help="GiB of HBM per chip to fit in; without it, the chip's own")
  parser.add_argument('--plan', action='store_true',
                      help='compile every candidate and choose the cheapest that fits')
  parser.add_argument('--plan-remat', nargs='+', default=list(nn.scale.planner.REMATS),
                      choices=nn.scale.planner.REMATS, metavar='REMAT',
                      help='with --plan: the checkpoint policies to try')
  parser.add_argument('--plan-tensor', nargs='+', type=command_line.positive, default=[1],
                      metavar='SIZE', help='with --plan: the sizes of the model (tensor '
                      'parallel) axis to try')
  parser.add_argument('--margin', type=float, default=0.05,
                      help="with --plan: the fraction of each chip's HBM left free")
  return parser


def load_topology(args) -> nn.scale.Topology:
  """``--compile-for``'s abstract chips; libtpu missing ends the script with its pip fix."""
  try:
    return nn.tpu_topology(args.compile_for, num_slices=args.num_slices)
  except TopologyError as error:
    raise UsageError(f'--compile-for {args.compile_for}: {error}') from None


def plan_flags(args, candidate) -> str:
  """The command line that compiles ``candidate`` alone."""
  mesh = ','.join(f'{axis}={size}' for axis, size in candidate.mesh)
  parts = [f'--compile-for {args.compile_for}', f'--model {args.model}',
           f'--remat {candidate.remat}', f'--mesh {mesh}']
  if args.num_slices != 1:
    parts.insert(1, f'--num-slices {args.num_slices}')
  if dict(candidate.mesh).get('stage', 1) > 1:
    parts += [f'--pipeline-stages {dict(candidate.mesh)["stage"]}',
              f'--microbatches {candidate.microbatches}']
  if candidate.offload_optimizer:
    parts.append('--offload-optimizer')
  if not candidate.bf16_propagation:
    parts.append('--no-bf16-propagation')
  return 'python examples/train_lm_at_scale.py ' + ' '.join(parts)


def run_plan(args, topology, model, batch) -> dict:
  """Plans with a line per candidate as it goes; prints the table, the chosen flags and
  the `plan.configure` call. Ctrl-C stops between compiles."""
  try:
    chosen = nn.plan(model, batch, topology, rules=axis_rules, optimizer=llama.optimizer(),
                     loss_fn=llama.next_token_loss, clip_norm=llama.CLIP_NORM,
                     memory_limit=int(args.hbm * GIB) if args.hbm else None,
                     margin=args.margin, remat=args.plan_remat, tensor=args.plan_tensor,
                     stages=sorted({1, args.pipeline_stages}),
                     microbatches=[args.microbatches], log=lambda line: print(line, flush=True))
  except KeyboardInterrupt:
    command_line.fail('stopped by Ctrl-C; nothing chosen', status=130)
  print(chosen)
  best = chosen.best
  print(f'chosen: {best.describe()}\nto compile it alone: {plan_flags(args, best)}')
  remat = nn.scale.planner.remat_value(best.remat)
  options = '' if best.bf16_propagation else ', compiler_options=nn.scale.NO_BF16_PROPAGATION'
  print(f'in code: model = plan.configure(model)  # remat={remat!r}; then '
        f'nn.compile_train_step(model, batch, mesh=nn.scale.make_mesh(devices, '
        f'{dict(best.mesh)}), offload_optimizer={best.offload_optimizer}{options}, ...)')
  return report(args, topology, dict(best.mesh), chosen.stats)


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the script on ``argv`` (default: the command line); returns the result line's
  figures. Flags it cannot run with end it before anything compiles, with one line naming
  the flag to pass (exit status 2)."""
  args = build_parser().parse_args(argv)
  try:
    mesh_shape = flags.check_flags(args)
    topology = load_topology(args)
  except UsageError as error:
    command_line.fail(str(error))
  model = build_model(args)
  batch = example_batch(args, topology.chips)
  config = llama.PRESETS[args.model]
  print(f'{args.model} ({config.parameters() / 1e9:.2f}B parameters), batch '
        f'{batch["inputs"].shape}, for {topology.name} x {topology.num_slices} slice(s): '
        f'{topology.chips} chips of {topology.hbm_bytes / GIB:.0f} GiB')
  if args.plan:
    return run_plan(args, topology, model, batch)
  assert mesh_shape is not None  # checked by check_flags, which returns None with --plan
  mesh = nn.scale.make_mesh(topology.devices, mesh_shape)
  print(f'mesh {dict(mesh.shape)}, remat {args.remat}, attention {model.attention or "auto"}'
        f'{", optimizer state in host memory" if args.offload_optimizer else ""}'
        f'{", no bf16 propagation" if args.no_bf16_propagation else ""}')
  step = nn.compile_train_step(model, batch, mesh=mesh, rules=axis_rules(mesh_shape),
                               optimizer=llama.optimizer(), loss_fn=llama.next_token_loss,
                               clip_norm=llama.CLIP_NORM,
                               offload_optimizer=args.offload_optimizer,
                               compiler_options=nn.scale.NO_BF16_PROPAGATION
                               if args.no_bf16_propagation else None)
  kernel = 'tpu_custom_call' in step.compiled.as_text()  # the Pallas kernel's call
  return report(args, topology, mesh_shape, step.stats, 'flash' if kernel else 'xla')


if __name__ == '__main__':
  main()
