"""Running a `flax.linen` module inside a `linen_ext` module: `from_flax`, `FlaxModule`.

A flax module at our scope ``S`` (path ``p``) runs through flax's own
``init_with_output``/``apply`` on a small flax tree that places it at ``p``:
``_Path`` modules named ``p[:-1]`` lead to a ``_Leaf`` named ``p[-1]`` whose scope
the flax module shares. So:

* its variables are ``S``'s variables, nested under ``p`` going in and taken
  from under ``p`` coming out (mutated collections are written back to ``S``);
* its rng keys are a native flax model's: our stream at ``S`` is the raw key
  plus suffix ``p`` (the path, unless ``fold_rngs`` cut it; the flax tree is
  built along the suffix), flax derives ``fold_in(key, hash(p + names +
  counter))`` from the raw key and the same names, and the draw counters of
  ``S`` and of everything below it go into flax's scope before the call and
  come back after it. Later calls, and the retraces of lifted transforms
  (``scan``'s pre-pass), continue the counts as a native module does. Where
  the suffix is not a path (inside ``lift.jit``), flax gets one fresh draw of
  each stream per call instead: never a repeated key, but not flax's;
* inside ``init`` the flag ``is_initializing()`` holds (flax's ``init``), and the
  variables created so far are put back first, so a second call reuses them;
* mutability is ``S``'s filter, so ``batch_stats`` follow ``apply(mutable=...)``
  and the lifted transforms around us.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as flax_nn

from lift.filters import DenyList, Filter, union_filters
from lift.rng import RngCounters
from lift.scope import Scope, copy_structure

from linen_ext import errors
from linen_ext._state import context
from linen_ext.module import Module, nowrap


@dataclasses.dataclass(frozen=True)
class FlaxCall:
  """One method call of a flax module, handed through flax's ``apply`` as an argument."""
  target: flax_nn.Module
  method: str
  args: tuple
  kwargs: dict
  existing: dict  # variables put at the target's scope first (init only)
  counters: RngCounters | None  # the draw counts at the target's scope; None: flax's own


class _Leaf(flax_nn.Module):
  """Sits at the target's path and shares its scope with the target."""
  adapted_flax_module: flax_nn.Module

  def setup(self):
    flax_nn.share_scope(self, self.adapted_flax_module)

  def __call__(self, call: FlaxCall):
    for col, tree in call.existing.items():
      for name, value in tree.items():
        self.scope.put_variable(col, name, value)
    if call.counters is None:
      return getattr(self.adapted_flax_module, call.method)(*call.args, **call.kwargs)
    # flax keeps a scope's counts in a dict: {stream: count, (token, child): {...}}.
    flax_counters = self.scope.rng_counters
    _to_flax_counters(call.counters, flax_counters, _child_token(self.scope))
    try:
      return getattr(self.adapted_flax_module, call.method)(*call.args, **call.kwargs)
    finally:
      _from_flax_counters(flax_counters, call.counters)


class _Path(flax_nn.Module):
  """One level of the path from the flax root down to the leaf."""
  names: tuple[str, ...]

  @flax_nn.compact
  def __call__(self, call: FlaxCall):
    head, *rest = self.names
    if rest:
      return _Path(tuple(rest), name=head)(call)
    return _Leaf(call.target, name=head)(call)


def to_flax_filter(f: Filter) -> Any:
  """Our filter as flax's (only `DenyList` differs).

  >>> to_flax_filter(DenyList('intermediates'))
  DenyList(deny=('intermediates',))
  """
  if isinstance(f, DenyList):
    return flax_nn.DenyList(to_flax_filter(f.deny))
  if isinstance(f, (set, frozenset)):
    return tuple(sorted(f))
  return f


def _nest(path: tuple[str, ...], tree: Any) -> Any:
  for name in reversed(path):
    tree = {name: tree}
  return tree


def _at(path: tuple[str, ...], tree: Mapping[str, Any]) -> Mapping[str, Any]:
  for name in path:
    tree = tree.get(name, {}) if isinstance(tree, Mapping) else {}
  return tree


def _flax_path(scope: Scope) -> tuple[str, ...]:
  """Where the flax module sits in its flax tree: our streams' suffix, so keys derive alike.

  The suffix is the scope's path unless a transform such as ``fold_rngs`` cut it.
  """
  suffixes = {stream.suffix for stream in scope.rngs.values()}
  if len(suffixes) == 1:
    suffix = suffixes.pop()
    if all(isinstance(name, str) for name in suffix):
      return suffix
  return scope.path


def _child_token(scope: Any) -> Any:
  """The marker flax puts before a child's name in its counter dicts (seen on the parent)."""
  parent = scope.parent
  keys = parent.rng_counters if parent is not None else {}
  return next((key[0] for key in keys if isinstance(key, tuple)), None)


