"""Transforms called inside a method with the module as an argument, as in Flax.

``nn.cond(pred, true_fun, false_fun, mdl, *operands)``, ``nn.switch``,
``nn.while_loop``, ``nn.vjp``, ``nn.jvp``, ``nn.grad``, ``nn.value_and_grad``,
and ``nn.custom_vjp``, which makes a function ``f(mdl, *args)`` (usable as a
method). Each function ``fn(mdl, *args)`` runs on a clone of ``mdl`` bound to
the lift transform's inner scopes (see ``lifting``).
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax

from lift.autodiff import custom_vjp as lift_custom_vjp
from lift.autodiff import jvp as lift_jvp
from lift.autodiff import value_and_grad as lift_value_and_grad
from lift.autodiff import vjp as lift_vjp
from lift.control_flow import cond as lift_cond
from lift.control_flow import switch as lift_switch
from lift.control_flow import while_loop as lift_while_loop
from lift.filters import Filter

from linen_ext import errors
from linen_ext.transforms.lifting import Collected, collect_scopes, mark_wrapped, scope_function
from linen_ext.module.core import Module, wrap_method


def _unbound(fn: Callable[..., Any]) -> Callable[..., Any]:
  if inspect.ismethod(fn) and isinstance(fn.__self__, Module):
    return fn.__func__
  return fn


def _prepare(transform: str, fns: Sequence[Callable[..., Any]], module: Module,
             args: tuple, kwargs: dict | None = None) -> tuple[list, Collected]:
  """Scope functions for ``fns`` run on ``module``, and the lifted scopes and arguments."""
  if not isinstance(module, Module):
    raise errors.NotAModuleError(transform, module)
  if module.scope is None:
    raise errors.UnboundModuleError(type(module).__name__, f'Calling `nn.{transform}`')
  collected = collect_scopes(module, args, kwargs or {})
  cores = [scope_function(transform, wrap_method(_unbound(fn)), module) for fn in fns]
  return cores, collected


def _with_one_scope(core: Callable[..., Any], scope, *args, **kwargs):
  return core([scope], *args, **kwargs)


def _single(transform: str, cores: list, collected: Collected) -> tuple[list, Any]:
  """For transforms whose variable cotangents/tangents are shaped like one scope."""
  if len(collected.scopes) != 1:
    raise errors.MultipleScopesError(transform, len(collected.scopes))
  return [functools.partial(_with_one_scope, c) for c in cores], collected.scopes[0]


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any],
         mdl: Module, *operands, variables: Filter = True, rngs: Filter = True) -> Any:
  """``true_fun(mdl, *operands)`` if ``pred`` else ``false_fun(mdl, *operands)`` (``lax.cond``).

  Both branches are traced; not for a ``pred`` known in Python: use an ``if``.

  Examples:
    >>> class Signed(nn.Module):
    ...   def setup(self):
    ...     self.dense = nn.Dense(2)
    ...   def __call__(self, x, positive):
    ...     return nn.cond(positive, lambda m, x: m.dense(x), lambda m, x: -m.dense(x), self, x)
    >>> model, x = Signed(), jnp.ones((1, 3))
    >>> variables = model.init(jax.random.key(0), x, True)
    >>> bool(jnp.all(model.apply(variables, x, True) == -model.apply(variables, x, False)))
    True
  """
  (true_core, false_core), c = _prepare('cond', (true_fun, false_fun), mdl, operands)
  return lift_cond(pred, true_core, false_core, c.scopes, *c.args, variables=variables,
                   rngs=rngs)


def switch(index: Any, branches: Sequence[Callable[..., Any]], mdl: Module, *operands,
           variables: Filter = True, rngs: Filter = True) -> Any:
  """``branches[index](mdl, *operands)`` (``lax.switch``).

  Every branch is traced; not for an index known in Python: index the list.

  Examples:
    >>> class Pick(nn.Module):
    ...   def setup(self):
    ...     self.dense = nn.Dense(2)
    ...   def __call__(self, x, i):
    ...     return nn.switch(i, [lambda m, x: m.dense(x), lambda m, x: 2 * m.dense(x)], self, x)
    >>> model, x = Pick(), jnp.ones((1, 3))
    >>> variables = model.init(jax.random.key(0), x, 0)
    >>> bool(jnp.all(model.apply(variables, x, 1) == 2 * model.apply(variables, x, 0)))
    True
  """
  cores, c = _prepare('switch', tuple(branches), mdl, operands)
  return lift_switch(index, cores, c.scopes, *c.args, variables=variables, rngs=rngs)


def while_loop(cond_fn: Callable[[Any, Any], Any], body_fn: Callable[[Any, Any], Any],
               mdl: Module, init: Any, carry_variables: Filter = False,
               broadcast_variables: Filter = True,
               split_rngs: Mapping[Filter, bool] = {}) -> Any:  # noqa: B006 (Flax's default)
  """``carry = body_fn(mdl, carry)`` while ``cond_fn(mdl, carry)`` (``lax.while_loop``).

  Not for a loop with a known trip count: `scan` also differentiates in reverse mode.

  Examples:
    >>> class Doubling(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return nn.while_loop(lambda m, c: c < 100, lambda m, c: 2 * c, self, x)
    >>> int(Doubling().apply({}, 1))
    128
  """
  (cond_core, body_core), c = _prepare('while_loop', (cond_fn, body_fn), mdl, (init,))
  return lift_while_loop(cond_core, body_core, c.scopes, c.args[0], carry_variables,
                         broadcast_variables, split_rngs)


def vjp(fn: Callable[..., Any], mdl: Module, *primals, has_aux: bool = False,
        reduce_axes: tuple = (), vjp_variables: Filter = 'params', variables: Filter = True,
        rngs: Filter = True, multi_scope: bool = False) -> tuple[Any, ...]:
  """``(y, bwd)`` of ``fn(mdl, *primals)``; ``bwd(dy) -> (variable_grads, *primal_grads)``.

  Not for a training step's gradients: ``jax.grad`` of a loss of the
  variables (around ``apply``) is simpler.

  Examples:
    >>> class Probe(nn.Module):
    ...   def setup(self):
    ...     self.dense = nn.Dense(1, use_bias=False, kernel_init=nn.initializers.ones)
    ...   def __call__(self, x):
    ...     y, bwd = nn.vjp(lambda m, x: m(x), self.dense, x)
    ...     return bwd(jnp.ones_like(y))
    >>> variables = {'params': {'dense': {'kernel': jnp.ones((2, 1))}}}
    >>> params_grad, x_grad = Probe().apply(variables, jnp.array([[1.0, 2.0]]))
    >>> params_grad['params']['kernel'].tolist(), x_grad.tolist()
    ([[1.0], [2.0]], [[1.0, 1.0]])
  """
  (core,), c = _prepare('vjp', (fn,), mdl, primals)
  scope = c.scopes
  if not multi_scope:
    (core,), scope = _single('vjp', [core], c)
  return lift_vjp(core, scope, *c.args, has_aux=has_aux, reduce_axes=reduce_axes,
                  vjp_variables=vjp_variables, variables=variables, rngs=rngs)


def jvp(fn: Callable[..., Any], mdl: Module, primals: Iterable[Any], tangents: Iterable[Any],
        variable_tangents: Any, variables: Filter = True, rngs: Filter = True) -> tuple[Any, Any]:
  """``(y, y_tangent)`` of ``fn(mdl, *primals)``, with ``{collection: tangents}`` for variables.

  Not for the gradient of a scalar: reverse mode (`vjp`, `grad`) takes one pass.

  Examples:
    >>> class Probe(nn.Module):
    ...   def setup(self):
    ...     self.dense = nn.Dense(1, use_bias=False, kernel_init=nn.initializers.ones)
    ...   def __call__(self, x):
    ...     kernel_dot = {'params': {'kernel': jnp.ones((2, 1))}}
    ...     return nn.jvp(lambda m, x: m(x), self.dense, (x,), (jnp.zeros_like(x),), kernel_dot)
    >>> variables = {'params': {'dense': {'kernel': jnp.ones((2, 1))}}}
    >>> y, y_dot = Probe().apply(variables, jnp.array([[1.0, 2.0]]))
    >>> y.tolist(), y_dot.tolist()
    ([[3.0]], [[3.0]])
  """
  (core,), c = _prepare('jvp', (fn,), mdl, tuple(primals))
  (core,), scope = _single('jvp', [core], c)
  return lift_jvp(core, scope, c.args, tangents, variable_tangents, variables=variables,
                  rngs=rngs)


def value_and_grad(fn: Callable[..., Any], mdl: Module, *primals, has_aux: bool = False,
                   reduce_axes: tuple = (), variables: Filter = True,
                   rngs: Filter = True) -> tuple[Any, Any]:
  """``(y, grads)`` (``((y, aux), grads)`` with ``has_aux``), grads with respect to the primals.

  Variables get no gradient; not for gradients of the weights: use `vjp`.

  Examples:
    >>> class Probe(nn.Module):
    ...   def setup(self):
    ...     self.dense = nn.Dense(1, use_bias=False, kernel_init=nn.initializers.ones)
    ...   def __call__(self, x):
    ...     return nn.value_and_grad(lambda m, x: m(x).sum(), self.dense, x)
    >>> (y, (x_grad,)), _ = Probe().init_with_output(jax.random.key(0), jnp.array([[1.0, 2.0]]))
    >>> float(y), x_grad.tolist()
    (3.0, [[1.0, 1.0]])
  """
  (core,), c = _prepare('value_and_grad', (fn,), mdl, primals)
  out = lift_value_and_grad(core, c.scopes, *c.args, has_aux=has_aux, reduce_axes=reduce_axes,
                            variables=variables, rngs=rngs)
  y, grads = out[0], out[-1]
  if jax.numpy.shape(y) != ():
    raise errors.NonScalarOutputError('value_and_grad', jax.numpy.shape(y))
  return ((y, out[1]), grads) if has_aux else (y, grads)


def grad(fn: Callable[..., Any], mdl: Module, *primals, has_aux: bool = False,
         reduce_axes: tuple = (), variables: Filter = True, rngs: Filter = True) -> Any:
  """The gradients of scalar ``fn(mdl, *primals)`` with respect to the primals.

  Variables get no gradient; not for gradients of the weights: use `vjp`.

  Examples:
    >>> class Probe(nn.Module):
    ...   def setup(self):
    ...     self.dense = nn.Dense(1, use_bias=False, kernel_init=nn.initializers.ones)
    ...   def __call__(self, x):
    ...     return nn.grad(lambda m, x: m(x).sum(), self.dense, x)
    >>> (x_grad,), _ = Probe().init_with_output(jax.random.key(0), jnp.array([[1.0, 2.0]]))
    >>> x_grad.tolist()
    [[1.0, 1.0]]
  """
  value, grads = value_and_grad(fn, mdl, *primals, has_aux=has_aux, reduce_axes=reduce_axes,
                                 variables=variables, rngs=rngs)
  return (grads, value[1]) if has_aux else grads


def _custom_vjp_method(lifted_for, fn, self, *args):
  (core, forward_core), c = _prepare('custom_vjp', (fn, lifted_for.forward_fn), self, args)
  (core, forward_core), scope = _single('custom_vjp', [core, forward_core], c)
  return lifted_for(core, forward_core)(scope, *c.args)


class _CustomVjp:
  """The options of one ``nn.custom_vjp``, validated once."""

  def __init__(self, forward_fn, backward_fn, grad_vars, nondiff_argnums):
    self.forward_fn, self.backward_fn = forward_fn, backward_fn
    self.grad_vars, self.nondiff_argnums = grad_vars, tuple(nondiff_argnums)
    self(_noop, _noop)

  def __call__(self, core, forward_core):
    return lift_custom_vjp(core, forward_core, self.backward_fn, self.grad_vars,
                           self.nondiff_argnums)


def _noop(scope, *args):
  del scope, args


def custom_vjp(fn: Callable[..., Any], forward_fn: Callable[..., Any],
               backward_fn: Callable[..., Any], grad_vars: Filter = 'params',
               nondiff_argnums: Iterable[int] = ()) -> Callable[..., Any]:
  """``f(mdl, *args)`` running ``fn`` with a hand-written backward rule (``mdl`` is argument 0).

  ``forward_fn(mdl, *args) -> (y, residuals)``; ``backward_fn(*nondiff_args,
  residuals, dy) -> (variable_grads, *input_grads)``. Not for changing only
  what is saved for the backward pass: `checkpoint` with a policy does that.

  Examples:
    >>> def fwd(mdl, x):
    ...   return nn.vjp(lambda m, x: m(x), mdl, x)
    >>> def bwd(vjp_fn, dy):
    ...   params_t, *inputs_t = vjp_fn(dy)
    ...   return (jax.tree.map(jnp.sign, params_t), *inputs_t)
    >>> sign_grad = nn.custom_vjp(lambda m, x: m(x), fwd, bwd)
    >>> class Model(nn.Module):
    ...   def setup(self):
    ...     self.dense = nn.Dense(1, use_bias=False)
    ...   def __call__(self, x):
    ...     return sign_grad(self.dense, x)
    >>> x = jnp.array([[-2.0, 3.0]])
    >>> variables = Model().init(jax.random.key(0), x)
    >>> grads = jax.grad(lambda v: Model().apply(v, x).sum())(variables)
    >>> grads['params']['dense']['kernel'].tolist()
    [[-1.0], [1.0]]
  """
  lifted_for = _CustomVjp(forward_fn, backward_fn, grad_vars, nondiff_argnums)

  def method(self, *args):
    return _custom_vjp_method(lifted_for, fn, self, *args)

  return mark_wrapped(method, fn)
