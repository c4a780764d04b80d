"""The one place where `lift` touches JAX internals.

Keep every import that is not public JAX API here, so that a JAX upgrade is a
change to this file only. Tested against the versions in pyproject.toml.
"""
from __future__ import annotations

import os as _os

from jax._src import traceback_util as _traceback_util


def hide_from_tracebacks(package_file: str) -> None:
  """Hides a package's frames from user tracebacks, as JAX does for its own."""
  _traceback_util.register_exclusion(_os.path.dirname(package_file))
