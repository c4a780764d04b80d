"""The documentation site: it builds with `mkdocs build --strict`, and every guide's code runs
and prints what the page shows.

Each guide's ```python blocks run in order in one namespace per page, as a reader
would run them, with JAX's default type promotion. A block that prints is followed by
its output, the ```text block right after it (titled "Output"; `tools/docs_outputs.py`
writes them): the printed text must be that, each float within a relative 1e-2 or ten
units of its last shown digit (another CPU rounds a trained model's loss differently).
"""
import contextlib
import dataclasses
import html as html_text
import inspect
import io
import math
import pathlib
import re
import subprocess
import sys
import types
from typing import NamedTuple

import jax
import pytest
from markdown_it import MarkdownIt

import lift
import linen_ext
from lift import loops
from linen_ext.scale import planner

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / 'docs'
GUIDES = sorted(DOCS.glob('*.md')) + sorted(DOCS.glob('api/**/*.md')) + [ROOT / 'README.md']
OUTPUT_INFO = 'text title="Output"'
FLOAT = re.compile(r'-?\d+\.\d*(?:e[-+]?\d+)?')


class Block(NamedTuple):
  """A python block: its first line, source, the lines it spans and the output shown."""
  line: int
  source: str
  end: int  # the line after the closing fence (0-based), where an output block would start
  shown: str | None  # the text of the output block after it, if any
  shown_lines: tuple[int, int] | None  # that block's line span (0-based, end exclusive)


def python_blocks(page: pathlib.Path) -> list[Block]:
  """Every fenced block whose language is python, with the output block right after it."""
  fences = [t for t in MarkdownIt('commonmark').parse(page.read_text()) if t.type == 'fence']
  blocks = []
  for i, token in enumerate(fences):
    if token.info.split()[:1] != ['python']:
      continue
    after = fences[i + 1] if i + 1 < len(fences) else None
    follows = (after is not None and after.info.split()[:1] == ['text']
               and after.map[0] - token.map[1] <= 1)
    blocks.append(Block(token.map[0] + 2, token.content, token.map[1],
                        after.content if follows else None,
                        tuple(after.map) if follows else None))
  return blocks


def run_page(page: pathlib.Path, module: types.ModuleType) -> list[tuple[Block, str]]:
  """Runs the page's python blocks in ``module``: each block and what it printed."""
  printed = []
  # Guides are user code and run as users run them, with JAX's default type promotion
  # (optax mixes Python floats with int32 step counts); the library's own code is held to
  # strict promotion by the rest of the suite.
  with jax.numpy_dtype_promotion('standard'):
    for block in python_blocks(page):
      # Named as in the repository: messages that quote the user's line print this name.
      code = compile('\n' * (block.line - 1) + block.source, str(page.relative_to(ROOT)),
                     'exec')
      with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(code, module.__dict__)  # a failure's traceback points at the page's own line
      printed.append((block, out.getvalue()))
  return printed


def same_output(shown: str, printed: str) -> bool:
  """The same text, trailing spaces aside, floats close (see the module's docstring)."""
  shown, printed = (_normalised(text) for text in (shown, printed))
  numbers = FLOAT.findall(shown)
  if FLOAT.split(shown) != FLOAT.split(printed) or len(numbers) != len(FLOAT.findall(printed)):
    return False
  return all(math.isclose(float(a), float(b), rel_tol=1e-2, abs_tol=10 * _last_digit(a))
             for a, b in zip(numbers, FLOAT.findall(printed)))


def _last_digit(number: str) -> float:
  """The value of one unit of the last digit shown: ``'0.004'`` -> 0.001."""
  mantissa, _, exponent = number.lower().partition('e')
  decimals = len(mantissa.partition('.')[2])
  return 10.0 ** (int(exponent or 0) - decimals)


def _normalised(text: str) -> str:
  return '\n'.join(line.rstrip() for line in text.strip('\n').split('\n'))


