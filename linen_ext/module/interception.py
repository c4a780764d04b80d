"""`intercept_methods`: wrap every module method call made inside a ``with`` block.

As `flax.linen.intercept_methods`: an interceptor is ``interceptor(next_fun,
args, kwargs, context)``; it may change the arguments, call ``next_fun(*args,
**kwargs)`` (the next interceptor, or the method), change the result, or skip
the method. Interceptors registered first run first. Methods marked `nowrap`,
dunder methods and dataclass fields are not intercepted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

from linen_ext.module.state import context

Interceptor = Callable[[Callable[..., Any], tuple, dict, 'InterceptorContext'], Any]


@dataclasses.dataclass(frozen=True)
class InterceptorContext:
  """What an interceptor is told about the call.

  ``orig_method`` is the method bound to ``module``: calling it skips the
  interceptors that follow. Not constructed by user code: each interceptor
  receives one.

  Attributes:
    module: the module whose method is called.
    method_name: the name of the method called (``'__call__'``, ``'setup'``, ...).
    orig_method: the method bound to ``module``, past the interceptors that follow.

  Examples:
    >>> def double_dense(next_fun, args, kwargs, context):
    ...   y = next_fun(*args, **kwargs)
    ...   return 2 * y if isinstance(context.module, nn.Dense) else y
    >>> variables = {'params': {'kernel': jnp.ones((3, 1)), 'bias': jnp.zeros(1)}}
    >>> with nn.intercept_methods(double_dense):
    ...   y = nn.Dense(1).apply(variables, jnp.ones((1, 3)))
    >>> y
    Array([[6.]], dtype=float32)
  """
  module: Any
  method_name: str
  orig_method: Callable[..., Any]


@contextlib.contextmanager
def intercept_methods(interceptor: Interceptor) -> Iterator[None]:
  """Runs every module method called inside the block through ``interceptor``.

  Not for changing one module class for good: subclass or wrap it.

  Examples:
    >>> def log_calls(next_fun, args, kwargs, context):
    ...   print(type(context.module).__name__, context.method_name)
    ...   return next_fun(*args, **kwargs)
    >>> class Mlp(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return nn.Dense(1)(nn.relu(nn.Dense(2)(x)))
    >>> variables = Mlp().init(jax.random.key(0), jnp.ones((1, 3)))
    >>> with nn.intercept_methods(log_calls):
    ...   y = Mlp().apply(variables, jnp.ones((1, 3)))
    Mlp __call__
    Dense __call__
    Dense __call__
  """
  context.interceptors.append(interceptor)
  try:
    yield
  finally:
    context.interceptors.pop()  # blocks nest, so the last registered leaves first


def run_intercepted(fun: Callable[..., Any], module: Any, method_name: str, args: tuple,
                    kwargs: dict) -> Any:
  """``fun(module, *args, **kwargs)`` through the registered interceptors."""
  call = functools.partial(fun, module)
  info = InterceptorContext(module, method_name, call)
  for interceptor in reversed(context.interceptors):  # the last registered is innermost
    call = functools.partial(_intercepted, interceptor, call, info)
  return call(*args, **kwargs)


def _intercepted(interceptor: Interceptor, next_fun: Callable[..., Any],
                 info: InterceptorContext, *args, **kwargs) -> Any:
  return interceptor(next_fun, args, kwargs, info)


__all__ = ['InterceptorContext', 'intercept_methods']
