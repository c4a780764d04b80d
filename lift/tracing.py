"""Tracing utilities for libraries built on `lift` (a module system, a layer library).

`lift` keeps every use of JAX internals in one private module; these are the two a
library on top of it needs, under names it can import.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lift import _compat


def hide_from_tracebacks(package_file: str) -> None:
  """Hides the frames of the package whose ``__init__`` is ``package_file`` from user
  tracebacks, as JAX hides its own (``JAX_TRACEBACK_FILTERING``).

  >>> hide_from_tracebacks(__file__)  # in a package's __init__.py
  """
  _compat.hide_from_tracebacks(package_file)


def evaluate_known(flat_fn: Callable[..., list], inputs: list, debug_info: Any) -> list | None:
  """``flat_fn(*inputs)`` where some inputs are ``jax.ShapeDtypeStruct`` placeholders.

  Partial evaluation: operations on concrete values run, those that need a placeholder
  are only traced, never run. Returns the outputs, or None if one of them needs a
  placeholder. ``debug_info`` is ``jax.api_util.debug_info(...)`` of the function.

  >>> fn = lambda x, y: [x * 2]  # never reads y
  >>> info = jax.api_util.debug_info('example', fn, (1.0, 2.0), {})
  >>> evaluate_known(fn, [jnp.float32(1.0), jax.ShapeDtypeStruct((), jnp.float32)], info)
  [Array(2., dtype=float32)]
  """
  return _compat.evaluate_known(flat_fn, inputs, debug_info)


__all__ = ['hide_from_tracebacks', 'evaluate_known']
