"""Named TPU topologies, compiled for on any machine (`jax.experimental.topologies`).

``tpu_topology('v5e-256')`` gives the 256 abstract devices of a TPU v5e pod and the
HBM of each chip. Nothing runs on them: `jax.jit(...).lower(...).compile()` compiles
for them ahead of time, with libtpu's compiler, on a CPU-only machine, and XLA's memory
and cost analyses of the result are what the chips would use.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os

from jax.experimental import topologies


from linen_ext.errors import TopologyError

GIB = 2 ** 30
_log = logging.getLogger(__name__)

# Per-chip HBM, and the chip layouts of the pod slices by chip count.
_TWO_D = {4: '2x2', 8: '2x4', 16: '4x4', 32: '4x8', 64: '8x8', 128: '8x16', 256: '16x16'}
_THREE_D = {4: '2x2x1', 8: '2x2x2', 16: '2x2x4', 32: '2x4x4', 64: '4x4x4', 128: '4x4x8',
            256: '4x8x8', 512: '8x8x8'}
HBM_BYTES = {'v5e': 16 * GIB, 'v6e': 32 * GIB, 'v5p': 95 * GIB}


def _known() -> dict[str, str]:
  names = {f'{kind}-{chips}': f'{kind}:{shape}'
           for kind in ('v5e', 'v6e') for chips, shape in _TWO_D.items()}
  # v5p slices are named by TensorCores, two per chip.
  names.update({f'v5p-{2 * chips}': f'v5p:{shape}' for chips, shape in _THREE_D.items()})
  return names


KNOWN_TOPOLOGIES = _known()


@dataclasses.dataclass(frozen=True)
class Topology:
  """The abstract devices of ``num_slices`` TPU slices of one kind, and each chip's HBM.

  ``devices`` are ordered slice by slice (`device.slice_index`), so a mesh whose first
  axis has ``num_slices`` entries puts that axis across the slices (the data-center
  network) and the others within each slice (the chips' interconnect).

  Attributes:
    name: the topology's name, as `tpu_topology` took it.
    devices: the abstract devices, slice by slice.
    hbm_bytes: the bytes of HBM of each chip.
    num_slices: the number of slices.
  """
  name: str
  devices: tuple
  hbm_bytes: int
  num_slices: int = 1

  @property
  def chips(self) -> int:
    return len(self.devices)


def _libtpu_present() -> bool:
  return importlib.util.find_spec('libtpu') is not None


def tpu_topology(name: str, num_slices: int = 1) -> Topology:
  """The abstract devices of a named TPU topology, to compile for without a TPU.

  Args:
    name: a pod slice by chip count (``'v5e-256'``, ``'v6e-64'``) or TensorCores
      (``'v5p-128'``, 64 chips in a 4x4x4 torus), or libtpu's own form
      (``'v5e:16x16'``, ``'v5p:4x4x4'``).
    num_slices: slices joined by the data-center network (multislice).

  Returns:
    A `Topology`: its ``devices`` go into a `jax.sharding.Mesh` as real ones do.

  Raises:
    TopologyError: an unknown name (the message lists the known ones), or libtpu
      missing (the message says how to install it).

  Examples:
    >>> tpu_topology('v5e-4').chips
    4

  Not for running anything: arrays cannot be placed on these devices. On a real
  pod, build the mesh from `jax.devices()`.
  """
  kind_shape = KNOWN_TOPOLOGIES.get(name, name)
  kind, _, shape = kind_shape.partition(':')
  if kind not in HBM_BYTES or not shape or kind_shape not in KNOWN_TOPOLOGIES.values():
    raise TopologyError(f'unknown TPU topology {name!r}. Known: '
                        f'{", ".join(KNOWN_TOPOLOGIES)} (or the same as kind:shape, e.g. '
                        "'v5e:16x16'). Fix: one of those names, e.g. nn.tpu_topology('v5e-256').")
  if not _libtpu_present():
    raise TopologyError(
        f'compiling for {name} needs libtpu (the TPU compiler; no TPU is needed). Fix: '
        "pip install 'libtpu==0.0.42.*' (the version jax[tpu]==0.10.2 pins), or "
        "pip install -e '.[tpu]'.")
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')  # other processes may hold it
  _note_libtpu_lines()
  description = topologies.get_topology_desc(platform='tpu', topology_name=kind_shape,
                                             num_slices=num_slices)
  devices = sorted(description.devices, key=lambda d: (getattr(d, 'slice_index', 0), getattr(d, 'id', 0)))
  return Topology(name, tuple(devices), HBM_BYTES[kind], num_slices)


# libtpu's lines on a machine without TPU chips: `import lift` silences them where nothing
# configures libtpu already (`lift._compat`); where something does, say once what they are.
LIBTPU_LINES_NOTE = (
    'linen_ext: libtpu may print "could not determine TPU accelerator type" and '
    '"E0000 ... INVALID_ARGUMENT ... TPU_WORKER_HOSTNAMES" lines as it loads (to compile for '
    'a TPU topology) on a machine without TPU chips: they are harmless, compiling works all '
    'the same. TPU_WORKER_HOSTNAMES=localhost TPU_HOST_BOUNDS=1,1,1 in the environment '
    'silence them.')
_noted: list[bool] = []


def _libtpu_will_print() -> bool:
  """Whether libtpu, initialised now, prints its errors about the TPU environment: where
  JAX found no TPU chip (it then sets TPU_SKIP_MDS_QUERY) and the environment lacks the
  worker hostnames, or both the host bounds and the accelerator type."""
  env = os.environ
  return bool(env.get('TPU_SKIP_MDS_QUERY')) and (
      'TPU_WORKER_HOSTNAMES' not in env
      or not ('TPU_HOST_BOUNDS' in env or 'TPU_ACCELERATOR_TYPE' in env))


def _note_libtpu_lines() -> None:
  """Logs `LIBTPU_LINES_NOTE` (a warning: stderr, unless logging is set up otherwise) if
  libtpu would print its lines; at the first topology only, after which libtpu is loaded."""
  if _noted:
    return
  _noted.append(True)
  if _libtpu_will_print():
    _log.warning(LIBTPU_LINES_NOTE)


def is_tpu(devices) -> bool:
  """Whether ``devices`` (of a mesh) are TPUs, real or abstract."""
  return all(getattr(d, 'platform', '') == 'tpu' for d in devices)


__all__ = ['GIB', 'HBM_BYTES', 'KNOWN_TOPOLOGIES', 'Topology', 'is_tpu', 'tpu_topology']
