"""Module method calls under `jax.named_scope`, for profiles (Flax's ``named_call``).

While enabled, a method call of a module runs inside ``jax.named_scope(name)``,
``name`` being the module's name (or class name) with ``.method`` for methods
other than ``__call__``: a profile or an HLO dump then shows ``Block_0/Dense_1``
instead of anonymous ``dot_general``s. On by default, as Flax's
``flax_profile`` flag (whose value it starts from).
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
from flax import config as flax_config

_enabled = [bool(flax_config.flax_profile)]


def enabled() -> bool:
  return _enabled[0]


def enable_named_call():
  """Runs module methods under ``jax.named_scope`` from now on.

  The scopes name each module's operations in profiles and compiled
  programs (``Scale/mul``). Flax's ``flax_profile`` flag sets the default;
  not for one block of code: use `override_named_call`.

  Examples:
    >>> class Scale(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return x * self.param('s', nn.initializers.ones, (3,))
    >>> def lowered_text():
    ...   apply = lambda x: Scale().apply({'params': {'s': jnp.ones(3)}}, x)
    ...   return jax.jit(apply).lower(jnp.ones(3)).as_text(debug_info=True)
    >>> with nn.override_named_call(False):   # restores the setting on exit
    ...   nn.enable_named_call()
    ...   text = lowered_text()
    >>> 'Scale/mul' in text
    True
  """
  _enabled[0] = True


def disable_named_call():
  """Stops running module methods under ``jax.named_scope``.

  Not for one block of code: use `override_named_call`.

  Examples:
    >>> class Scale(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return x * self.param('s', nn.initializers.ones, (3,))
    >>> def lowered_text():
    ...   apply = lambda x: Scale().apply({'params': {'s': jnp.ones(3)}}, x)
    ...   return jax.jit(apply).lower(jnp.ones(3)).as_text(debug_info=True)
    >>> with nn.override_named_call(True):   # restores the setting on exit
    ...   nn.disable_named_call()
    ...   text = lowered_text()
    >>> 'Scale/mul' in text
    False
  """
  _enabled[0] = False


@contextlib.contextmanager
def override_named_call(enable: bool = True) -> Iterator[None]:
  """Enables (or disables) named scopes inside a ``with`` block only.

  Not for a whole program: `enable_named_call` / `disable_named_call` set it.

  Examples:
    >>> class Scale(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return x * self.param('s', nn.initializers.ones, (3,))
    >>> def lowered_text():
    ...   apply = lambda x: Scale().apply({'params': {'s': jnp.ones(3)}}, x)
    ...   return jax.jit(apply).lower(jnp.ones(3)).as_text(debug_info=True)
    >>> with nn.override_named_call(True):
    ...   text = lowered_text()
    >>> 'Scale/mul' in text
    True
  """
  previous, _enabled[0] = _enabled[0], enable
  try:
    yield
  finally:
    _enabled[0] = previous


def named_call(class_fn: Callable[..., Any], force: bool = True) -> Callable[..., Any]:
  """Labels one method's calls with `jax.named_scope`, as Flax's ``nn.named_call``.

  Args:
    class_fn: the method (``fn(self, *args, **kwargs)``).
    force: label the calls even while named calls are disabled.

  Returns:
    The method, running under ``jax.named_scope('<module name>[.<method>]')``
    (not in ``setup``).

  Not needed while named calls are enabled (the default): every method call is
  labelled already, and this adds a second scope of the same name.

  Examples:
    >>> class Scale(nn.Module):
    ...   @nn.named_call
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return x * self.param('s', nn.initializers.ones, (3,))
    >>> apply = lambda x: Scale().apply({'params': {'s': jnp.ones(3)}}, x)
    >>> with nn.override_named_call(False):
    ...   text = jax.jit(apply).lower(jnp.ones(3)).as_text(debug_info=True)
    >>> 'Scale/mul' in text
    True
  """
  @functools.wraps(class_fn)
  def labelled(self, *args, **kwargs):
    if (not force and not enabled()) or self._state.in_setup:
      return class_fn(self, *args, **kwargs)
    with jax.named_scope(scope_name(self, class_fn.__name__)):
      return class_fn(self, *args, **kwargs)
  return labelled


def scope_name(module, method_name: str) -> str:
  """``Dense_0``, or ``Model.encode`` for a method other than ``__call__``."""
  suffix = '' if method_name == '__call__' else f'.{method_name}'
  return f'{module.name or type(module).__name__}{suffix}'


__all__ = ['enable_named_call', 'disable_named_call', 'named_call', 'override_named_call']
