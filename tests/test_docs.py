"""The documentation site: it builds with `mkdocs build --strict`, and every guide's code runs.

Each guide's ```python blocks run in order in one namespace per page, as a reader
would run them, with JAX's default type promotion.
"""
import pathlib
import re
import subprocess
import sys
import types

import jax
import pytest
from markdown_it import MarkdownIt

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / 'docs'
GUIDES = sorted(DOCS.glob('*.md')) + [ROOT / 'README.md']


def python_blocks(page: pathlib.Path) -> list[tuple[int, str]]:
  """``(first line, source)`` of every fenced block whose language is python."""
  tokens = MarkdownIt('commonmark').parse(page.read_text())
  return [(token.map[0] + 2, token.content) for token in tokens
          if token.type == 'fence' and token.info.split()[:1] == ['python']]


@pytest.mark.parametrize('page', GUIDES, ids=[p.stem for p in GUIDES])
def test_guide_code_runs(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # files a guide writes land in a scratch folder
  module = types.ModuleType(f'docs_{page.stem.replace("-", "_")}')
  monkeypatch.setitem(sys.modules, module.__name__, module)  # classes defined there find it
  # Guides are user code and run as users run them, with JAX's default type promotion
  # (optax mixes Python floats with int32 step counts); the library's own code is held to
  # strict promotion by the rest of the suite.
  with jax.numpy_dtype_promotion('standard'):
    for line, source in python_blocks(page):
      code = compile('\n' * (line - 1) + source, str(page), 'exec')
      exec(code, module.__dict__)  # a failure's traceback points at the page's own line


def test_site_builds_strict():
  """Exactly the documented command: strict mode counts every warning (``--quiet`` would
  hide them from it), so one griffe or link warning fails the build."""
  mkdocs = pathlib.Path(sys.executable).parent / 'mkdocs'
  built = subprocess.run([str(mkdocs), 'build', '--strict'], cwd=ROOT, capture_output=True,
                         text=True, check=False)
  assert built.returncode == 0, built.stdout + built.stderr
  assert not re.search(r'^WARNING\b', built.stderr, re.MULTILINE), built.stderr
