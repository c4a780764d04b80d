"""Run Flax's own `tests/linen` suite against `linen_ext`, with only the import changed.

A maintainer's tool, not part of CI. Get Flax's sources at the installed version (e.g.
`git clone https://github.com/google/flax` and check out the commit of `pip show flax`'s
version), then, from this repository's root:

    python tools/flax_linen_tests.py /path/to/flax/tests            # every file, 2 workers
    python tools/flax_linen_tests.py /path/to/flax/tests -n 0 --files linen_test.py
    python tools/flax_linen_tests.py /path/to/flax/tests -k vmap --show-failures
    python tools/flax_linen_tests.py /path/to/flax/tests --no-swap  # Flax on itself

It copies `tests/linen/*_test.py` into a scratch folder (a temporary one, or `--workdir`),
swaps the imports of the Module system (`from flax import linen as nn`,
`import flax.linen as nn`, `from flax.linen[.sub] import public_names`, and dotted
`'flax.linen.x.y'` strings as given to `mock.patch`) for `linen_ext`, runs pytest there (so
this repository's `conftest.py` and pytest settings do not apply) with this repository on
`PYTHONPATH`, and prints passed / failed / errors / skipped per file and in total. Imports
of Flax's internals that the tests test (`flax.core`, `flax.errors`, `flax.traverse_util`)
and private names (`flax.linen.transforms._HashableProxy`,
`mock.patch('flax.linen.partitioning._with_sharding_constraint')`) are left alone. As in
Flax's own CI, JAX runs on the CPU with 4 host devices (`JAX_PLATFORMS` and `XLA_FLAGS`
in the environment override this).

`--lift-scope` also replaces the `Scope` imported from `flax.core` (which some tests pass
as a module's `parent`) by this package's `lift.Scope`: a second count, showing which of
those tests fail only for being given Flax's scope object.

Flax's tests need one package this project does not: `cloudpickle`. Without it two tests
fail on the import; install it, or `pip install --target DIR cloudpickle` and put DIR on
`PYTHONPATH` (which the tool keeps). `notes/flax-linen-tests.md` has the latest counts and
the reason for every test that does not pass.
"""
from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

# (pattern, replacement) applied in order to every test file's source.
_SWAPS = (
    (re.compile(r'^(\s*)from flax import linen as (\w+)\s*$', re.M), r'\1import linen_ext as \2'),
    (re.compile(r'^(\s*)import flax\.linen as (\w+)\s*$', re.M), r'\1import linen_ext as \2'),
    # A dotted name in a string (``mock.patch('flax.linen.spmd.f')``), unless it is private.
    (re.compile(r"(['\"])flax\.linen((?:\.[a-zA-Z]\w*)+['\"])"), r'\1linen_ext\2'),
)
_FROM_IMPORT = re.compile(r'^(\s*)from flax\.linen((?:\.\w+)*) import (.+)$', re.M)
_SCOPE_IMPORT = re.compile(r'^(\s*)from flax\.core import ((?:[\w ]+, )*Scope(?:, [\w ]+)*)$',
                           re.M)


def _swap_from_import(match: re.Match) -> str:
  """`from flax.linen[.sub] import names` -> `linen_ext`, unless it names a private object."""
  indent, submodule, names = match.groups()
  if any(name.strip().startswith('_') for name in names.strip('()').split(',')):
    return match.group(0)  # a Flax internal: the test tests Flax itself
  return f'{indent}from linen_ext{submodule} import {names}'


def swap_imports(source: str) -> str:
  """Returns `source` with Flax's Module system replaced by `linen_ext`."""
  for pattern, replacement in _SWAPS:
    source = pattern.sub(replacement, source)
  return _FROM_IMPORT.sub(_swap_from_import, source)


def _swap_scope_import(match: re.Match) -> str:
  indent, names = match.groups()
  rest = [n.strip() for n in names.split(',') if n.strip() != 'Scope']
  kept = f'{indent}from flax.core import {", ".join(rest)}\n' if rest else ''
  return f'{kept}{indent}from lift import Scope'


def swap_scope(source: str) -> str:
  """Returns `source` with ``from flax.core import ..., Scope, ...`` taking `lift.Scope`."""
  return _SCOPE_IMPORT.sub(_swap_scope_import, source)


def copy_tests(flax_tests: pathlib.Path, workdir: pathlib.Path, files: list[str],
               swap: bool, lift_scope: bool = False) -> list[str]:
  """Copies the linen test files into `workdir` (swapped if `swap`); returns their names."""
  linen_dir = flax_tests / 'linen'
  names = files or sorted(p.name for p in linen_dir.glob('*_test.py'))
  workdir.mkdir(parents=True, exist_ok=True)
  for name in names:
    source = (linen_dir / name).read_text()
    source = swap_imports(source) if swap else source
    (workdir / name).write_text(swap_scope(source) if lift_scope else source)
  # An empty ini file pins pytest's rootdir here: no settings or conftest from elsewhere.
  (workdir / 'pytest.ini').write_text('[pytest]\n')
  return names


