"""Every module-level name of every `flax.linen` module, public or private, imports from the
`linen_ext` module of the same path, unless docs/porting.md lists it with the reason.

Oracle: Flax's installed package, walked file by file (so ``flax.linen.experimental``, a
namespace package that ``pkgutil`` does not list, is walked too), and the page's table
between its ``flax-names-not-kept`` markers, read here so that page and test cannot drift.

The rule, as the page states it: a name counts unless it is a dunder, a module (``jnp``), a
type variable, or a name Flax's file imports from the standard library (``Any``,
``partial``). A name that counts is in ``linen_ext.X`` and is there

- this package's object of the name where ``flax.linen`` exports Flax's (``compact``);
- this package's layer where it is a Flax layer (``nn.linear.Dense is nn.Dense``);
- otherwise Flax's own object (a plain function, constant or type alias), or one of
  this package's (an equivalent: ``lift.Scope`` for ``flax.core.Scope``).

A listed name must be Flax's and absent here. Imports only: nothing is traced or compiled.
"""
import ast
import importlib
import inspect
import pathlib
import re
import sys
import types
import typing

import flax.linen as flax_nn
import pytest

import linen_ext as nn
from linen_ext.layers.native import NATIVE_COUNTERPARTS

PORTING = pathlib.Path(__file__).resolve().parents[2] / 'docs' / 'porting.md'
FLAX_LINEN = pathlib.Path(flax_nn.__file__).parent
PYTHON = sys.stdlib_module_names | {'typing_extensions'}  # the standard library and its backport


def flax_modules() -> list[str]:
  """Every module of ``flax.linen`` by its path below it (``linear``,
  ``experimental.layers_with_named_axes``)."""
  modules = []
  for path in sorted(FLAX_LINEN.rglob('*.py')):
    parts = path.relative_to(FLAX_LINEN).with_suffix('').parts
    parts = parts[:-1] if parts[-1] == '__init__' else parts
    if parts:
      modules.append('.'.join(parts))
  return modules


def python_imports(module: types.ModuleType) -> set[str]:
  """The names ``module``'s file binds with ``from <standard library> import ...``."""
  return {alias.asname or alias.name
          for node in ast.walk(ast.parse(inspect.getsource(module)))
          if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
          and node.module.split('.')[0] in PYTHON
          for alias in node.names}


def counted_names(module: types.ModuleType) -> list[str]:
  """``module``'s names that count (the rule in the module's docstring)."""
  python = python_imports(module)
  return [name for name, value in vars(module).items()
          if not (name.startswith('__') and name.endswith('__')) and name not in python
          and not isinstance(value, (types.ModuleType, typing.TypeVar))]


def not_kept() -> dict[tuple[str, str], str]:
  """``{(module, name): reason}``: the rows of the page's table, ``| `flax.linen.X` |
  `name`, ... | reason |``."""
  _, table, _ = re.split(r'<!-- flax-names-not-kept:(?:start|end) -->', PORTING.read_text())
  listed = {}
  for row in table.strip().splitlines()[2:]:  # after the header and its rule
    cells = [cell.strip() for cell in row.strip().strip('|').split('|')]
    module = re.fullmatch(r'`flax\.linen\.([\w.]+)`', cells[0])
    assert module and len(cells) == 3 and cells[2], f'docs/porting.md, a malformed row: {row}'
    for name in re.findall(r'`(\w+)`', cells[1]):
      listed[module.group(1), name] = cells[2]
  return listed


MODULES = flax_modules()
NOT_KEPT = not_kept()


def is_ours(value) -> bool:
  return (getattr(value, '__module__', None) or '').split('.')[0] in ('lift', 'linen_ext')


def problem(name: str, ours, theirs) -> str | None:
  """What is wrong with ``ours`` as the counterpart of Flax's ``theirs``, or None."""
  if getattr(flax_nn, name, None) is theirs and hasattr(nn, name):
    return None if ours is getattr(nn, name) else f'is not linen_ext.{name}'
  if inspect.isclass(theirs) and issubclass(theirs, flax_nn.Module):
    layer = NATIVE_COUNTERPARTS.get(theirs)
    if ours is layer or (layer is None and inspect.isclass(ours) and issubclass(ours, nn.Module)):
      return None
    return f'is not this package\'s layer {layer}'
  if ours is theirs or is_ours(ours):
    return None
  return f'is {ours!r}: neither Flax\'s object nor one of this package\'s'


def test_the_walk_sees_flax_linen_and_the_table():
  assert {'linear', 'module', 'normalization', 'experimental.layers_with_named_axes'} <= set(
      MODULES)
  names = counted_names(importlib.import_module('flax.linen.normalization'))
  assert {'_compute_stats', '_normalize', 'Module', 'Array'} <= set(names)
  assert not {'Any', 'Iterable', 'jnp'} & set(names)  # from the standard library; a module
  assert 'T' not in counted_names(importlib.import_module('flax.linen.module'))  # a TypeVar
  assert ('module', '_CallInfo') in NOT_KEPT and ('transforms', 'fork_rngs') in NOT_KEPT


@pytest.mark.parametrize('path', MODULES)
def test_every_flax_name_is_here_or_listed(path):
  theirs = importlib.import_module(f'flax.linen.{path}')
  ours = importlib.import_module(f'linen_ext.{path}')
  if hasattr(flax_nn, path):  # flax.linen binds its submodule: linen_ext binds ours
    assert getattr(nn, path) is ours
  problems = []
  for name in counted_names(theirs):
    where = f'linen_ext.{path}.{name}'
    if (path, name) in NOT_KEPT:
      continue
    if not hasattr(ours, name):
      problems.append(f'{where}: missing, and not in docs/porting.md\'s table of names not kept')
    elif (wrong := problem(name, getattr(ours, name), vars(theirs)[name])) is not None:
      problems.append(f'{where} {wrong}')
  assert not problems, '\n'.join(problems)


@pytest.mark.parametrize('path,name', sorted(NOT_KEPT))
def test_a_name_listed_as_not_kept_is_flaxs_and_not_here(path, name):
  assert path in MODULES, f'docs/porting.md lists flax.linen.{path}, which Flax lacks'
  theirs = importlib.import_module(f'flax.linen.{path}')
  assert name in counted_names(theirs), f'docs/porting.md lists flax.linen.{path}.{name}'
  assert not hasattr(importlib.import_module(f'linen_ext.{path}'), name), (
      f'linen_ext.{path}.{name} exists: take it off docs/porting.md\'s table')
