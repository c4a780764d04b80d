"""`run_flax`: a `flax.linen` module run at one of our scopes (by `FlaxModule`, `FlaxLayer`).

A flax module at our scope ``S`` (path ``p``) runs through flax's own
``init_with_output``/``apply`` on a small flax tree that places it at ``p``:
``_Path`` modules lead to a ``_Group`` at the caller's path ``p[:-1]``, which
binds the module there under ``p[-1]``, with the flax submodules that its
fields hold where flax puts them (beside it when made in a ``compact``
method, under it otherwise). At an empty path the module is flax's root
itself. So:

* its variables are ``S``'s variables, nested under ``p`` going in and taken
  from under ``p`` coming out (mutated collections are written back to ``S``);
* its rng keys are a native flax model's: our stream at ``S`` is the raw key
  plus suffix ``p`` (the path, unless ``fold_rngs`` cut it; the flax tree is
  built along the suffix), flax derives ``fold_in(key, hash(p + names +
  counter))`` from the raw key and the same names, and the draw counters of
  ``S`` and of everything below it go into flax's scope before the call and
  come back after it. Later calls, and the retraces of lifted transforms
  (``scan``'s pre-pass), continue the counts as a native module does. Inside
  ``lift.jit``'s first trace of a structure the suffix is not known yet; a
  flax module that draws there makes ``lift.jit`` compile that structure for
  its concrete suffixes and counts. Where ``fold_rngs`` cut the suffix to
  something other than a path, flax gets one fresh draw of each stream per
  call instead: never a repeated key, but not flax's;
* inside ``init`` the flag ``is_initializing()`` holds (flax's ``init``), and the
  variables created so far are put back first, so a second call reuses them;
* mutability is ``S``'s filter, so ``batch_stats`` follow ``apply(mutable=...)``
  and the lifted transforms around us.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, cast

import flax.core
import flax.errors
import flax.linen as flax_nn

from lift.rng_counters import total
from lift.jit_keys import has_tape_streams, require_concrete
from lift.errors import (ImmutableCollectionError, LiftError, MissingCollectionError,
                         MissingParamError, MissingVariableError, ParamShapeError,
                         UnknownRngError)
from lift.filters import DenyList, Filter, union_filters
from lift.rng import RngCounters
from lift.scope import Scope, copy_structure


from linen_ext.module import named_call
from linen_ext.module.state import context


@dataclasses.dataclass(frozen=True)
class FlaxCall:
  """One method call of a flax module, handed through flax's ``apply`` as an argument."""
  target: Any  # the flax module (flax's root), or the _Built group to bind
  method: str
  args: tuple
  kwargs: dict
  existing: dict  # variables put at the group's (root's) scope first (init only)
  counters: RngCounters | None  # the draw counts there; None: flax's own


def _put_existing(flax_scope: Any, existing: dict) -> None:
  for col, tree in existing.items():
    for name, value in tree.items():
      flax_scope.put_variable(col, name, value)


def _root_method(module: flax_nn.Module, call: FlaxCall) -> Any:
  """Runs ``call`` on ``module``, flax's root (the ``method=`` of flax's ``init``/``apply``)."""
  _put_existing(module.scope, call.existing)
  method = getattr(module, call.method)
  return _run_counted(module.scope, call, lambda: _named(method, call))


def _named(method, call: FlaxCall) -> Any:
  """The flax module's own call, under flax's named scopes where ours are on (the
  scaffolding around it, run with them off, adds none)."""
  with flax_nn.override_named_call(named_call.enabled()):
    return method(*call.args, **call.kwargs)


@dataclasses.dataclass(frozen=True)
class _Built:
  """A flax module to bind under ``name``, after the field submodules flax bound before it."""
  module: flax_nn.Module
  name: str
  children: tuple[_Built, ...]

  def bind(self, parent: flax_nn.Module) -> flax_nn.Module:
    """Binds the field submodules (if built beside it), then the module, under ``parent``;
    unbound field submodules are adopted by the module, as in ``setup``."""
    children = iter([child.bind(parent) for child in self.children])
    fields = map_flax_children(self.module, lambda _: next(children)) if self.children else {}
    return self.module.clone(parent=parent, name=self.name, **fields)


