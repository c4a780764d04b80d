"""The checkpoint side of examples/train_lm.py: orbax checkpoints that survive preemption.

* `checkpoint_manager`, `save`, `restore`: orbax's `CheckpointManager`. Orbax writes a
  checkpoint into a temporary directory and renames it once complete, and lists complete
  ones only, so a checkpoint cut short (a killed process) is never read: `restore` takes
  the latest complete one, or tells there is none.
* `Preemption`: on SIGTERM (what a scheduler sends before it preempts a job) or SIGINT
  the step under way finishes, every process agrees to stop after that same step, a
  checkpoint is written there and the job exits 0; a second signal exits at once.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
from collections.abc import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils


def checkpoint_manager(directory: pathlib.Path, every: int):
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(save_interval_steps=every, max_to_keep=2)
  return ocp.CheckpointManager(directory.absolute(), options=options)


def save(manager, step: int, state, history: dict, *, force: bool = False) -> None:
  """Starts writing a checkpoint of ``step`` in the background. The history is copied
  first: the loop goes on appending to it while orbax writes."""
  import orbax.checkpoint as ocp
  history = json.loads(json.dumps(history))
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                              history=ocp.args.JsonSave(history)),
               force=force)


def restore(manager, state):
  """The latest complete checkpoint as ``(step, state, history)``, or None if there is none;
  ``state`` gives the structure and the shardings to restore onto (whatever mesh the
  checkpoint was saved from)."""
  import orbax.checkpoint as ocp
  step = manager.latest_step()
  if step is None:
    return None
  abstract = jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract), history=ocp.args.JsonRestore()))
  return step, restored['state'], restored['history']


class Preemption:
  """Whether the job was asked to stop (SIGTERM or SIGINT), agreed between processes."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.received: int | None = None

  def _handle(self, signum, frame):
    del frame
    if self.received is not None:  # a second signal: stop at once, as the default would
      os._exit(128 + signum)
    self.received = signum

  @contextlib.contextmanager
  def installed(self) -> Iterator[Preemption]:
    """The handlers, for the duration of the training loop (the previous ones after)."""
    previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
    try:
      yield self
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)

  def agreed(self) -> bool:
    """Whether any process was asked to stop. Every process calls it after every step, so
    all of them stop after the same one."""
    asked = self.received is not None
    if jax.process_count() == 1:
      return asked
    return bool(np.any(multihost_utils.process_allgather(np.array([asked]))))

  def describe(self) -> str:
    if self.received is None:
      return 'another process was asked to stop'
    return signal.Signals(self.received).name
