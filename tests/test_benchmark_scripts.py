"""The benchmark scripts the documentation tells users to run still run, at tiny sizes."""
import os
import pathlib
import subprocess
import sys

from tests.helpers import child_xla_flags

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / 'examples' / 'benchmarks'


def test_remat_memory_plot_prints_a_table_and_writes_a_png(tmp_path):
  out = tmp_path / 'remat.png'
  run = subprocess.run(
      [sys.executable, str(BENCHMARKS / 'remat_memory_plot.py'), '--depths', '3',
       '--d-model', '16', '--heads', '2', '--mlp', '32', '--seq', '8', '--batch', '1',
       '--policies', 'nested', '--out', str(out)],
      capture_output=True, text=True, check=False)
  assert run.returncode == 0, run.stdout + run.stderr
  assert 'nested' in run.stdout and 'depth 3' in run.stdout
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_trace_time_prints_the_ratio_table_and_writes_a_png(tmp_path):
  out = tmp_path / 'trace.png'
  run = subprocess.run(
      [sys.executable, str(BENCHMARKS / 'trace_time.py'), '--depths', '2', '--repeats', '1',
       '--d-model', '16', '--compile-depth', '0', '--out', str(out)],
      capture_output=True, text=True, check=False)
  assert run.returncode == 0, run.stdout + run.stderr
  assert all(word in run.stdout for word in ('linen_ext', 'train step', '(1.00x)'))
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_init_trace_prints_ours_over_flax():
  run = subprocess.run(
      [sys.executable, str(BENCHMARKS / 'init_trace.py'), '--layers', '2', '--d-model', '32',
       '--heads', '2', '--repeats', '1'],
      capture_output=True, text=True, check=False)
  assert run.returncode == 0, run.stdout + run.stderr
  assert all(word in run.stdout for word in ('ours / Flax', 'init', 'apply'))


def test_pipeline_memory_prints_bytes_and_collectives_per_stage_count():
  run = subprocess.run([sys.executable, str(BENCHMARKS / 'pipeline_memory.py'), '--tiny',
                        '--stages', '1,2'],
                       capture_output=True, text=True, check=False,
                       env={**os.environ, 'XLA_FLAGS': child_xla_flags(8)})
  assert run.returncode == 0, run.stdout + run.stderr
  rows = [line for line in run.stdout.splitlines() if line.startswith('| ') and 'x 2' in line]
  assert len(rows) == 4, run.stdout
  piped = [row for row in rows if '| pipeline |' in row]
  assert all('all-gather' not in row for row in piped), piped
  assert all('collective-permute' in row for row in piped[1:]), piped


def test_device_check_prints_its_table_on_cpu(tmp_path):
  """The prepared accelerator check, at tiny sizes (compiled without LLVM's optimisation:
  only that it runs is checked here)."""
  run = subprocess.run(['bash', str(BENCHMARKS / 'device_check.sh'), '--tiny'],
                       capture_output=True, text=True, check=False,
                       env={**os.environ, 'PYTHON': sys.executable, 'OUT': str(tmp_path),
                            'XLA_FLAGS': '--xla_backend_optimization_level=0'})
  assert run.returncode == 0, run.stdout + run.stderr
  assert run.stdout.startswith('Device: cpu'), run.stdout
  rows = [line for line in run.stdout.splitlines() if line.startswith('| ') and 'x' in line]
  assert len(rows) == 10, run.stdout  # 3 loops, 3 remat policies, 4 decoders
  assert (tmp_path / 'device_check.md').read_text() == run.stdout


def test_scan_rewrites_prints_its_tables():
  run = subprocess.run([sys.executable, str(BENCHMARKS / 'scan_rewrites.py'), '--tiny'],
                       capture_output=True, text=True, check=False)
  assert run.returncode == 0, run.stdout + run.stderr
  rows = [line for line in run.stdout.splitlines() if line.startswith(('| lstm', '| gru'))]
  assert len(rows) == 2 and 'rewritten, step rewritten' in rows[0], run.stdout
  assert 'while loops in the compiled program 2 -> 1' in run.stdout, run.stdout


def test_import_time_prints_each_import_over_flax():
  run = subprocess.run([sys.executable, str(BENCHMARKS / 'import_time.py'), '--rounds', '1'],
                       capture_output=True, text=True, check=False)
  assert run.returncode == 0, run.stdout + run.stderr
  rows = [line.rstrip(' |').split(' | ') for line in run.stdout.splitlines() if line.startswith('| `')]
  assert [row[0] for row in rows] == ['| `from flax import linen`', '| `import flax.errors (floor)`',
                                      '| `import lift`', '| `import linen_ext`'], run.stdout
  assert rows[0][2] == '1.00x' and float(rows[2][3]) > 0 and float(rows[1][3]) == 0, run.stdout