class _Group(flax_nn.Module):
  """Sits at the caller's path: binds the target and the submodules built with it there,
  as flax binds modules constructed in a ``compact`` method (``LSTMCell_0`` beside ``RNN_0``)."""
  _summary_role: ClassVar[str] = 'scaffolding'  # no row in `tabulate`

  @flax_nn.compact
  def __call__(self, call: FlaxCall):
    _put_existing(self.scope, call.existing)
    target = call.target.bind(self)
    return _run_counted(self.scope, call, lambda: _named(getattr(target, call.method), call))


def _run_counted(flax_scope: Any, call: FlaxCall, run) -> Any:
  """``run()`` with flax's draw counts at ``flax_scope`` taken from, and returned to, ours."""
  if call.counters is None:
    return run()
  # flax keeps a scope's counts in a dict: {stream: count, (token, child): {...}}.
  flax_counters = flax_scope.rng_counters
  _to_flax_counters(call.counters, flax_counters, _child_token())
  try:
    return run()
  finally:
    _from_flax_counters(flax_counters, call.counters)


class _Path(flax_nn.Module):
  """One level of the path from the flax root down to the group."""
  _summary_role: ClassVar[str] = 'scaffolding'  # no row in `tabulate`
  names: tuple[str, ...]

  @flax_nn.compact
  def __call__(self, call: FlaxCall):
    head, *rest = self.names
    if rest:
      return _Path(tuple(rest), name=head)(call)
    return _Group(name=head)(call)


def map_flax_children(module: flax_nn.Module, fn) -> dict[str, Any]:
  """The fields of ``module`` holding flax modules, each such module replaced by ``fn(it)``.

  Nested lists, tuples and dicts are walked in order (flax's ``Sequential`` layers).
  """
  found: list[flax_nn.Module] = []

  def walk(value):
    if isinstance(value, flax_nn.Module):
      found.append(value)
      return fn(value)
    if isinstance(value, (list, tuple)):
      return type(value)(walk(v) for v in value)
    if isinstance(value, Mapping):  # a concrete Mapping type, which takes its items
      return type(value)({k: walk(v) for k, v in value.items()})  # type: ignore[call-arg]
    return value

  changed = {}
  for field in dataclasses.fields(module):
    if field.init and field.name not in ('parent', 'name'):
      count = len(found)
      value = walk(getattr(module, field.name))
      if len(found) > count:
        changed[field.name] = value
  return changed


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
      return cast(tuple[str, ...], suffix)
  return scope.path


@functools.cache
def _child_token() -> Any:
  """The marker flax puts before a child's name in a scope's counter dict, read from one."""
  scope = flax.core.Scope({})
  scope.push('child')
  return next(key[0] for key in scope.rng_counters if isinstance(key, tuple))


def _to_flax_counters(node: RngCounters, counters: dict, token: Any) -> None:
  counters.update(node.counts)
  for name, child in node.children.items():
    _to_flax_counters(child, counters.setdefault((token, name), {}), token)


def _from_flax_counters(counters: dict, node: RngCounters) -> None:
  for key, value in counters.items():
    if isinstance(key, tuple):
      _from_flax_counters(value, node.child(key[1]))
    else:
      node.counts[key] = value


def _native_rngs(scope: Scope, path: tuple[str, ...]) -> bool:
  """Whether flax, given the raw keys at ``path``, derives exactly our keys at ``scope``.

  Inside ``lift.jit``'s first trace (tape streams) the answer is yes if flax
  draws nothing; if it draws, `run_flax` asks ``lift.jit`` for concrete suffixes.
  """
  if has_tape_streams(scope.rngs):
    return True
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
  return lambda m, method: not isinstance(m, (_Path, _Group)) and capture(m, method)


