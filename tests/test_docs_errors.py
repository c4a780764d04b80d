"""The errors page names every error class, so it cannot fall behind the code, and agrees with
the misuse catalogue: every class is raised by a case, and each common mistake it lists is a
case raising the error the page names."""
import inspect
import pathlib

import pytest
from markdown_it import MarkdownIt

import lift.errors
import linen_ext.errors
from tests.misuse.catalogue import CASES

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


# -- the page against the misuse catalogue (tests/misuse/) ---------------------------------

# Concrete classes no catalogue case raises, and why.
NOT_RAISED_BY_A_MISTAKE = {
    'LiftError': 'the base class; raised itself only when lift.jit\'s compiled body is traced '
                 'outside a call (tests/lift/test_jit.py)',
    'ModuleError': 'the base class of the Module system',
    'ShardingError': 'the base class of the sharding errors',
    'PipelineError': 'the base class of the errors of Stacked.pipeline',
    'ScaleError': 'the base class of the errors compiling for a topology and planning',
    'UnmappedCollectionError': 'raised as its subclass UnliftedCollectionError: pack makes a '
                               'collection immutable inside unless an out filter returns it',
}


def test_every_error_class_is_raised_by_a_catalogue_case_or_listed_with_a_reason():
  raised = {case.error for case in CASES.values()}
  for module in MODULES:
    for name, cls in error_classes(module).items():
      if name in NOT_RAISED_BY_A_MISTAKE:
        assert cls not in raised, f'{name} is raised by a case: drop it from the list'
      else:
        assert cls in raised, f'no case of the misuse catalogue raises {module.__name__}.{name}'


def mistake_rows() -> list[tuple[str, ...]]:
  """The cells of every table row in the page's "Common mistakes" section."""
  tokens = MarkdownIt('commonmark').enable('table').parse(PAGE.read_text())
  rows, section, cells = [], None, []
  for previous, token in zip([None] + tokens, tokens):
    if previous is not None and previous.type == 'heading_open' and previous.tag == 'h2':
      section = token.content
    elif section == 'Common mistakes':
      if token.type == 'tr_open':
        cells = []
      elif token.type == 'inline' and previous is not None and previous.type == 'td_open':
        cells.append(token.content)
      elif token.type == 'tr_close' and cells:
        rows.append(tuple(cells))
  return rows


def test_the_common_mistakes_are_catalogue_cases_with_their_error():
  rows = mistake_rows()
  assert len(rows) >= 20
  for mistake, error in rows:
    assert mistake in CASES, f'docs/errors.md: {mistake!r} is not a case of the misuse catalogue'
    cls = CASES[mistake].error
    assert error.strip('`') in (cls.__name__, f'{cls.__module__}.{cls.__name__}'), (
        f'docs/errors.md: {mistake!r} raises {cls.__module__}.{cls.__name__}, not {error}')
