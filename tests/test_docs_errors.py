"""The errors page names every error class, so it cannot fall behind the code."""
import inspect
import pathlib

import pytest
from markdown_it import MarkdownIt

import lift.errors
import linen_ext.errors

PAGE = pathlib.Path(__file__).resolve().parent.parent / 'docs' / 'errors.md'
MODULES = (lift.errors, linen_ext.errors)


def error_classes(module) -> dict[str, type]:
  """The exception classes a module defines itself (not those it imports)."""
  return {name: cls for name, cls in vars(module).items()
          if inspect.isclass(cls) and issubclass(cls, BaseException)
          and cls.__module__ == module.__name__}


def documented_names() -> set[str]:
  """Every inline `code span` of the page (tables included), and its last dotted part."""
  tokens = MarkdownIt('commonmark').enable('table').parse(PAGE.read_text())
  spans = {child.content for token in tokens if token.type == 'inline'
           for child in token.children if child.type == 'code_inline'}
  return spans | {span.rsplit('.', 1)[-1] for span in spans}


CLASSES = [(module.__name__, name) for module in MODULES for name in error_classes(module)]


def test_the_modules_define_errors():
  assert len(CLASSES) > 50


@pytest.mark.parametrize('module, name', CLASSES, ids=[f'{m}.{n}' for m, n in CLASSES])
def test_every_error_class_is_named_on_the_page(module, name):
  assert name in documented_names(), f'docs/errors.md does not name `{name}` ({module})'


def test_names_defined_in_both_packages_are_qualified():
  shared = set(error_classes(lift.errors)) & set(error_classes(linen_ext.errors))
  spans = documented_names()
  for name in shared:
    for module in MODULES:
      assert f'{module.__name__}.{name}' in spans, (
          f'`{name}` is defined in both packages: name `{module.__name__}.{name}` on the page')
