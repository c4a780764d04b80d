"""`tabulate`: a table of a model's module calls, their shapes, variables and FLOPs.

The table is Flax's (`flax.linen.tabulate`), cell for cell: ``init`` runs
abstractly (``jax.eval_shape``) under `intercept_methods`, which records every
method call with what it received and returned; wrapped flax layers report
their own submodules' calls through flax's interceptors. Each row lists the
variables the called module holds itself (or, at the ``depth`` cut, all
below it), per collection, with their count and bytes; ``compute_flops`` and
``compute_vjp_flops`` add the XLA cost analysis of the call and of its VJP.

Of `flax.linen.summary`'s other names, Flax's helpers for values (``_get_value_representation``,
``_size_and_bytes_repr``, ``_get_flops``, ...) and type aliases are Flax's own; its table of
call records (``Table``, ``_get_module_table``, ...) is not kept (docs/porting.md, "Every name
of `flax.linen`").
"""
from __future__ import annotations

import dataclasses
import enum
import io
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import rich.console
import rich.table
import rich.text
import yaml
from flax.core import meta
from flax.linen.summary import (Array, CollectionFilter, FrozenVariableDict, LogicalNames,
                                MutableVariableDict, PRNGKey, RNGSequences, unfreeze)
from flax.linen.summary import _ArrayRepresentation as _ArrayRepresentation
from flax.linen.summary import _as_yaml_str as _as_yaml_str
from flax.linen.summary import _bytes_repr as _bytes_repr
from flax.linen.summary import _from_value_representation as _from_value_representation
from flax.linen.summary import _get_flops as _get_flops
from flax.linen.summary import _get_rich_repr as _get_rich_repr
from flax.linen.summary import _get_value_representation as _get_value_representation
from flax.linen.summary import _maybe_render as _maybe_render
from flax.linen.summary import _normalize_structure as _normalize_structure
from flax.linen.summary import _ObjectRepresentation as _ObjectRepresentation
from flax.linen.summary import _PartitionedArrayRepresentation as _PartitionedArrayRepresentation
from flax.linen.summary import _represent_tree as _represent_tree
from flax.linen.summary import _size_and_bytes_repr as _size_and_bytes_repr
from flax.linen.summary import _summary_tree_map as _summary_tree_map
from flax.linen.summary import _ValueRepresentation as _ValueRepresentation

from lift.filters import DenyList
from lift.rng import is_prng_key
from linen_ext.module.interception import intercept_methods


class Call(NamedTuple):
  """One recorded method call; arrays in ``args``, ``kwargs``, ``outputs`` as shapes."""
  path: tuple[str, ...]
  copy: Any  # the called module, unbound (a linen_ext or a flax module)
  method: str
  args: tuple
  kwargs: dict
  outputs: Any
  mutable: Any  # the collections the call could write


def _shape(x: Any) -> Any:
  if isinstance(x, meta.AxisMetadata):  # kept boxed: the table shows its axis names
    return x.replace_boxed(_shape(x.unbox()))
  if hasattr(x, 'shape') and hasattr(x, 'dtype'):
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
  return x


def _shapes(tree: Any) -> Any:
  return jax.tree.map(_shape, tree, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))


def _recorded(module: Any, rngs: Any, args: tuple, kwargs: dict, mutable: Any):
  """The calls ``module.init`` makes, in the order they start, and the variables' shapes."""
  calls: list[Call | None] = []
  wrapped: list[tuple | None] = []  # (path, method) of the wrapped flax layers running

  def recorder(next_fun, call_args, call_kwargs, context):
    module, path = context.module, tuple(context.module.path)
    role = getattr(module, '_summary_role', 'row')  # a Module hook, see Module._summary_role
    skip = role in ('flax', 'scaffolding') or (
        isinstance(module, flax_nn.Module) and wrapped
        and wrapped[-1] == (path, context.method_name))  # the flax layer under its wrapper's row
    if skip:
      return next_fun(*call_args, **call_kwargs)
    index = len(calls)
    calls.append(None)
    wrapped.append((path, context.method_name) if role == 'row_over_flax' else None)
    try:
      y = next_fun(*call_args, **call_kwargs)
    finally:
      wrapped.pop()
    calls[index] = Call(path, module.clone(), context.method_name, _shapes(call_args),
                        _shapes(call_kwargs), _shapes(y), module.scope.mutable)
    return y

  def run():  # arguments stay concrete, as Flax's: Python flags among them stay usable
    with intercept_methods(recorder), flax_nn.intercept_methods(recorder):
      return module.init(rngs, *args, mutable=mutable, **kwargs)

  variables = jax.eval_shape(run)
  return [c for c in calls if c is not None and c.method != 'setup'], variables


# -- cells -------------------------------------------------------------------------------


