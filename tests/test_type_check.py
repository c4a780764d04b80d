"""`lift` and `linen_ext` ship ``py.typed``: mypy (configured in pyproject.toml) passes on both."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_mypy_passes_on_lift_and_linen_ext():
  out = subprocess.run([sys.executable, '-m', 'mypy'], cwd=ROOT, capture_output=True, text=True)
  assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
