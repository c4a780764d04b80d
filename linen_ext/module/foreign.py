"""Modules of another module system (`flax.linen`'s) held by a Module's attributes.

`linen_ext.layers` registers how a `flax.linen.Module` becomes one of ours (`from_flax`);
`Module` wraps the ones it finds in fields and ``setup`` attributes before adopting them.
"""
from __future__ import annotations

import contextlib
import pathlib
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from flax import errors as flax_errors
from flax.core import FrozenDict
from flax.linen import partitioning as flax_partitioning

from lift.scope import Scope

from linen_ext import errors

# How a module of another system becomes one of ours, by its class (filled by the layers).
FOREIGN_MODULES: dict[type, Callable[[Any], Any]] = {}


def wrap_foreign_modules(tree: Any) -> Any:
  """``tree`` with each module of another system (`flax.linen`'s) wrapped as one of ours.

  Lists, tuples and dicts are walked; other values come back as they are.

  Examples:
    >>> import flax.linen
    >>> type(wrap_foreign_modules([flax.linen.Dense(2)])[0]).__name__
    'FlaxModule'
  """
  wrap = next((fn for cls, fn in FOREIGN_MODULES.items() if isinstance(tree, cls)), None)
  if wrap is not None:
    return wrap(tree)
  if isinstance(tree, (dict, FrozenDict)):
    return type(tree)({k: wrap_foreign_modules(v) for k, v in tree.items()})
  if isinstance(tree, (list, tuple)) and not hasattr(tree, '_fields'):
    return type(tree)(wrap_foreign_modules(v) for v in tree)
  return tree


def is_flax_scope(value: Any) -> bool:
  """Whether ``value`` is a `flax.core.Scope` (told by its class, without importing flax's)."""
  return type(value).__name__ == 'Scope' and type(value).__module__ == 'flax.core.scope'


def scope_over_flax_scope(flax_scope: Any, cls_name: str) -> Scope:
  """A `lift.Scope` that reads and writes the variables of the root `flax.core.Scope` given.

  What a module bound to it creates lands in ``flax_scope.variables()``, as with
  Flax. Its rng streams start from the same keys; the keys drawn are this
  package's, not Flax's.
  """
  if flax_scope.parent is not None:
    raise errors.InvalidParentError(cls_name, flax_scope)
  rngs = {name: rng.as_jax_rng() for name, rng in flax_scope.rngs.items()}
  return Scope(flax_scope._variables, rngs, mutable=flax_scope.mutable,
               path=flax_scope.path, flags=flax_scope.flags)


_FLAX_PARTITIONING = pathlib.Path(flax_partitioning.__file__).resolve()


@contextlib.contextmanager
def flax_errors_as_ours(cls_name: str, method: str) -> Iterator[None]:
  """Errors of `flax.linen` code that looked for a flax module around it, as ours.

  Flax binds modules, and finds "the current module", only inside flax modules:
  a flax module made and called inline, or flax's `param_with_axes` /
  `variable_with_axes` called without ``module=`` inside ``cls_name.method``,
  fail there with flax's unbound-module error or a bare ``AssertionError``.
  """
  try:
    yield
  except flax_errors.CallCompactUnboundModuleError as e:
    if isinstance(e, errors.ModuleError):  # ours, from a method called inside
      raise
    raise errors.FlaxModuleCalledInlineError(cls_name, method) from e
  except AssertionError as e:
    frame = traceback.extract_tb(e.__traceback__)[-1]
    if pathlib.Path(frame.filename).resolve() != _FLAX_PARTITIONING:
      raise
    raise errors.FlaxPartitioningError(frame.name, cls_name, method) from e


__all__ = ['FOREIGN_MODULES', 'flax_errors_as_ours', 'is_flax_scope', 'scope_over_flax_scope',
           'wrap_foreign_modules']
