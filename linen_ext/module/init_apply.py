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
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax

import lift
from lift import tracing
from lift import errors as lift_errors
from lift.filters import DenyList, Filter, union_filters
from lift.rng import is_prng_key

from linen_ext import errors, summary
from linen_ext.module.state import context
from linen_ext.describe import short_str

CaptureFilter = bool | Callable[[Any, str], bool]
_Capture = Literal[False] | Callable[[Any, str], bool]  # True resolved by _capture_filter


def capture_call_intermediates(module: Any, method_name: str) -> bool:
  """The default ``capture_intermediates`` filter: outputs of ``__call__``.

  ``capture_intermediates=True`` means this filter; not for capturing other
  methods' outputs: pass your own ``filter(module, method_name) -> bool``.

  Examples:
    >>> dense, x = nn.Dense(2), jnp.ones((1, 3))
    >>> y, state = dense.apply(dense.init(jax.random.key(0), x), x,
    ...                        capture_intermediates=True, mutable='intermediates')
    >>> jax.tree.map(jnp.shape, state)
    {'intermediates': {'__call__': ((1, 2),)}}
  """
  del module
  return method_name == '__call__'


def _class_attribute(cls: type, name: str) -> Any:
  """``name`` from the class or its bases (not from the metaclass: ``type.__call__``)."""
  for klass in cls.__mro__:
    if name in vars(klass):
      return getattr(cls, name)
  return None


def _check_instance(module: Any, entry: str, usage: str | None = None):
  if not isinstance(module, EntryMixin):  # e.g. `Model.init(key, x)`: the key became `self`
    raise errors.InvalidInstanceModuleError(entry, module, usage)
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
  return unbound_fn(method)


def unbound_fn(method_or_fn: Any) -> Callable[..., Any]:
  """A module's bound method as the function under it; any other callable as it is.

  Flax's private ``flax.linen.module._get_unbound_fn``, kept as ``nn.module._get_unbound_fn``
  for clients that resolve a method before ``nn.apply`` or ``jax.jit``.

  >>> unbound_fn(nn.Dense(2).__call__).__name__
  '__call__'
  """
  if inspect.ismethod(method_or_fn) and isinstance(method_or_fn.__self__, EntryMixin):
    method_or_fn = method_or_fn.__func__
  if not callable(method_or_fn) or not _takes_an_argument(method_or_fn):
    raise errors.InvalidMethodError(method_or_fn)
  return method_or_fn


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


def _scope_fn(module: Any, fn: Callable[..., Any], capture: _Capture):

  @functools.wraps(fn)
  def scope_fn(scope, *args, **kwargs):
    context.capture_stack.append(capture or None)
    try:
      return fn(module.clone(parent=scope, _deep_clone=True), *args, **kwargs)
    finally:
      context.capture_stack.pop()

  return scope_fn


def _capture_filter(capture: CaptureFilter, mutable: Filter) -> tuple[_Capture, Filter]:
  if capture is True:
    capture = capture_call_intermediates
  if capture:
    mutable = union_filters(mutable, 'intermediates')
  return capture, mutable


def apply(fn: Callable[..., Any], module: Any, mutable: Filter = False,
          capture_intermediates: CaptureFilter = False) -> Callable[..., Any]:
  """``fn(bound_module, *args)`` as ``(variables, *args, rngs=None, **kwargs) -> y``.

  Returns ``(y, mutated)`` if ``mutable``, like ``flax.linen.apply``. Not
  needed to run one method: ``module.apply(variables, x, method=...)`` does.

  Examples:
    >>> class AutoEncoder(nn.Module):
    ...   def setup(self):
    ...     self.encoder, self.decoder = nn.Dense(2), nn.Dense(3)
    ...   def __call__(self, x):
    ...     return self.decoder(self.encoder(x))
    >>> x = jnp.ones((1, 3))
    >>> variables = AutoEncoder().init(jax.random.key(0), x)
    >>> nn.apply(lambda m, x: m.encoder(x), AutoEncoder())(variables, x).shape
    (1, 2)
  """
  _check_instance(module, 'nn.apply', 'nn.apply(fn, MyModule(...))')
  capture, mutable = _capture_filter(capture_intermediates, mutable)
  return lift.apply(_scope_fn(module, fn, capture), mutable=mutable)


