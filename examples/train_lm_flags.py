"""The flags of examples/train_lm.py, checked against each other before anything loads.

``--help`` shows them grouped (model and task size, training, evaluation and outputs,
devices and processes) with their defaults. Flags that contradict each other end the job
with one line naming the flag to pass (`command_line.UsageError`).
"""
from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence

import command_line
from command_line import UsageError


def build_parser() -> command_line.Parser:
  """The job's flags (``--help`` shows them with their defaults)."""
  count = command_line.positive
  parser = command_line.Parser(description=(
      'Trains a small Transformer language model (linen_ext, nn.Stacked, remat) to add '
      'numbers, then evaluates it by greedy decoding with the one-token step that '
      'nn.as_scan derives from the training-mode model.'))
  size = parser.add_argument_group('model and task size')
  size.add_argument('--digits', type=count, default=4, help='digits of each operand')
  size.add_argument('--depth', type=count, default=4, help='Transformer blocks (nn.Stacked)')
  size.add_argument('--width', type=count, default=64, help='d_model')
  size.add_argument('--heads', type=count, default=4, help='attention heads')
  size.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'],
                    help='compute dtype of the model (variables, optimizer state and loss '
                    'stay float32)')
  size.add_argument('--remat', default='nested',
                    choices=['none', 'full', 'nested', 'save_all', 'offload'],
                    help="the layer stack's checkpoint policy")
  train = parser.add_argument_group('training')
  train.add_argument('--steps', type=count, default=1500, help='optimizer steps')
  train.add_argument('--batch', type=count, default=128, help='problems per step')
  train.add_argument('--learning-rate', type=float, default=2e-3, help='peak AdamW rate')
  train.add_argument('--warmup', type=int, default=100, help='linear warmup steps')
  train.add_argument('--seed', type=int, default=0,
                     help='seed of the initial variables (the training data uses seed + 1)')
  run = parser.add_argument_group('evaluation, checkpoints and outputs')
  run.add_argument('--eval-every', type=count, default=250, help='steps between evaluations')
  run.add_argument('--eval-problems', type=count, default=512, help='held-out problems')
  run.add_argument('--checkpoint-every', type=count, default=500,
                   help='steps between checkpoints')
  run.add_argument('--resume', action='store_true', help='continue from the latest checkpoint')
  run.add_argument('--stop-after', type=count, default=None,
                   help='end after this many steps, as if interrupted (continue with --resume)')
  run.add_argument('--out', type=pathlib.Path, default=pathlib.Path('runs/train_lm'),
                   help='directory for checkpoints, history and the plot')
  add_scale_flags(parser.add_argument_group('devices and processes'))
  return parser


def add_scale_flags(scale) -> None:
  """The flags of meshes, pipelines and processes (and, hidden, the tests' fault hooks)."""
  count = command_line.positive
  scale.add_argument('--mesh', default=None,
                     help='device mesh, e.g. data=4,model=2 or stage=4,data=2; without it, '
                     'every device on data')
  scale.add_argument('--pipeline-stages', type=count, default=1,
                     help='run the blocks as a pipeline of this many stages (Stacked.pipeline; '
                     'over the mesh axis stage, if the mesh has one)')
  scale.add_argument('--microbatches', type=count, default=1,
                     help='microbatches of a pipelined step (they divide --batch)')
  scale.add_argument('--processes', type=count, default=1,
                     help='processes joined with jax.distributed on 127.0.0.1')
  scale.add_argument('--process-timeout', type=count, default=30,
                     help='seconds to join the processes, and to stop them after one fails')
  scale.add_argument('--process-id', type=int, default=None, help=argparse.SUPPRESS)
  scale.add_argument('--coordinator', default=None, help=argparse.SUPPRESS)
  scale.add_argument('--crash-after-step', type=int, default=None,  # for tests: a lost worker
                     help=argparse.SUPPRESS)
  scale.add_argument('--pause-after-step', type=int, default=None,  # for tests: a signal's
                     help=argparse.SUPPRESS)                        # moment
  scale.add_argument('--pause-seconds', type=float, default=30.0, help=argparse.SUPPRESS)


def check_flags(args: argparse.Namespace) -> None:
  """Raises `command_line.UsageError` for flags that contradict each other."""
  if not 0 <= args.warmup < args.steps:
    raise UsageError(f'--warmup {args.warmup} must be at least 0 and below --steps '
                     f'{args.steps}. Fix: --warmup between 0 and {args.steps - 1}, or more --steps.')
  if args.depth % args.pipeline_stages:
    raise UsageError(f'--pipeline-stages {args.pipeline_stages}: it does not divide the '
                     f'{args.depth} blocks of --depth {args.depth}, and each stage holds an '
                     f'equal share. Fix: --pipeline-stages {command_line.divisors(args.depth)}.')
  if args.pipeline_stages > 1 and args.batch % args.microbatches:
    raise UsageError(f'--microbatches {args.microbatches}: it does not divide the '
                     f'{args.batch} problems of --batch {args.batch}. Fix: --microbatches '
                     f'{command_line.divisors(args.batch)}, or another --batch.')


def check_mesh(args: argparse.Namespace, sizes: dict[str, int]) -> None:
  """Raises `command_line.UsageError` if ``--mesh``'s stage axis is not the pipeline's."""
  stage = sizes.get('stage', 1)
  if stage > 1 and stage != args.pipeline_stages:
    raise UsageError(f'--mesh {args.mesh}: stage={stage} spreads a pipeline of {stage} '
                     f'stages, but --pipeline-stages is {args.pipeline_stages}. Fix: '
                     f'--pipeline-stages {stage}, or --mesh without stage.')


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  """The flags of ``argv``, checked against each other (`check_flags`)."""
  args = build_parser().parse_args(argv)
  check_flags(args)
  return args
