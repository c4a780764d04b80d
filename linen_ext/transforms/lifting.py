"""How a module method goes through a `lift` transform and comes back.

One mechanism serves every transform, on a Module class and as a method decorator:

1. :func:`collect_scopes` gathers the scopes the method may touch: those of the
   module's field submodules (after adopting them, without running ``setup``),
   the module's own, and those of modules and Variables passed as arguments,
   which are replaced by leafless placeholders;
2. the lift transform runs a scope function on those scopes;
3. inside, :func:`rebind` rebuilds the module (and the argument modules and
   Variables) bound to the inner scopes; ``setup`` reruns there, so
   setup-defined submodules live in the transformed scope;
4. the method runs on the clone; :func:`check_return` refuses Modules and
   Variables in its result, since their scopes end with the transform.

``jit`` caches its trace by the function it wraps, so for it the scope
function is built once per method and the module travels as a static
:class:`ModuleProxy` (hashed by its configuration), not in a closure.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import serialization

from lift.rng import RngStream
from lift.scope import Scope, Variable

from linen_ext import errors
from linen_ext.module.state import ModuleState, context
from linen_ext.module.core import Module, fn_name, map_modules

Build = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclasses.dataclass(frozen=True)
class ModuleArg:
  """A bound module passed as an argument, as a leafless static pytree node."""
  module: Any = dataclasses.field(compare=False, hash=False)
  module_id: int = 0


@dataclasses.dataclass(frozen=True)
class VariableArg:
  """A Variable passed as an argument."""
  collection: str
  name: str
  unbox: bool


jax.tree_util.register_static(ModuleArg)
jax.tree_util.register_static(VariableArg)


class Collected(NamedTuple):
  """What :func:`collect_scopes` found: scopes to lift and placeholder arguments."""
  scopes: list[Scope]
  args: tuple
  kwargs: dict


def _field_values(module: Module) -> dict[str, Any]:
  return {f.name: getattr(module, f.name) for f in dataclasses.fields(module)
          if f.init and f.name not in ('parent', 'name')}


def _field_variables(value: Any) -> list[Variable]:
  """The Variables held by a field (directly or in lists, tuples and dicts)."""
  leaves = jax.tree_util.tree_leaves(value, is_leaf=lambda x: isinstance(x, (Module, Variable)))
  return [leaf for leaf in leaves if isinstance(leaf, Variable)]


def _rebind_variables(value: Any, scopes) -> Any:
  """``value`` with each Variable bound to the next inner scope, in `_field_variables` order."""
  if not _field_variables(value):
    return value
  return jax.tree_util.tree_map(
      lambda x: Variable(next(scopes), x.collection, x.name, x.unbox)
      if isinstance(x, Variable) else x,
      value, is_leaf=lambda x: isinstance(x, (Module, Variable)))


def _collect_module(module: Module, scopes: list[Scope], seen: set[int]):
  if module._id in seen:
    return
  seen.add(module._id)
  module._try_setup(shallow=True)

  def visit(_, sub):
    if sub.scope is not None:
      _collect_module(sub, scopes, seen)
    return sub

  for value in _field_values(module).values():
    map_modules(visit, value)
    scopes.extend(variable.scope for variable in _field_variables(value))
  assert module.scope is not None, 'only bound modules are collected'
  scopes.append(module.scope)


def collect_scopes(module: Module, args: tuple, kwargs: dict) -> Collected:
  """Stage 1: the scopes to lift, and the arguments with placeholders for modules and Variables.

  >>> scopes, args, kwargs = collect_scopes(self, (x, self.encoder), {})
  """
  scopes: list[Scope] = []
  seen: set[int] = set()

  def placeholder(x):
    if isinstance(x, Module) and x.scope is not None:
      _collect_module(x, scopes, seen)
      return ModuleArg(x, x._id)
    if isinstance(x, Variable):
      scopes.append(x.scope)
      return VariableArg(x.collection, x.name, x.unbox)
    return x

  args, kwargs = jax.tree_util.tree_map(placeholder, (args, kwargs))
  if module.scope is not None:  # an unbound module (jit only) has no variables to lift
    _collect_module(module, scopes, seen)
  return Collected(scopes, args, kwargs)


def _rebind_module(module: Module, scopes, memo: dict[int, Module], cls: type | None = None):
  if module._id in memo:
    return memo[module._id]

  def visit(_, sub):
    return _rebind_module(sub, scopes, memo) if sub.scope is not None else sub

  fields = {k: _rebind_variables(map_modules(visit, v), scopes)
            for k, v in _field_values(module).items()}
  clone = (cls or type(module))(parent=next(scopes), name=module.name, **fields)
  memo[module._id] = clone
  return clone


def _is_placeholder(x: Any) -> bool:
  return isinstance(x, (ModuleArg, VariableArg))


def rebind(module: Module, args: tuple, kwargs: dict, scopes: list[Scope],
           cls: type | None = None) -> tuple[Module, tuple, dict]:
  """Stage 3: the module and argument placeholders, bound to the inner ``scopes``.

  >>> clone, args, kwargs = rebind(module, args, kwargs, inner_scopes)
  """
  memo: dict[int, Module]
  remaining, memo = iter(scopes), {}

  def restore(x):
    if isinstance(x, ModuleArg):
      return _rebind_module(x.module, remaining, memo)
    if isinstance(x, VariableArg):
      return Variable(next(remaining), x.collection, x.name, x.unbox)
    return x

  args, kwargs = jax.tree_util.tree_map(restore, (args, kwargs), is_leaf=_is_placeholder)
  if module.scope is None:
    return (cls or type(module))(**_field_values(module), name=module.name), args, kwargs
  return _rebind_module(module, remaining, memo, cls), args, kwargs


def check_return(transform: str, method: str, y: Any):
  """Stage 4: a transformed method may not return Modules or Variables.

  >>> check_return('vmap', '__call__', (y, {'aux': z}))   # arrays: fine
  """
  for leaf in jax.tree_util.tree_leaves(y):
    if isinstance(leaf, (Module, Variable)):
      raise errors.TransformedReturnError(transform, method, type(leaf).__name__)


def _run_inner(transform: str, fn, outer: Module, state: ModuleState, cls: type | None,
               scopes, *args, **kwargs):
  clone, args, kwargs = rebind(outer, args, kwargs, scopes, cls)
  object.__setattr__(clone, '_state', state.export())
  y = fn(clone, *args, **kwargs)
  outer._state.reimport(clone._state)
  check_return(transform, fn_name(fn), y)
  return y


def call_lifted(transform: str, build: Build, fn: Callable[..., Any], module: Module,
                args: tuple, kwargs: dict, cls: type | None = None) -> Any:
  """Runs ``fn(module, *args, **kwargs)`` through the lift transform made by ``build``.

  >>> y = call_lifted('remat', lift.checkpoint, Block.__call__, block, (x,), {})
  """
  if module.scope is None:
    raise errors.UnboundModuleError(type(module).__name__,
                                    f'Calling `nn.{transform}`-transformed "{fn_name(fn)}"')
  collected = collect_scopes(module, args, kwargs)
  core = scope_function(transform, fn, module, cls)
  return build(core)(collected.scopes, *collected.args, **collected.kwargs)


def scope_function(transform: str, fn: Callable[..., Any], module: Module,
                   cls: type | None = None) -> Callable[..., Any]:
  """``core(scopes, *args, **kwargs)``: ``fn`` run on ``module`` rebuilt on ``scopes``.

  >>> y = lift.checkpoint(scope_function('remat', Block.__call__, block))([block.scope], x)
  """
  core = functools.partial(_run_inner, transform, fn, module, module._state.export(), cls)
  return with_signature(core, fn, ('scopes',))


def with_signature(core, fn: Callable[..., Any], leading: tuple[str, ...]):
  """Gives ``core`` the signature of method ``fn`` with ``self`` replaced by ``leading``.

  The lift transforms read parameter names from it (error messages, jit's
  ``static_argnames``).

  >>> core = with_signature(functools.partial(run, fn), fn, ('scopes',))  # (scopes, x)
  """
  params = list(inspect.signature(fn).parameters.values())[1:]
  first = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in leading]
  core.__signature__ = inspect.Signature(first + params)
  core.__name__ = fn_name(fn)
  core.__qualname__ = getattr(fn, '__qualname__', core.__name__)
  return core


@contextlib.contextmanager
def forked_rngs(scope: Scope) -> Iterator[None]:
  """Inside, each stream of ``scope`` restarts from a key drawn from it (Flax's ``fork_rngs``).

  >>> with forked_rngs(module.scope):
  ...   y = lifted(scopes, x)
  """
  saved = scope.rngs
  scope.rngs = {name: RngStream(scope.make_rng(name)) for name in saved}
  try:
    yield
  finally:
    scope.rngs = saved


# -- jit: the scope function is built once; the module is a static argument ---------------


def _fingerprint(value: Any, seen: dict[int, int], path: str) -> Any:
  """A hashable stand-in for ``value`` (a field at ``path``) equal for equal configurations.

  Modules by class, fields and setup state (a module met twice by its first
  index); unhashable dataclasses by fields; containers item by item; numpy
  arrays by value; types registered with ``flax.serialization`` by their
  state dict (as Flax); anything else must be hashable itself.
  """
  if isinstance(value, Module):
    if value._id in seen:
      return type(value), seen[value._id]
    seen[value._id] = len(seen)
    fields = tuple((k, _fingerprint(v, seen, f'{path}.{k}'))
                   for k, v in _field_values(value).items())
    state = value._state
    return type(value), fields, (state.in_setup, state.in_compact_method,
                                 int(bool(state.setup_called)),
                                 tuple(sorted(state.autoname_cursor.items())))
  if dataclasses.is_dataclass(value) and not isinstance(value, type) and not _hashable(value):
    return type(value), tuple((f.name, _fingerprint(getattr(value, f.name), seen,
                                                    f'{path}.{f.name}'))
                              for f in dataclasses.fields(value) if hasattr(value, f.name))
  if isinstance(value, Mapping):  # dict and FrozenDict (setup freezes dicts, as Flax)
    return tuple((k, _fingerprint(v, seen, f'{path}[{k!r}]')) for k, v in value.items())
  if isinstance(value, (list, tuple)):
    return type(value), tuple(_fingerprint(v, seen, f'{path}[{i}]') for i, v in enumerate(value))
  if isinstance(value, (set, frozenset)):
    return type(value), frozenset(_fingerprint(v, seen, f'{path}{{}}') for v in value)
  if isinstance(value, np.ndarray):
    return np.ndarray, value.dtype.str, value.shape, value.tobytes()
  if serialization.is_serializable(value):  # a type registered with flax.serialization
    return type(value), _fingerprint(serialization.to_state_dict(value), seen, path)
  try:
    hash(value)
  except TypeError as error:
    raise errors.UnhashableModuleError(
        f'`nn.jit` caches compilations by the configuration of the module, but the field '
        f'`{path}` is not hashable ({error}). Fix: give it a hashable value, a container or '
        'dataclass of such, or a numpy array; pass jax arrays as call arguments or create '
        'them as variables.') from None
  return value


def _hashable(value: Any) -> bool:
  try:
    hash(value)
  except TypeError:
    return False
  return True


class _Identity:
  """An unhashable callable (a capture filter object) as a cache key: itself, by identity."""

  def __init__(self, value: Any):
    self.value = value  # held, so its id is not reused while a cache entry holds this

  def __hash__(self) -> int:
    return id(self.value)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, _Identity) and other.value is self.value


@dataclasses.dataclass(frozen=True)
class ModuleProxy:
  """A module as a static argument: equal to another with the same configuration and state.

  >>> ModuleProxy.of(Block(4, parent=scope), None) == ModuleProxy.of(Block(4, parent=other), None)
  True
  """
  # Held weakly: caches keep the proxy (a jit cache key), and the module holds variables.
  module_ref: weakref.ref = dataclasses.field(compare=False, hash=False)
  cls: type | None = dataclasses.field(compare=False, hash=False)
  state: ModuleState = dataclasses.field(compare=False, hash=False)
  fingerprint: Any = None

  @property
  def module(self) -> Module:
    """The module of the call that made this proxy (alive while that call traces)."""
    module = self.module_ref()
    assert module is not None, 'read while the call that made the proxy traces'
    return module

  @classmethod
  def of(cls, module: Module, module_cls: type | None) -> ModuleProxy:
    # Interceptors and the capture filter act while tracing: a trace made without them
    # would hide calls from them (tabulate) or skip the intermediates they ask for.
    key = lambda fns: tuple(f if _hashable(f) else _Identity(f) for f in fns)
    active = (key(context.interceptors), key(context.capture_stack[-1:]))
    fingerprint = (module_cls, _fingerprint(module, {}, type(module).__name__), active)
    return cls(weakref.ref(module), module_cls, module._state.export(), fingerprint)


def _run_inner_cached(transform: str, fn, scopes, proxy: ModuleProxy, *args, **kwargs):
  return _run_inner(transform, fn, proxy.module, proxy.state, proxy.cls, scopes,
                    *args, **kwargs)


def cached_lifted(transform: str, build: Build, fn: Callable[..., Any]) -> Callable[..., Any]:
  """``call_lifted`` for transforms that cache by function identity (``jit``).

  ``build`` receives ``core(scopes, proxy, *args, **kwargs)``: the proxy is
  argument 1 and must be static.

  >>> call = cached_lifted('jit', lambda core: lift.jit(core, static_argnums=1), fn)
  >>> y = call(block, (x,), {})
  """
  core = with_signature(functools.partial(_run_inner_cached, transform, fn), fn,
                        ('scopes', 'module'))
  lifted = build(core)

  def call(module: Module, args: tuple, kwargs: dict, cls: type | None = None):
    # An unbound module runs unbound inside (e.g. a jitted ``init_with_output``), as in Flax.
    collected = collect_scopes(module, args, kwargs)
    return lifted(collected.scopes, ModuleProxy.of(module, cls), *collected.args,
                  **collected.kwargs)

  return call


# -- targets: Module classes and methods ------------------------------------------------


def positional_parameters(fn: Callable[..., Any]) -> tuple[list[str], bool]:
  """Names of ``fn``'s positional parameters (``self`` first) and whether it takes ``*args``.

  >>> positional_parameters(lambda self, x, *rest: x)
  (['self', 'x'], True)
  """
  params = list(inspect.signature(fn).parameters.values())
  kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  names = [p.name for p in params if p.kind in kinds]
  return names, any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)


def check_field_is_hashable(path: tuple[str, ...], x: Any) -> None:
  """Raises ``ValueError`` naming ``path`` if ``x`` cannot be hashed (a module field that
  a cached transform would key on), as Flax's helper of that name does."""
  try:
    hash(x)
  except Exception as error:
    raise ValueError(f"Value at '{'/'.join(path)}' is not hashable: {error}") from error


def is_module_class(target: Any) -> bool:
  """A Module subclass, or a ``functools.partial`` of one (``is_module_class(Dense)``)."""
  if isinstance(target, functools.partial):
    return is_module_class(target.func)
  return inspect.isclass(target) and issubclass(target, Module)


def mark_wrapped(fn: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
  """Marks a transformed method so that Module does not wrap it again.

  It must not run ``setup`` outside the transform: setup runs on the clone inside.

  >>> method = mark_wrapped(transformed_call, Block.__call__)
  """
  functools.update_wrapper(fn, original)
  fn.method_handler_wrapped = True  # type: ignore[attr-defined]
  return fn