def _render_leaf(x: Any) -> str:
  if isinstance(x, (int, float, bool, type(None))) or (isinstance(x, np.ndarray)
                                                        and np.isscalar(x)):
    return repr(x)
  if isinstance(x, meta.Partitioned):
    return f'{_render_leaf(x.value)} [dim]P[/dim]{x.names}'
  try:
    shape, dtype = (x.shape, x.dtype) if hasattr(x, 'dtype') else (jnp.shape(x),
                                                                    jnp.result_type(x))
  except Exception:  # noqa: BLE001 (anything that is not an array is shown by repr)
    return repr(x)
  return f'[dim]{dtype}[/dim][{",".join(str(d) for d in shape)}]'


def _plain(obj: Any) -> Any:
  """Tuples, dicts and strings only (what YAML writes): dataclasses as dicts, enums as values."""
  if isinstance(obj, (tuple, list)):
    return tuple(_plain(x) for x in obj)
  if isinstance(obj, Mapping):
    return {_plain(k): _plain(v) for k, v in obj.items()}
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
  if isinstance(obj, enum.Enum):
    return obj.value
  return obj


def _cell(tree: Any) -> str:
  """A tree of values as Flax shows it: YAML of its rendered leaves, without quotes."""
  rendered = _plain(jax.tree.map(_render_leaf, tree,
                                 is_leaf=lambda x: x is None or isinstance(x, meta.Partitioned)))
  if rendered is None or (hasattr(rendered, '__len__') and len(rendered) == 0):
    return ''
  text = yaml.safe_dump(rendered, default_flow_style=False, indent=2, sort_keys=False,
                        explicit_end=False)
  return text.replace('\n...', '').replace("'", '').strip()


def _size_and_bytes(tree: Any) -> tuple[int, int]:
  leaves = [x for x in jax.tree.leaves(tree) if hasattr(x, 'size')]
  return sum(x.size for x in leaves), sum(x.size * x.dtype.itemsize for x in leaves)


def _count(size: int, nbytes: int) -> str:
  if not size:
    return ''
  for unit, scale in (('GB', 1e9), ('MB', 1e6), ('KB', 1e3)):
    if nbytes > scale:
      return f'{size:,} [dim]({nbytes / scale:,.1f} {unit})[/dim]'
  return f'{size:,} [dim]({nbytes:,} B)[/dim]'


def _inputs(args: tuple, kwargs: dict) -> Any:
  if args and kwargs:
    return (*args, kwargs)
  if args:
    return args[0] if len(args) == 1 else args
  return kwargs if kwargs else ()


# -- rows ---------------------------------------------------------------------------------


