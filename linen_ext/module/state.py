"""Per-instance bookkeeping of a Module and the per-thread module stack."""
from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable
from typing import Any


class SetupState(enum.IntEnum):
  """Whether ``setup`` ran, and where."""
  NEW = 0  # setup has not run
  TRANSFORMED = 1  # setup ran outside a transform; the clone inside reruns it, reusing scopes
  DONE = 2


@dataclasses.dataclass
class ModuleState:
  """What a module instance tracks while its methods run."""
  in_setup: bool = False
  in_compact_method: bool = False
  setup_called: SetupState = SetupState.NEW
  is_initialized: bool = False
  autoname_cursor: dict[str, int] = dataclasses.field(default_factory=dict)

  def reset(self):
    """Forgets per-call state after a compact method or setup returns."""
    self.in_setup = False
    self.in_compact_method = False
    self.autoname_cursor = {}

  def export(self) -> ModuleState:
    """The state a clone inside a lifted transform starts from."""
    setup = SetupState.TRANSFORMED if self.setup_called else SetupState.NEW
    return ModuleState(self.in_setup, self.in_compact_method, setup,
                       self.is_initialized, dict(self.autoname_cursor))

  def reimport(self, other: ModuleState):
    """Takes back what the clone inside a transform changed (names handed out)."""
    self.in_setup, self.in_compact_method = other.in_setup, other.in_compact_method
    self.is_initialized = other.is_initialized
    self.autoname_cursor = dict(other.autoname_cursor)


UNINITIALIZED = ModuleState()


class _Context(threading.local):
  """The module whose method is running (creating modules adopts them), capture filters
  and method interceptors."""

  def __init__(self):
    self.module_stack: list[Any] = [None]
    self.capture_stack: list[Callable[[Any, str], bool] | None] = []
    self.interceptors: list[Callable[..., Any]] = []  # intercept_methods, outermost first
    self.flax_inline_parents: dict[bool, Any] = {}  # see linen_ext.module.foreign.inline_parent


context = _Context()