@pytest.mark.parametrize('page', GUIDES, ids=[str(p.relative_to(ROOT)) for p in GUIDES])
def test_guide_code_runs_and_prints_what_it_shows(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # files a guide writes land in a scratch folder
  module = types.ModuleType(f'docs_{page.stem.replace("-", "_")}')
  monkeypatch.setitem(sys.modules, module.__name__, module)  # classes defined there find it
  for block, printed in run_page(page, module):
    where = f'{page.relative_to(ROOT)}:{block.line}'
    if block.shown is None:
      assert not printed, f'{where} prints, but shows no ```{OUTPUT_INFO} block:\n{printed}'
    else:
      assert same_output(block.shown, printed), (
          f'{where} shows\n{block.shown}\nbut prints\n{printed}\n'
          'Fix: python tools/docs_outputs.py rewrites the output blocks.')


def test_site_builds_strict():
  """The documented command, exactly: strict mode counts every warning
  (``--quiet`` would hide them from it), so one griffe or link warning fails the build. It
  prints its log lines only: no notice box from a theme or plugin (notes/test-suite.md,
  the docs). The API reference it builds is then checked (`constructor_problems`): one
  build for both."""
  mkdocs = pathlib.Path(sys.executable).parent / 'mkdocs'
  built = subprocess.run([str(mkdocs), 'build', '--strict'], cwd=ROOT, capture_output=True,
                         text=True, check=False)
  assert built.returncode == 0, built.stdout + built.stderr
  assert not re.search(r'^WARNING\b', built.stderr, re.MULTILINE), built.stderr
  stray = [line for line in (built.stdout + built.stderr).splitlines()
           if line.strip() and not line.startswith('INFO')]
  assert not stray, '\n'.join(stray)
  sections = api_sections(ROOT / 'site' / 'api')
  problems = constructor_problems(sections) + reading_problems(sections)
  assert not problems, '\n'.join(problems)


def api_sections(api: pathlib.Path) -> dict[str, str]:
  """The HTML of each object an API page renders at the top (a level-3 heading), by the
  heading's id (the path its ``:::`` directive names)."""
  sections = {}
  for page in api.glob('*/index.html'):
    html = page.read_text()
    starts = [(m.start(), m.group(1)) for m in re.finditer(r'<h3 id="([^"]+)"', html)]
    for (start, ident), (end, _) in zip(starts, starts[1:] + [(len(html), '')]):
      sections[ident] = html[start:end]
  return sections


def public_classes() -> dict[type, set[str]]:
  """Our public classes (``dir()`` of `lift`, `lift.loops` and `linen_ext`), each with
  the paths that can name it on an API page."""
  classes: dict[type, set[str]] = {}
  for pkg in (lift, loops, linen_ext):
    for name in dir(pkg):
      obj = getattr(pkg, name)
      if (not name.startswith('_') and isinstance(obj, type)
          and obj.__module__.split('.')[0] in ('lift', 'linen_ext')):
        classes.setdefault(obj, {f'{obj.__module__}.{obj.__qualname__}'}).add(
            f'{pkg.__name__}.{name}')
  return classes


def constructor_fields(cls: type) -> tuple[list[str], bool]:
  """The names the constructor takes, and whether they are fields (a dataclass's or a
  NamedTuple's, which get a table); an ``__init__`` inherited from Python takes none."""
  if dataclasses.is_dataclass(cls):
    return [f.name for f in dataclasses.fields(cls) if f.init], True
  if issubclass(cls, tuple) and hasattr(cls, '_fields'):
    return list(cls._fields), True
  if (getattr(cls.__init__, '__module__', None) or '').split('.')[0] in ('lift', 'linen_ext'):
    return list(inspect.signature(cls).parameters), False
  return [], False


def constructor_problems(sections: dict[str, str]) -> list[str]:
  """What the API pages miss: a public class without a section, a constructor argument
  missing from the class's signature, a field without its row in the ``Fields:`` table,
  or an object rendered as a module (``::: lift.generate`` once named the module)."""
  problems = [f'{ident}: rendered as a module' for ident, html in sections.items()
              if 'doc-module-name' in html.split('</h3>')[0]]
  for cls, paths in public_classes().items():
    section = next((sections[p] for p in sorted(paths) if p in sections), None)
    if section is None:
      problems.append(f'{min(paths)}: no section on an API page')
      continue
    names, are_fields = constructor_fields(cls)
    signature = re.search(r'<div class="doc-signature.*?</div>', section, re.S)
    shown = set(re.findall(r'<span class="n">(\w+)</span>', signature.group(0) if signature
                           else ''))
    table = re.search(r'>Fields:?</span>.*?</table>', section, re.S | re.I)  # FIELDS: spacy
    rows = set(re.findall(r'<tr class="doc-section-item">\s*<td>\s*<code>(\w+)</code>',
                          table.group(0) if table else ''))
    problems += [f'{min(paths)}: {name!r} is not in its signature'
                 for name in names if name not in shown]
    problems += [f'{min(paths)}: field {name!r} has no row in its Fields table'
                 for name in names if are_fields and name not in rows]
  return problems


# The objects the guides call by their `nn.` name (`linen_ext`'s names loaded on first use):
# their heading on the API page is that name, not the module path.
NN_HEADINGS = {'linen_ext.scale.tpu_topology': 'nn.tpu_topology',
               'linen_ext.scale.compile_train_step': 'nn.compile_train_step',
               'linen_ext.scale.plan': 'nn.plan'}
# Constant-looking defaults whose name is what they mean: Flax's sentinel for `parent`.
NAMED_DEFAULTS = {'UNSPECIFIED'}


def text_of(html: str) -> str:
  """The text a reader sees of some HTML (tags dropped, entities decoded, no permalink)."""
  return html_text.unescape(re.sub(r'<[^>]+>', '', html)).replace('\u00b6', '').strip()


def reading_problems(sections: dict[str, str]) -> list[str]:
  """What a reader of the API pages would miss: an object headed by its module path where
  the guides call it `nn.name`, or a default shown as the name of a constant (``REMATS``)
  rather than what it holds, as `nn.plan`'s ``remat`` once was."""
  problems = [f'{ident}: headed {text_of(sections[ident].split("</h3>")[0])!r}, not {name!r} '
              'as the guides call it' for ident, name in NN_HEADINGS.items()
              if ident in sections and text_of(sections[ident].split('</h3>')[0]) != name]
  problems += [f'{ident}: no section on an API page' for ident in NN_HEADINGS
               if ident not in sections]
  for ident, section in sections.items():
    signature = re.search(r'<div class="doc-signature.*?</div>', section, re.S)
    shown = text_of(signature.group(0)) if signature else ''
    problems += [f"{ident}: the signature shows {name}={default}, a constant's name, not "
                 'what it holds' for name, default in re.findall(r'(\w+)=([A-Z][A-Z0-9_]+)\b',
                                                                shown)
                 if default not in NAMED_DEFAULTS]
  plan = re.sub(r'\s+', ' ', text_of(sections.get('linen_ext.scale.plan', ''))).replace('"', "'")
  remats = repr(planner.REMATS)
  if f'remat={remats}' not in plan or f'DEFAULT: {remats}' not in plan:
    problems.append(f'linen_ext.scale.plan: remat\'s default {remats} is not spelled out in '
                    'its signature and its parameters table')
  return problems
