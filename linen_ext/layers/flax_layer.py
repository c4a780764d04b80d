"""`FlaxLayer`: a Module class with a flax layer's fields that runs it through the adapter."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, ClassVar

import flax.linen as flax_nn

from linen_ext.layers.flax_adapter import run_flax
from linen_ext.layers.native import copy_flax_fields, detached_flax, flax_methods
from linen_ext.module.core import Module
from linen_ext.module.foreign import FOREIGN_CLASSES
from linen_ext.module.method_wrapping import nowrap


class FlaxLayer(Module):
  """A Module class with ``flax_class``'s fields, whose calls run a flax instance of it.

  For a flax layer whose code uses Flax internals (its ``scope``, Flax's lifted
  transforms), which `NativeLayer` cannot run on our scopes. Not needed to use
  a flax module once: `from_flax` wraps any instance; and not for plain layers:
  `NativeLayer` traces faster.

  Examples:
    >>> class MyDense(FlaxLayer):
    ...   flax_class = flax_nn.Dense
    >>> jax.tree.map(jnp.shape, MyDense(2).init(jax.random.key(0), jnp.ones((1, 3))))
    {'params': {'bias': (2,), 'kernel': (3, 2)}}
  """
  flax_class: ClassVar[type]
  _summary_role: ClassVar[str] = 'row_over_flax'

  def __init_subclass__(cls, **kwargs):
    if 'flax_class' in cls.__dict__:
      copy_flax_fields(cls, cls.flax_class)
    super().__init_subclass__(**kwargs)

  @nowrap
  def to_flax(self) -> flax_nn.Module:
    """The equivalent detached `flax.linen` module.

    Examples:
      >>> class MyDense(FlaxLayer):
      ...   flax_class = flax_nn.Dense
      >>> MyDense(3).to_flax()
      Dense(...)
    """
    return detached_flax(self)

  def _capture(self, method_name, y):
    del method_name, y  # flax captures the layer's own intermediates

  def _named_scope(self, method_name):
    del method_name  # flax names the layer's calls (and its submodules') itself
    return contextlib.nullcontext()

  @nowrap
  def _run(self, method: str, args: tuple, kwargs: dict) -> Any:
    scope = self._bound_scope(f'Calling `{type(self).__name__}.{method}`')
    return run_flax(scope, self.to_flax(), method, args, kwargs)

  def __call__(self, *args, **kwargs):
    return self._run('__call__', args, kwargs)


@functools.cache
def flax_layer_class(flax_class: type) -> type[FlaxLayer]:
  """The `FlaxLayer` class of ``flax_class``: its name, fields and methods, run by flax.

  What a lifted transform given a `flax.linen` class transforms (``nn.vmap(bridge.ToLinen,
  ...)``, as in Flax): the result is named as Flax names it (``VmapToLinen``).

  Examples:
    >>> Layer = flax_layer_class(flax_nn.Embed)
    >>> Layer.__name__, Layer(5, 3).to_flax()
    ('Embed', Embed(...))
  """
  namespace: dict[str, Any] = {'flax_class': flax_class, '__module__': flax_class.__module__,
                               '__qualname__': flax_class.__qualname__}
  for name in flax_methods(flax_class):
    if name != '__call__':
      namespace[name] = _method_running(name)
  return type(flax_class.__name__, (FlaxLayer,), namespace)


def _method_running(name: str):
  def method(self, *args, **kwargs):
    return self._run(name, args, kwargs)
  method.__name__ = name
  return method


FOREIGN_CLASSES[flax_nn.Module] = flax_layer_class
