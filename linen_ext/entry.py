"""`init`, `apply`, `bind`, `unbind`: a module method becomes a pure function of variables.

``apply(variables, x)`` is ``lift.apply(scope_fn)(variables, x)`` where
``scope_fn(scope, x)`` clones the module bound to ``scope`` (``parent=scope``)
and calls the method on the clone. The functional forms ``apply(fn, module)``,
``init(fn, module)`` and ``init_with_output(fn, module)`` (Flax's
``flax.linen.apply`` and friends) do the same for any ``fn(module, *args)``.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax

import lift
from lift import _compat
from lift import errors as lift_errors
from lift.filters import DenyList, Filter, union_filters
from lift.rng import is_prng_key

from linen_ext import errors
from linen_ext._state import context
from linen_ext.module_repr import short_str

CaptureFilter = bool | Callable[[Any, str], bool]


def capture_call_intermediates(module: Any, method_name: str) -> bool:
  """The default ``capture_intermediates`` filter: outputs of ``__call__``.

  >>> capture_call_intermediates(Dense(2), '__call__')
  True
  """
  del module
  return method_name == '__call__'


def _class_attribute(cls: type, name: str) -> Any:
  """``name`` from the class or its bases (not from the metaclass: ``type.__call__``)."""
  for klass in cls.__mro__:
    if name in vars(klass):
      return getattr(cls, name)
  return None


def _check_instance(module: Any, entry: str):
  if not isinstance(module, EntryMixin):  # e.g. `Model.init(key, x)`: the key became `self`
    raise errors.InvalidInstanceModuleError(entry, module)
  if '_id' not in module.__dict__:  # Module.__post_init__ never ran
    raise errors.IncorrectPostInitOverrideError(type(module).__name__)


def _unbound_method(module: Any, method: Any) -> Callable[..., Any]:
  """``method`` as a function taking the module first (from a name, bound method or function)."""
  if method is None:
    method = '__call__'
  if isinstance(method, str):
    name, method = method, _class_attribute(type(module), method)
    if method is None and isinstance(getattr(module, name, None), EntryMixin):
      return lambda m, *args, **kwargs: getattr(m, name)(*args, **kwargs)  # a submodule field
    if method is None:
      raise errors.MissingMethodError(type(module).__name__, name)
    if not callable(method):
      raise errors.MethodNotCallableError(type(module).__name__, name, method)
  if inspect.ismethod(method) and isinstance(method.__self__, EntryMixin):
    method = method.__func__
  if not callable(method) or not _takes_an_argument(method):
    raise errors.InvalidMethodError(method)
  return method


def _check_rngs(module: Any, rngs: Any):
  """A single rng must be a PRNG key (dicts are checked by `lift`); Flax's message first."""
  if rngs is not None and not isinstance(rngs, Mapping) and not is_prng_key(rngs):
    raise lift_errors.InvalidRngsError(
        f'RNGs should be of shape (2,) or PRNGKey in Module {type(module).__name__}, but '
        f'rngs are: {short_str(rngs)}. Fix: pass `jax.random.key(seed)` (it feeds the '
        '"params" stream), or a dict of keys, e.g. `{"params": key, "dropout": key2}`.')


def _takes_an_argument(fn: Callable[..., Any]) -> bool:
  """Whether ``fn`` can be called with the module as its one positional argument."""
  try:
    inspect.signature(fn).bind_partial(object())
  except TypeError:
    return False
  except ValueError:  # no signature (a builtin): let the call decide
    return True
  return True


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


def apply(fn: Callable[..., Any], module: Any, mutable: Filter = False,
          capture_intermediates: CaptureFilter = False) -> Callable[..., Any]:
  """``fn(bound_module, *args)`` as ``(variables, *args, rngs=None, **kwargs) -> y``
  (``(y, mutated)`` if ``mutable``), like ``flax.linen.apply``.

  >>> y = apply(lambda m, x: m.decode(m.encode(x)), AutoEncoder())(variables, x)
  """
  capture, mutable = _capture_filter(capture_intermediates, mutable)
  return lift.apply(_scope_fn(module, fn, capture), mutable=mutable)


def init_with_output(fn: Callable[..., Any], module: Any,
                     mutable: Filter = DenyList('intermediates'),
                     capture_intermediates: CaptureFilter = False) -> Callable[..., Any]:
  """``fn(bound_module, *args)`` as ``(rngs, *args, **kwargs) -> (y, variables)``,
  like ``flax.linen.init_with_output``.

  >>> y, variables = init_with_output(lambda m, x: m.encode(x), AutoEncoder())(key, x)
  """
  capture, mutable = _capture_filter(capture_intermediates, mutable)
  return lift.init(_scope_fn(module, fn, capture), mutable=mutable)


def init(fn: Callable[..., Any], module: Any, mutable: Filter = DenyList('intermediates'),
         capture_intermediates: CaptureFilter = False) -> Callable[..., dict[str, Any]]:
  """``fn(bound_module, *args)`` as ``(rngs, *args, **kwargs) -> variables``,
  like ``flax.linen.init``.

  >>> variables = init(lambda m, x: m.encode(x), AutoEncoder())(key, x)
  """
  init_fn = init_with_output(fn, module, mutable, capture_intermediates)

  @functools.wraps(init_fn)
  def variables_only(*args, **kwargs):
    return init_fn(*args, **kwargs)[1]

  return variables_only


