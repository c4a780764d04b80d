"""Lifted control flow: `cond`, `switch` and `while_loop` over scope functions.

Every branch (and the loop's condition and body) is traced from the same rng
counters, so a branch draws the keys it would draw without the transform;
afterwards each counter holds the maximum over the traces, so later draws are
fresh whichever branch runs.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import jax
from jax import lax

from lift import errors
from lift.rng_counters import Chained, SharedStart
from lift.filters import Filter
from lift.pack import pack
from lift.scope import Scope
from lift.axes import check_split_rngs

C = TypeVar('C')

_NOT_CALLABLE = (
    '{transform}: {what} is {value!r}, which is not callable. Each branch is a '
    'function `branch(scope, *operands)`. Fix: pass functions, e.g. '
    '{example}.')
_NO_BRANCHES = (
    'switch: branches is {value!r}; it must be a non-empty sequence of functions '
    '`branch(scope, *operands)`. Fix: e.g. `switch(index, [f, g], scope, x)`.')
_BRANCHES_DIFFER = (
    '{transform} at "{path}": branch {index} creates or updates different '
    'variables than branch 0:\n{detail}\nThe lifted {transform} returns one set '
    'of variables, so every branch must create and update the same variables '
    '(names, shapes and dtypes). Fix: give every branch the same submodules and '
    'variables, or create every branch\'s variables before the {transform}, '
    'e.g. `if scope.is_mutable_collection("params"): [b(scope, x) for b in '
    'branches]`.')
_CARRY_CHANGED = (
    'while_loop at "{path}": the body changes the carry variables:\n{detail}\n'
    'The loop carry keeps one structure, shape and dtype for every iteration, so '
    'the body cannot create carry variables or change their shapes or dtypes. '
    'Fix: create them before the loop, e.g. call `body_fn(scope, init)` once '
    'before `while_loop`, and keep their shapes and dtypes fixed.')


def _path_text(scope_tree: Any) -> str:
  scopes = jax.tree.leaves(scope_tree, is_leaf=lambda x: isinstance(x, Scope))
  return '/' + '/'.join(scopes[0].path) if scopes else '/'


def variable_types(groups: Any) -> dict[str, str]:
  """``{'collection/name/...': 'float32[3,2]'}`` for every variable in ``groups[filter][root]``."""
  types = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(groups)[0]:
    names = [str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path[2:]]
    aval = jax.typeof(leaf)
    types['/'.join(names)] = f'{aval.dtype}{list(aval.shape)}'
  return types


def _difference(first: dict[str, str], other: dict[str, str], other_name: str) -> str:
  lines = [f'  only in branch 0: {k} {v}' for k, v in first.items() if k not in other]
  lines += [f'  only in {other_name}: {k} {v}' for k, v in other.items() if k not in first]
  lines += [f'  {k}: {first[k]} in branch 0, {other[k]} in {other_name}'
            for k in first if k in other and first[k] != other[k]]
  return '\n'.join(lines)


def _check_callable(transform: str, what: str, value: Any, example: str):
  if not callable(value):
    raise errors.TransformArgumentError(_NOT_CALLABLE.format(
        transform=transform, what=what, value=value, example=example))


# -- cond and switch --------------------------------------------------------------

class _BranchRun:
  """The pure branches of one lifted cond/switch call, traced from the same counters."""

  def __init__(self, branches, scope_fn, repack_fn, variable_groups, rng_groups):
    self.branches, self.scope_fn, self.repack_fn = branches, scope_fn, repack_fn
    self.variable_groups, self.rng_groups = variable_groups, rng_groups
    self.counters = SharedStart()
    self.types: dict[int, dict[str, str]] = {}
    self.path = '/'

  def __call__(self, index: int, *operands):
    scope_tree = self.scope_fn(self.variable_groups, self.rng_groups)
    self.path = _path_text(scope_tree)
    self.counters.begin(scope_tree)
    y = self.branches[index](scope_tree, *operands)
    out_groups = self.repack_fn(scope_tree)
    self.counters.end()
    self.types[index] = variable_types(out_groups)
    return y, out_groups

  def variables_mismatch(self, transform: str) -> errors.BranchVariablesError | None:
    first = self.types.get(0, {})
    for index, types in sorted(self.types.items()):
      if types != first:
        return errors.BranchVariablesError(_BRANCHES_DIFFER.format(
            transform=transform, path=self.path, index=index,
            detail=_difference(first, types, f'branch {index}')))
    return None


def _branch_groups(transform: str, select: Callable[..., Any], branches: Sequence[Callable],
                   scope_fn, repack_fn, variable_groups, rng_groups, *operands):
  run = _BranchRun(branches, scope_fn, repack_fn, variable_groups, rng_groups)
  pure = [functools.partial(run, i) for i in range(len(branches))]
  try:
    return select(pure, *operands)
  except TypeError:
    mismatch = run.variables_mismatch(transform)
    if mismatch is None:
      raise
    raise mismatch from None
  finally:
    run.counters.finish()


def _select_cond(pred, pure, *operands):
  return lax.cond(pred, pure[0], pure[1], *operands)


def _select_switch(index, pure, *operands):
  return lax.switch(index, pure, *operands)


def cond(pred: Any, true_fun: Callable[..., C], false_fun: Callable[..., C], scope: Any,
         *operands, variables: Filter = True, rngs: Filter = True) -> C:
  """Lifted ``lax.cond``: ``true_fun(scope, *operands)`` if ``pred`` else ``false_fun(...)``.

  Both branches are traced (at init too, so each creates its variables) and
  must create and update the same variables; updates of the branch taken
  survive. Each branch draws the rng keys it would draw without ``cond``.

  Args:
    pred: a boolean scalar.
    true_fun: ``branch(scope, *operands)``, run when ``pred`` is true.
    false_fun: the other branch, with the output type of ``true_fun``.
    scope: a scope or a pytree of scopes.
    *operands (Any): the branch arguments.
    variables: the collections lifted in and out (default: all).
    rngs: the rng streams available inside (default: all).

  Not for a ``pred`` known in Python: use an ``if``, which traces one branch.

  Examples:
    >>> def f(scope, x, pred):
    ...   dense = lambda s, x: x @ s.param('w', jax.nn.initializers.ones, (x.shape[-1], 2))
    ...   return cond(pred, dense, lambda s, x: -dense(s, x), scope, x)
    >>> y, variables = lift.init(f)(jax.random.key(0), jnp.ones((1, 3)), True)
    >>> y
    Array([[3., 3.]], dtype=float32)
  """
  _check_callable('cond', 'true_fun', true_fun, '`cond(pred, f, g, scope, x)`')
  _check_callable('cond', 'false_fun', false_fun, '`cond(pred, f, g, scope, x)`')
  inner = functools.partial(_branch_groups, 'cond', functools.partial(_select_cond, pred),
                            (true_fun, false_fun))
  return pack(inner, (variables,), (variables,), (rngs,), name='cond')(scope, *operands)


def switch(index: Any, branches: Sequence[Callable[..., C]], scope: Any, *operands,
           variables: Filter = True, rngs: Filter = True) -> C:
  """Lifted ``lax.switch``: ``branches[index](scope, *operands)``, index clamped.

  Every branch is traced and must create and update the same variables; updates
  of the branch taken survive. Each branch draws the rng keys it would draw
  without ``switch``. Not for an index known in Python: index the list, which
  traces one branch.

  Args:
    index: an integer scalar.
    branches: a non-empty sequence of ``branch(scope, *operands)``.
    scope: a scope or a pytree of scopes.
    *operands (Any): the branch arguments.
    variables: the collections lifted in and out (default: all).
    rngs: the rng streams available inside (default: all).

  Examples:
    >>> def f(scope, x, i):
    ...   return switch(i, [lambda s, x: x, lambda s, x: 2 * x], scope, x)
    >>> lift.apply(f)({}, jnp.ones(3), 1)
    Array([2., 2., 2.], dtype=float32)
  """
  if isinstance(branches, (str, bytes)) or not isinstance(branches, Sequence) or not branches:
    raise errors.TransformArgumentError(_NO_BRANCHES.format(value=branches))
  for i, branch in enumerate(branches):
    _check_callable('switch', f'branches[{i}]', branch, '`switch(i, [f, g], scope, x)`')
  inner = functools.partial(_branch_groups, 'switch', functools.partial(_select_switch, index),
                            tuple(branches))
  return pack(inner, (variables,), (variables,), (rngs,), name='switch')(scope, *operands)


# -- while_loop ---------------------------------------------------------------------

def _fold_rngs(rng_groups: Sequence[Any], splits: Sequence[bool], i: Any) -> tuple[Any, ...]:
  """Split streams get the raw key ``fold_in(key, i)``, same suffix (as Flax)."""
  return tuple(jax.tree.map(lambda k: jax.random.fold_in(k, i), group) if split else group
               for group, split in zip(rng_groups, splits))


class _Loop:
  """The pure condition and body of one lifted while_loop call."""

  def __init__(self, cond_fn, body_fn, splits, scope_fn, repack_fn, broadcast, rng_groups):
    self.cond_fn, self.body_fn, self.splits = cond_fn, body_fn, splits
    self.scope_fn, self.repack_fn = scope_fn, repack_fn
    self.broadcast, self.rng_groups = broadcast, rng_groups
    self.counters = Chained(('cond', 'body'))  # as in Flax: the body draws after the condition

  def cond(self, state):
    i, carry_variables, carry = state
    scope_tree = self.scope_fn((carry_variables, self.broadcast),
                               _fold_rngs(self.rng_groups, self.splits, -i), mutable_filter=False)
    self.counters.begin('cond', scope_tree)
    result = self.cond_fn(scope_tree, carry)
    self.counters.end('cond')
    return result

  def body(self, state):
    i, carry_variables, carry = state
    scope_tree = self.scope_fn((carry_variables, self.broadcast),
                               _fold_rngs(self.rng_groups, self.splits, i))
    self.counters.begin('body', scope_tree)
    carry = self.body_fn(scope_tree, carry)
    (new_variables,) = self.repack_fn(scope_tree)
    self.counters.end('body')
    _check_carry((carry_variables,), (new_variables,), _path_text(scope_tree))
    return i + 1, new_variables, carry


def _check_carry(before: Any, after: Any, path: str):
  old, new = variable_types(before), variable_types(after)
  if old != new:
    detail = '\n'.join(
        [f'  created: {k} {v}' for k, v in new.items() if k not in old]
        + [f'  {k}: {old[k]} before, {new[k]} after' for k in old if k in new and old[k] != new[k]]
        + [f'  dropped: {k} {v}' for k, v in old.items() if k not in new])
    raise errors.LoopVariablesError(_CARRY_CHANGED.format(path=path, detail=detail))


def _while_groups(cond_fn, body_fn, splits, scope_fn, repack_fn, variable_groups, rng_groups, init):
  carry_variables, broadcast = variable_groups
  loop = _Loop(cond_fn, body_fn, splits, scope_fn, repack_fn, broadcast, rng_groups)
  try:
    _, carry_variables, carry = lax.while_loop(loop.cond, loop.body, (0, carry_variables, init))
  finally:
    loop.counters.finish()
  return carry, (carry_variables,)


def while_loop(cond_fn: Callable[[Any, C], Any], body_fn: Callable[[Any, C], C], scope: Any,
               init: C, carry_variables: Filter = False, broadcast_variables: Filter = True,
               split_rngs: Mapping[Filter, bool] = {}) -> C:  # noqa: B006 (Flax's default)
  """Lifted ``lax.while_loop``: ``carry = body_fn(scope, carry)`` while ``cond_fn(scope, carry)``.

  Args:
    cond_fn: ``cond_fn(scope, carry) -> bool scalar``; sees every variable, read-only.
    body_fn: ``body_fn(scope, carry) -> carry``.
    scope: a scope or a pytree of scopes.
    init: the initial carry.
    carry_variables: collections carried through the loop: mutable inside, with
      fixed structure, shapes and dtypes (create them before the loop).
    broadcast_variables: collections visible inside, read-only (default: all).
    split_rngs: ``{stream filter: bool}``; iteration ``i`` of the body draws
      from ``fold_in(key, i)`` for a split stream (the condition from
      ``fold_in(key, -i)``), from the same key for an unsplit one. Streams
      matched by no filter are not available inside.

  Not for a loop with a known trip count: ``scan`` also differentiates in
  reverse mode.

  Examples:
    >>> def f(scope, x):
    ...   count = scope.variable('state', 'n', lambda: 0)
    ...   def body(scope, x):
    ...     scope.put_variable('state', 'n', scope.get_variable('state', 'n') + 1)
    ...     return 2 * x
    ...   return while_loop(lambda s, x: x < 100, body, scope, x, carry_variables='state')
    >>> y, state = lift.apply(f, mutable='state')({}, 1)
    >>> int(y), int(state['state']['n'])
    (128, 7)
  """
  _check_callable('while_loop', 'cond_fn', cond_fn, '`while_loop(cond_fn, body_fn, scope, init)`')
  _check_callable('while_loop', 'body_fn', body_fn, '`while_loop(cond_fn, body_fn, scope, init)`')
  rng_filters, splits = check_split_rngs('while_loop', split_rngs)
  inner = functools.partial(_while_groups, cond_fn, body_fn, splits)
  return pack(inner, (carry_variables, broadcast_variables), (carry_variables,), rng_filters,
              name='while_loop')(scope, init)


__all__ = ['cond', 'switch', 'while_loop', 'variable_types']
