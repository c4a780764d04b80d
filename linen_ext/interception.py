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

from linen_ext._state import context

Interceptor = Callable[[Callable[..., Any], tuple, dict, 'InterceptorContext'], Any]


@dataclasses.dataclass(frozen=True)
class InterceptorContext:
  """What an interceptor is told about the call.

  ``orig_method`` is the method bound to ``module``: calling it skips the
  interceptors that follow.
  """
  module: Any
  method_name: str
  orig_method: Callable[..., Any]


@contextlib.contextmanager
def intercept_methods(interceptor: Interceptor) -> Iterator[None]:
  """Runs every module method called inside the block through ``interceptor``.

  >>> def log_calls(next_fun, args, kwargs, context):
  ...   print(type(context.module).__name__, context.method_name)
  ...   return next_fun(*args, **kwargs)
  >>> with intercept_methods(log_calls):
  ...   y = model.apply(variables, x)   # prints each module call
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