def run_pytest(workdir: pathlib.Path, names: list[str], args: argparse.Namespace) -> int:
  """Runs pytest on the copies from inside `workdir`; writes `results.xml` there."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get('PYTHONPATH')]))
  env.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=4')
  env.setdefault('JAX_PLATFORMS', 'cpu')
  command = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
             '--continue-on-collection-errors', '--junitxml=results.xml',
             '-o', 'junit_family=xunit1', '-n', str(args.n)]
  if args.k:
    command += ['-k', args.k]
  command += args.pytest_args + names
  output = None if args.verbose else subprocess.DEVNULL
  return subprocess.run(command, cwd=workdir, env=env, stdout=output, stderr=output,
                        check=False).returncode


def _outcome(case: ElementTree.Element) -> str:
  for tag, outcome in (('failure', 'failed'), ('error', 'errors'), ('skipped', 'skipped')):
    if case.find(tag) is not None:
      return outcome
  return 'passed'


def read_results(xml_path: pathlib.Path) -> dict[str, list[tuple[str, str, str]]]:
  """Per file: (test id, outcome, first line of the message) for every test case."""
  by_file: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
  for case in ElementTree.parse(xml_path).iter('testcase'):
    # A file that fails to import is one case with an error, named after the file.
    classname = case.get('classname') or case.get('name', '?').replace('/', '.')
    file_name = case.get('file') or classname.split('.')[0] + '.py'
    outcome = _outcome(case)
    detail = next((child for child in case if child.tag in ('failure', 'error')), None)
    message = (detail.get('message') or '') if detail is not None else ''
    test_class = (case.get('classname') or '').split('.')[-1]
    test_id = f"{test_class}::{case.get('name')}" if test_class else str(case.get('name'))
    by_file[pathlib.Path(file_name).name].append((test_id, outcome, message.split('\n')[0]))
  return by_file


def print_summary(by_file: dict[str, list[tuple[str, str, str]]], show_failures: bool) -> None:
  """Prints a table of outcomes per file and in total (and each failure, if asked)."""
  columns = ('passed', 'failed', 'errors', 'skipped')
  totals: collections.Counter = collections.Counter()
  print(f"{'file':34}" + ''.join(f'{c:>9}' for c in columns) + f"{'total':>9}")
  for file_name in sorted(by_file):
    counts = collections.Counter(outcome for _, outcome, _ in by_file[file_name])
    totals.update(counts)
    print(f'{file_name:34}' + ''.join(f'{counts[c]:9d}' for c in columns)
          + f'{len(by_file[file_name]):9d}')
  print(f"{'TOTAL':34}" + ''.join(f'{totals[c]:9d}' for c in columns)
        + f'{sum(totals.values()):9d}')
  if show_failures:
    for file_name in sorted(by_file):
      for test_id, outcome, message in by_file[file_name]:
        if outcome in ('failed', 'errors'):
          print(f'{outcome.upper():7} {file_name}::{test_id}: {message[:200]}')


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('flax_tests', type=pathlib.Path,
                      help="a Flax checkout's tests folder (the one holding linen/)")
  parser.add_argument('--workdir', type=pathlib.Path,
                      help='scratch folder for the copies (default: a temporary one, removed)')
  parser.add_argument('--files', nargs='+', default=[], help='only these files of tests/linen')
  parser.add_argument('-n', default='2', help='pytest-xdist workers (0: one process)')
  parser.add_argument('-k', help="pytest's -k expression")
  parser.add_argument('--no-swap', action='store_true',
                      help='copy the files unchanged (Flax tested against itself)')
  parser.add_argument('--lift-scope', action='store_true',
                      help="give the tests lift.Scope where they import flax.core's Scope")
  parser.add_argument('--show-failures', action='store_true',
                      help='list each failing test with the first line of its message')
  parser.add_argument('-v', '--verbose', action='store_true', help="show pytest's output")
  parser.add_argument('pytest_args', nargs='*', help='further pytest arguments (after --)')
  args = parser.parse_args(argv)
  if not (args.flax_tests / 'linen').is_dir():
    parser.error(f'{args.flax_tests} has no linen/ folder')
  workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix='flax_linen_tests_'))
  try:
    names = copy_tests(args.flax_tests, workdir, args.files, swap=not args.no_swap,
                       lift_scope=args.lift_scope)
    run_pytest(workdir, names, args)
    if not (workdir / 'results.xml').exists():
      print('pytest wrote no results (run with -v to see why)', file=sys.stderr)
      return 2
    print_summary(read_results(workdir / 'results.xml'), args.show_failures)
  finally:
    if args.workdir is None:
      shutil.rmtree(workdir, ignore_errors=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
