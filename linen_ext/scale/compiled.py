"""What a compiled program needs per chip: XLA's memory and cost analyses, and its
collectives, read from `jax.stages.Compiled`."""
from __future__ import annotations

import collections
import dataclasses
import math
import re

import jax

GIB = 2 ** 30
COLLECTIVES = ('all-gather', 'reduce-scatter', 'all-reduce', 'collective-permute', 'all-to-all')
_COMPUTATION = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$')
_COLLECTIVE = re.compile(r'\b(' + '|'.join(COLLECTIVES) + r')(?:-start)?\(')


@dataclasses.dataclass(frozen=True)
class CompiledStats:
  """Per-chip bytes of a compiled program (XLA's memory analysis: exact, not sampled),
  its FLOPs per chip (`jaxpr_flops` of the whole step over the chips: recomputation
  included, every loop counted as often as it runs) and how many collectives of each
  kind its code holds (a collective inside a loop counts once). A program for several
  slices moves data between them over the data-center network: ``cross_slice`` counts
  those transfers by kind, and ``cross_slice_in_loops`` those inside a loop (a pipeline's
  tick loop should hold only ``collective-permute`` transfers).

  ``device_bytes`` is what the chip's memory must hold at the peak: arguments,
  temporaries, and outputs that do not reuse a donated argument's buffer.

  Attributes:
    argument_bytes: the arguments' bytes on each chip.
    output_bytes: the outputs' bytes on each chip.
    alias_bytes: the bytes of the outputs that reuse a donated argument's buffer.
    temp_bytes: the temporaries' bytes on each chip.
    host_bytes: the bytes in host memory (arguments, temporaries and outputs there).
    flops: the FLOPs of one step on each chip.
    collectives: the number of collectives of each kind in the code (``'all-reduce'``, ...).
    compile_seconds: how long the compilation took.
    cross_slice: the transfers between slices, by kind.
    cross_slice_in_loops: the transfers between slices inside a loop, by kind.
    collective_bytes: the bytes the collectives produce on each chip in one step, each
      loop's counted as often as it runs (`collective_bytes`).
  """
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  host_bytes: int
  flops: float
  collectives: dict[str, int]
  compile_seconds: float
  cross_slice: dict[str, int] = dataclasses.field(default_factory=dict)
  cross_slice_in_loops: dict[str, int] = dataclasses.field(default_factory=dict)
  collective_bytes: int = 0

  @property
  def device_bytes(self) -> int:
    return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes

  def row(self) -> str:
    """One line: arguments, temporaries, the total, host memory and FLOPs."""
    return (f'args {size_text(self.argument_bytes)}  temps {size_text(self.temp_bytes)}  '
            f'total {size_text(self.device_bytes)}  host {size_text(self.host_bytes)}  '
            f'{flops_text(self.flops)}')


def size_text(size: float) -> str:
  """Bytes in GiB from 1 GiB, else in MiB: ``' 13.43 GiB'``, ``'  5.71 MiB'``."""
  return f'{size / GIB:6.2f} GiB' if size >= GIB else f'{size / 2 ** 20:6.2f} MiB'


def flops_text(flops: float) -> str:
  """FLOPs in the largest unit that keeps a whole number: ``'16.6 TFLOP'``."""
  for unit, scale in (('P', 1e15), ('T', 1e12), ('G', 1e9), ('M', 1e6)):
    if flops >= scale:
      return f'{flops / scale:6.1f} {unit}FLOP'
  return f'{flops:6.0f} FLOP'


def count_collectives(hlo_text: str) -> dict[str, int]:
  """How many collectives of each kind the HLO text holds (an async pair counts once).

  A TPU program implements a reduce-scatter as an ``all-reduce-scatter`` computation
  around an all-reduce: it counts as one reduce-scatter.
  """
  found: collections.Counter = collections.Counter()
  inside_scatter = False
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      inside_scatter = head.group(1).startswith('all-reduce-scatter')
      found['reduce-scatter'] += inside_scatter
    elif not inside_scatter:
      found.update(m.group(1) for m in _COLLECTIVE.finditer(line))
  return {kind: found[kind] for kind in COLLECTIVES if found[kind]}


_TRANSFER = re.compile(r' send\(.*_xla_megascale_transfer_type="(\w+)"')
_CALLEE = re.compile(r'(?:body|condition|calls|to_apply)=%?([\w.\-]+)')
_BODY = re.compile(r'body=%?([\w.\-]+)')
_TRANSFER_KINDS = {'ONE_TO_ONE': 'collective-permute', 'ALL_GATHER': 'all-gather',
                   'ALL_REDUCE': 'all-reduce', 'REDUCE_SCATTER': 'reduce-scatter',
                   'ALL_TO_ALL': 'all-to-all'}


