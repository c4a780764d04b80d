"""`share_scope`: two modules, one scope (one set of variables), as Flax's."""
from __future__ import annotations

from lift.scope import Scope

from linen_ext import errors
from linen_ext.module.core import Module, _children


def share_scope(module: Module, other: Module, /) -> None:
  """Makes ``module`` and ``other`` use one scope (one set of variables), as Flax's.

  If ``other`` lives below ``module`` (e.g. a setup attribute), ``other`` moves up
  into ``module``'s scope; otherwise ``module`` moves into ``other``'s (a wrapper
  around a layer passed in). Existing children move along with the one that moves.
  Not for tying weights between two layers: call one submodule twice.

  Examples:
    >>> class Wrapper(nn.Module):
    ...   def setup(self):
    ...     self.inner = nn.Dense(2)
    ...     nn.share_scope(self, self.inner)   # inner's variables sit at Wrapper's path
    ...   def __call__(self, x):
    ...     return self.inner(x)
    >>> list(Wrapper().init(jax.random.key(0), jnp.ones((1, 3)))['params'])
    ['kernel', 'bias']
  """
  if module.scope is None or other.scope is None:
    unbound = module if module.scope is None else other
    raise errors.UnboundModuleError(type(unbound).__name__, 'Calling `share_scope`')
  if _is_below(other.scope, module.scope):
    _move_scope(other, module.scope)
  else:
    _move_scope(module, other.scope)


def _is_below(scope: Scope, ancestor: Scope) -> bool:
  node: Scope | None = scope
  while node is not None:
    if node.identity == ancestor.identity:
      return True
    node = node.parent
  return False


def _move_scope(module: Module, scope: Scope) -> None:
  """Binds ``module`` to ``scope`` and moves its existing children below it.

  A moved child keeps its rng streams and counters (its keys do not change), as
  in Flax, where only its parent pointer changes.
  """
  old = module.scope
  assert old is not None, 'share_scope moves bound modules'
  object.__setattr__(module, 'scope', scope)
  for child in _children(module).values():
    if child.scope is not None and child.scope.parent is not None \
        and child.scope.parent.identity == old.identity:
      moved = scope.push(child.scope.name)
      moved.rngs, moved.rng_counters = child.scope.rngs, child.scope.rng_counters
      _move_scope(child, moved)
