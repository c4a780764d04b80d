"""`Module`: a dataclass whose methods run against a `lift.Scope`.

A module instance is a configuration (its dataclass fields) plus, once bound, a
scope. Binding happens in three ways, as in Flax: ``parent=scope`` makes the module
the top of an ``init``/``apply`` call; created while a parent module's ``setup`` or
``@compact`` method runs, it is named (given name, attribute name, or
``ClassName_N``) and bound to ``parent.scope.push(name)``; passed in from outside
(``parent=None``) as a field or setup attribute, it is cloned and adopted under the
attribute name (its own name, where the class sets ``preserve_adopted_names = True``
or Flax's config flag ``flax_preserve_adopted_names`` is on).

Every method a subclass defines, private ones included, is wrapped (as in
Flax) so that ``setup`` runs lazily before it and a ``@compact`` method gets
fresh automatic names on each call (its scope is rewound afterwards, so a
second call reuses the same variables). A class may have several ``@compact``
methods; automatic names continue across nested calls of them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import typing
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import jax
from flax import config as flax_config
from flax.core import FrozenDict
from flax.linen.module import merge_param as merge_param  # noqa: F401 (nn.module.merge_param)

from lift.scope import Scope

from linen_ext import errors

from linen_ext.module import named_call
from linen_ext.module.state import UNINITIALIZED, ModuleState, SetupState, context
from linen_ext.module.foreign import (FOREIGN_MODULES, FlaxContext, is_flax_scope,
                                      scope_over_flax_scope, wrap_foreign_modules)
from linen_ext.module.interception import run_intercepted
from linen_ext.module.method_wrapping import compact, fn_name, wrap_method
from linen_ext.describe import module_repr
from linen_ext.module.variables import VariablesMixin
from linen_ext.module.init_apply import EntryMixin

M = TypeVar('M', bound='Module')

_ids = itertools.count()


class _Unspecified:
  def __repr__(self):
    return 'UNSPECIFIED_PARENT'

  def __reduce__(self):  # one sentinel, also through copy, deepcopy and pickle
    return 'UNSPECIFIED'


UNSPECIFIED = _Unspecified()


def map_modules(fn: Callable[[str, Any], Any], tree: Any, suffix: str = '') -> Any:
  """Applies ``fn(suffix, module)`` to the modules in nested dicts, lists and tuples.

  ``suffix`` is Flax's naming of a module inside an attribute: ``''`` for the
  attribute itself, ``'_0'`` for ``layers[0]``, ``'_a_1'`` for ``{'a': [_, m]}``.
  The result is frozen as Flax freezes module attributes: lists become tuples,
  dicts become ``FrozenDict``.

  Examples:
    >>> map_modules(lambda suffix, m: suffix, [Dense(1), {'a': Dense(2)}])[1]['a']
    '_1_a'
  """
  if isinstance(tree, Module):
    return fn(suffix, tree)
  if isinstance(tree, Mapping):
    # In sorted key order, as Flax walks attributes (a pytree map): a module held
    # under two keys is named after the first.
    items = sorted(tree.items(), key=lambda kv: kv[0]) if _sortable(tree) else tree.items()
    mapped = {k: map_modules(fn, v, f'{suffix}_{k}') for k, v in items}
    if isinstance(tree, (dict, FrozenDict)):
      return FrozenDict(mapped)
    return type(tree)(mapped)  # type: ignore[call-arg]  # a concrete Mapping takes its items
  if isinstance(tree, (list, tuple)):
    items = [map_modules(fn, v, f'{suffix}_{i}') for i, v in enumerate(tree)]
    return type(tree)(*items) if hasattr(tree, '_fields') else tuple(items)
  return tree


def _sortable(tree: Mapping) -> bool:
  try:
    sorted(tree)
  except TypeError:
    return False
  return True


def _module_fields(module) -> list[dataclasses.Field]:
  return [f for f in dataclasses.fields(module) if f.init and f.name not in ('parent', 'name')]


@typing.dataclass_transform(field_specifiers=(dataclasses.field,))
class _DataclassBase:
  """Tells type checkers that `Module` and its subclasses are dataclasses (as
  `_make_dataclass` makes every subclass), so ``parent`` and ``name`` are fields."""
  if typing.TYPE_CHECKING:
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


class Module(VariablesMixin, EntryMixin, _DataclassBase):
  """Base class of models: subclasses become dataclasses with ``parent`` and ``name``.

  Variable trees, names and initial values are those of `flax.linen.Module`
  for the same model. Not needed for a stateless function (an activation, a
  reshape): write a plain function; for code against scopes, use `lift`.

  Attributes:
    parent: the module (or `lift.Scope`) this one is attached to; by default the module
      whose method is running (None: a top-level, unbound module).
    name: this module's name in its parent, the key of its variables; by default the
      attribute `setup` assigns it to, or ``ClassName_N`` in a compact method.

  Examples:
    >>> class Mlp(nn.Module):
    ...   features: int
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return nn.Dense(self.features)(nn.relu(nn.Dense(4)(x)))
    >>> variables = Mlp(1).init(jax.random.key(0), jnp.ones((2, 3)))
    >>> jax.tree.map(jnp.shape, variables)['params']['Dense_0']   # the outer Dense, made first
    {'bias': (1,), 'kernel': (4, 1)}
  """
  # Declared for type checkers; every subclass gets them as keyword-only dataclass fields.
  parent: Any = dataclasses.field(default=UNSPECIFIED, kw_only=True, repr=False, compare=False)
  name: str | None = dataclasses.field(default=None, kw_only=True)
  if typing.TYPE_CHECKING:  # attributes, not fields
    scope: Scope | None = dataclasses.field(default=None, init=False)
    _state: ModuleState = dataclasses.field(default=UNINITIALIZED, init=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # where a subclass defines it
      ...
  else:
    scope = None
    _state = UNINITIALIZED
  _compact_name_scope_methods: ClassVar[tuple[str, ...]] = ()  # set per subclass
  # How `tabulate` shows this module's calls, a hook like `_capture` and `_named_scope`:
  # 'row' (a row of its own), 'flax' (none: the flax module it runs reports itself) or
  # 'row_over_flax' (its row, in place of the row of the flax layer it runs).
  _summary_role: ClassVar[str] = 'row'
  # Whether flax.linen modules held by attributes are wrapped as submodules (`FlaxModule`,
  # which holds the flax module it runs, says no).
  _wraps_foreign_modules: ClassVar[bool] = True

  def __init_subclass__(cls, kw_only: bool = False, **kwargs):
    super().__init_subclass__(**kwargs)
    _make_dataclass(cls, kw_only)
    cls._compact_name_scope_methods = tuple(sorted(
        {name for klass in cls.__mro__ for name, attr in vars(klass).items()
         if getattr(attr, 'compact_name_scope', False)}))
    _wrap_local_methods(cls)

  # -- construction and binding ---------------------------------------------

  def __post_init__(self) -> None:
    object.__setattr__(self, '_id', next(_ids))
    object.__setattr__(self, '_state', ModuleState())
    if self.parent is UNSPECIFIED:
      object.__setattr__(self, 'parent', context.module_stack[-1])
    if self.parent is None:
      return
    if isinstance(self.parent, Module):
      if self.parent._state.in_setup and self.name is None:
        return  # named when setup assigns it to an attribute
      self._attach_to_parent()
    elif isinstance(self.parent, Scope):
      object.__setattr__(self, 'scope', self.parent)
    elif is_flax_scope(self.parent):
      object.__setattr__(self, 'scope', scope_over_flax_scope(self.parent, type(self).__name__))
    else:
      raise errors.InvalidParentError(type(self).__name__, self.parent)
    for field in _module_fields(self):
      self._register_submodules(field.name, getattr(self, field.name))
    self._state.is_initialized = True

  def _attach_to_parent(self):
    parent: Module = self.parent
    if parent.scope is None:
      raise errors.UnboundModuleError(type(parent).__name__,
                                      f'Creating submodule `{type(self).__name__}`')
    if not parent._initialization_allowed:
      raise errors.SubmoduleOutsideSetupError(type(parent).__name__, 'Submodule',
                                              type(self).__name__)
    name = self.name
    if name is None:
      prefix = self.autoname_prefix()
      cursor = parent._state.autoname_cursor.get(prefix, 0)
      name = f'{prefix}_{cursor}'
      object.__setattr__(self, 'name', name)
      parent._state.autoname_cursor[prefix] = cursor + 1
    reuse = parent._state.in_setup and parent._state.setup_called == SetupState.TRANSFORMED
    if not reuse and parent.scope.name_reserved(name):
      raise errors.NameInUseError('submodule', name, type(parent).__name__,
                                  parent.scope.path)
    object.__setattr__(self, 'scope', parent.scope.push(name, reuse=reuse))
    _children(parent)[name] = self

  def autoname_prefix(self) -> str:
    """The prefix of automatic names, ``ClassName`` as in Flax.

    Examples:
      >>> nn.Dense(3).autoname_prefix()
      'Dense'
    """
    return type(self).__name__

  def _register_submodules(self, name: str, value: Any):
    """Adopts the modules in attribute ``name`` and stores it (lists become tuples)."""
    # Outside modules adopted under one root keep their sharing: the same instance
    # passed twice becomes one clone (by instance id), kept on the root scope.
    assert self.scope is not None, 'a module adopts submodules once bound'
    if not isinstance(value, (Module, Mapping, list, tuple, *FOREIGN_MODULES)):
      object.__setattr__(self, name, value)  # nothing to adopt (most fields of most layers)
      return
    cache = self.scope.root.client_cache.setdefault('adopted_modules', {})
    preserve = getattr(type(self), 'preserve_adopted_names', flax_config.flax_preserve_adopted_names)
    queue = []

    def adopt(suffix, module):
      if module.parent is None:
        key = module._id
        if key not in cache:  # a detached clone; it keeps its own name where preserved
          cache[key] = module.clone(name=module.name if preserve else None)
        module = cache[key]
      if module.name is None or module.parent is None:
        object.__setattr__(module, 'parent', self)
        object.__setattr__(module, 'name', module.name or f'{name}{suffix}')
        queue.append(module)
      return module

    if self._wraps_foreign_modules:
      value = wrap_foreign_modules(value)
    object.__setattr__(self, name, map_modules(adopt, value))
    for module in queue:
      module.__post_init__()

  def _try_setup(self, shallow: bool = False) -> None:
    """Runs ``setup`` once, lazily; ``shallow`` only adopts field submodules."""
    state = self._state
    if self.scope is None or state.in_setup or state.setup_called == SetupState.DONE:
      return
    try:
      state.in_setup = True
      for field in _module_fields(self):
        self._register_submodules(field.name, getattr(self, field.name))
      if not shallow:
        self.setup()
        self._add_compact_name_scopes()
    finally:
      state.in_setup = False
      if not shallow:
        state.setup_called = SetupState.DONE

  def _add_compact_name_scopes(self) -> None:
    scopes = {name: CompactNameScope(getattr(type(self), name).inner_fun, weakref.ref(self),
                                     parent=self, name=name)
              for name in type(self)._compact_name_scope_methods}
    object.__setattr__(self, '_compact_name_scopes', scopes)

  def setup(self) -> None:
    """Defines submodules and variables lazily; runs before the first method call.

    Examples:
      >>> class Model(Module):
      ...   def setup(self):
      ...     self.layers = [Dense(4), Dense(1)]   # named layers_0, layers_1
    """

  @property
  def _initialization_allowed(self) -> bool:
    state = self._state
    return not state.is_initialized or state.in_setup or state.in_compact_method

  # -- method calls ---------------------------------------------------------

  def _call_wrapped_method(self, fun: Callable[..., Any], args, kwargs):
    is_compact = getattr(fun, 'compact', False)
    is_setup = fn_name(fun) == 'setup'
    state, recurrent = self._state, False
    if is_setup:
      if self.scope is None:
        raise errors.UnboundModuleError(type(self).__name__, 'Calling setup')
      recurrent, state.in_setup = state.in_setup, True
    else:
      self._try_setup()
    if is_compact:
      if self.scope is None:
        raise errors.UnboundModuleError(type(self).__name__,
                                        f'Calling @compact method "{fn_name(fun)}"')
      recurrent, state.in_compact_method = state.in_compact_method, True
    context.module_stack.append(self)
    try:
      with self._named_scope(fn_name(fun)), \
          FlaxContext(type(self).__name__, fn_name(fun), state.in_setup):
        if context.interceptors:
          y = run_intercepted(fun, self, fn_name(fun), args, kwargs)
        else:
          y = fun(self, *args, **kwargs)
      self._capture(fn_name(fun), y)
      return y
    finally:
      context.module_stack.pop()
      if is_compact:
        assert self.scope is not None, 'checked before the call'
        object.__setattr__(self, 'scope', self.scope.rewound())
      if (is_compact or is_setup) and not recurrent:
        state.reset()

  def _named_scope(self, method_name: str) -> contextlib.AbstractContextManager:
    """The profiling scope of a method call (see `named_call`); flax wrappers leave it to flax."""
    if not named_call.enabled():
      return contextlib.nullcontext()
    return jax.named_scope(named_call.scope_name(self, method_name))

  def _capture(self, method_name: str, y: Any):
    capture = context.capture_stack[-1] if context.capture_stack else None
    if capture is not None and capture(self, method_name):
      self.sow('intermediates', method_name, y)

  # -- attributes -----------------------------------------------------------

  def __setattr__(self, name: str, value: Any):
    state = self._state
    if not state.in_setup:
      if not state.is_initialized or name.startswith('__'):
        object.__setattr__(self, name, value)
        return
      raise errors.FrozenModuleError(type(self).__name__, name, value)
    if name in {f.name for f in dataclasses.fields(self) if f.init}:
      raise errors.SetupFieldAssignmentError(type(self).__name__, name)
    self._register_submodules(name, value)

  def __getattr__(self, name: str) -> Any:
    if name.startswith('__'):
      raise AttributeError(name)
    if any(name in vars(k) for k in type(self).__mro__):  # a property raised AttributeError
      raise errors.DescriptorAttributeError(type(self).__name__, name)
    self._try_setup()
    if name in self.__dict__:
      return self.__dict__[name]
    if self.scope is None:
      raise errors.UnboundAttributeError(type(self).__name__, name)
    raise AttributeError(f'"{type(self).__name__}" object has no attribute "{name}".')

  def __repr__(self) -> str:
    return module_repr(self, _children)

  def __dir__(self) -> list[str]:
    self._try_setup()
    return list(object.__dir__(self))

  # -- copies -----------------------------------------------------------------

  def clone(self: M, *, parent: Any = None, **updates) -> M:
    """A copy with the same fields (and ``updates``); by default detached (``parent=None``).

    ``updates`` may hold Flax's private ``_deep_clone`` (copy field modules too), ``_reset_names``.

    Examples:
      >>> nn.Dense(3).clone(features=4).features
      4
    """
    _deep_clone: bool | dict = updates.pop('_deep_clone', False)
    _reset_names: bool = updates.pop('_reset_names', False)
    attrs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
    attrs.update(parent=parent, **updates)
    if _deep_clone is not False:
      cache = {} if _deep_clone is True else _deep_clone

      def clone_child(_, module):
        if module._id not in cache:
          extra = {'name': None} if _reset_names else {}
          cache[module._id] = module.clone(_deep_clone=cache, _reset_names=_reset_names,
                                           **extra)
        return cache[module._id]

      for field in _module_fields(self):
        if field.name not in updates:
          attrs[field.name] = map_modules(clone_child, attrs[field.name])
    return type(self)(**attrs)

  def copy(self: M, *, parent: Any = UNSPECIFIED, name: str | None = None, **updates) -> M:
    """A deep copy (``updates`` applied) attached like a new module: by default to
    the module whose method is running, under ``name`` or a fresh automatic name.

    Examples:
      >>> nn.Dense(3, name='a').copy(name='b', features=4).name
      'b'
    """
    return self.clone(parent=parent, name=name, _deep_clone=True, **updates)

  @property
  def path(self) -> tuple[str, ...]:
    """The names from the root module down to this one (``()`` at the top).

    Examples:
      >>> class Model(nn.Module):
      ...   def setup(self):
      ...     self.dense = nn.Dense(2)
      ...   def __call__(self, x):
      ...     return self.dense(x)
      >>> variables = Model().init(jax.random.key(0), jnp.ones((1, 3)))
      >>> Model().bind(variables).dense.path
      ('dense',)
    """
    return self._bound_scope('Reading `path`').path


def _children(module: Module) -> dict[str, Module]:
  """The submodules bound below ``module`` so far, by name (``share_scope`` moves them).

  Kept under Module's name-mangled key, so no attribute of a subclass can clash.
  """
  return module.__dict__.setdefault('_Module__children', {})


def _make_dataclass(cls: type[Module], kw_only: bool) -> None:
  annotations = cls.__dict__.get('__annotations__', {})
  for reserved in ('parent', 'name'):
    if reserved in annotations:
      raise errors.ReservedNameError(cls.__name__, reserved)
  cls.__annotations__ = {**annotations, 'parent': Any, 'name': 'str | None'}
  cls.parent = dataclasses.field(default=UNSPECIFIED, kw_only=True, repr=False, compare=False)
  cls.name = dataclasses.field(default=None, kw_only=True)
  dataclasses.dataclass(cls, unsafe_hash='__hash__' not in cls.__dict__, repr=False,
                        kw_only=kw_only)
  fields = cls.__dataclass_fields__  # parent and name last, as Flax lists them
  for reserved in ('parent', 'name'):
    fields[reserved] = fields.pop(reserved)
  cls.parent = _ParentRef()
  if cls.__hash__ is not None:  # wraps the dataclass-made method, whose type mypy cannot see
    cls.__hash__ = _unbound_only_hash(cls.__hash__)  # type: ignore[method-assign, assignment]


class _ParentRef:
  """``Module.parent``, held by weak reference when it is a module (as in Flax).

  A parent holds its children (attributes, ``_Module__children``); a strong
  reference back would make a cycle that keeps the traced values of an
  ``init`` or ``apply`` alive until the next garbage collection. A module
  reads its parent only while it is built, when the parent is running.
  """

  def __get__(self, obj: Any, objtype: type | None = None) -> Any:
    if obj is None:
      return UNSPECIFIED
    parent = obj.__dict__.get('_parent_ref', UNSPECIFIED)
    return parent() if isinstance(parent, weakref.ref) else parent

  def __set__(self, obj: Any, value: Any):
    obj.__dict__['_parent_ref'] = weakref.ref(value) if isinstance(value, Module) else value


def _unbound_only_hash(hash_fn: Callable[[Any], int]) -> Callable[[Any], int]:
  """``__hash__`` for configurations only: a bound module holds variables, as in Flax."""
  @functools.wraps(hash_fn)
  def __hash__(self) -> int:
    if self.__dict__.get('scope') is not None:
      raise errors.UnhashableModuleError(
          "Can't call __hash__ on modules that hold variables: "
          f'{type(self).__name__} is bound. Fix: hash an unbound copy, '
          'e.g. module.clone(parent=None).')
    return hash_fn(self)
  return __hash__


# Methods a subclass may define that are never wrapped: the dataclass-generated ones
# (as in Flax) and Module's own machinery (hooks such as `_capture` that subclasses
# override); every other method, private ones included, is wrapped as in Flax.
_DATACLASS_METHODS = frozenset({'__init__', '__repr__', '__eq__', '__hash__'})


def _machinery_names() -> set[str]:
  return {name for klass in Module.__mro__[:-1] for name in vars(klass)
          if name.startswith('_')}


def _wrap_local_methods(cls: type) -> None:
  skip = {f.name for f in dataclasses.fields(cls)} | _DATACLASS_METHODS | _machinery_names()
  for key, attr in list(vars(cls).items()):
    if key in skip:
      continue
    if callable(attr) and not isinstance(attr, (type, staticmethod, classmethod)) \
        and not getattr(attr, 'nowrap', False):
      setattr(cls, key, wrap_method(attr))


class CompactNameScope(Module):
  """The submodule a `compact_name_scope` method runs in: ``fn(module, ...)`` as its compact call."""
  fn: Callable[..., Any]
  module_ref: Callable[[], Module | None]  # a weak reference: the module holds this submodule

  @compact
  def __call__(self, *args, **kwargs):
    return self.fn(self.module_ref(), *args, **kwargs)