def _computations(hlo_text: str) -> dict[str, list[str]]:
  """Each computation's lines, by name."""
  found: dict[str, list[str]] = {}
  lines: list[str] = []
  for line in hlo_text.splitlines():
    head = _COMPUTATION.match(line)
    if head:
      lines = found.setdefault(head.group(1), [])
    lines.append(line)
  return found


def _in_loops(computations: dict[str, list[str]]) -> set[str]:
  """The computations that run inside a while loop: the bodies and what they call."""
  pending = [m.group(1) for lines in computations.values() for line in lines
             for m in _BODY.finditer(line)]
  inside: set[str] = set()
  while pending:
    name = pending.pop()
    if name in inside or name not in computations:
      continue
    inside.add(name)
    pending.extend(m.group(1) for line in computations[name] for m in _CALLEE.finditer(line))
  return inside


def cross_slice_transfers(hlo_text: str) -> tuple[dict[str, int], dict[str, int]]:
  """The transfers between slices (over the data-center network) by kind: all of them,
  and those inside loops."""
  computations = _computations(hlo_text)
  loops = _in_loops(computations)
  every: collections.Counter = collections.Counter()
  looped: collections.Counter = collections.Counter()
  for name, lines in computations.items():
    for line in lines:
      match = _TRANSFER.search(line)
      if match:
        kind = _TRANSFER_KINDS.get(match.group(1), match.group(1).lower())
        every[kind] += 1
        looped[kind] += name in loops
  return dict(every), {kind: n for kind, n in looped.items() if n}


_ARRAY = re.compile(r'\b(pred|[subf]\d+|bf16|f8\w*)\[([\d,]*)\]')
_WHILE = re.compile(r' while\(.*condition=%?([\w.\-]+), body=%?([\w.\-]+)')
_TRIP = re.compile(r'= s32\[\]\S* constant\((\d+)\)')
_STARTED = re.compile(r'= (.*?) (' + '|'.join(COLLECTIVES) + r')(-start)?\(')


def _array_bytes(dtype: str, dims: str) -> int:
  width = 1 if dtype in ('pred',) or dtype.startswith(('f8', 's8', 'u8')) else (
      2 if dtype in ('bf16', 'f16', 's16', 'u16') else int(dtype[1:]) // 8)
  return width * math.prod(int(d) for d in dims.split(',') if d)


def _trip_count(condition: list[str]) -> int:
  """A loop's trips: the integer constant its condition compares the counter with
  (JAX's loops count from 0 up to it); 1 if there is none."""
  found = [int(n) for line in condition for n in _TRIP.findall(line)]
  return max(found, default=1)


def collective_bytes(hlo_text: str) -> int:
  """The bytes the collectives of one run of the program produce on each chip: every
  collective's result (an async one's output), times the trips of the loops around it."""
  computations = _computations(hlo_text)
  entry = next((line.split()[1].lstrip('%') for line in hlo_text.splitlines()
                if line.startswith('ENTRY ')), None)

  def visit(name: str, times: int) -> int:
    total = 0
    for line in computations.get(name, ()):
      loop = _WHILE.search(line)
      if loop:
        total += visit(loop.group(2), times * _trip_count(computations.get(loop.group(1), [])))
        continue
      started = _STARTED.search(line)
      if started:
        arrays = _ARRAY.findall(started.group(1))
        if arrays:
          total += times * (_array_bytes(*arrays[-1]) if started.group(3) else
                            sum(_array_bytes(*a) for a in arrays))
      total += sum(visit(m.group(1), times) for m in _CALLEE.finditer(line))
    return total
  return visit(entry, 1) if entry else 0


def compiled_stats(compiled: jax.stages.Compiled, flops: float,
                   compile_seconds: float = 0.0) -> CompiledStats:
  """The `CompiledStats` of ``compiled`` (from ``jax.jit(f).lower(...).compile()``), with
  ``flops`` per chip (say, `jaxpr_flops` of its ``trace(...).jaxpr`` over the chips)."""
  memory = compiled.memory_analysis()
  assert memory is not None, 'this backend gives no memory analysis'
  text = compiled.as_text() or ''
  cross_slice, cross_slice_in_loops = cross_slice_transfers(text)
  host = (memory.host_argument_size_in_bytes + memory.host_temp_size_in_bytes
          + memory.host_output_size_in_bytes - memory.host_alias_size_in_bytes)
  return CompiledStats(
      argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
      alias_bytes=memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
      host_bytes=host, flops=float(flops),
      collectives=count_collectives(text), compile_seconds=compile_seconds,
      cross_slice=cross_slice, cross_slice_in_loops=cross_slice_in_loops,
      collective_bytes=collective_bytes(text))


__all__ = ['COLLECTIVES', 'CompiledStats', 'collective_bytes', 'compiled_stats',
           'count_collectives',
           'cross_slice_transfers', 'flops_text',
           'size_text']
