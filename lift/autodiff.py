"""Lifted autodiff: `vjp`, `jvp`, `value_and_grad` and `custom_vjp` over scope functions.

Signatures and return conventions are those of ``flax.core.lift``: `vjp`'s
backward function returns ``(variable cotangents, *input cotangents)``,
`value_and_grad` differentiates the inputs only, `jvp` takes tangents for
variable collections, and `custom_vjp`'s backward rule returns
``(variable cotangents, *input cotangents)``.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lift import errors
from lift.checkpoint import check_argnums, check_in_range
from lift.filters import Filter
from lift.pack import pack
from lift.scope import Scope

_REDUCE_AXES = (
    '{transform}: reduce_axes={value!r} is not supported: JAX removed '
    '`reduce_axes` from its autodiff functions. Fix: drop the argument and '
    'reduce the cotangents yourself, e.g. with `lax.psum(grads, axis_name)`.')
_TANGENT_WITHOUT_VARIABLES = (
    'jvp: variable_tangents has collection {col!r}, but the scope at "{path}" '
    'has no variables in it (it has {present}). A tangent needs a variable of '
    'the same structure. Fix: pass tangents only for existing collections, e.g. '
    '`{{"params": jax.tree.map(jnp.ones_like, scope.variables()["params"])}}`.')
_NOT_A_DICT = (
    'jvp: variable_tangents must be a dict {{collection: tangents}} (or a pytree '
    'of such dicts shaped like the scope tree), got {value!r}. Fix: e.g. '
    '`variable_tangents={{"params": params_tangent}}`, or `{{}}` for none.')
_CUSTOM_VJP_COUNTING = '(custom_vjp counts the scope as argument 0, as flax.core.lift.custom_vjp.)'
_NONDIFF_SCOPE = (
    'custom_vjp: nondiff_argnums={value!r} holds 0, the scope. The scope\'s '
    'variables in `grad_vars` are always differentiated and the others never '
    'are. Fix: list only the positions of plain arguments (the first argument '
    'after the scope is 1).')


def _scope_treedef(scope: Any) -> Any:
  return jax.tree.structure(scope, is_leaf=lambda x: isinstance(x, Scope))


def _check_no_reduce_axes(transform: str, reduce_axes: Any):
  if reduce_axes:
    raise errors.TransformArgumentError(_REDUCE_AXES.format(transform=transform, value=reduce_axes))


def _run(fn, has_aux: bool, scope_fn, repack_fn, rng_groups, variable_groups, args):
  """``fn`` on scopes rebuilt from ``variable_groups``: ``(y, (aux, out_groups))``."""
  scope = scope_fn(variable_groups, rng_groups)
  out = fn(scope, *args)
  y, aux = out if has_aux else (out, ())
  return y, (aux, repack_fn(scope))


# -- vjp ---------------------------------------------------------------------------

def _vjp_target(run, other, vjp_variables, *args):
  return run((vjp_variables, other), args)


def _variable_first_bwd(treedef, bwd, cotangent):
  variables_grad, *inputs_grad = bwd(cotangent)
  return (treedef.unflatten(variables_grad), *inputs_grad)


def _vjp_groups(fn, has_aux, treedef, scope_fn, repack_fn, variable_groups, rng_groups, *args):
  vjp_variables, other = variable_groups
  run = functools.partial(_run, fn, has_aux, scope_fn, repack_fn, rng_groups)
  y, bwd, (aux, out_groups) = jax.vjp(
      functools.partial(_vjp_target, run, other), vjp_variables, *args, has_aux=True)
  bwd = jax.tree_util.Partial(functools.partial(_variable_first_bwd, treedef), bwd)
  return ((y, bwd, aux) if has_aux else (y, bwd)), out_groups


def vjp(fn: Callable[..., Any], scope: Any, *primals, has_aux: bool = False,
        reduce_axes: tuple = (), vjp_variables: Filter = 'params',
        variables: Filter = True, rngs: Filter = True) -> tuple[Any, ...]:
  """Lifted ``jax.vjp`` of ``fn(scope, *primals)``, also with respect to variables.

  Returns ``(y, bwd)``, or ``(y, bwd, aux)`` with ``has_aux``;
  ``bwd(cotangent) -> (variable_cotangents, *primal_cotangents)`` where the
  variable cotangents cover the ``vjp_variables`` collections, shaped like the
  scope tree (``{'params': ...}`` for one scope). Not needed for gradients of
  a whole model's loss: ``jax.grad`` of a function of the variables dict
  (around `lift.apply`) is simpler.

  Args:
    fn: the scope function; returns ``y`` (or ``(y, aux)`` with ``has_aux``).
    scope: a scope or a pytree of scopes.
    *primals (Any): the arguments after the scope.
    has_aux: whether ``fn`` returns ``(y, aux)``.
    reduce_axes: must be empty (JAX removed it).
    vjp_variables: collections that get cotangents.
    variables: other collections visible inside, without cotangents.
    rngs: the rng streams available inside (default: all).

  Examples:
    >>> def f(scope, x):
    ...   w = scope.param('w', jax.nn.initializers.ones, (x.shape[-1],))
    ...   y, bwd = vjp(lambda s, x: jnp.sum(s.get_variable('params', 'w') * x), scope, x)
    ...   params_grad, x_grad = bwd(jnp.float32(1.0))
    ...   return params_grad, x_grad
    >>> (params_grad, x_grad), variables = lift.init(f)(jax.random.key(0), jnp.arange(3.0))
    >>> params_grad['params']['w'], x_grad
    (Array([0., 1., 2.], dtype=float32), Array([1., 1., 1.], dtype=float32))
  """
  _check_no_reduce_axes('vjp', reduce_axes)
  inner = functools.partial(_vjp_groups, fn, has_aux, _scope_treedef(scope))
  return pack(inner, (vjp_variables, variables), (variables,), (rngs,), name='vjp')(scope, *primals)


# -- value_and_grad --------------------------------------------------------------------

def _grad_target(run, variable_groups, *args):
  return run(variable_groups, args)


def _value_and_grad_groups(fn, has_aux, scope_fn, repack_fn, variable_groups, rng_groups, *args):
  run = functools.partial(_run, fn, has_aux, scope_fn, repack_fn, rng_groups)
  y, bwd, (aux, out_groups) = jax.vjp(
      functools.partial(_grad_target, run, variable_groups), *args, has_aux=True)
  grads = bwd(jnp.ones_like(y))
  return ((y, aux, grads) if has_aux else (y, grads)), out_groups


def value_and_grad(fn: Callable[..., Any], scope: Any, *primals, has_aux: bool = False,
                   reduce_axes: tuple = (), variables: Filter = True,
                   rngs: Filter = True) -> tuple[Any, ...]:
  """Lifted ``jax.value_and_grad`` of ``fn(scope, *primals)`` with respect to the primals.

  Returns ``(y, grads)``, or ``(y, aux, grads)`` with ``has_aux``; ``grads`` is
  a tuple with one gradient per primal (as ``flax.core.lift.value_and_grad``).
  Variables get no gradient: use `vjp` for that (and not this transform).

  Args:
    fn: the scope function; returns a scalar ``y`` (or ``(y, aux)``).
    scope: a scope or a pytree of scopes.
    *primals (Any): the arguments after the scope.
    has_aux: whether ``fn`` returns ``(y, aux)``.
    reduce_axes: must be empty (JAX removed it).
    variables: the collections visible inside (default: all).
    rngs: the rng streams available inside (default: all).

  Examples:
    >>> def f(scope, x):
    ...   return value_and_grad(lambda s, x: jnp.sum(x ** 2), scope, x)
    >>> (y, (x_grad,)), _ = lift.init(f)(jax.random.key(0), jnp.arange(3.0))
    >>> y, x_grad
    (Array(5., dtype=float32), Array([0., 2., 4.], dtype=float32))
  """
  _check_no_reduce_axes('value_and_grad', reduce_axes)
  inner = functools.partial(_value_and_grad_groups, fn, has_aux)
  return pack(inner, (variables,), (variables,), (rngs,), name='value_and_grad')(scope, *primals)


# -- jvp -----------------------------------------------------------------------------------

def _jvp_target(fn, scope_fn, repack_fn, other, rng_groups, jvp_variables, args):
  scope = scope_fn((jvp_variables, other), rng_groups)
  return fn(scope, *args), repack_fn(scope)


def _check_tangent_collections(jvp_variables, variable_tangents, scope_fn, variable_groups,
                               rng_groups):
  for present, tangents in zip(jvp_variables, variable_tangents):
    for col in tangents:
      if col not in present:
        path = jax.tree.leaves(scope_fn(variable_groups, rng_groups),
                               is_leaf=lambda x: isinstance(x, Scope))[0].path
        raise errors.TransformArgumentError(_TANGENT_WITHOUT_VARIABLES.format(
            col=col, path='/' + '/'.join(path), present=sorted(present)))


def _jvp_groups(fn, tangents, variable_tangents, scope_fn, repack_fn, variable_groups,
                rng_groups, *args):
  jvp_variables, other = variable_groups
  _check_tangent_collections(jvp_variables, variable_tangents, scope_fn, variable_groups,
                             rng_groups)
  target = functools.partial(_jvp_target, fn, scope_fn, repack_fn, other, rng_groups)
  (y, out_groups), (y_tangent, _) = jax.jvp(
      target, (jvp_variables, args), (variable_tangents, tuple(tangents)))
  return (y, y_tangent), out_groups


def jvp(fn: Callable[..., Any], scope: Any, primals: Iterable[Any], tangents: Iterable[Any],
        variable_tangents: Any, variables: Filter = True,
        rngs: Filter = True) -> tuple[Any, Any]:
  """Lifted ``jax.jvp`` of ``fn(scope, *primals)``, with tangents for variables too.

  Returns ``(y, y_tangent)``. Not for gradients of a scalar loss: forward mode
  costs one pass per input direction; use `vjp`.

  Args:
    fn: the scope function.
    scope: a scope or a pytree of scopes.
    primals: the arguments after the scope, as a tuple or list.
    tangents: one tangent per primal.
    variable_tangents: ``{collection: tangents}`` (a pytree of such dicts
      shaped like the scope tree); a collection left out has zero tangent.
    variables: other collections visible inside, without tangents.
    rngs: the rng streams available inside (default: all).

  Examples:
    >>> def f(scope, x):
    ...   w = scope.param('w', jax.nn.initializers.ones, (3,))
    ...   dense = lambda s, x: jnp.sum(s.get_variable('params', 'w') * x)
    ...   return jvp(dense, scope, (x,), (jnp.zeros(3),), {'params': {'w': jnp.ones(3)}})
    >>> (y, y_dot), _ = lift.init(f)(jax.random.key(0), jnp.arange(3.0))
    >>> y, y_dot
    (Array(3., dtype=float32), Array(3., dtype=float32))
  """
  treedef = _scope_treedef(scope)
  try:
    per_scope = treedef.flatten_up_to(variable_tangents)
  except (TypeError, ValueError):
    raise errors.TransformArgumentError(_NOT_A_DICT.format(value=variable_tangents)) from None
  if not all(isinstance(t, dict) for t in per_scope):
    raise errors.TransformArgumentError(_NOT_A_DICT.format(value=variable_tangents))
  # Empty collections are dropped: JAX treats {'params': {}} and {} as different trees.
  per_scope = tuple({col: t for col, t in tree.items() if t} for tree in per_scope)
  target = tuple(per_scope[0]) if per_scope else ()
  inner = functools.partial(_jvp_groups, fn, tuple(tangents), per_scope)
  return pack(inner, (target, variables), (variables,), (rngs,), name='jvp')(scope, *primals)


# -- custom_vjp ------------------------------------------------------------------------------

class _CustomVjp(NamedTuple):
  fn: Callable[..., Any]
  forward_fn: Callable[..., Any]
  backward_fn: Callable[..., Any]
  nondiff_argnums: tuple[int, ...]


class _ScopeShape:
  """The scope tree structure, learnt in the forward pass, used to flatten the backward's output."""
  treedef: Any = None