def run_flax(scope: Scope, target: flax_nn.Module, method: str, args: tuple,
             kwargs: dict, siblings: Sequence[Any] = ()) -> Any:
  """Runs ``target.<method>(*args, **kwargs)`` as if it were a native module at ``scope``.

  ``siblings`` are the wrappers (`FlaxModule`) of ``target``'s field submodules,
  bound beside it; flax then runs at the caller's path and binds them there.

  >>> y = run_flax(scope, flax.linen.Dense(3), '__call__', (x,), {})
  """
  path = _flax_path(scope)
  runs: flax_nn.Module | _Built = target  # what FlaxCall binds: the target, or a group
  members: dict[str, Scope] | None
  native = _native_rngs(scope, path)
  rngs = _flax_keys(scope, native)
  initializing = bool(scope.get_flag('initializing', False))
  if path and scope.parent is not None and path[-1] == scope.name:
    # flax runs at the caller's path and binds the target (and its siblings) there.
    # Siblings are field submodules of a bound module: bound (and named) with it.
    base = path[:-1]
    members = cast(dict[str, Scope], {m.name: m.scope for m in _flatten(siblings)})
    members[path[-1]] = scope
    counters, runs = scope.parent.rng_counters, _Built(target, path[-1], _built(siblings))
  elif path:  # a root scope (or a cut suffix): a group binds the target alone at path[-1]
    base, members, counters = path[:-1], {path[-1]: scope}, RngCounters()
    counters.children[path[-1]] = scope.rng_counters
    runs = _Built(target, path[-1], ())
  else:  # the target is flax's root
    base, members, counters = (), None, scope.rng_counters
  existing = _read(scope, members)
  call = FlaxCall(runs, method, args, kwargs, existing if initializing else {},
                  counters if native else None)
  if not has_tape_streams(scope.rngs):
    return _run_root(scope, members, base, call, existing, rngs, initializing)
  before = total(counters)
  y = _run_root(scope, members, base, call, existing, rngs, initializing)
  if total(counters) != before:  # flax drew keys; from tape streams they are not flax's
    require_concrete(scope.rngs, scope.path_text)
  return y


def _run_root(scope: Scope, members: Mapping[str, Scope] | None, base: tuple[str, ...],
              call: FlaxCall, existing: dict, rngs: dict, initializing: bool) -> Any:
  """Runs ``call`` through flax's ``init_with_output``/``apply``; writes back what it mutated."""
  if members is None:
    root, method = call.target, _root_method
  else:
    root, method = (_Path(base) if base else _Group()), None
  capture = _capture_filter()
  with flax_nn.override_named_call(False), _our_variable_errors(scope):
    y, out = _run_flax_entry(root, method, scope, call, base, existing, rngs, initializing,
                             capture)
  for col, tree in out.items():
    if scope.is_mutable_collection(col):
      _write(scope, members, col, _at(base, tree))
  return y


# flax's variable errors, and the pattern of each message: (variable, collection, path)
_FLAX_VARIABLE_ERRORS: dict[type[Exception], str] = {
    flax.errors.ScopeCollectionNotFound:
        r'"(?P<name>[^"]*)" from collection "(?P<col>[^"]*)" in "(?P<path>[^"]*)"',
    flax.errors.ScopeVariableNotFoundError:
        r'named "(?P<name>[^"]*)" for collection "(?P<col>[^"]*)" exists in "(?P<path>[^"]*)"',
    flax.errors.ModifyScopeVariableError:
        r'variable "(?P<name>[^"]*)" in "(?P<path>[^"]*)" because collection "(?P<col>[^"]*)"',
    flax.errors.ScopeParamNotFoundError:
        r'parameter named "(?P<name>[^"]*)" in scope "(?P<path>[^"]*)"',
    flax.errors.ScopeParamShapeError:
        r'parameter "(?P<name>[^"]*)" in "(?P<path>[^"]*)", the given initializer is expected '
        r'to generate shape (?P<expected>\([^)]*\)), but the existing parameter it received '
        r'has shape (?P<existing>\([^)]*\))',
}


