"""The mesh side of examples/train_lm.py: device mesh, axis rules, sharded state, processes.

Everything here is JAX's own machinery: a `jax.sharding.Mesh` over the devices
(``--mesh data=4,model=2``), logical axis rules that map the model's named
axes onto it (FSDP: parameters split over ``data`` along ``embed``; tensor
parallelism: the MLP and attention heads split over ``model``; pipeline parallelism,
``--mesh stage=4,data=2 --pipeline-stages 4``: the layers over ``stage``), `jax.jit` with
in/out shardings that `nn.variable_shardings` derives, `memory_analysis()` of
the compiled step, and `jax.distributed` for several processes
(``--processes 2``): this module only starts the workers, on 127.0.0.1, in
their own process group, and stops them all when one fails.
"""
from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import linen_ext as nn
from command_line import MESH_AXES, UsageError, mesh_sizes


def parse_mesh(text: str | None) -> dict[str, int]:
  """``'data=4,model=2'`` as ``{'stage': 1, 'data': 4, 'model': 2}``; missing axes have
  size 1, and ``None`` puts every device on ``data``.

  Raises:
    UsageError: an unknown axis, a size that is not a count, or more devices than present.
  """
  count = jax.device_count()
  if text is None:
    return {'stage': 1, 'data': count, 'model': 1}
  sizes = {**dict.fromkeys(MESH_AXES, 1), **mesh_sizes(text, count)}
  if math.prod(sizes.values()) > count:
    raise UsageError(f'--mesh {text}: {math.prod(sizes.values())} devices asked for, {count} '
                     f'present. Fix: sizes that multiply to at most {count}, e.g. --mesh '
                     f'data={count} (on CPU, simulate more devices with XLA_FLAGS='
                     '--xla_force_host_platform_device_count=8).')
  return sizes


def make_mesh(sizes: dict[str, int]) -> jax.sharding.Mesh:
  """The mesh over the first ``stage * data * model`` devices; a ``stage`` axis only where
  the pipeline's stages are spread over devices (``stage`` > 1)."""
  axes = tuple(a for a in MESH_AXES if a != 'stage' or sizes.get('stage', 1) > 1)
  shape = tuple(sizes.get(a, 1) for a in axes)
  auto = (jax.sharding.AxisType.Auto,) * len(axes)
  return jax.make_mesh(shape, axes, axis_types=auto, devices=jax.devices()[:math.prod(shape)])


def axis_rules(mesh: jax.sharding.Mesh, heads: int) -> tuple[tuple[str, str | None], ...]:
  """The model's logical axes on the mesh: batch and (FSDP) embed over ``data``; the MLP and
  the heads (or, where the heads do not divide, each head's features) over ``model``; the
  layers of the stack over ``stage`` (each device of a pipeline stage holds its layers)."""
  by_heads = heads % mesh.shape['model'] == 0
  return (('batch', 'data'), ('embed', 'data'), ('mlp', 'model'),
          ('heads', 'model' if by_heads else None), ('kv', None if by_heads else 'model'),
          ('vocab', None), ('length', None),
          ('layers', 'stage' if 'stage' in mesh.axis_names else None))


def create_state(model, optimizer, example, key, mesh, rules):
  """The params and optimizer state, created directly in their shards; and their shardings."""
  def create(key):
    params = model.init(key, example)['params']
    return {'params': params, 'opt_state': optimizer.init(params)}
  return nn.init_sharded(create, key, mesh=mesh, rules=rules)


def batch_sharding(mesh) -> NamedSharding:
  return NamedSharding(mesh, P('data', None))


def memory_report(compiled, state) -> str:
  """Per-device bytes of the compiled step (`memory_analysis()`) against the whole state."""
  stats = compiled.memory_analysis()
  whole = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  return (f'per-device memory: params + optimizer state {stats.argument_size_in_bytes / 2**10:.1f} '
          f'KiB (whole state {whole / 2**10:.1f} KiB), temporaries '
          f'{stats.temp_size_in_bytes / 2**10:.1f} KiB')


def local_params(params):
  """``params`` as arrays on this process's first device (gathered from every process)."""
  if jax.process_count() > 1:
    params = multihost_utils.process_allgather(params, tiled=True)
  return jax.device_put(jax.tree.map(np.asarray, params), jax.local_devices()[0])


# ----------------------------------------------------------------------------- processes


def initialize_worker(args) -> None:
  """Joins the job's other processes through the coordinator on 127.0.0.1."""
  jax.distributed.initialize(
      coordinator_address=args.coordinator, num_processes=args.processes,
      process_id=args.process_id, initialization_timeout=args.process_timeout,
      heartbeat_timeout_seconds=max(2, args.process_timeout // 3),
      shutdown_timeout_seconds=args.process_timeout)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _stop(workers) -> None:
  try:
    os.killpg(workers[0].pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  for worker in workers:
    worker.wait()


def launch(script: str, argv: list[str], processes: int, timeout: int) -> None:
  """Runs ``processes`` workers of ``script`` joined on 127.0.0.1, in one new process group.

  When a worker fails, the others get ``timeout`` seconds to notice (their heartbeat
  does) and are then stopped; so is every worker still running after the job's own
  deadline. Raises SystemExit with what happened.
  """
  coordinator = f'127.0.0.1:{_free_port()}'
  workers: list[subprocess.Popen] = []
  for index in range(processes):
    command = [sys.executable, script, *argv, '--process-id', str(index),
               '--coordinator', coordinator]
    group = 0 if not workers else workers[0].pid  # the first worker leads the group
    workers.append(subprocess.Popen(command, process_group=group))
  first_failure, failed_at = None, None
  while [w.poll() for w in workers].count(None):
    failures = [(i, w.returncode) for i, w in enumerate(workers) if w.returncode not in (None, 0)]
    if failures and first_failure is None:
      first_failure, failed_at = failures[0], time.monotonic()
    if failed_at is not None and time.monotonic() - failed_at > timeout:
      break
    time.sleep(0.1)
  if first_failure is None:
    first_failure = next(((i, w.returncode) for i, w in enumerate(workers) if w.returncode), None)
  _stop(workers)
  if first_failure is not None:
    index, code = first_failure
    raise SystemExit(f'--processes {processes}: worker {index} exited with code {code}; the other '
                     'workers were stopped (the first error printed above is the cause).')
