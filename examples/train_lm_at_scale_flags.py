"""The flags of examples/train_lm_at_scale.py checked against each other before anything loads.

A topology's chips are read from its name, so a mesh that does not fill them, an unknown
mesh axis or a pipeline that does not divide them is refused in the flags' terms
(``--mesh data=128``), without libtpu and before any compilation; `nn.tpu_topology` and
`nn.scale.make_mesh` would refuse them too, with their fixes in Python.
"""
from __future__ import annotations

import argparse
import math

import linen_ext as nn
from command_line import UsageError, divisors, mesh_sizes


def closest_topology(name: str) -> str:
  """The known topology of ``name``'s kind (v5e if the kind is unknown) nearest in size."""
  kind, _, size = name.partition('-')
  known = list(nn.scale.KNOWN_TOPOLOGIES)
  same_kind = [k for k in known if k.startswith(f'{kind}-')] or [
      k for k in known if k.startswith('v5e-')]
  wanted = int(size) if size.isdigit() else 256
  return min(same_kind, key=lambda k: (abs(int(k.rpartition('-')[2]) - wanted), k))


def topology_chips(name: str, num_slices: int) -> int:
  """The chips of ``--compile-for name`` over ``--num-slices``, from the name alone."""
  known = nn.scale.KNOWN_TOPOLOGIES
  kind_shape = known.get(name, name)
  if kind_shape not in known.values():
    raise UsageError(
        f'--compile-for {name}: unknown TPU topology. Fix: --compile-for '
        f'{closest_topology(name)} (known: {", ".join(known)}; or kind:shape, e.g. v5e:16x16).')
  return math.prod(int(n) for n in kind_shape.partition(':')[2].split('x')) * num_slices


def _default_mesh(chips: int, stages: int) -> dict[str, int]:
  """Every chip on ``data`` beside the ``stage`` axis of the pipeline's stages."""
  if chips % stages:
    raise UsageError(f'--pipeline-stages {stages}: the stages do not divide the {chips} '
                     f'chips. Fix: --pipeline-stages {divisors(chips)}.')
  return {'stage': stages, 'data': chips // stages, 'model': 1}


def parse_mesh(text: str | None, chips: int, stages: int, topology: str) -> dict[str, int]:
  """``--mesh`` as axis sizes whose product is the ``chips`` of ``topology``; by default
  every chip on ``data`` (beside ``stage``, which has ``--pipeline-stages`` entries)."""
  if text is None:
    return _default_mesh(chips, stages)
  sizes = mesh_sizes(text, chips)
  product = math.prod(sizes.values())
  if product != chips:
    spelled = ' x '.join(map(str, sizes.values())) + (f' = {product}' if len(sizes) > 1 else '')
    raise UsageError(f'--mesh {text}: {spelled} chips, but {topology} has {chips} chips. Fix: '
                     f'--mesh data={chips} (FSDP over every chip), or sizes that multiply to '
                     f'{chips}, e.g. --mesh data={max(chips // 2, 1)},model=2.')
  if stages > 1 and sizes.get('stage', 1) != stages:
    raise UsageError(f'--mesh {text}: stage={sizes.get("stage", 1)}, but --pipeline-stages '
                     f'{stages} spreads its stages over a stage axis of {stages}. Fix: --mesh '
                     f'stage={stages},data={chips // stages}.')
  return sizes


def check_flags(args: argparse.Namespace) -> dict[str, int] | None:
  """The mesh the flags ask for (None with ``--plan``, which chooses it), once they agree.

  Raises:
    UsageError: a flag's value, or two flags, that the job cannot run with.
  """
  chips = topology_chips(args.compile_for, args.num_slices)
  topology = args.compile_for + (f' x {args.num_slices} slices' if args.num_slices > 1 else '')
  if args.plan:
    if args.mesh is not None:
      raise UsageError(f'--mesh {args.mesh} with --plan: the plan chooses the mesh. Fix: '
                       'leave out --mesh, or --plan.')
    return None
  mesh = parse_mesh(args.mesh, chips, args.pipeline_stages, topology)
  batch, count, data = args.per_device_batch * chips, args.microbatches, mesh.get('data', 1)
  if batch % count or batch // count % data:
    raise UsageError(
        f'--microbatches {count}: the {batch} sequences of a step (--per-device-batch '
        f'{args.per_device_batch} x {chips} chips) do not split into {count} microbatches '
        f'that divide over data={data}. Fix: --microbatches {divisors(batch // data)}, or a '
        'larger --per-device-batch.')
  return mesh
