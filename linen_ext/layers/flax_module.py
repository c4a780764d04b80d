"""`FlaxModule` and `from_flax`: a `flax.linen` module instance as a submodule of ours.

The wrapper runs its flax module with `flax_adapter.run_flax`, at its own path; see
that module for how variables, rng keys and mutable collections go through flax.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, ClassVar

import flax.linen as flax_nn

from linen_ext import errors

from linen_ext.layers.flax_adapter import map_flax_children, run_flax
from linen_ext.module.core import Module
from linen_ext.module.foreign import FOREIGN_MODULES, inline_adoption
from linen_ext.module.method_wrapping import nowrap
from linen_ext.module.state import context


class FlaxModule(Module):
  """A `flax.linen` module instance used as a `linen_ext` submodule (see `from_flax`).

  Its automatic name is the flax class's (``Dense_0``). The flax module's
  fields and properties read through it (``wrapped.features``, a composite's
  ``self.encoder.config`` in ``setup``), and its methods run as the flax
  module's, bound at this module's place (``wrapped.attend(x)``).
  ``siblings`` wrap the flax submodules that its fields hold, where flax binds
  them: beside it, when it was made in a ``compact`` method. Not constructed
  directly: `from_flax` makes one.

  Attributes:
    module: the `flax.linen` module it runs.
    siblings: the wrappers of the flax submodules ``module``'s fields hold.

  Examples:
    >>> import flax.linen
    >>> wrapped = nn.from_flax(flax.linen.Dense(2))
    >>> type(wrapped).__name__, wrapped.autoname_prefix()
    ('FlaxModule', 'Dense')
  """
  module: flax_nn.Module
  siblings: tuple[FlaxModule, ...] = ()
  _summary_role: ClassVar[str] = 'flax'
  _wraps_foreign_modules: ClassVar[bool] = False  # it runs the flax module it holds

  @nowrap
  def autoname_prefix(self) -> str:
    return type(self.module).__name__

  def _capture(self, method_name, y):
    del method_name, y  # flax captures the wrapped module's own intermediates

  def _named_scope(self, method_name):
    del method_name  # flax names the module's calls (and its submodules') itself
    return contextlib.nullcontext()

  def __call__(self, *args, **kwargs):
    scope = self._bound_scope(f'Calling flax `{type(self.module).__name__}`')
    return run_flax(scope, self.module, '__call__', args, kwargs, self.siblings)

  def __getattr__(self, name: str) -> Any:
    """The flax module's field, property or method ``name`` (methods run bound, as ours)."""
    module = self.__dict__.get('module')
    if module is None or name.startswith('__') or not hasattr(module, name):
      return super().__getattr__(name)
    if _is_method(type(module), name):
      return functools.partial(self.call_method, name)
    return getattr(module, name)

  def call_method(self, method: str, *args, **kwargs):
    """Runs another method of the flax module.

    Examples:
      >>> import flax.linen
      >>> embed = nn.from_flax(flax.linen.Embed(5, 3))
      >>> variables = embed.init(jax.random.key(0), jnp.array([[0, 4]]))
      >>> attend = lambda m, q: m.call_method('attend', q)
      >>> embed.apply(variables, jnp.ones((1, 3)), method=attend).shape
      (1, 5)
    """
    scope = self._bound_scope(f'Calling flax `{type(self.module).__name__}.{method}`')
    return run_flax(scope, self.module, method, args, kwargs, self.siblings)


def _is_method(cls: type, name: str) -> bool:
  """Whether ``cls.name`` is a method (flax wraps them; properties and fields are read)."""
  attr = next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)
  return callable(attr) and not isinstance(attr, (type, staticmethod, classmethod, property))


def from_flax(module: flax_nn.Module, *, name: str | None = None) -> FlaxModule:
  """Wraps a `flax.linen` module instance as a submodule of the current module.

  Variables, rng keys and mutable collections are those of the same module in
  a native flax model at the same path. Flax modules held by its fields (an
  ``RNN``'s cell, ``Sequential``'s layers) sit where flax puts them: beside it
  (``LSTMCell_0``, ``RNN_0``) in a ``compact`` method, under it (``rnn/cell``)
  in ``setup``. Optional for a flax module made in a method of ours: it is
  adopted as flax adopts it, as if wrapped where it was made. Not needed for the
  ready-made layers (`nn.Dense`, `nn.LSTMCell`, ...): they take flax's
  arguments natively.

  Examples:
    >>> import flax.linen
    >>> class Model(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return nn.from_flax(flax.linen.Dense(3))(x)
    >>> list(Model().init(jax.random.key(0), jnp.ones((1, 2)))['params'])   # flax's name
    ['Dense_0']
  """
  if not isinstance(module, flax_nn.Module):
    raise errors.FlaxAdapterError(module)
  adoption = inline_adoption(module)
  if adoption is not None:  # made in a method of ours: wrapped once, for its owner
    if adoption.wrapper is None:
      owner = adoption.owner()
      adoption.wrapper = _wrap(module, name or adoption.name, owner)
    return adoption.wrapper
  return _wrap(module, name or module.name, context.module_stack[-1])


def _wrap(module: flax_nn.Module, name: str | None, parent: Module | None) -> FlaxModule:
  """``module`` wrapped as a submodule of ``parent`` (detached where it is None)."""
  module = module.clone(parent=None, name=None)
  siblings: list[FlaxModule] = []
  if parent is not None and parent._state.in_compact_method and not parent._state.in_setup:
    # flax binds a module made in a compact method to that method's module at once.
    map_flax_children(module, lambda sub: siblings.append(from_flax(sub)))
  return FlaxModule(module, tuple(siblings), name=name, parent=parent)


FOREIGN_MODULES[flax_nn.Module] = from_flax  # a flax module held by a Module is wrapped
