"""The packages' layering: `lift` knows nothing of Modules, `linen_ext` uses `lift`'s public
modules only, and the import graph of both has no cycle (every import at the top)."""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = ('linen_ext', 'flax.core.scope', 'flax.core.lift', 'flax.core.axes_scan', 'flax.linen')


def module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


MODULES = {module_name(p): p for pkg in ('lift', 'linen_ext') for p in (ROOT / pkg).rglob('*.py')}


def imports(path):
  """``(imported module, at the top of the file)`` for each import; ``from P import m``
  names ``P.m`` when that is one of our modules."""
  tree = ast.parse(path.read_text())
  top = {id(node) for node in tree.body}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from ((alias.name, id(node) in top) for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      for alias in node.names:
        full = f'{node.module}.{alias.name}'
        yield (full if full in MODULES else node.module), id(node) in top


def test_lift_sources_import_no_module_system_or_flax_lifting():
  offenders = [f'{name}: {m}' for name, path in MODULES.items() if name.startswith('lift')
               for m, _ in imports(path)
               if any(m == f or m.startswith(f + '.') for f in FORBIDDEN)]
  assert not offenders


def test_linen_ext_imports_no_private_lift_module():
  offenders = [f'{name}: {m}' for name, path in MODULES.items() if name.startswith('linen_ext')
               for m, _ in imports(path)
               if m.startswith('lift.') and any(p.startswith('_') for p in m.split('.'))]
  assert not offenders


def test_every_import_is_at_the_top_of_its_file():
  inside = [f'{name}: {m}' for name, path in MODULES.items()
            for m, at_top in imports(path) if not at_top]
  assert not inside


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
  """A cycle of ``graph`` as a path that ends where it starts, or None."""
  state: dict[str, str] = {}
  stack: list[str] = []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for succ in graph[node]:
      if state.get(succ) == 'open':
        return stack[stack.index(succ):] + [succ]
      if succ not in state and (cycle := visit(succ)):
        return cycle
    stack.pop()
    state[node] = 'done'
    return None

  return next((c for node in graph if node not in state and (c := visit(node))), None)


def test_import_graph_has_no_cycle():
  graph = {name: sorted({m for m, _ in imports(path) if m in MODULES})
           for name, path in MODULES.items()}
  assert find_cycle(graph) is None, ' -> '.join(find_cycle(graph))


def test_find_cycle_finds_one():  # the check above can fail
  assert find_cycle({'a': ['b'], 'b': ['c'], 'c': ['a']}) == ['a', 'b', 'c', 'a']
  assert find_cycle({'a': ['b'], 'b': [], 'c': ['a']}) is None


def test_importing_lift_loads_no_linen_ext():
  code = 'import sys, lift; print(any(m.split(".")[0] == "linen_ext" for m in sys.modules))'
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, check=True)
  assert out.stdout.strip() == 'False'
