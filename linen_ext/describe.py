"""How a Module prints: Flax's layout, attributes then the children bound so far.

    >>> print(Mlp(4))
    Mlp(
        # attributes
        features = 4
    )
"""
from __future__ import annotations

import dataclasses
import functools
import textwrap
from collections.abc import Callable, Mapping
from typing import Any


def _attr_repr(value: Any) -> str:
  """A function by its name (``relu``, an initializer's ``init``), anything else by ``repr``."""
  name = (value.__dict__.get('__name__') if dataclasses.is_dataclass(value) and
          hasattr(value, '__dict__') else getattr(value, '__name__', None))
  return name if callable(value) and isinstance(name, str) else repr(value)


def module_repr(module: Any, children_of: Callable[[Any], Mapping[str, Any]],
                indent: int = 4) -> str:
  """``Cls(# attributes ..., # children ...)``, one entry per line; runs no ``setup``."""
  lines = []
  fields = [f.name for f in dataclasses.fields(module)
            if f.name not in ('parent', 'name') and f.repr]
  if fields:
    lines += ['# attributes'] + [f'{name} = {_attr_repr(module.__dict__.get(name))}'
                                 for name in fields]
  children = children_of(module)
  if children:
    lines += ['# children'] + [f'{name} = {module_repr(child, children_of, indent)}'
                               for name, child in children.items()]
  if not lines:
    return f'{type(module).__name__}()'
  return f'{type(module).__name__}(\n{textwrap.indent(chr(10).join(lines), " " * indent)}\n)'


def loop_name(kind: str, block: Any) -> str:
  """How a loop over a block names itself in messages and scope paths.

  >>> loop_name('Stacked', functools.partial(nn.Dense, 3))
  'nn.Stacked(Dense)'
  """
  cls = block.func if isinstance(block, functools.partial) else block
  return f'nn.{kind}({getattr(cls, "__qualname__", None) or type(cls).__name__})'


def one_line(value: Any, width: int = 80) -> str:
  """``repr(value)`` on one line, cut at ``width`` characters (for error messages)."""
  return ' '.join(repr(value).split())[:width]


def short_str(value: Any, width: int = 60) -> str:
  """``str(value)`` as Flax's messages print it, or `one_line` when that is long.

  >>> short_str(2), short_str(jnp.ones((9, 9)))
  """
  text = str(value)
  return text if len(text) <= width and '\n' not in text else one_line(value, width)
