"""The core of the suite on the newest Python the project supports, 3.13.

Numerics do not depend on the interpreter (the same jaxlib compiles the same programs),
so this run covers what does: scopes, `pack`, `vmap` and `scan`, the Module system
(dataclasses, descriptors, method wrapping, threads), the NNX bridge and the error
messages (the misuse catalogue runs every mistake of every area); the other lifted
transforms, the stacks' numerics, the sweeps and the property tests run on 3.11 only.
Each version gets a fresh venv with the dependencies pyproject.toml
lists, and imports the package from the working tree. It shares the suite's
compilation cache (what it compiles first, the rest of the suite finds compiled), and is
collected first, as the other long tests.
"""
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
VERSIONS = ('3.13',)
# What leans on the interpreter: scopes, `pack`, two lifted transforms, the Module system
# (dataclasses, descriptors, method wrapping), the NNX bridge, the error messages, threads.
# 3.12 lies between the suite's 3.11 and 3.13 and is not run (the suite's time budget).
CORE = [
    'tests/lift/test_scope.py', 'tests/lift/test_pack.py', 'tests/lift/test_filters.py',
    'tests/lift/test_vmap.py', 'tests/lift/test_scan.py', 'tests/lift/test_tracer_leaks.py',
    'tests/linen_ext/module', 'tests/linen_ext/layers/test_nnx_bridge.py',
    'tests/test_misuse_catalogue.py', 'tests/test_threads.py',
]
SWEEPS = 'not (every_policy or policies_keep_hessians or 300)'


def interpreter(version: str) -> str | None:
  """The path of a Python ``version``: ``python3.12`` on the PATH, else pyenv's."""
  for extra in ({}, {'PYENV_VERSION': version}):
    try:
      found = subprocess.run([f'python{version}', '-c', 'import sys; print(sys.executable)'],
                             env={**os.environ, **extra}, capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
      continue
    if found.returncode == 0:
      return found.stdout.strip()
  return None


def dependencies() -> list[str]:
  project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
  tests = ['pytest', 'hypothesis']  # what these test files import
  return project['dependencies'] + tests


@pytest.mark.parametrize('version', VERSIONS)
def test_the_core_of_the_suite_passes_on(version, tmp_path):
  python = interpreter(version)
  if python is None:
    pytest.skip(f'no Python {version} here (python{version}, or pyenv with that version)')
  venv = tmp_path / 'venv'
  subprocess.run([python, '-m', 'venv', str(venv)], check=True, timeout=120)
  # --no-compile: the run imports a fraction of what pip would byte-compile (15 s -> 9 s with
  # the first import).
  installed = subprocess.run([str(venv / 'bin' / 'python'), '-m', 'pip', 'install', '-q',
                              '--no-compile', *dependencies()],
                             capture_output=True, text=True, timeout=600)
  assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
  env = {**os.environ, 'PYTHONPATH': str(ROOT)}
  ran = subprocess.run([str(venv / 'bin' / 'python'), '-m', 'pytest', '-q', '-x',
                        '-p', 'no:cacheprovider', '-o', 'addopts=', '-k', SWEEPS,
                        *CORE],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert ran.returncode == 0, f'Python {version}:\n' + ran.stdout[-6000:] + ran.stderr[-3000:]
  assert ' passed' in ran.stdout.splitlines()[-1], ran.stdout[-2000:]
  assert sys.version_info[:2] != tuple(map(int, version.split('.')))  # another Python