def _primal(fn, scope_fn, repack_fn, other, rng_groups, grad_variables, *args):
  scope = scope_fn((grad_variables, other), rng_groups)
  y = fn(scope, *args)
  return y, repack_fn(scope)


def _forward(forward_fn, scope_fn, repack_fn, other, rng_groups, shape, grad_variables, *args):
  scope = scope_fn((grad_variables, other), rng_groups)
  shape.treedef = _scope_treedef(scope)
  y, residuals = forward_fn(scope, *args)
  return (y, repack_fn(scope)), residuals


def _backward(backward_fn, shape, *args):
  # JAX passes (*nondiff_args, residuals, cotangent of (y, variables out)).
  *nondiff_args, residuals, (y_cotangent, _) = args
  variables_cotangent, *inputs_cotangent = backward_fn(*nondiff_args, residuals, y_cotangent)
  return (tuple(shape.treedef.flatten_up_to(variables_cotangent)), *inputs_cotangent)


def _custom_vjp_groups(config: _CustomVjp, scope_fn, repack_fn, variable_groups, rng_groups, *args):
  check_in_range('custom_vjp', 'nondiff_argnums', config.nondiff_argnums, len(args) + 1,
                 'including the scope')
  grad_variables, other = variable_groups
  shape = _ScopeShape()
  f = jax.custom_vjp(functools.partial(_primal, config.fn, scope_fn, repack_fn, other, rng_groups),
                     nondiff_argnums=config.nondiff_argnums)
  f.defvjp(functools.partial(_forward, config.forward_fn, scope_fn, repack_fn, other,
                             rng_groups, shape),
           functools.partial(_backward, config.backward_fn, shape))
  return f(grad_variables, *args)


