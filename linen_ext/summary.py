"""`tabulate`: a table of a model's module calls, their shapes and their variables.

As `flax.linen.tabulate`: ``init`` runs abstractly (``jax.eval_shape``, no
FLOPs, no memory) under `intercept_methods`, which records every method call
with the shapes it received and returned; each row then lists the variables
the called module holds itself, per collection, with their count and bytes.
"""
from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import numpy as np
import rich.console
import rich.table
import rich.text

from lift.filters import DenyList
from linen_ext.interception import intercept_methods


class Call(NamedTuple):
  """One recorded method call."""
  path: tuple[str, ...]
  module: str
  method: str
  inputs: Any
  outputs: Any
  copy: Any  # the called module, unbound


def _shape(x: Any) -> Any:
  if hasattr(x, 'shape') and hasattr(x, 'dtype'):
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
  return x


def _recorded(module: Any, rngs: Any, args: tuple, kwargs: dict, mutable: Any):
  """The calls ``module.init`` makes, in the order they start, and the variables' shapes."""
  calls: list[Call | None] = []

  def record(next_fun, call_args, call_kwargs, context):
    index = len(calls)
    calls.append(None)
    y = next_fun(*call_args, **call_kwargs)
    inputs = call_args[0] if len(call_args) == 1 and not call_kwargs else (call_args, call_kwargs)
    calls[index] = Call(tuple(context.module.path), type(context.module).__name__,
                        context.method_name, jax.tree.map(_shape, inputs), jax.tree.map(_shape, y),
                        context.module.clone())
    return y

  def run(rngs, *args, **kwargs):
    with intercept_methods(record):
      return module.init(rngs, *args, mutable=mutable, **kwargs)

  variables = jax.eval_shape(run, rngs, *args, **kwargs)
  return [c for c in calls if c is not None and c.method != 'setup'], variables


def _describe(tree: Any) -> str:
  """``float32[16,9]`` for an array; one line per leaf of a tuple or dict of them."""
  def one(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return f'{x.dtype.name}[{",".join(map(str, x.shape))}]'
    return repr(x)

  if isinstance(tree, tuple) and len(tree) == 2 and isinstance(tree[1], dict):
    args, kwargs = tree
    lines = [f'- {_describe(a)}' for a in args] + [f'{k}: {_describe(v)}' for k, v in kwargs.items()]
    return '\n'.join(lines)
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  if len(leaves) == 1 and not leaves[0][0]:
    return one(leaves[0][1])
  return '\n'.join(f'{jax.tree_util.keystr(path)}: {one(x)}' for path, x in leaves)


def _size(leaves: Sequence[Any]) -> tuple[int, int]:
  return (sum(int(np.prod(x.shape)) for x in leaves),
          sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves))


def _count(size: tuple[int, int]) -> str:
  count, nbytes = size
  for unit, scale in (('GB', 1e9), ('MB', 1e6), ('KB', 1e3)):
    if nbytes >= scale:
      return f'{count:,} ({nbytes / scale:.1f} {unit})'
  return f'{count:,} ({nbytes:,} B)'


def _at(tree: Any, path: tuple[str, ...]) -> Any:
  for name in path:
    if not isinstance(tree, Mapping) or name not in tree:
      return {}
    tree = tree[name]
  return tree


def _variables_cell(tree: Any, collapsed: bool) -> str:
  """The module's own variables (and with ``collapsed`` its hidden descendants' count)."""
  if not isinstance(tree, Mapping):
    return ''
  own = {k: v for k, v in tree.items() if not isinstance(v, Mapping)}
  counted = jax.tree.leaves(tree) if collapsed else list(own.values())
  if not counted:
    return ''
  lines = [f'{k}: {_describe(_shape(v))}' for k, v in own.items()]
  return '\n'.join(lines + ['', _count(_size([_shape(v) for v in counted]))]).lstrip('\n')


def _rows(calls: list[Call], depth: int | None, show_repeated: bool) -> list[Call]:
  seen, rows = set(), []
  for call in calls:
    if depth is not None and len(call.path) > depth:
      continue
    if not show_repeated and (call.path, call.method) in seen:
      continue
    seen.add((call.path, call.method))
    rows.append(call)
  return rows


def module_table(module: Any, rngs: Any, *args, depth: int | None = None,
                 show_repeated: bool = False, mutable: Any = DenyList('intermediates'),
                 console_kwargs: Mapping[str, Any] | None = None,
                 table_kwargs: Mapping[str, Any] = MappingProxyType({}),
                 column_kwargs: Mapping[str, Any] = MappingProxyType({}),
                 compute_flops: bool = False, compute_vjp_flops: bool = False,
                 **kwargs) -> str:
  """The summary table of ``module.init(rngs, *args, **kwargs)`` as a string.

  >>> print(Model().tabulate(jax.random.key(0), x))   # path, module, inputs, outputs, params
  """
  if compute_flops or compute_vjp_flops:
    raise NotImplementedError('tabulate: compute_flops is not supported; use '
                              'jax.jit(f).lower(...).compile().cost_analysis() for FLOPs.')
  calls, variables = _recorded(module, rngs, args, kwargs, mutable)
  collections = sorted((c for c in variables if jax.tree.leaves(variables[c])),
                       key=lambda c: c != 'params')  # params first, as Flax
  table = rich.table.Table(show_header=True, show_lines=True, show_footer=True,
                           title=f'{type(module).__name__} Summary', **table_kwargs)
  for name in ('path', 'module', 'inputs', 'outputs', *collections):
    table.add_column(name, **column_kwargs)
  for call in _rows(calls, depth, show_repeated):
    collapsed = depth is not None and len(call.path) == depth
    method = '' if call.method == '__call__' else f'.{call.method}'
    table.add_row('/'.join(call.path), call.module + method, _describe(call.inputs),
                  _describe(call.outputs),
                  *(_variables_cell(_at(variables[c], call.path), collapsed) for c in collections))
  totals = [_size([_shape(x) for x in jax.tree.leaves(variables[c])]) for c in collections]
  for column, size in zip(table.columns[4:], totals):
    column.footer = rich.text.Text(_count(size))
  table.columns[3].footer = rich.text.Text('Total', justify='right')
  grand = _size([_shape(x) for c in collections for x in jax.tree.leaves(variables[c])])
  table.caption = f'Total Parameters: {_count(grand)}'
  out = io.StringIO()
  console = rich.console.Console(file=out, force_terminal=False, width=120,
                                 **(console_kwargs or {}))
  console.print(table)
  return out.getvalue()


def module_paths(module: Any, rngs: Any, *args, show_repeated: bool = False,
                 mutable: Any = DenyList('intermediates'), **kwargs) -> dict[str, Any]:
  """``{path: unbound copy}`` of every module ``module.init(rngs, *args)`` calls.

  >>> Model().module_paths(jax.random.key(0), x)['Dense_0']
  Dense(...)
  """
  calls, _ = _recorded(module, rngs, args, kwargs, mutable)
  return {'/'.join(call.path): call.copy for call in _rows(calls, None, show_repeated)}


def tabulate(module: Any, rngs: Any, **options) -> Callable[..., str]:
  """``tabulate(module, rngs)(x)``: `module_table` with the call's arguments, as Flax's.

  >>> print(tabulate(Model(), jax.random.key(0), depth=1)(x))
  """
  return lambda *args, **kwargs: module_table(module, rngs, *args, **options, **kwargs)


__all__ = ['tabulate']
