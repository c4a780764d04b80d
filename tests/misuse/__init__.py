"""The misuse catalogue: one record per mistake a user can make, grouped by area.

Each area module (`scope_cases`, `vmap_cases`, ...) holds a list ``CASES`` of `Case`;
`tests.misuse.catalogue` gathers them and `tests/test_misuse_catalogue.py` runs them. This is
the one home of "this mistake raises this error with this message" tests: a test elsewhere
that raises an error does so to check something else (a behaviour, Flax parity of values).
"""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable

import flax.core
import flax.linen

import lift
import linen_ext


@dataclasses.dataclass(frozen=True)
class Case:
  """One mistake, the error it raises and what the message must say.

  Attributes:
    name: the mistake, as a user would describe it; unique in the catalogue (docs/errors.md
      names cases by it).
    mistake: makes the mistake; it must raise ``error``.
    error: our class, exactly (a `lift.LiftError` subclass).
    fragments: what the message must contain: the argument, variable path or collection
      at fault. The runner also requires the message's ``Fix:``.
    flax_error: the class Flax raises for the same mistake (its own, or the built-in it
      raises), else None; ours must be an instance of it, so that code catching Flax's error
      keeps working.
    flax_mistake: the same mistake made with Flax; it must raise ``flax_error``.
    xfail: why the case fails today, for a known gap (the runner marks it strict xfail).
  """
  name: str
  mistake: Callable[[], Any]
  error: type[BaseException]
  fragments: tuple[str, ...]
  flax_error: type[BaseException] | None = None
  flax_mistake: Callable[[], Any] | None = None
  xfail: str | None = None


def case(name: str, mistake: Callable[[], Any], error: type[BaseException], *fragments: str,
         flax_error: type[BaseException] | None = None, xfail: str | None = None) -> Case:
  """A mistake made with our libraries only."""
  return Case(name, mistake, error, fragments, flax_error, None, xfail)


def both(name: str, build: Callable[[Any], Any], error: type[BaseException],
         flax_error: type[BaseException], *fragments: str, core: bool = False,
         xfail: str | None = None) -> Case:
  """A mistake that ``build(nn)`` makes with either library: ours raises ``error``, Flax
  raises ``flax_error``. ``build`` gets `linen_ext` and `flax.linen`, or with ``core``
  `lift` and `flax.core`."""
  ours, theirs = (lift, flax.core) if core else (linen_ext, flax.linen)
  return Case(name, lambda: build(ours), error, fragments, flax_error, lambda: build(theirs),
              xfail)