def custom_vjp(fn: Callable[..., Any], forward_fn: Callable[..., Any],
               backward_fn: Callable[..., Any], grad_vars: Filter = 'params',
               nondiff_argnums: Iterable[int] = ()) -> Callable[..., Any]:
  """Lifted ``jax.custom_vjp``: ``fn(scope, *args)`` with a hand-written backward rule.

  Not for changing only what is saved for the backward pass: `checkpoint`
  with a ``policy`` does that and keeps the exact gradient.

  Args:
    fn: the scope function, run when no gradient is taken.
    forward_fn: ``forward_fn(scope, *args) -> (y, residuals)``.
    backward_fn: ``backward_fn(*nondiff_args, residuals, y_cotangent) ->
      (variable_cotangents, *input_cotangents)``; the variable cotangents cover
      ``grad_vars`` shaped like the scope tree (``{'params': ...}``), the input
      cotangents the arguments not in ``nondiff_argnums``. The scope is not
      available in the backward pass.
    grad_vars: the collections that get cotangents (default: 'params').
    nondiff_argnums: positions of arguments without cotangents, with the scope
      as 0 (as ``flax.core.lift.custom_vjp``); they are passed to ``backward_fn``.

  Examples:
    >>> def dense(scope, x):
    ...   return x @ scope.param('w', jax.nn.initializers.ones, (x.shape[-1], 2))
    >>> def forward(scope, x):
    ...   y, bwd = vjp(dense, scope, x)
    ...   return y, bwd
    >>> def backward(bwd, y_cotangent):
    ...   params_t, x_t = bwd(y_cotangent)
    ...   return jax.tree.map(jnp.sign, params_t), x_t
    >>> sign_grad_dense = custom_vjp(dense, forward, backward)
    >>> def loss(variables, x):
    ...   return jnp.sum(lift.apply(sign_grad_dense)(variables, x))
    >>> variables = {'params': {'w': jnp.ones((3, 2))}}
    >>> jax.grad(loss)(variables, jnp.array([[-2.0, 0.0, 3.0]]))['params']['w']
    Array([[-1., -1.],
           [ 0.,  0.],
           [ 1.,  1.]], dtype=float32)
  """
  argnums = check_argnums('custom_vjp', 'nondiff_argnums', nondiff_argnums, _CUSTOM_VJP_COUNTING)
  if 0 in argnums:
    raise errors.ArgnumsError(_NONDIFF_SCOPE.format(value=nondiff_argnums))
  config = _CustomVjp(fn, forward_fn, backward_fn, argnums)
  inner = functools.partial(_custom_vjp_groups, config)
  functools.update_wrapper(inner, fn)
  return pack(inner, (grad_vars, True), (grad_vars, True), (True,), name='custom_vjp')


__all__ = ['vjp', 'jvp', 'value_and_grad', 'custom_vjp']