def _lazy(fn: Callable[..., Any]) -> Callable[..., Any]:
  """``fn`` accepting ``jax.ShapeDtypeStruct`` for inputs its result must not read.

  Partial evaluation: the operations on concrete inputs run, those that need a
  placeholder are only traced (never run), so the result must not need them.
  """

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    leaves, in_tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
    out_tree = []

    def flat_fn(*flat):
      a, k = jax.tree_util.tree_unflatten(in_tree, flat)
      out, tree = jax.tree_util.tree_flatten(fn(*a, **k))
      out_tree.append(tree)
      return out

    debug = jax.api_util.debug_info('lazy_init', fn, args, kwargs)
    outs = _compat.evaluate_known(flat_fn, [leaf for _, leaf in leaves], debug)
    if outs is None:
      holes = [_argument_name(path) for path, leaf in leaves
               if isinstance(leaf, jax.ShapeDtypeStruct)]
      raise errors.LazyInitError(', '.join(holes))
    return jax.tree_util.tree_unflatten(out_tree[-1], outs)

  return wrapper


def _argument_name(path: tuple) -> str:
  """``args[0]['x']`` / ``kwargs['mask']`` from a path into ``(args, kwargs)``."""
  head, rest = path[0], jax.tree_util.keystr(path[1:])
  return f'args{rest}' if head.idx == 0 else f'kwargs{rest}'


class EntryMixin:
  """Pure-function entry points of `Module`."""

  def init_with_output(self, rngs: Any, *args, method: Any = None,
                       mutable: Filter = DenyList('intermediates'),
                       capture_intermediates: CaptureFilter = False,
                       **kwargs) -> tuple[Any, dict[str, Any]]:
    """Runs ``method`` (default ``__call__``) creating variables; returns ``(y, variables)``.

    >>> y, variables = Dense(2).init_with_output(jax.random.key(0), jnp.ones((1, 3)))
    """
    _check_instance(self, 'init_with_output')
    _check_rngs(self, rngs)
    return init_with_output(_unbound_method(self, method), self, mutable,
                            capture_intermediates)(rngs, *args, **kwargs)

  def init(self, rngs: Any, *args, method: Any = None,
           mutable: Filter = DenyList('intermediates'),
           capture_intermediates: CaptureFilter = False, **kwargs) -> dict[str, Any]:
    """Creates the variables of the module; a single key means ``{'params': key}``.

    >>> variables = Dense(2).init(jax.random.key(0), jnp.ones((1, 3)))
    """
    _check_instance(self, 'init')
    _, variables = self.init_with_output(
        rngs, *args, method=method, mutable=mutable,
        capture_intermediates=capture_intermediates, **kwargs)
    return variables

  def lazy_init(self, rngs: Any, *args, method: Any = None,
                mutable: Filter = DenyList('intermediates'), **kwargs) -> dict[str, Any]:
    """``init`` without computing on the inputs: pass ``jax.ShapeDtypeStruct`` for
    inputs whose values the variables do not depend on (others concretely).

    >>> variables = Dense(2).lazy_init(key, jax.ShapeDtypeStruct((1, 3), jnp.float32))
    """
    _check_instance(self, 'lazy_init')
    def init_variables(*args, **kwargs):
      return self.init(rngs, *args, method=method, mutable=mutable, **kwargs)

    return _lazy(init_variables)(*args, **kwargs)

  def apply(self, variables: Mapping[str, Any], *args, rngs: Any = None,
            method: Any = None, mutable: Filter = False,
            capture_intermediates: CaptureFilter = False, **kwargs) -> Any:
    """Runs ``method`` with ``variables``; returns ``y``, or ``(y, mutated)`` if ``mutable``.

    >>> y = Dense(2).apply(variables, jnp.ones((1, 3)))
    """
    _check_instance(self, 'apply')
    _check_rngs(self, rngs)
    return apply(_unbound_method(self, method), self, mutable, capture_intermediates)(
        variables, *args, rngs=rngs, **kwargs)

  def bind(self, variables: Mapping[str, Any], *args, rngs: Any = None,
           mutable: Filter = False):
    """An interactive copy bound to ``variables``: its methods and setup attributes work.

    >>> dense = Dense(2).bind(variables)
    >>> y = dense(jnp.ones((1, 3)))
    """
    _check_instance(self, 'bind')
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

  def tabulate(self, rngs: Any, *args, **kwargs) -> str:
    """A table of the calls ``init`` makes: paths, shapes in and out, variables (as Flax's).

    Options: ``depth``, ``show_repeated``, ``mutable``, ``console_kwargs``,
    ``table_kwargs``, ``column_kwargs``; nothing runs (``jax.eval_shape``).

    >>> print(Model().tabulate(jax.random.key(0), x, depth=1))
    """
    from linen_ext.summary import module_table  # summary runs init: import it when used
    return module_table(self, rngs, *args, **kwargs)

  def module_paths(self, rngs: Any, *args, **kwargs) -> dict[str, Any]:
    """``{path: unbound module}`` of the modules ``init`` calls (``''`` is this one), as Flax's.

    >>> Model().module_paths(jax.random.key(0), x)['Dense_0'].features
    4
    """
    from linen_ext.summary import module_paths
    return module_paths(self, rngs, *args, **kwargs)
