"""`stack_rows` and `unstack_rows`: `jnp.stack` and its inverse, compiled once per shape.

A loop over layers that keep their own variables (``layers_0``, ``layers_1``,
...) stacks them into one array per variable on every call, and its gradient
splits the stacked gradient back into one array per layer. Written with
`jnp.stack`, that split is one slice per layer and variable, each at its own
constant offset, and XLA compiles every one of them into a separate kernel:
on XLA:CPU the 384 slices of a 64-layer Transformer's six variables take
three times as long to compile as the whole loop.

These two primitives are each other's transpose. `unstack_rows` reads row i
with a dynamic slice whose start index XLA cannot treat as a constant (it is
computed from the data, see `_row_starts`), so all rows of one shape share one
kernel; one set of start indices serves every leaf of a tree. Values, JVPs,
gradients and batching are those of `jnp.stack` and of indexing. Integer,
bool and key leaves (not differentiated, and small in practice) are stacked
and indexed with `jnp.stack` and constant offsets.

>>> rows = [jnp.full((2,), float(i)) for i in range(3)]
>>> stacked = stack_rows(rows)
>>> [row.tolist() for row in unstack_rows(stacked)] == [row.tolist() for row in rows]
True
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lift import _compat
from lift.errors import StackRowsError

stack_rows_p = _compat.Primitive('stack_rows')
unstack_rows_p = _compat.Primitive('unstack_rows')
# Both act on all float leaves of a tree at once, so that their rows share one
# set of start indices: stack_rows_p.bind(*rows, rows_per_leaf=n) takes the n
# rows of each leaf in turn and returns one stacked array per leaf;
# unstack_rows_p.bind(*stacked) returns the n rows of each leaf in turn.


def _row_starts(n: int, x: jax.Array) -> list[jax.Array]:
  """The start indices ``0, 1, ..., n-1`` as values XLA cannot fold; `x` is a float array.

  Each is ``0 + i`` where the 0 is ``x[0, ...] > inf`` (false for every float,
  NaN included), and each comes out of its own operand of one sort, so no
  consumer kernel can embed its value. If a compiler ever folds the
  comparison, the slices get constant offsets again: slower to compile, same
  values.
  """
  zero = lax.convert_element_type(lax.gt(x.reshape(-1)[0], jnp.inf), np.int32)
  key = jnp.stack([zero, zero + 1])
  # lax.sort takes any arrays; its annotation admits only jax.Array.
  starts = lax.sort(
      (key,) + tuple(np.full((2,), i, np.int32) for i in range(n)),  # type: ignore[misc]
      num_keys=1)[1:]
  return [start[0] for start in starts]


def _lower_starts(ctx, n: int, stacked: Sequence[Any]) -> list[Any]:
  """Runtime row starts taken from the first float operand; constants if there is none."""
  for x, aval in zip(stacked, ctx.avals_in):
    if jnp.issubdtype(aval.dtype, jnp.floating) and aval.size:
      scalar = aval.update(shape=(), dtype=np.dtype(np.int32))
      return _compat.lower_function(ctx, lambda x: _row_starts(n, x), [aval], [scalar] * n, x)
  return list(range(n))


def _unstack_lowering(ctx, *stacked):
  starts = _lower_starts(ctx, ctx.avals_in[0].shape[0], stacked)
  return [row for x, aval in zip(stacked, ctx.avals_in)
          for row in _compat.lower_dynamic_rows(ctx, aval, x, starts)]


def _stack_lowering(ctx, *rows, rows_per_leaf):
  n = rows_per_leaf
  return [_compat.lower_stack(ctx, ctx.avals_in[i:i + n], rows[i:i + n])
          for i in range(0, len(rows), n)]


def _leaves(rows: Sequence[Any], n: int) -> list[Sequence[Any]]:
  return [rows[i:i + n] for i in range(0, len(rows), n)]


def _check_rows(rows):
  first = rows[0]
  for i, row in enumerate(rows):
    if (row.shape, row.dtype) != (first.shape, first.dtype):
      raise StackRowsError(
          f'stack_rows: row {i} is {row.dtype}{list(row.shape)} but row 0 is '
          f'{first.dtype}{list(first.shape)}. Fix: give every row of a leaf the same shape '
          'and dtype (cast or pad the rows first).')


def _stack_abstract_eval(*rows, rows_per_leaf):
  leaves = _leaves(rows, rows_per_leaf)
  for leaf in leaves:
    _check_rows(leaf)
  return [leaf[0].update(shape=(rows_per_leaf,) + leaf[0].shape) for leaf in leaves]


def _unstack_abstract_eval(*stacked):
  return [x.update(shape=x.shape[1:]) for x in stacked for _ in range(x.shape[0])]


def _stack_transpose(cotangents, *rows, rows_per_leaf):
  leaves = [i for i, leaf in enumerate(_leaves(rows, rows_per_leaf))
            if any(map(_compat.is_undefined_primal, leaf))]
  split = iter(unstack_rows_p.bind(*(cotangents[i] for i in leaves)))
  out = [[next(split) for _ in range(rows_per_leaf)] if i in leaves else [None] * rows_per_leaf
         for i in range(len(cotangents))]
  return [ct if _compat.is_undefined_primal(row) else None
          for ct, row in zip((ct for leaf in out for ct in leaf), rows)]


def _unstack_transpose(cotangents, *stacked):
  n = stacked[0].aval.shape[0]
  leaves = [i for i, x in enumerate(stacked) if _compat.is_undefined_primal(x)]
  merged = iter(stack_rows_p.bind(*(ct for i in leaves for ct in cotangents[i * n:(i + 1) * n]),
                                  rows_per_leaf=n))
  return [next(merged) if i in leaves else None for i in range(len(stacked))]


def _stack_batch(rows, dims, rows_per_leaf):
  size = next(row.shape[dim] for row, dim in zip(rows, dims) if dim is not None)
  rows = [jnp.broadcast_to(row, (size,) + row.shape) if dim is None else jnp.moveaxis(row, dim, 0)
          for row, dim in zip(rows, dims)]
  stacked = stack_rows_p.bind(*rows, rows_per_leaf=rows_per_leaf)
  return stacked, [1] * len(stacked)


def _unstack_batch(stacked, dims):
  size = next(x.shape[dim] for x, dim in zip(stacked, dims) if dim is not None)
  stacked = [jnp.moveaxis(x, dim, 1) if dim is not None
             else jnp.broadcast_to(x[:, None], (x.shape[0], size) + x.shape[1:])
             for x, dim in zip(stacked, dims)]
  rows = unstack_rows_p.bind(*stacked)
  return rows, [0] * len(rows)


def _stack_impl(*rows, rows_per_leaf):
  return [jnp.stack(leaf) for leaf in _leaves(rows, rows_per_leaf)]


_compat.define_linear_primitive(
    stack_rows_p, impl=_stack_impl, lowering=_stack_lowering,
    abstract_eval=_stack_abstract_eval, transpose=_stack_transpose, batch=_stack_batch)
_compat.define_linear_primitive(
    unstack_rows_p, impl=lambda *stacked: [row for x in stacked for row in x],
    lowering=_unstack_lowering, abstract_eval=_unstack_abstract_eval,
    transpose=_unstack_transpose, batch=_unstack_batch)


def _is_numeric(x: Any) -> bool:
  """Whether the primitives handle `x`: floats; ints and bools (not differentiated, so
  their float0 tangents never meet a float's) and typed keys use `jnp.stack`."""
  return jnp.issubdtype(x.dtype, jnp.inexact)


def stack_rows(trees: Sequence[Any]) -> Any:
  """Equal-structured trees stacked leaf by leaf along a new leading axis.

  The same values as ``jax.tree.map(lambda *xs: jnp.stack(xs), *trees)``;
  its gradient splits into one kernel per leaf shape instead of one per row
  (see the module docstring). Not needed outside gradients of many rows:
  `jnp.stack` gives the same values.

  Examples:
    >>> stack_rows([{'w': jnp.zeros(3)}, {'w': jnp.ones(3)}])['w'].shape
    (2, 3)
  """
  if not trees:
    raise StackRowsError('stack_rows: no trees to stack. Fix: pass a list of at least one '
                         'tree, e.g. stack_rows([row0, row1]).')
  columns = [tuple(map(jnp.asarray, rows)) for rows in zip(*map(jax.tree.leaves, trees))]
  treedef = jax.tree.structure(jax.tree.map(lambda *_: 0, *trees))
  for rows in columns:
    _check_rows(rows)
  numeric = [rows for rows in columns if _is_numeric(rows[0])]
  stacked = iter(stack_rows_p.bind(*(r for rows in numeric for r in rows),
                                   rows_per_leaf=len(trees)) if numeric else ())
  return jax.tree.unflatten(treedef, [next(stacked) if _is_numeric(rows[0]) else jnp.stack(rows)
                                      for rows in columns])


def unstack_rows(tree: Any) -> list[Any]:
  """The rows of a tree whose leaves share a leading axis: ``[row 0, row 1, ...]``.

  The inverse of `stack_rows`; every row of one leaf shape is read by the
  same compiled kernel. Not needed to read one row: index the leaves.

  Examples:
    >>> [row['w'].tolist() for row in unstack_rows({'w': jnp.arange(2.0)})]
    [0.0, 1.0]
  """
  leaves, treedef = jax.tree.flatten(tree)
  if not leaves:
    return []
  lengths = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
  if len(lengths) != 1 or None in lengths:
    raise StackRowsError(
        f'unstack_rows: the leaves have no one shared leading axis; their shapes are '
        f'{[np.shape(leaf) for leaf in leaves]}. Fix: pass a tree whose every leaf has the '
        'same size along axis 0 (the rows).')
  n = lengths.pop()
  assert n is not None  # checked above
  leaves = [jnp.asarray(leaf) for leaf in leaves]
  numeric = [leaf for leaf in leaves if _is_numeric(leaf)]
  rows = iter(unstack_rows_p.bind(*numeric) if numeric else ())
  columns = [[next(rows) for _ in range(n)] if _is_numeric(leaf) else list(leaf)
             for leaf in leaves]
  return [jax.tree.unflatten(treedef, [column[i] for column in columns]) for i in range(n)]


__all__ = ['stack_rows', 'unstack_rows']
