"""Every public name has a runnable docstring example and a place in the API reference.

The public names are what ``dir()`` of `lift`, `lift.loops` and `linen_ext` lists
without a leading underscore, modules aside. Ours (``__module__`` in `lift` or
`linen_ext`) carry a ``>>>`` example that runs under doctest with the globals of the
module defining them plus ``jax``, ``jnp``, ``np``, ``lift``, ``nn`` (`linen_ext`) and
``loops`` (`lift.loops`), under the suite's strict JAX settings (conftest.py); so do
the examples of their public methods, which the API reference shows too. Every
public name, ours or re-exported from Flax and JAX, and every submodule a package binds
by name in its ``__init__``, appears in docs/api/*.md; every object of ours is rendered
there by a ``:::`` directive under one of its names.
"""
import ast
import doctest
import importlib
import inspect
import pathlib
import pydoc
import re
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from markdown_it import MarkdownIt

import lift
import linen_ext
from lift import loops

ROOT = pathlib.Path(__file__).resolve().parent.parent
API_PAGES = sorted((ROOT / 'docs' / 'api').glob('*.md'))
PACKAGES = (lift, loops, linen_ext)
EXAMPLE_GLOBALS = {'jax': jax, 'jnp': jnp, 'np': np, 'lift': lift, 'nn': linen_ext,
                   'loops': loops}
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def is_ours(obj) -> bool:
  return (getattr(obj, '__module__', None) or '').split('.')[0] in ('lift', 'linen_ext')


def public_names() -> list[tuple[str, object]]:
  """``(full public path, object)`` of every public non-module name of the packages."""
  return [(f'{pkg.__name__}.{name}', getattr(pkg, name))
          for pkg in PACKAGES for name in sorted(dir(pkg))
          if not name.startswith('_') and not isinstance(getattr(pkg, name), types.ModuleType)]


def namespace_modules() -> list[str]:
  """Submodules a package's ``__init__`` binds by name (``nn.linear``, ``lift.errors``)."""
  paths = []
  for pkg in PACKAGES:
    tree = ast.parse(pathlib.Path(pkg.__file__).read_text())
    bound = {alias.asname or alias.name.split('.')[0] for node in tree.body
             if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    paths += [f'{pkg.__name__}.{name}' for name in sorted(bound)
              if not name.startswith('_') and isinstance(getattr(pkg, name), types.ModuleType)]
  return paths


def public_methods() -> list[tuple[str, object]]:
  """Public methods and properties with a ``>>>`` example of our public classes (and
  their bases of ours, whose members the API reference shows), each function once."""
  seen, methods = set(), []
  classes = [obj for _, obj in public_names() if isinstance(obj, type) and is_ours(obj)]
  for klass in [base for cls in classes for base in cls.__mro__ if is_ours(base)]:
    for name, member in vars(klass).items():
      fn = member.fget if isinstance(member, property) else member
      if (not name.startswith('_') and callable(fn) and is_ours(fn) and id(fn) not in seen
          and '>>>' in (fn.__doc__ or '')):
        seen.add(id(fn))
        methods.append((f'{klass.__module__}.{klass.__qualname__}.{name}', fn))
  return methods


PUBLIC = public_names()
OURS = [(path, obj) for path, obj in PUBLIC if is_ours(obj)]
METHODS = public_methods()


def api_text() -> str:
  return '\n'.join(page.read_text() for page in API_PAGES)


def resolve(path: str):
  """What a ``::: path`` directive names: the longest importable module prefix, then attributes.

  A module wins over a package attribute of the same name (``lift.scan`` is the module),
  as it does for the documentation tools.
  """
  parts = path.split('.')
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module('.'.join(parts[:i]))
    except ImportError:
      continue
    for attr in parts[i:]:
      obj = getattr(obj, attr)
    return obj
  raise ImportError(path)


def example_globals(obj) -> dict:
  return {**vars(sys.modules[obj.__module__]), **EXAMPLE_GLOBALS}


def test_the_collection_finds_the_packages_names():
  assert len(OURS) > 100 and ('linen_ext.Stacked', linen_ext.Stacked) in OURS
  assert ('linen_ext.relu', linen_ext.relu) in PUBLIC and not is_ours(linen_ext.relu)
  assert {'lift.errors', 'lift.loops', 'linen_ext.linear'} <= set(namespace_modules())
  assert 'linen_ext.module.init_apply.EntryMixin.apply' in dict(METHODS)


@pytest.mark.parametrize('path,obj', OURS, ids=[path for path, _ in OURS])
def test_docstring_has_an_example(path, obj):
  assert '>>>' in (obj.__doc__ or ''), f'{path} has no `>>>` example in its docstring'


def run_examples(path: str, obj) -> None:
  tests = doctest.DocTestFinder(recurse=False).find(obj, path, globs=example_globals(obj))
  assert tests and all(test.examples for test in tests), f'{path}: no example found'
  runner = doctest.DocTestRunner(optionflags=OPTIONS)
  report: list[str] = []
  for test in tests:
    runner.run(test, out=report.append)
  assert runner.failures == 0, ''.join(report)


def signature_text(obj) -> str:
  try:
    return str(inspect.signature(obj))
  except ValueError:  # a class whose constructor is Python's (a warning class)
    return ''


def test_signatures_show_real_types():
  """`help` and `inspect.signature` show types, never ``ForwardRef('float')``: what a
  NamedTuple gets in a module with ``from __future__ import annotations``."""
  assert 'ForwardRef' not in pydoc.render_doc(lift.Sampling)
  forward_refs = [path for path, obj in OURS
                  if isinstance(obj, type) and 'ForwardRef' in signature_text(obj)]
  assert not forward_refs, f'signatures with ForwardRef annotations: {forward_refs}'


@pytest.mark.parametrize('path,obj', OURS, ids=[path for path, _ in OURS])
def test_docstring_example_runs(path, obj):
  run_examples(path, obj)


@pytest.mark.parametrize('path,fn', METHODS, ids=[path for path, _ in METHODS])
def test_method_example_runs(path, fn):
  run_examples(path, fn)


def test_every_public_name_is_in_the_api_reference():
  text = api_text()
  missing = [path for path in [p for p, _ in PUBLIC] + namespace_modules()
             if not re.search(rf'(?<![\w.]){re.escape(path)}(?!\w)', text)]
  assert not missing, f'not in docs/api/*.md: {missing}'


def test_every_object_of_ours_is_rendered():
  directives = re.findall(r'^::: ([\w.]+)\s*$', api_text(), flags=re.M)
  rendered = {id(resolve(path)) for path in directives}
  missing = [path for path, obj in OURS if id(obj) not in rendered
             and id(type(obj)) not in rendered]  # a marker instance is documented by its class
  assert not missing, f'no `:::` directive in docs/api/*.md renders {missing}'


@pytest.mark.parametrize('page', API_PAGES, ids=[p.stem for p in API_PAGES])
def test_api_page_code_runs(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  module = types.ModuleType(f'docs_api_{page.stem}')
  monkeypatch.setitem(sys.modules, module.__name__, module)
  for token in MarkdownIt('commonmark').parse(page.read_text()):
    if token.type == 'fence' and token.info.split()[:1] == ['python']:
      exec(compile('\n' * (token.map[0] + 1) + token.content, str(page), 'exec'), module.__dict__)
