"""A stated model of a training step's time per chip, from its compiled stats and the
chip's published figures: what `nn.plan` ranks candidates by. Modelled, not measured.

    time = max(FLOPs / peak, HBM bytes / HBM bandwidth)
           + 2 x host bytes / host link bandwidth
           + collective bytes / ICI bandwidth

- FLOPs: the step's products with every loop's trip count, recomputation included
  (`CompiledStats.flops`).
- HBM bytes: a floor: every argument and output byte read or written once, every
  temporary written and read once.
- host bytes: what lives in host memory (offloaded activations or optimizer state) goes
  down and comes back once a step.
- collective bytes: the bytes the step's collectives produce on each chip, each loop's
  counted as often as it runs (`CompiledStats.collective_bytes`), over the chip's
  inter-chip bandwidth (all its links).

Transfers are not overlapped with compute: an upper bound on a compute-bound step, and
an order that never prefers more recomputation or more traffic. MFU is the model's
FLOPs (the fewest of the candidates: no recomputation) over the modelled time at peak.
"""
import dataclasses

from linen_ext.scale.compiled import CompiledStats


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's published per-chip figures.

  Attributes:
    peak_flops: bfloat16 FLOP/s.
    hbm_bandwidth: HBM bytes/s.
    host_bandwidth: host (PCIe) bytes/s, each way.
    ici_bandwidth: inter-chip bytes/s of the chip, all its links.
  """
  peak_flops: float
  hbm_bandwidth: float
  host_bandwidth: float
  ici_bandwidth: float


# Sources: Google Cloud's TPU v5e, v5p and v6e pages (peak bf16 FLOP/s; HBM bandwidth;
# inter-chip interconnect per chip: 1,600, 4,800 and 3,584 Gbps) and "How to Scale Your
# Model" (jax-ml.github.io/scaling-book, part 2: PCIe 1.5e10 bytes/s per chip, given for
# v6e and taken here for all three).
CHIPS = {
    'v5e': Chip(peak_flops=1.97e14, hbm_bandwidth=8.1e11, host_bandwidth=1.5e10,
                ici_bandwidth=2.0e11),
    'v5p': Chip(peak_flops=4.59e14, hbm_bandwidth=2.76e12, host_bandwidth=1.5e10,
                ici_bandwidth=6.0e11),
    'v6e': Chip(peak_flops=9.18e14, hbm_bandwidth=1.64e12, host_bandwidth=1.5e10,
                ici_bandwidth=4.48e11),
}


@dataclasses.dataclass(frozen=True)
class StepTime:
  """A step's modelled seconds, by term (`modelled_time`).

  Attributes:
    compute: FLOPs over the peak.
    hbm: the HBM floor's bytes over its bandwidth.
    host: host transfers over the host link.
    collectives: collective bytes over the ICI links.
  """
  compute: float
  hbm: float
  host: float
  collectives: float

  @property
  def total(self) -> float:
    return max(self.compute, self.hbm) + self.host + self.collectives


def compute_floor(flops: float, chip: Chip) -> float:
  """The seconds a step of ``flops`` per chip takes at least: no candidate with more
  FLOPs can beat one modelled under this."""
  return flops / chip.peak_flops


def modelled_time(stats: CompiledStats, chip: Chip) -> StepTime:
  """The modelled seconds of one step with ``stats`` on ``chip`` (see the module's
  equation). Modelled, not measured.

  Examples:
    >>> stats = CompiledStats(0, 0, 0, 0, host_bytes=0, flops=1.97e14, collectives={})
    >>> modelled_time(stats, CHIPS['v5e']).total
    1.0
  """
  hbm_bytes = stats.argument_bytes + stats.output_bytes + 2 * stats.temp_bytes
  return StepTime(compute=compute_floor(stats.flops, chip),
                  hbm=hbm_bytes / chip.hbm_bandwidth,
                  host=2 * stats.host_bytes / chip.host_bandwidth,
                  collectives=stats.collective_bytes / chip.ici_bandwidth)


def chip_of(devices) -> Chip | None:
  """The `Chip` of TPU ``devices`` (their ``device_kind``), or ``None`` if not known."""
  kind = str(getattr(devices[0], 'device_kind', '')).lower()
  for name, marker in (('v5e', 'v5 lite'), ('v5e', 'v5e'), ('v6e', 'v6'), ('v5p', 'v5')):
    if marker in kind:
      return CHIPS[name]
  return None


__all__ = ['CHIPS', 'Chip', 'StepTime', 'chip_of', 'compute_floor', 'modelled_time']
