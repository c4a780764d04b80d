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


def _is_type_checking_block(node) -> bool:
  """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): names for type checkers, never run."""
  return isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test)


def imports(path):
  """``(imported module, at the top of the file)`` for each import; ``from P import m``
  names ``P.m`` when that is one of our modules."""
  tree = ast.parse(path.read_text())
  top = {id(node) for node in tree.body}
  top |= {id(node) for block in tree.body if _is_type_checking_block(block) for node in block.body}
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


# What only some users need loads on first use: decoding's rules, the scan rewrites'
# passes, the at-scale planner (optax, libtpu's topologies), and no example's dependency.
NOT_ON_IMPORT = ('lift.causal', 'lift.scan_rewrites', 'linen_ext.scale', 'optax', 'orbax',
                 'matplotlib', 'hypothesis', 'pytest', 'jax.experimental.topologies')
LOADED = f"""
import sys
def loaded(*extra):
  names = {NOT_ON_IMPORT!r} + extra
  return sorted(m for m in sys.modules if m in names or m.startswith(tuple(n + '.' for n in names)))
import lift; print(loaded('linen_ext'))
import linen_ext; print(loaded())
print(lift.as_scan is lift.causal.as_scan, linen_ext.causal_self_attention is lift.causal_self_attention,
      'generate' in dir(lift), 'lift.scan_rewrites' in sys.modules)
"""


def test_import_loads_only_what_every_user_needs():
  out = subprocess.run([sys.executable, '-c', LOADED], capture_output=True, text=True, cwd=ROOT,
                       check=True).stdout.splitlines()
  assert out[0] == '[]', f'import lift loaded {out[0]}'
  assert out[1] == '[]', f'import linen_ext loaded {out[1]}'
  assert out[2] == 'True True True False', out[2]  # the lazy names are the real ones
