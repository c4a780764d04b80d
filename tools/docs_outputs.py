"""Writes each guide's output blocks: what its python blocks print, as the docs test runs them.

After a python block that prints, a ```text title="Output"``` block holds the printed
text (an untitled ```text block right after it is taken for its output and replaced);
`tests/test_docs.py` checks that the two agree. Run from the repository root after
changing a guide's code:

    .venv/bin/python tools/docs_outputs.py                   # every guide
    .venv/bin/python tools/docs_outputs.py docs/concepts.md  # one
"""
import os
import pathlib
import sys
import tempfile
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import conftest  # noqa: E402,F401  (the suite's JAX settings and compile cache)
from tests.test_docs import GUIDES, OUTPUT_INFO, run_page  # noqa: E402


def rewrite(page: pathlib.Path) -> int:
  """Puts each block's printed text after it; how many. Messages that quote the page's
  own line numbers move with the inserted blocks, so it runs until nothing changes."""
  for _ in range(3):
    before = page.read_text()
    written = _rewrite_once(page)
    if page.read_text() == before:
      break
  return written


def _rewrite_once(page: pathlib.Path) -> int:
  """Puts each block's printed text after it, replacing an old output block; how many."""
  module = types.ModuleType(f'docs_{page.stem.replace("-", "_")}')
  sys.modules[module.__name__] = module
  here = os.getcwd()
  with tempfile.TemporaryDirectory() as scratch:
    os.chdir(scratch)  # files a guide writes land in a scratch folder
    try:
      printed = run_page(page, module)
    finally:
      os.chdir(here)
  lines = page.read_text().split('\n')
  written = 0
  for block, text in reversed(printed):  # from the end: earlier line numbers stay valid
    start, end = block.shown_lines or (block.end, block.end)
    output = [f'```{OUTPUT_INFO}', *text.rstrip('\n').split('\n'), '```'] if text else []
    if block.shown_lines is None and output:
      output = [''] + output
    lines[start:end] = output
    written += bool(output)
  page.write_text('\n'.join(lines))
  return written


def main(paths: list[str]) -> None:
  pages = [pathlib.Path(p).resolve() for p in paths] or GUIDES
  for page in pages:
    print(f'{page.relative_to(ROOT)}: {rewrite(page)} output blocks')


if __name__ == '__main__':
  main(sys.argv[1:])
