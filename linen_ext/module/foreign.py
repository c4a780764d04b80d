"""Modules of another module system (`flax.linen`'s) held by a Module or made in its methods.

`linen_ext.layers` registers how a `flax.linen.Module` becomes one of ours (`from_flax`);
`Module` wraps the ones it finds in fields and ``setup`` attributes before adopting them.

A flax module made while a method of ours runs (``flax.linen.Dense(3)``, NNX's
``bridge.to_linen(...)`` in a ``@compact`` method) is adopted as a flax module made in
a flax method is: flax takes its parent from flax's own module stack, on which each call
of one of our methods puts an `inline_parent`. That parent leaves the module unbound but
marks it with its owner (the module whose method runs) and the name it was given; its
first call (or `from_flax` of it) wraps it, once, as a submodule of the owner, which
must then allow submodules (in ``setup`` or a compact method, as flax's check), and
every call of its methods runs the wrapper's. In ``setup``, unnamed modules are left
alone until assigned to an attribute, as flax leaves them.
"""
from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from typing import Any

import flax.linen as flax_nn
from flax import errors as flax_errors
from flax.core import FrozenDict
from flax.linen import module as flax_module_system

from lift.scope import Scope

from linen_ext import errors
from linen_ext.module.method_wrapping import fn_name
from linen_ext.module.state import context

# How a module of another system becomes one of ours, by its class (filled by the layers).
FOREIGN_MODULES: dict[type, Callable[[Any], Any]] = {}
# How a module class of another system becomes a Module class of ours (for the transforms).
FOREIGN_CLASSES: dict[type, Callable[[type], type]] = {}


def our_class(cls: type) -> type:
  """``cls``, or the Module class of ours standing for a module class of another system.

  >>> import flax.linen
  >>> our_class(flax.linen.Dense).__name__
  'Dense'
  """
  wrap = next((fn for base, fn in FOREIGN_CLASSES.items() if issubclass(cls, base)), None)
  return cls if wrap is None else wrap(cls)


def wrap_foreign_modules(tree: Any) -> Any:
  """``tree`` with each module of another system (`flax.linen`'s) wrapped as one of ours.

  Lists, tuples and dicts are walked; other values come back as they are.

  Examples:
    >>> import flax.linen
    >>> type(wrap_foreign_modules([flax.linen.Dense(2)])[0]).__name__
    'FlaxModule'
  """
  wrap = next((fn for cls, fn in FOREIGN_MODULES.items() if isinstance(tree, cls)), None)
  if wrap is not None:
    return wrap(tree)
  if isinstance(tree, (dict, FrozenDict)):
    return type(tree)({k: wrap_foreign_modules(v) for k, v in tree.items()})
  if isinstance(tree, (list, tuple)) and not hasattr(tree, '_fields'):
    return type(tree)(wrap_foreign_modules(v) for v in tree)
  return tree


def flax_module_stack() -> list[Any]:
  """Flax's per-thread stack of the modules whose methods run (its parents of new modules)."""
  return flax_module_system._context.module_stack


@dataclasses.dataclass
class InlineAdoption:
  """How a flax module made in a method of ``owner`` becomes its submodule."""
  owner: weakref.ref  # the Module whose method made it
  name: str | None  # the name it was given; None: the wrapper is named as ours are
  wrapper: Any = None  # its FlaxModule, made on first use


_ADOPTION = '_linen_ext_adoption'  # where a flax module made inline keeps its InlineAdoption


def inline_adoption(module: Any) -> InlineAdoption | None:
  """The adoption record of a flax module made in a method of ours, if it is one."""
  return module.__dict__.get(_ADOPTION)


class _AutonameCursor(dict):
  """The inline parent's autoname counts: a write means flax named the module being made."""
  named_by_flax = False

  def __setitem__(self, key, value):
    self.named_by_flax = True
    super().__setitem__(key, value)


class _Adopting(dict):
  """The inline parent's children: registering one marks it for adoption instead."""

  def __init__(self, cursor: _AutonameCursor):
    super().__init__()
    self._cursor = cursor

  def __setitem__(self, name: str, module: Any) -> None:
    given = None if self._cursor.named_by_flax else name
    self._cursor.named_by_flax = False
    object.__setattr__(module, 'name', given)
    object.__setattr__(module, '_call_wrapped_method', functools.partial(_run_adopted, module))
    module.__dict__[_ADOPTION] = InlineAdoption(weakref.ref(context.module_stack[-1]), given)