def _at(variables: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
  """``{collection: the variables at path}`` for the collections that reach that path."""
  found = {}
  for collection, tree in variables.items():
    for name in path:
      tree = tree.get(name) if isinstance(tree, Mapping) else None
    if tree is not None:
      found[collection] = dict(tree)
  return found


class Row(NamedTuple):
  call: Call
  own: dict[str, Any]  # the module's variables, without its called submodules'
  counted: dict[str, Any]  # what the row counts (own, or everything below at the depth cut)


def _rows(calls: list[Call], variables: Any, depth: int | None,
          show_repeated: bool) -> list[Row]:
  """Flax's selection: each module path once (unless ``show_repeated``), down to ``depth``."""
  paths = {c.path for c in calls}
  seen, rows = set(), []
  for call in calls:
    if call.path in seen or not hasattr(call.copy, call.method):
      if show_repeated:
        rows.append(Row(call, {}, {}))
      continue
    if depth is not None and len(call.path) > depth:
      continue
    seen.add(call.path)
    own = {col: {k: v for k, v in tree.items() if call.path + (k,) not in paths}
           for col, tree in _at(variables, call.path).items()}
    cut = depth is not None and len(call.path) == depth
    rows.append(Row(call, own, _at(variables, call.path) if cut else own))
  return rows


def _flops(call: Call, rngs: dict, vjp: bool) -> int:
  """XLA's FLOP count of the call (or of its VJP) run alone on its recorded shapes."""
  def run(rngs, args, kwargs):
    return call.copy.init(rngs, *args, method=call.method, mutable=call.mutable, **kwargs)

  dynamic = lambda x: isinstance(x, jax.ShapeDtypeStruct)
  leaves, tree = jax.tree.flatten((call.args, call.kwargs))
  positions = [i for i, x in enumerate(leaves) if dynamic(x)]

  def inputs(values):
    filled = list(leaves)
    for i, v in zip(positions, values):
      filled[i] = v
    return jax.tree.unflatten(tree, filled)

  traced = [leaves[i] for i in positions]
  variables = jax.eval_shape(lambda r, d: run(r, *inputs(d)), rngs, traced)

  def apply(v, r, d):
    args, kwargs = inputs(d)
    return call.copy.apply(v, *args, rngs=r, method=call.method, mutable=call.mutable,
                           **kwargs)

  def pulled_back(v, r, d):
    y, pullback = jax.vjp(apply, v, r, d)
    return pullback(y)

  cost = jax.jit(pulled_back if vjp else apply).lower(variables, rngs, traced).cost_analysis()
  return int(cost['flops']) if cost and 'flops' in cost else 0


# -- table ---------------------------------------------------------------------------------


def _table(module: Any, rows: list[Row], collections: list[str], extra: dict[str, list[int]],
           table_kwargs: Mapping[str, Any], column_kwargs: Mapping[str, Any]) -> rich.table.Table:
  table = rich.table.Table(show_header=True, show_lines=True, show_footer=True,
                           title=f'{type(module).__name__} Summary', **table_kwargs)
  columns = ['path', 'module', 'inputs', 'outputs', *extra]
  for name in columns + collections:
    table.add_column(name, **column_kwargs)
  totals = dict.fromkeys(collections, (0, 0))
  for i, row in enumerate(rows):
    call, cells = row.call, []
    for col in collections:
      size = _size_and_bytes(row.counted.get(col, {}))
      totals[col] = (totals[col][0] + size[0], totals[col][1] + size[1])
      own = _cell(row.own[col]) if col in row.own else ''
      cells.append((own + '\n\n' if own else '') + f'[bold]{_count(*size)}[/bold]')
    method = '' if call.method in ('__call__', '<lambda>') else f' [dim]({call.method})[/dim]'
    table.add_row('/'.join(call.path), type(call.copy).__name__ + method,
                  _cell(_inputs(call.args, call.kwargs)), _cell(call.outputs),
                  *(_cell(values[i]) for values in extra.values()), *cells)
  table.columns[len(columns) - 1].footer = rich.text.Text.from_markup('Total', justify='right')
  for column, col in zip(table.columns[len(columns):], collections):
    column.footer = _count(*totals[col])
  table.caption_style = 'bold'
  grand = (sum(size for size, _ in totals.values()), sum(nbytes for _, nbytes in totals.values()))
  table.caption = '\nTotal Parameters: ' + _count(*grand)
  return table


def module_table(module: Any, rngs: Any, *args, depth: int | None = None,
                 show_repeated: bool = False, mutable: Any = DenyList('intermediates'),
                 console_kwargs: Mapping[str, Any] | None = None,
                 table_kwargs: Mapping[str, Any] = MappingProxyType({}),
                 column_kwargs: Mapping[str, Any] = MappingProxyType({}),
                 compute_flops: bool = False, compute_vjp_flops: bool = False,
                 **kwargs) -> str:
  """The summary table of ``module.init(rngs, *args, **kwargs)`` as a string, as Flax's.

  >>> print(Model().tabulate(jax.random.key(0), x, compute_flops=True))
  """
  calls, variables = _recorded(module, rngs, args, kwargs, mutable)
  rows = _rows(calls, variables, depth, show_repeated)
  keys = {'params': rngs} if is_prng_key(rngs) else dict(rngs)
  extra = {}
  if compute_flops:
    extra['flops'] = [_flops(row.call, keys, vjp=False) for row in rows]
  if compute_vjp_flops:
    extra['vjp_flops'] = [_flops(row.call, keys, vjp=True) for row in rows]
  collections = sorted(variables, key=lambda c: c != 'params')  # params first
  table = _table(module, rows, collections, extra, table_kwargs, column_kwargs)
  out = io.StringIO()
  options = {'force_terminal': True, 'force_jupyter': False, **(console_kwargs or {})}
  rich.console.Console(file=out, **options).print(table)
  return '\n' + out.getvalue() + '\n'


def module_paths(module: Any, rngs: Any, *args, show_repeated: bool = False,
                 mutable: Any = DenyList('intermediates'), **kwargs) -> dict[str, Any]:
  """``{path: unbound copy}`` of every module ``module.init(rngs, *args)`` calls.

  >>> Model().module_paths(jax.random.key(0), x)['Dense_0']
  Dense(...)
  """
  calls, variables = _recorded(module, rngs, args, kwargs, mutable)
  return {'/'.join(row.call.path): row.call.copy
          for row in _rows(calls, variables, None, show_repeated)}


def tabulate(module: Any, rngs: Any, **options) -> Callable[..., str]:
  """``tabulate(module, rngs)(x)``: `module_table` with the call's arguments, as Flax's.

  Returns the table as text, for reading. Not for sizes a program uses:
  count them with ``jax.tree.map`` over the variables.

  Examples:
    >>> table = nn.tabulate(nn.Dense(2), jax.random.key(0))(jnp.ones((1, 3)))
    >>> 'Total Parameters: 8' in table   # print(table) shows one row per module call
    True
  """
  return lambda *args, **kwargs: module_table(module, rngs, *args, **options, **kwargs)


__all__ = ['Array', 'CollectionFilter', 'FrozenVariableDict', 'LogicalNames', 'MutableVariableDict',
           'PRNGKey', 'RNGSequences', 'tabulate', 'unfreeze']
