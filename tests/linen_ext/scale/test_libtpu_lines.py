"""libtpu's start-up errors on a machine without TPU chips: `import linen_ext` (through
`lift`) keeps them off stderr, for a JAX program and for `nn.tpu_topology`, and where the
user configured libtpu themselves `nn.tpu_topology` says once that they are harmless.

Each check runs in a child process: JAX starts its backends (libtpu among them) once per
process, and the parent's environment is the suite's (``JAX_PLATFORMS=cpu``, and the
settings `import lift` made), which the children are started without."""
import importlib.util
import os
import subprocess
import sys

import pytest

from lift import _compat
from linen_ext.scale.topology import LIBTPU_LINES_NOTE

# What libtpu prints when it starts without knowing the machine (see `lift._compat`).
LIBTPU_LINES = ('TPU_WORKER_HOSTNAMES', 'could not determine TPU accelerator type',
                'INVALID_ARGUMENT', 'E0000')

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                       reason="libtpu is not installed (pip install -e '.[tpu]')"),
    pytest.mark.skipif(_compat.tpu_chips_present(),
                       reason='this machine has TPU chips: libtpu starts as a runtime'),
]


def run(code: str, **env: str) -> subprocess.CompletedProcess:
  """``code`` in a fresh Python, with none of the settings of libtpu, nor JAX's platform
  choice, that this process has; ``env`` added."""
  unset = {*_compat.LIBTPU_SINGLE_HOST, 'TPU_SKIP_MDS_QUERY', 'JAX_PLATFORMS'}
  child_env = {k: v for k, v in os.environ.items() if k not in unset} | env
  return subprocess.run([sys.executable, '-c', code], env=child_env, capture_output=True,
                        text=True, timeout=300, check=True)


def libtpu_lines(stderr: str) -> list[str]:
  """The lines of ``stderr`` that libtpu printed (our note quotes them: not one of them)."""
  return [line for line in stderr.splitlines()
          if any(m in line for m in LIBTPU_LINES) and line != LIBTPU_LINES_NOTE]


def test_libtpu_prints_its_errors_in_a_jax_program_that_does_not_import_us():
  """The oracle: without `import linen_ext`, JAX's first operation starts libtpu, which
  prints them (were it silent here, the checks below could not fail)."""
  assert libtpu_lines(run('import jax; jax.numpy.ones(3)').stderr)


def test_import_linen_ext_keeps_libtpu_quiet_for_an_operation_and_a_topology():
  code = ('import os; import linen_ext as nn; import jax; print(jax.numpy.ones(3).sum()); '
          "print(nn.tpu_topology('v5e-4').chips, os.environ.get('TPU_WORKER_HOSTNAMES'))")
  done = run(code)
  assert not libtpu_lines(done.stderr), done.stderr
  assert done.stdout.split() == ['3.0', '4', 'localhost'], done.stdout
  assert LIBTPU_LINES_NOTE not in done.stderr  # nothing to explain


def test_tpu_topology_says_once_that_the_lines_are_harmless_where_libtpu_is_configured():
  """A user's own libtpu setting (here the accelerator type) is kept, and libtpu prints:
  the note comes first, once for two topologies."""
  code = ("import os; import linen_ext as nn; print(nn.tpu_topology('v5e-4').chips, "
          "nn.tpu_topology('v5e-8').chips, 'TPU_WORKER_HOSTNAMES' in os.environ)")
  done = run(code, JAX_PLATFORMS='cpu', TPU_ACCELERATOR_TYPE='v5litepod-4')
  assert done.stdout.split() == ['4', '8', 'False'], done.stdout
  lines = libtpu_lines(done.stderr)
  assert lines and done.stderr.count(LIBTPU_LINES_NOTE) == 1, done.stderr
  assert done.stderr.splitlines().index(LIBTPU_LINES_NOTE) < done.stderr.splitlines().index(
      lines[0]), done.stderr