class _RunningScope:
  """The inline parent's scope: it reserves no name and binds no child (adoption does
  both), and is otherwise the scope of the module whose method runs."""

  def name_reserved(self, name: str, collection: str | None = None) -> bool:
    del name, collection
    return False

  def push(self, name: str | None = None, reuse: bool = False) -> None:
    del name, reuse

  def __getattr__(self, name: str) -> Any:
    return getattr(context.module_stack[-1].scope, name)


class _InlineParent(flax_nn.Module):
  """Flax's parent of the flax modules made in our compact methods (see `inline_parent`).

  Flax code that finds "the current module" on flax's stack (`flax.linen.partitioning`'s
  ``param_with_axes`` without ``module=``) reaches the running module of ours through it.
  """

  @flax_nn.nowrap
  def param(self, *args, **kwargs) -> Any:
    return context.module_stack[-1].param(*args, **kwargs)

  @flax_nn.nowrap
  def variable(self, *args, **kwargs) -> Any:
    return context.module_stack[-1].variable(*args, **kwargs)

  @flax_nn.nowrap
  def sow(self, *args, **kwargs) -> Any:
    return context.module_stack[-1].sow(*args, **kwargs)

  @flax_nn.nowrap
  def is_mutable_collection(self, col: str) -> bool:
    return context.module_stack[-1].is_mutable_collection(col)


def inline_parent(in_setup: bool) -> _InlineParent:
  """This thread's `_InlineParent`: flax registers each module made under it as its child.

  The one for ``setup`` (``in_setup``) leaves unnamed modules alone, as flax does: they
  are named by the attribute they are assigned to.
  """
  parent = context.flax_inline_parents.get(in_setup)
  if parent is None:
    parent = _InlineParent(parent=None)  # an orphan: flax leaves it alone
    cursor = _AutonameCursor()
    parent._state.in_setup = in_setup
    parent._state.autoname_cursor = cursor
    parent._state.children = _Adopting(cursor)
    object.__setattr__(parent, 'scope', _RunningScope())
    context.flax_inline_parents[in_setup] = parent
  return parent


def _run_adopted(module: Any, fun: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
  """A method call of an adopted flax module: the same method of its wrapper."""
  wrapper = wrap_foreign_modules(module)
  method = fn_name(fun)
  if method == '__call__':
    return wrapper(*args, **kwargs)
  return wrapper.call_method(method, *args, **kwargs)


def is_flax_scope(value: Any) -> bool:
  """Whether ``value`` is a `flax.core.Scope` (told by its class, without importing flax's)."""
  return type(value).__name__ == 'Scope' and type(value).__module__ == 'flax.core.scope'


def scope_over_flax_scope(flax_scope: Any, cls_name: str) -> Scope:
  """A `lift.Scope` that reads and writes the variables of the root `flax.core.Scope` given.

  What a module bound to it creates lands in ``flax_scope.variables()``, as with
  Flax. Its rng streams start from the same keys; the keys drawn are this
  package's, not Flax's.
  """
  if flax_scope.parent is not None:
    raise errors.InvalidParentError(cls_name, flax_scope)
  rngs = {name: rng.as_jax_rng() for name, rng in flax_scope.rngs.items()}
  return Scope(flax_scope._variables, rngs, mutable=flax_scope.mutable,
               path=flax_scope.path, flags=flax_scope.flags)


class FlaxContext:
  """Where a method of ours runs, for flax: the inline parent on flax's module stack (flax
  modules made in the method are adopted by the module), and flax's unbound-module error
  for a flax module nothing adopted turned into ours. A class: one per method call."""

  def __init__(self, cls_name: str, method: str, in_setup: bool):
    self.cls_name, self.method, self.in_setup = cls_name, method, in_setup

  def __enter__(self) -> None:
    flax_module_stack().append(inline_parent(self.in_setup))

  def __exit__(self, kind, error, traceback) -> None:
    flax_module_stack().pop()
    if (isinstance(error, flax_errors.CallCompactUnboundModuleError)
        and not isinstance(error, errors.ModuleError)):  # ours, from a method called inside
      raise errors.FlaxModuleCalledInlineError(self.cls_name, self.method) from error


__all__ = ['FOREIGN_CLASSES', 'FOREIGN_MODULES', 'FlaxContext', 'InlineAdoption',
           'flax_module_stack', 'inline_adoption', 'inline_parent', 'is_flax_scope', 'our_class',
           'scope_over_flax_scope', 'wrap_foreign_modules']
