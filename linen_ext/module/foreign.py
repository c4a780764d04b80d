"""Modules of another module system (`flax.linen`'s) held by a Module's attributes.

`linen_ext.layers` registers how a `flax.linen.Module` becomes one of ours (`from_flax`);
`Module` wraps the ones it finds in fields and ``setup`` attributes before adopting them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flax.core import FrozenDict

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


__all__ = ['FOREIGN_MODULES', 'wrap_foreign_modules']
