"""Method decorators of Modules (`compact`, `compact_name_scope`, `nowrap`) and the
wrapper that routes every other method call through `Module._call_wrapped_method`."""
from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from linen_ext import errors

F = TypeVar('F', bound=Callable[..., Any])


def compact(fun: F) -> F:
  """Marks the method that may create submodules and variables inline.

  Not for a class that defines ``setup``: declare submodules in one place,
  ``setup`` or one ``compact`` method (a class may have several ``compact``
  methods, but most need one).

  Examples:
    >>> class Linear(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return nn.Dense(1)(x)
    >>> list(Linear().init(jax.random.key(0), jnp.ones((2, 3)))['params'])
    ['Dense_0']
  """
  fun.compact = True  # type: ignore[attr-defined]
  return fun


def compact_name_scope(fun: F) -> F:
  """Runs a method like a ``compact`` one of its own submodule named after it (as Flax's).

  Submodules created inline go below the method's name; the method still
  gets the module itself as ``self``. Not needed when the method's
  submodules may sit beside the others: a plain ``compact`` method does that.

  Examples:
    >>> class AutoEncoder(nn.Module):
    ...   @nn.compact_name_scope
    ...   def encode(self, x):
    ...     return nn.Dense(2)(x)
    ...   @nn.compact_name_scope
    ...   def decode(self, z):
    ...     return nn.Dense(3)(z)
    ...   def __call__(self, x):
    ...     return self.decode(self.encode(x))
    >>> variables = AutoEncoder().init(jax.random.key(0), jnp.ones((1, 3)))
    >>> {name: list(tree) for name, tree in variables['params'].items()}
    {'encode': ['Dense_0'], 'decode': ['Dense_0']}
  """
  name = fun.__name__

  @functools.wraps(fun)
  def run_in_scope(self, *args, **kwargs):
    self._try_setup()
    scopes = self.__dict__.get('_compact_name_scopes')
    if scopes is None:
      raise errors.UnboundModuleError(type(self).__name__, f'Calling "{name}"')
    return scopes[name](*args, **kwargs)

  run_in_scope.compact_name_scope = True  # type: ignore[attr-defined]
  run_in_scope.inner_fun = fun  # type: ignore[attr-defined]
  run_in_scope.nowrap = True  # type: ignore[attr-defined]
  return typing.cast(F, run_in_scope)


def nowrap(fun: F) -> F:
  """Marks a helper method that runs without setup or name bookkeeping.

  Use it for methods that create submodules for a caller, e.g. a factory
  called from ``setup``. Not for methods that read variables or call
  submodules: those need the wrapping (``setup`` runs before them).

  Examples:
    >>> class Block(nn.Module):
    ...   @nn.nowrap
    ...   def make_dense(self, n):
    ...     return nn.Dense(n)
    ...   def setup(self):
    ...     self.proj = self.make_dense(2)
    ...   def __call__(self, x):
    ...     return self.proj(x)
    >>> list(Block().init(jax.random.key(0), jnp.ones((1, 3)))['params'])
    ['proj']
  """
  fun.nowrap = True  # type: ignore[attr-defined]
  return fun


def _unpartial(fun: Callable[..., Any]) -> Callable[..., Any]:
  while isinstance(fun, functools.partial):
    fun = fun.func
  return fun


def fn_name(fun: Callable[..., Any]) -> str:
  """The name of a method or function, also through ``functools.partial``.

  >>> fn_name(functools.partial(fn_name))
  'fn_name'
  """
  return getattr(_unpartial(fun), '__name__', None) or repr(fun)


def wrap_method(fun: F) -> F:
  """Wraps ``fun`` once so that calls go through :meth:`Module._call_wrapped_method`.

  A ``functools.partial`` of a wrapped method (``partial(Foo.inner)``) is
  already wrapped.

  >>> call = wrap_method(lambda module, x: module.dense(x))   # runs setup first
  """
  if getattr(_unpartial(fun), 'method_handler_wrapped', False):
    return fun

  @functools.wraps(fun)
  def wrapped(self, *args, **kwargs):
    return self._call_wrapped_method(fun, args, kwargs)

  wrapped.method_handler_wrapped = True  # type: ignore[attr-defined]
  wrapped.inner_fun = fun  # type: ignore[attr-defined]
  return typing.cast(F, wrapped)