@contextlib.contextmanager
def _our_variable_errors(scope: Scope):
  """Flax's errors about a missing, read-only or misshapen variable or a missing rng stream,
  as ours (subclasses of flax's).

  Ours say how to fix them and, inside a lifted transform that does not
  return the collection, name the transform (`UnliftedCollectionError`), as
  native modules do.
  """
  try:
    yield
  except flax.errors.InvalidRngError as e:
    found = re.search(r'(?P<module>\S+) needs PRNG for "(?P<name>[^"]*)"', str(e))
    if isinstance(e, LiftError) or found is None:
      raise
    module = None if found['module'] == 'None' else found['module']  # flax's unnamed root
    raise UnknownRngError(found['name'], scope.path_text, scope.rngs, scope_name=module) from e
  except tuple(_FLAX_VARIABLE_ERRORS) as e:
    if isinstance(e, LiftError):
      raise
    pattern = next(p for cls, p in _FLAX_VARIABLE_ERRORS.items() if isinstance(e, cls))
    found = re.search(pattern, str(e))
    if found is None:
      raise
    name, path = found['name'], found['path']
    col = found.groupdict().get('col', 'params')
    scope.check_lifted(col, name)
    if isinstance(e, flax.errors.ScopeParamNotFoundError):
      raise MissingParamError(name, path) from e
    if isinstance(e, flax.errors.ScopeParamShapeError):
      shapes = (ast.literal_eval(found['existing']), ast.literal_eval(found['expected']))
      raise ParamShapeError(name, path, *shapes) from e
    if isinstance(e, flax.errors.ScopeCollectionNotFound):
      raise MissingCollectionError(col, name, path) from e
    if isinstance(e, flax.errors.ScopeVariableNotFoundError):
      raise MissingVariableError(col, name, path) from e
    raise ImmutableCollectionError(col, name, path) from e


def _run_flax_entry(root, method, scope: Scope, call: FlaxCall, base: tuple[str, ...],
                    existing: dict, rngs: dict, initializing: bool, capture) -> tuple[Any, dict]:
  """flax's ``init_with_output`` or ``apply`` of ``root``: ``(y, mutated collections)``."""
  if initializing:
    mutable = to_flax_filter(union_filters(scope.mutable, set(existing)))
    return root.init_with_output(rngs, call, method=method, mutable=mutable,
                                 capture_intermediates=capture)
  variables = {col: _nest(base, tree) for col, tree in existing.items()}
  if scope.mutable is False:
    return root.apply(variables, call, rngs=rngs or None, method=method), {}
  return root.apply(variables, call, rngs=rngs or None, method=method,
                    mutable=to_flax_filter(scope.mutable), capture_intermediates=capture)


def _flatten(wrappers: Sequence[Any]) -> list[Any]:
  return [w for wrapper in wrappers for w in (*_flatten(wrapper.siblings), wrapper)]


def _built(wrappers: Sequence[Any]) -> tuple[_Built, ...]:
  return tuple(_Built(w.module, cast(str, w.name), _built(w.siblings))  # named: bound
               for w in wrappers)


def _read(scope: Scope, members: Mapping[str, Scope] | None) -> dict:
  """The variables flax starts from: ``scope``'s, or each member's under its name."""
  if members is None:
    return {col: copy_structure(tree) for col, tree in scope.variables().items()}
  existing: dict = {}
  for name, member in members.items():
    for col, tree in member.variables().items():
      existing.setdefault(col, {})[name] = copy_structure(tree)
  return existing


def _write(scope: Scope, members: Mapping[str, Scope] | None, col: str, tree: Mapping) -> None:
  if members is None:
    for name, value in tree.items():
      scope.put_variable(col, name, value)
    return
  for member, subtree in tree.items():
    for name, value in subtree.items():
      members[member].put_variable(col, name, value)