def init_with_output(fn: Callable[..., Any], module: Any,
                     mutable: Filter = DenyList('intermediates'),
                     capture_intermediates: CaptureFilter = False) -> Callable[..., Any]:
  """``fn(bound_module, *args)`` as ``(rngs, *args, **kwargs) -> (y, variables)``.

  Like ``flax.linen.init_with_output``. Not needed to initialise through one
  method: ``module.init_with_output(key, x, method=...)`` does.

  Examples:
    >>> class AutoEncoder(nn.Module):
    ...   def setup(self):
    ...     self.encoder, self.decoder = nn.Dense(2), nn.Dense(3)
    ...   def __call__(self, x):
    ...     return self.decoder(self.encoder(x))
    >>> init_fn = nn.init_with_output(lambda m, x: m.encoder(x), AutoEncoder())
    >>> z, variables = init_fn(jax.random.key(0), jnp.ones((1, 3)))
    >>> z.shape, list(variables['params'])
    ((1, 2), ['encoder'])
  """
  _check_instance(module, 'nn.init_with_output', 'nn.init_with_output(fn, MyModule(...))')
  capture, mutable = _capture_filter(capture_intermediates, mutable)
  return lift.init(_scope_fn(module, fn, capture), mutable=mutable)


def init(fn: Callable[..., Any], module: Any, mutable: Filter = DenyList('intermediates'),
         capture_intermediates: CaptureFilter = False) -> Callable[..., dict[str, Any]]:
  """``fn(bound_module, *args)`` as ``(rngs, *args, **kwargs) -> variables``.

  Like ``flax.linen.init``. Not needed to initialise through one method:
  ``module.init(key, x, method=...)`` does.

  Examples:
    >>> class AutoEncoder(nn.Module):
    ...   def setup(self):
    ...     self.encoder, self.decoder = nn.Dense(2), nn.Dense(3)
    ...   def __call__(self, x):
    ...     return self.decoder(self.encoder(x))
    >>> variables = nn.init(lambda m, x: m.encoder(x), AutoEncoder())(
    ...     jax.random.key(0), jnp.ones((1, 3)))
    >>> list(variables['params'])   # only what fn reached
    ['encoder']
  """
  _check_instance(module, 'nn.init', 'nn.init(fn, MyModule(...))')
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
    outs = tracing.evaluate_known(flat_fn, [leaf for _, leaf in leaves], debug)
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

  scope: lift.Scope | None
  if typing.TYPE_CHECKING:  # Module's
    @property
    def variables(self) -> dict[str, Any]: ...

    def clone(self, *, parent: Any = None, **updates: Any) -> Any: ...

  def init_with_output(self, rngs: Any, *args, method: Any = None,
                       mutable: Filter = DenyList('intermediates'),
                       capture_intermediates: CaptureFilter = False,
                       **kwargs) -> tuple[Any, dict[str, Any]]:
    """Runs ``method`` (default ``__call__``) creating variables; returns ``(y, variables)``.

    Examples:
      >>> y, variables = nn.Dense(2).init_with_output(jax.random.key(0), jnp.ones((1, 3)))
      >>> y.shape
      (1, 2)
    """
    _check_instance(self, 'init_with_output')
    _check_rngs(self, rngs)
    return init_with_output(_unbound_method(self, method), self, mutable,
                            capture_intermediates)(rngs, *args, **kwargs)

  def init(self, rngs: Any, *args, method: Any = None,
           mutable: Filter = DenyList('intermediates'),
           capture_intermediates: CaptureFilter = False, **kwargs) -> dict[str, Any]:
    """Creates the variables of the module; a single key means ``{'params': key}``.

    Examples:
      >>> variables = nn.Dense(2).init(jax.random.key(0), jnp.ones((1, 3)))
      >>> jax.tree.map(jnp.shape, variables)
      {'params': {'bias': (2,), 'kernel': (3, 2)}}
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

    Examples:
      >>> x = jax.ShapeDtypeStruct((1, 3), jnp.float32)
      >>> nn.Dense(2).lazy_init(jax.random.key(0), x)['params']['kernel'].shape
      (3, 2)
    """
    _check_instance(self, 'lazy_init')
    def init_variables(*args, **kwargs):
      return self.init(rngs, *args, method=method, mutable=mutable, **kwargs)

    return _lazy(init_variables)(*args, **kwargs)

  def apply(self, variables: Mapping[str, Any], *args, rngs: Any = None,
            method: Any = None, mutable: Filter = False,
            capture_intermediates: CaptureFilter = False, **kwargs) -> Any:
    """Runs ``method`` with ``variables``; returns ``y``, or ``(y, mutated)`` if ``mutable``.

    Examples:
      >>> variables = {'params': {'kernel': jnp.ones((3, 2)), 'bias': jnp.zeros(2)}}
      >>> nn.Dense(2).apply(variables, jnp.ones((1, 3)))
      Array([[3., 3.]], dtype=float32)
    """
    _check_instance(self, 'apply')
    _check_rngs(self, rngs)
    return apply(_unbound_method(self, method), self, mutable, capture_intermediates)(
        variables, *args, rngs=rngs, **kwargs)

  def bind(self, variables: Mapping[str, Any], *args, rngs: Any = None,
           mutable: Filter = False):
    """An interactive copy bound to ``variables``: its methods and setup attributes work.

    Examples:
      >>> dense = nn.Dense(2).bind({'params': {'kernel': jnp.ones((3, 2)), 'bias': jnp.zeros(2)}})
      >>> dense(jnp.ones((1, 3)))
      Array([[3., 3.]], dtype=float32)
    """
    _check_instance(self, 'bind')
    del args
    return self.clone(parent=lift.bind(variables, rngs=rngs, mutable=mutable),
                      _deep_clone=True)

  def unbind(self) -> tuple[Any, dict[str, Any]]:
    """The inverse of ``bind``: ``(detached module, its variables)``.

    Examples:
      >>> variables = {'params': {'kernel': jnp.ones((3, 2)), 'bias': jnp.zeros(2)}}
      >>> module, variables = nn.Dense(2).bind(variables).unbind()
      >>> module.scope is None, jax.tree.map(jnp.shape, variables)
      (True, {'params': {'bias': (2,), 'kernel': (3, 2)}})
    """
    if self.scope is None:
      raise errors.UnboundModuleError(type(self).__name__, 'Calling unbind()')
    module = self.clone(_deep_clone=True, _reset_names=True, name=None)
    return module, self.variables

  def tabulate(self, rngs: Any, *args, **kwargs) -> str:
    """A table of the calls ``init`` makes: paths, shapes in and out, variables (as Flax's).

    Options: ``depth``, ``show_repeated``, ``mutable``, ``console_kwargs``,
    ``table_kwargs``, ``column_kwargs``; nothing runs (``jax.eval_shape``).

    Examples:
      >>> table = nn.Dense(2).tabulate(jax.random.key(0), jnp.ones((1, 3)), depth=1)
      >>> 'Total Parameters: 8' in table   # print(table) to read it
      True
    """
    return summary.module_table(self, rngs, *args, **kwargs)

  def module_paths(self, rngs: Any, *args, **kwargs) -> dict[str, Any]:
    """``{path: unbound module}`` of the modules ``init`` calls (``''`` is this one), as Flax's.

    Examples:
      >>> class Mlp(nn.Module):
      ...   @nn.compact
      ...   def __call__(self, x):
      ...     return nn.Dense(1)(nn.Dense(4)(x))
      >>> paths = Mlp().module_paths(jax.random.key(0), jnp.ones((1, 3)))
      >>> sorted(paths), paths['Dense_1'].features
      (['', 'Dense_0', 'Dense_1'], 4)
    """
    return summary.module_paths(self, rngs, *args, **kwargs)
