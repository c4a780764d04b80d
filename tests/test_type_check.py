"""Static checks, configured in pyproject.toml: mypy passes on `lift` and `linen_ext` (which
ship ``py.typed``), and ruff's lint passes on the whole repository."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_mypy_passes_on_lift_and_linen_ext():
  out = subprocess.run([sys.executable, '-m', 'mypy'], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_check_passes():
  ruff = pathlib.Path(sys.executable).parent / 'ruff'
  out = subprocess.run([str(ruff), 'check'], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
