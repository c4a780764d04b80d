"""What the planner knows of its candidates before compiling them, and the order in which
it compiles them so that as few as possible need compiling.

On one mesh (and microbatch count), remat policies are ordered by how much they save:
``none < dots < full < offload`` and ``full < nested`` (each keeps a subset of what the
one before keeps, or moves it to the host). If ``a``'s policy comes before ``b``'s:

    time(a) <= time(b)     (less recomputation never costs more; nor does keeping the
                            optimizer state on the chip rather than moving it each step)
    need(a) >= need(b)     (with the optimizer state where it is in both: saving more
                            needs no more memory; an assumption, true where activations
                            outweigh the compiler's fixed buffers)

So once ``a`` fits, every ``b`` after it in time is dominated (it cannot be chosen), and
once ``b`` does not fit, no ``a`` before it in memory can. Moving values to the host is
not ordered in memory: ``offload`` stages the carries it moves through device buffers,
and the update moves an offloaded optimizer state through staging buffers (at small sizes
either can need more than keeping the values on the chip). The next candidate compiled
is the one whose answer settles the most of the others either way (a binary search along
the orders). Candidates on different meshes are not ordered: each is compiled unless
its FLOPs alone take longer than a fitting candidate's modelled step.
"""
from collections.abc import Sequence

_TIME_BEFORE = {'none': {'dots', 'full', 'offload', 'nested'},
                'dots': {'full', 'offload', 'nested'}, 'full': {'offload', 'nested'}}
_MEMORY_BEFORE = {'none': {'dots', 'full', 'nested'}, 'dots': {'full', 'nested'},
                  'full': {'nested'}}


def _before(order: dict, a, b) -> bool:
  return (a.mesh, a.microbatches) == (b.mesh, b.microbatches) and (
      a.remat == b.remat or b.remat in order.get(a.remat, set()))


def precedes(a, b) -> bool:
  """Whether candidate ``a`` costs no more time than ``b`` (``a`` itself included)."""
  return _before(_TIME_BEFORE, a, b) and (not a.offload_optimizer or b.offload_optimizer)


def needs_no_less(a, b) -> bool:
  """Whether candidate ``a`` needs at least ``b``'s memory (``a`` itself included)."""
  return _before(_MEMORY_BEFORE, a, b) and a.offload_optimizer == b.offload_optimizer


def next_to_compile(undecided: Sequence) -> int:
  """The index in ``undecided`` whose answer (fits or not) settles the most others in
  the worse case: ``min(#preceding it, #following it)``, ties to the earlier."""
  def settled(c) -> int:
    before = sum(needs_no_less(o, c) for o in undecided)
    after = sum(precedes(c, o) for o in undecided)
    return min(before, after)
  return max(range(len(undecided)), key=lambda i: (settled(undecided[i]), -i))


__all__ = ['needs_no_less', 'next_to_compile', 'precedes']
