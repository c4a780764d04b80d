"""`init`, `apply`, `bind`, `unbind`: a module method becomes a pure function of variables.

``apply(variables, x)`` is ``lift.apply(scope_fn)(variables, x)`` where
``scope_fn(scope, x)`` clones the module bound to ``scope`` (``parent=scope``)
and calls the method on the clone.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import lift
from lift.filters import DenyList, Filter, union_filters

from linen_ext import errors
from linen_ext._state import context

CaptureFilter = bool | Callable[[Any, str], bool]


def capture_call_intermediates(module: Any, method_name: str) -> bool:
  """The default ``capture_intermediates`` filter: outputs of ``__call__``.

  >>> capture_call_intermediates(Dense(2), '__call__')
  True
  """
  del module
  return method_name == '__call__'


def _unbound_method(module: Any, method: Any) -> Callable[..., Any]:
  """``method`` as a function taking the module first (from a name, bound method or function)."""
  if method is None:
    method = '__call__'
  if isinstance(method, str):
    name, method = method, getattr(type(module), method, None)
    if method is None or not callable(method):
      raise errors.InvalidMethodError(name)
  if inspect.ismethod(method) and isinstance(method.__self__, EntryMixin):
    method = method.__func__
  if not callable(method):
    raise errors.InvalidMethodError(method)
  return method


def _scope_fn(module: Any, fn: Callable[..., Any], capture: CaptureFilter):

  @functools.wraps(fn)
  def scope_fn(scope, *args, **kwargs):
    context.capture_stack.append(capture or None)
    try:
      return fn(module.clone(parent=scope, _deep_clone=True), *args, **kwargs)
    finally:
      context.capture_stack.pop()

  return scope_fn


def _capture_filter(capture: CaptureFilter, mutable: Filter) -> tuple[CaptureFilter, Filter]:
  if capture is True:
    capture = capture_call_intermediates
  if capture:
    mutable = union_filters(mutable, 'intermediates')
  return capture, mutable


class EntryMixin:
  """Pure-function entry points of `Module`."""

  def init_with_output(self, rngs: Any, *args, method: Any = None,
                       mutable: Filter = DenyList('intermediates'),
                       capture_intermediates: CaptureFilter = False,
                       **kwargs) -> tuple[Any, dict[str, Any]]:
    """Runs ``method`` (default ``__call__``) creating variables; returns ``(y, variables)``.

    >>> y, variables = Dense(2).init_with_output(jax.random.key(0), jnp.ones((1, 3)))
    """
    fn = _unbound_method(self, method)
    capture, mutable = _capture_filter(capture_intermediates, mutable)
    return lift.init(_scope_fn(self, fn, capture), mutable=mutable)(rngs, *args, **kwargs)

  def init(self, rngs: Any, *args, method: Any = None,
           mutable: Filter = DenyList('intermediates'),
           capture_intermediates: CaptureFilter = False, **kwargs) -> dict[str, Any]:
    """Creates the variables of the module; a single key means ``{'params': key}``.

    >>> variables = Dense(2).init(jax.random.key(0), jnp.ones((1, 3)))
    """
    _, variables = self.init_with_output(
        rngs, *args, method=method, mutable=mutable,
        capture_intermediates=capture_intermediates, **kwargs)
    return variables

  def apply(self, variables: Mapping[str, Any], *args, rngs: Any = None,
            method: Any = None, mutable: Filter = False,
            capture_intermediates: CaptureFilter = False, **kwargs) -> Any:
    """Runs ``method`` with ``variables``; returns ``y``, or ``(y, mutated)`` if ``mutable``.

    >>> y = Dense(2).apply(variables, jnp.ones((1, 3)))
    """
    fn = _unbound_method(self, method)
    capture, mutable = _capture_filter(capture_intermediates, mutable)
    return lift.apply(_scope_fn(self, fn, capture), mutable=mutable)(
        variables, *args, rngs=rngs, **kwargs)

  def bind(self, variables: Mapping[str, Any], *args, rngs: Any = None,
           mutable: Filter = False):
    """An interactive copy bound to ``variables``: its methods and setup attributes work.

    >>> dense = Dense(2).bind(variables)
    >>> y = dense(jnp.ones((1, 3)))
    """
    del args
    return self.clone(parent=lift.bind(variables, rngs=rngs, mutable=mutable),
                      _deep_clone=True)

  def unbind(self) -> tuple[Any, dict[str, Any]]:
    """The inverse of ``bind``: ``(detached module, its variables)``.

    >>> module, variables = Dense(2).bind(variables).unbind()
    """
    if self.scope is None:
      raise errors.UnboundModuleError(type(self).__name__, 'Calling unbind()')
    module = self.clone(_deep_clone=True, _reset_names=True, name=None)
    return module, self.variables