def _to_flax_counters(node: RngCounters, counters: dict, token: Any) -> None:
  counters.update(node.counts)
  if token is None:
    return
  for name, child in node.children.items():
    _to_flax_counters(child, counters.setdefault((token, name), {}), token)


def _from_flax_counters(counters: dict, node: RngCounters) -> None:
  for key, value in counters.items():
    if isinstance(key, tuple):
      _from_flax_counters(value, node.child(key[1]))
    else:
      node.counts[key] = value


def _native_rngs(scope: Scope, path: tuple[str, ...]) -> bool:
  """Whether flax, given the raw keys at ``path``, derives exactly our keys at ``scope``."""
  return bool(scope.rngs) and all(s.suffix == path for s in scope.rngs.values())


def _flax_keys(scope: Scope, native: bool) -> dict[str, Any]:
  """The raw keys (flax derives native keys from them); else one fresh draw per stream."""
  if native:
    return {name: stream.key for name, stream in scope.rngs.items()}
  return {name: stream.draw(scope.rng_counters.next(name)) for name, stream in scope.rngs.items()}


def _capture_filter():
  capture = context.capture_stack[-1] if context.capture_stack else None
  if capture is None:
    return False
  return lambda m, method: not isinstance(m, (_Path, _Leaf)) and capture(m, method)


def run_flax(scope: Scope, target: flax_nn.Module, method: str, args: tuple,
             kwargs: dict) -> Any:
  """Runs ``target.<method>(*args, **kwargs)`` as if it were a native module at ``scope``.

  >>> y = run_flax(scope, flax.linen.Dense(3), '__call__', (x,), {})
  """
  path = _flax_path(scope)
  existing = {col: copy_structure(tree) for col, tree in scope.variables().items()}
  native = _native_rngs(scope, path)
  rngs = _flax_keys(scope, native)
  initializing = bool(scope.get_flag('initializing', False))
  call = FlaxCall(target, method, args, kwargs, existing if initializing else {},
                  scope.rng_counters if native else None)
  root = _Path(path) if path else _Leaf(target)
  capture = _capture_filter()
  if initializing:
    mutable = to_flax_filter(union_filters(scope.mutable, set(existing)))
    y, out = root.init_with_output(rngs, call, mutable=mutable,
                                   capture_intermediates=capture)
  elif scope.mutable is False:
    variables = {col: _nest(path, tree) for col, tree in existing.items()}
    return root.apply(variables, call, rngs=rngs or None)
  else:
    variables = {col: _nest(path, tree) for col, tree in existing.items()}
    y, out = root.apply(variables, call, rngs=rngs or None,
                        mutable=to_flax_filter(scope.mutable), capture_intermediates=capture)
  for col, tree in out.items():
    if scope.is_mutable_collection(col):
      for name, value in _at(path, tree).items():
        scope.put_variable(col, name, value)
  return y


class FlaxModule(Module):
  """A `flax.linen` module instance used as a `linen_ext` submodule (see `from_flax`).

  Its automatic name is the flax class's (``Dense_0``); other methods of the
  flax module are reachable as attributes (``from_flax(nn.Embed(...)).attend``).
  """
  module: flax_nn.Module

  @nowrap
  def autoname_prefix(self) -> str:
    return type(self.module).__name__

  def _capture(self, method_name, y):
    del method_name, y  # flax captures the wrapped module's own intermediates

  def __call__(self, *args, **kwargs):
    scope = self._bound_scope(f'Calling flax `{type(self.module).__name__}`')
    return run_flax(scope, self.module, '__call__', args, kwargs)

  def call_method(self, method: str, *args, **kwargs):
    """Runs another method of the flax module.

    >>> logits = from_flax(flax.linen.Embed(10, 4)).call_method('attend', query)
    """
    scope = self._bound_scope(f'Calling flax `{type(self.module).__name__}.{method}`')
    return run_flax(scope, self.module, method, args, kwargs)


def from_flax(module: flax_nn.Module, *, name: str | None = None) -> FlaxModule:
  """Wraps a `flax.linen` module instance as a submodule of the current module.

  Variables, rng keys and mutable collections are those of the same module in
  a native flax model at the same path.

  >>> class Model(Module):
  ...   @compact
  ...   def __call__(self, x):
  ...     return from_flax(flax.linen.Dense(3))(x)   # params at 'Dense_0'
  """
  if not isinstance(module, flax_nn.Module):
    raise errors.FlaxAdapterError(module)
  return FlaxModule(module.clone(parent=None, name=None), name=name or module.name)
