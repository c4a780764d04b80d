"""Per-device memory and collectives of a pipelined training step, against `fold`.

A stack of MLP blocks (`nn.Stacked`, its layer axis named 'stage', the batch sharded over
'data') trains one AdamW step, jitted with the shardings `nn.variable_shardings` gives. For
S = 1, 2, 4 stages on a (stage=S, data=2) mesh of simulated CPU devices, two programs run
on the same mesh and variables: the stack's `pipeline` (S stages, M microbatches) and its
`fold` (the layers' rows on their stage's devices too, gathered by the partitioner). The
script prints, per program, the per-device bytes of `memory_analysis()` (arguments: params
and optimizer state; temporaries) and the collectives of the compiled step, in the loop
and outside it.

    python examples/benchmarks/pipeline_memory.py           # d_model 256, 8 layers, batch 32
    python examples/benchmarks/pipeline_memory.py --tiny --stages 1,2   # a quick check
"""
from __future__ import annotations

import argparse
import collections
import os
import re

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')

import jax  # noqa: E402 (the device count is fixed when jax starts)
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import linen_ext as nn  # noqa: E402

COLLECTIVE = re.compile(r'(all-reduce|all-gather|reduce-scatter|all-to-all|'
                        r'collective-permute|collective-broadcast)(?:-start)?\(')


class Block(nn.Module):
  """A residual MLP with plain (unboxed) variables: the stack names their layer axis."""
  hidden: int

  @nn.compact
  def __call__(self, x):
    return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(self.hidden)(nn.LayerNorm()(x))))


def collectives(hlo: str) -> str:
  """``kind xN`` for each kind of collective, those inside a loop marked ``(loop)``."""
  counts: collections.Counter = collections.Counter()
  for line in hlo.splitlines():
    match = COLLECTIVE.search(line)
    if match:
      in_loop = '/while/' in line
      counts[match.group(1) + (' (loop)' if in_loop else '')] += 1
  return ', '.join(f'{kind} x{count}' for kind, count in sorted(counts.items())) or '-'


def train_step(stack, optimizer, mesh, boxed, x, pipeline: dict | None):
  """The compiled AdamW step of the stack on ``x`` (its batch over 'data'); the params in
  the shardings `nn.variable_shardings` gives, the optimizer's moments alike."""
  shardings = nn.variable_shardings(boxed, mesh)['params']
  params = jax.device_put(nn.unbox(boxed)['params'], shardings)
  opt_shardings = optax.tree_utils.tree_map_params(  # the moments as their params
      optimizer, lambda _, sharding: sharding, jax.eval_shape(optimizer.init, params),
      shardings, transform_non_params=lambda _: NamedSharding(mesh, PartitionSpec()),
      is_leaf=lambda x: isinstance(x, NamedSharding))
  state_shardings = {'params': shardings, 'opt': opt_shardings}
  state = {'params': params,
           'opt': jax.jit(optimizer.init, out_shardings=opt_shardings)(params)}

  def loss(params, x):
    if pipeline is None:
      return jnp.mean(stack.apply({'params': params}, x) ** 2)
    return jnp.mean(stack.apply({'params': params}, x, method='pipeline', **pipeline) ** 2)

  def step(state, x):
    value, grads = jax.value_and_grad(loss)(state['params'], x)
    updates, opt = optimizer.update(grads, state['opt'], state['params'])
    return {'params': optax.apply_updates(state['params'], updates), 'opt': opt}, value

  by_data = NamedSharding(mesh, PartitionSpec('data'))
  with jax.set_mesh(mesh):
    jitted = jax.jit(step, in_shardings=(state_shardings, by_data),
                     out_shardings=(state_shardings, None))
    return jitted.lower(state, x).compile()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--d-model', type=int, default=256)
  parser.add_argument('--hidden', type=int, default=1024)
  parser.add_argument('--layers', type=int, default=8)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--microbatches', type=int, default=4)
  parser.add_argument('--stages', default='1,2,4', help='stage counts, each on a stage x 2 mesh')
  parser.add_argument('--tiny', action='store_true', help='tiny sizes: checks that it runs')
  args = parser.parse_args()
  if args.tiny:
    args.d_model, args.hidden, args.layers, args.batch = 8, 16, 4, 16
  x = jax.random.normal(jax.random.key(1), (args.batch, args.d_model))
  optimizer = optax.adamw(1e-3)
  print(f'{args.layers} MLP blocks, d_model {args.d_model}, hidden {args.hidden}, batch '
        f'{args.batch}, {args.microbatches} microbatches, AdamW, float32, '
        f'{jax.devices()[0].platform}; bytes per device')
  print('| stages x data | program | params + optimizer state | temporaries | collectives |')
  print('|---|---|---|---|---|')
  for stages in (int(s) for s in args.stages.split(',')):
    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((stages, 2), ('stage', 'data'), axis_types=(auto, auto),
                         devices=jax.devices()[:2 * stages])
    stack = nn.Stacked(Block, args.layers, block_kwargs={'hidden': args.hidden},
                       metadata_params={nn.PARTITION_NAME: 'stage'})
    boxed = stack.init(jax.random.key(0), x)
    pipeline = {'stages': stages, 'microbatches': args.microbatches, 'mesh_axis': 'stage'}
    for name, options in (('pipeline', pipeline), ('fold', None)):
      compiled = train_step(stack, optimizer, mesh, boxed, x, options)
      memory = compiled.memory_analysis()
      print(f'| {stages} x 2 | {name} | {memory.argument_size_in_bytes / 2**20:.2f} MiB | '
            f'{memory.temp_size_in_bytes / 2**20:.2f} MiB | {collectives(compiled.as_text())} |')


if __name__ == '__main__':
  main()
