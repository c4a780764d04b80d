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
kernel. Values, JVPs, gradients and batching are those of `jnp.stack` and of
indexing.

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

stack_rows_p = _compat.Primitive('stack_rows')
unstack_rows_p = _compat.Primitive('unstack_rows')


def _row_starts(x: jax.Array) -> list[Any]:
  """The start indices ``0, 1, ..., n-1`` of the rows of `x`, as values XLA cannot fold.

  Each is ``0 + i`` where the 0 is ``x[0, ...] > inf`` (false for every float,
  NaN included), and each comes out of its own operand of one sort, so no
  consumer kernel can embed its value. If a compiler ever folds the
  comparison, the slices get constant offsets again: slower to compile, same
  values. Other dtypes keep constant offsets.
  """
  n = x.shape[0]
  if not jnp.issubdtype(x.dtype, jnp.floating) or x.size == 0:
    return list(range(n))
  zero = lax.convert_element_type(lax.gt(x.reshape(-1)[0], jnp.inf), np.int32)
  key = jnp.stack([zero, zero + 1])
  starts = lax.sort((key,) + tuple(np.full((2,), i, np.int32) for i in range(n)),
                    num_keys=1)[1:]
  return [start[0] for start in starts]


def _stack_lowering(*rows):
  return lax.concatenate([lax.reshape(row, (1,) + row.shape) for row in rows], 0)


def _unstack_lowering(x):
  zeros = (0,) * (x.ndim - 1)
  return [lax.reshape(lax.dynamic_slice(x, (start,) + zeros, (1,) + x.shape[1:]), x.shape[1:])
          for start in _row_starts(x)]


def _check_rows(rows):
  first = rows[0]
  for i, row in enumerate(rows):
    if (row.shape, row.dtype) != (first.shape, first.dtype):
      raise TypeError(f'stack_rows: row {i} is {row.dtype}{list(row.shape)} but row 0 is '
                      f'{first.dtype}{list(first.shape)}; every row needs the same shape '
                      'and dtype.')


def _stack_abstract_eval(*rows):
  _check_rows(rows)
  return rows[0].update(shape=(len(rows),) + rows[0].shape)


def _unstack_abstract_eval(x):
  return [x.update(shape=x.shape[1:])] * x.shape[0]


def _stack_transpose(cotangent, *rows):
  cotangents = unstack_rows_p.bind(cotangent)
  return [ct if _compat.is_undefined_primal(row) else None
          for ct, row in zip(cotangents, rows)]


def _unstack_transpose(cotangents, x):
  del x
  return [stack_rows_p.bind(*cotangents)]


def _stack_batch(rows, dims):
  size = next(row.shape[dim] for row, dim in zip(rows, dims) if dim is not None)
  rows = [jnp.broadcast_to(row, (size,) + row.shape) if dim is None else jnp.moveaxis(row, dim, 0)
          for row, dim in zip(rows, dims)]
  return stack_rows_p.bind(*rows), 1


def _unstack_batch(args, dims):
  (x,), (dim,) = args, dims
  rows = unstack_rows_p.bind(jnp.moveaxis(x, dim, 1))
  return rows, [0] * len(rows)


_compat.define_linear_primitive(
    stack_rows_p, impl=lambda *rows: jnp.stack(rows), lowering=_stack_lowering,
    abstract_eval=_stack_abstract_eval, transpose=_stack_transpose, batch=_stack_batch,
    multiple_results=False)
_compat.define_linear_primitive(
    unstack_rows_p, impl=lambda x: list(x), lowering=_unstack_lowering,
    abstract_eval=_unstack_abstract_eval, transpose=_unstack_transpose, batch=_unstack_batch,
    multiple_results=True)


def stack_rows(trees: Sequence[Any]) -> Any:
  """Equal-structured trees stacked leaf by leaf along a new leading axis.

  The same values as ``jax.tree.map(lambda *xs: jnp.stack(xs), *trees)``;
  its gradient splits into one kernel per leaf shape instead of one per row
  (see the module docstring).

  >>> stack_rows([{'w': jnp.zeros(3)}, {'w': jnp.ones(3)}])['w'].shape
  (2, 3)
  """
  if not trees:
    raise ValueError('stack_rows: no trees to stack; pass at least one.')
  return jax.tree.map(_stack_leaf, *trees)


def _is_numeric(x: Any) -> bool:
  return not jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)  # e.g. typed PRNG keys


def _stack_leaf(*rows: Any) -> Any:
  rows = tuple(map(jnp.asarray, rows))
  _check_rows(rows)
  return stack_rows_p.bind(*rows) if _is_numeric(rows[0]) else jnp.stack(rows)


def _unstack_leaf(leaf: Any) -> list[Any]:
  leaf = jnp.asarray(leaf)
  return unstack_rows_p.bind(leaf) if _is_numeric(leaf) else list(leaf)


def unstack_rows(tree: Any) -> list[Any]:
  """The rows of a tree whose leaves share a leading axis: ``[row 0, row 1, ...]``.

  The inverse of `stack_rows`; every row of one leaf shape is read by the
  same compiled kernel.

  >>> [row['w'].tolist() for row in unstack_rows({'w': jnp.arange(2.0)})]
  [0.0, 1.0]
  """
  leaves, treedef = jax.tree.flatten(tree)
  if not leaves:
    return []
  lengths = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
  if len(lengths) != 1 or None in lengths:
    raise ValueError(f'unstack_rows: the leaves need one shared leading axis; their '
                     f'shapes are {[np.shape(leaf) for leaf in leaves]}.')
  columns = [_unstack_leaf(leaf) for leaf in leaves]
  return [jax.tree.unflatten(treedef, [column[i] for column in columns])
          for i in range(lengths.pop())]


__all__ = ['stack_rows', 'unstack_rows']
