"""`NativeLayer`: a Module that runs a `flax.linen` layer's own method code on its scope.

A ready-made layer declares ``flax_class = flax.linen.Dense``. At class creation
it takes Flax's dataclass fields, and Flax's methods and properties as plain
functions (their code, unwrapped from Flax's method handling), so every method
runs directly against this module's scope: ``self.param``, ``self.variable``,
``self.make_rng`` are ours, and no flax scope or flax instance is made per call.
The values equal Flax's by construction, since the code is Flax's.

A layer whose code builds other Flax layers (attention builds ``DenseGeneral``,
the cells build ``Dense``) gets its functions relinked: their global names that
denote a Flax layer with a native counterpart denote the counterpart instead.
"""
from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import flax.linen as flax_nn

from linen_ext import errors
from linen_ext.module.core import Module
from linen_ext.module.method_wrapping import nowrap

# flax class -> the native layer that runs its code; filled as layers are defined.
NATIVE_COUNTERPARTS: dict[type, type] = {}

# Flax's base classes hold Module machinery and abstract stubs, never layer code.
_FLAX_BASES = (flax_nn.Module, flax_nn.RNNCellBase)


def copy_flax_fields(cls: type, flax_class: type) -> None:
  """Declares on ``cls`` the dataclass fields of ``flax_class`` (minus parent and name),
  with Flax's types and defaults."""
  annotations = dict(cls.__dict__.get('__annotations__', {}))
  for f in dataclasses.fields(flax_class):
    if not f.init or f.name in ('parent', 'name'):
      continue
    annotations[f.name] = f.type
    setattr(cls, f.name, dataclasses.field(default=f.default, default_factory=f.default_factory))
  cls.__annotations__ = annotations


def _layer_code(flax_class: type) -> Iterator[tuple[str, Any]]:
  """(name, function or property) of the layer code ``flax_class`` defines or inherits."""
  fields = {f.name for f in dataclasses.fields(flax_class)}
  seen: set[str] = set()
  for klass in flax_class.__mro__:
    if any(klass in base.__mro__ for base in _FLAX_BASES) or not issubclass(klass, flax_nn.Module):
      continue
    for name, value in vars(klass).items():
      value = getattr(value, 'wrapped', value)  # flax wraps descriptors
      if name in seen or name in fields or (name.startswith('__') and name != '__call__'):
        continue
      if isinstance(value, property) or hasattr(getattr(value, '__wrapped__', value), '__code__'):
        seen.add(name)
        yield name, value


def flax_methods(flax_class: type) -> list[str]:
  """The names of the methods of ``flax_class``'s layer code (``__call__``, ``attend``, ...).

  >>> flax_methods(flax_nn.Embed)
  ['__call__', 'attend']
  """
  return [name for name, value in _layer_code(flax_class)
          if not isinstance(value, property) and name != 'setup'
          and (name == '__call__' or not name.startswith('_'))]


def _flax_classes_named(code: types.CodeType, namespace: dict) -> Iterator[str]:
  """Global names in ``code`` (nested functions included) that denote a flax Module class."""
  for name in code.co_names:
    value = namespace.get(name)
    if isinstance(value, type) and issubclass(value, flax_nn.Module):
      yield name
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      yield from _flax_classes_named(const, namespace)


def _relinked(fn: Callable, owner: str) -> Callable:
  """A copy of ``fn`` whose global names of Flax layers denote their native counterparts."""
  names = set(_flax_classes_named(fn.__code__, fn.__globals__))
  missing = sorted(n for n in names if fn.__globals__[n] not in NATIVE_COUNTERPARTS)
  if missing:
    raise errors.NativeLayerError(owner, missing)
  namespace = fn.__globals__
  if names:
    namespace = {**namespace, **{n: NATIVE_COUNTERPARTS[namespace[n]] for n in names}}
  copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
  copy.__kwdefaults__ = fn.__kwdefaults__
  copy.__dict__.update(fn.__dict__)
  copy.__qualname__ = fn.__qualname__
  return copy


def native_function(fn: Callable, owner: str) -> Callable:
  """The plain function of a flax method ``fn``, relinked to native layers.

  Examples:
    >>> call = native_function(flax_nn.Dense.__call__, 'MyDense')
    >>> call.__name__, hasattr(call, '__wrapped__')
    ('__call__', False)
  """
  raw = getattr(fn, '__wrapped__', fn)  # Flax's method handler wraps its methods
  method = _relinked(raw, owner)
  return nowrap(method) if getattr(raw, 'method_handler_wrapped', False) else method


class NativeLayer(Module):
  """Base of the ready-made layers: ``flax_class`` gives the fields and the method code.

  Examples:
    >>> class MyDense(NativeLayer):
    ...   flax_class = flax_nn.Dense
    >>> jax.tree.map(jnp.shape, MyDense(2).init(jax.random.key(0), jnp.ones((1, 3))))
    {'params': {'bias': (2,), 'kernel': (3, 2)}}

  Not for a flax module used once or a layer that uses Flax internals (its
  ``scope``, lifted Flax transforms): `from_flax` runs any flax module.
  """
  flax_class: ClassVar[type]

  def __init_subclass__(cls, **kwargs):
    flax_class = cls.__dict__.get('flax_class')
    if flax_class is not None:
      copy_flax_fields(cls, flax_class)
      for name, value in _layer_code(flax_class):
        if name not in cls.__dict__:
          owner = f'{cls.__qualname__}.{name} (the code of {flax_class.__qualname__}.{name})'
          native = value if isinstance(value, property) else native_function(value, owner)
          setattr(cls, name, native)
      NATIVE_COUNTERPARTS.setdefault(flax_class, cls)
    super().__init_subclass__(**kwargs)

  def __post_init__(self) -> None:
    for field in dataclasses.fields(self):  # ``dot_general_cls=flax_nn.Fp8DotGeneralOp``
      value = self.__dict__.get(field.name)
      if isinstance(value, type) and value in NATIVE_COUNTERPARTS:
        object.__setattr__(self, field.name, NATIVE_COUNTERPARTS[value])
    super().__post_init__()

  @nowrap
  def to_flax(self) -> flax_nn.Module:
    """The equivalent detached `flax.linen` module.

    Examples:
      >>> nn.Dense(3).to_flax()
      Dense(...)
    """
    return detached_flax(self)


def detached_flax(module: Module) -> flax_nn.Module:
  """The unbound ``module.flax_class`` with ``module``'s fields (native classes as flax's)."""
  flax_of = {ours: theirs for theirs, ours in NATIVE_COUNTERPARTS.items()}
  fields = {f.name: getattr(module, f.name) for f in dataclasses.fields(module)
            if f.init and f.name not in ('parent', 'name')}
  fields = {k: flax_of.get(v, v) if isinstance(v, type) else v for k, v in fields.items()}
  return type(module).flax_class(**fields, parent=None)  # type: ignore[attr-defined]
