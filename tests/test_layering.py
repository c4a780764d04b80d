"""`lift` is the functional core: it knows nothing about Modules or Flax's own lifting."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = ('linen_ext', 'flax.core.scope', 'flax.core.lift', 'flax.core.axes_scan', 'flax.linen')


def imported_modules(path):
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module
      yield from (f'{node.module}.{alias.name}' for alias in node.names)


def test_lift_sources_import_no_module_system_or_flax_lifting():
  offenders = [f'{p.relative_to(ROOT)}: {m}'
               for p in sorted((ROOT / 'lift').rglob('*.py'))
               for m in imported_modules(p)
               if any(m == f or m.startswith(f + '.') for f in FORBIDDEN)]
  assert not offenders


def test_importing_lift_loads_no_linen_ext():
  code = 'import sys, lift; print("linen_ext" in sys.modules or any(m.startswith("linen_ext.") for m in sys.modules))'
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, check=True)
  assert out.stdout.strip() == 'False'
