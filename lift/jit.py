"""Lifted `jit`: one compilation per structure, and the rng keys of the un-jitted program.

A call is keyed by the function and the transform's settings, the static
arguments, the scope structure, each root's mutability, rng stream names and
flags, plus the shapes and dtypes of the variables and dynamic arguments. Rng
counters and scope paths are not part of the key, so repeated calls (and other
scopes with the same structure) reuse the compiled function.

A key drawn inside is ``fold_in(raw, sha1(suffix, counter))``; the counter
changes from call to call and SHA-1 cannot run on a traced value. So the
compiled function takes the hashes as an array, and its streams hand them out
in order as ``fold_in(key, hash)``:

The streams and the hashing live in `lift.jit_keys`.

1. :func:`_trace_first` traces (``jax.jit(...).trace``, no compilation) the
   first call of a structure with zeroed counters and a placeholder hash
   array; the streams record each draw (stream, suffix, counter path below the
   lifted root, relative count) and the counter increments. JAX keeps that
   trace for the call, so the function runs once per structure;
2. ``draw_hashes`` hashes every recorded draw with the absolute count
   (outer count + relative count), on the host;
3. the compiled function runs with those hashes: the keys of the un-jitted
   program;
4. the outer counters advance by the recorded increments.

Code that hashes its own keys while tracing (a wrapped flax layer, which
derives keys from its path in Python; `scan_layers`, which hashes each
layer's draws) cannot draw from a tape: it raises `ConcreteKeysNeeded` in the
first trace. Such a structure is compiled per concrete stream suffixes (part
of the streams' pytree structure) and draw counts (part of the key), with the
streams themselves inside: the un-jitted keys again, at the price of one
compilation per path and count, as Flax's own `jit`.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import numpy as np

from lift import errors
from lift.rng_counters import (CountSnapshot, EMPTY, advance, counter_roots, frozen, measured,
                            snapshot, zeroed)
from lift.jit_keys import (ConcreteKeysNeeded, Draw, Tape, draw_hashes, has_tape_streams,
                            tape_streams)
from lift.checkpoint import check_argnames, check_argnums, check_in_range
from lift.filters import DenyList, Filter, validate_filter
from lift.pack import pack
from lift.scope import Scope

_JIT_COUNTING = '(jit counts the scope as argument 0, as flax.core.lift.jit.)'
_DONATED_STATIC = (
    'jit: argument {index} is in both static_argnums and donate_argnums (or '
    'named in static_argnames). A static argument is a Python value baked into '
    'the compiled function, so there is no buffer to donate. Fix: remove {index} '
    'from one of them.')
_NOT_AN_ARRAY = (
    'jit: {what} of {fn} is {value!r} (type {type}), which is not an array: '
    '{error} Every argument that is not an array (or a pytree of arrays) must '
    'be static. Fix: {fix}.')
_UNHASHABLE = (
    'jit: {what} of {fn} is {value!r}, which is not hashable ({error}). Static '
    'values are part of the compilation cache key. Fix: pass a hashable value '
    '(a tuple instead of a list, a frozen dataclass instead of a dict), or make '
    'the argument dynamic.')
_NO_ACTIVE_CALL = (
    "jit: lift.jit's compiled function was traced outside a call of the lifted "
    'function (for example by lowering it directly). Fix: call the function '
    'returned by lift.jit with a scope.')
_RECORDED_CACHE_SIZE = 4096


# -- the cache key ----------------------------------------------------------------------

class _Config(NamedTuple):
  """What ``lift.jit(...)`` was given; equal configs share compiled functions."""
  fn: Callable[..., Any]
  variables: Filter
  rngs: Filter
  static_positions: frozenset[int]  # positions in args (after the scope)
  static_names: frozenset[str]
  donate_positions: tuple[int, ...]
  device: Any  # jax.jit's device and backend
  backend: str | None


class _RootKey(NamedTuple):
  mutable: Filter
  rngs: tuple[str, ...]
  flags: tuple[tuple[str, Any], ...]


class CallKey(NamedTuple):
  """Everything static about one call: the jit cache key without the array types."""
  config: _Config
  n_args: int
  static_args: tuple[tuple[int, Any], ...]
  static_kwargs: tuple[tuple[str, Any], ...]
  scope_treedef: Any
  scope_paths: tuple[tuple[int, tuple[str, ...]], ...]
  roots: tuple[_RootKey, ...]
  counts: tuple | None = None  # each root's draw counts, where keys are hashed while tracing


class _SplitCall(NamedTuple):
  static_args: tuple[tuple[int, Any], ...]
  static_kwargs: tuple[tuple[str, Any], ...]
  dyn_args: tuple[Any, ...]
  dyn_kwargs: dict[str, Any]


def _name(fn: Any) -> str:
  return getattr(fn, '__qualname__', None) or getattr(fn, '__name__', None) or repr(fn)


def _parameter(fn: Any, index: int) -> str:
  """``fn``'s parameter at ``index`` (the scope is 0) by name where its signature says."""
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    params = []
  positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  if index < len(params) and params[index].kind in positional:
    return repr(params[index].name)
  return str(index)


def _hashable_filter(f: Filter) -> Filter:
  if f is True or f is False or isinstance(f, DenyList):
    return f
  return frozenset({f}) if isinstance(f, str) else frozenset(f)


def _check_hashable(fn, what: str, value: Any):
  try:
    hash(value)
  except TypeError as error:
    raise errors.JitArgumentError(_UNHASHABLE.format(
        what=what, fn=_name(fn), value=value, error=error)) from None


def _split_call(config: _Config, args: tuple, kwargs: dict) -> _SplitCall:
  static_args = tuple((i, args[i]) for i in sorted(config.static_positions) if i < len(args))
  static_kwargs = tuple(sorted((k, v) for k, v in kwargs.items() if k in config.static_names))
  for i, value in static_args:
    _check_hashable(config.fn, f'static argument {_parameter(config.fn, i + 1)}', value)
  for name, value in static_kwargs:
    _check_hashable(config.fn, f'static argument {name!r}', value)
  dyn_args = tuple(a for i, a in enumerate(args) if i not in config.static_positions)
  dyn_kwargs = {k: v for k, v in kwargs.items() if k not in config.static_names}
  return _SplitCall(static_args, static_kwargs, dyn_args, dyn_kwargs)


def _merge_call(key: CallKey, dyn_args: tuple, dyn_kwargs: dict) -> tuple[list, dict]:
  static = dict(key.static_args)
  rest = iter(dyn_args)
  args = [static[i] if i in static else next(rest) for i in range(key.n_args)]
  return args, {**dyn_kwargs, **dict(key.static_kwargs)}


def _roots(scope_tree: Any) -> tuple[list[Scope], Any, list[Scope]]:
  leaves, treedef = jax.tree.flatten(scope_tree, is_leaf=lambda x: isinstance(x, Scope))
  roots: dict[int, Scope] = {}
  for leaf in leaves:
    roots.setdefault(id(leaf.root), leaf.root)
  return leaves, treedef, list(roots.values())


def _call_key(config: _Config, call: _SplitCall, n_args: int, scope_tree: Any) -> CallKey:
  leaves, treedef, roots = _roots(scope_tree)
  index = {id(root): i for i, root in enumerate(roots)}
  paths = tuple((index[id(s.root)], s.path[len(s.root.path):]) for s in leaves)
  root_keys = []
  for root in roots:
    flags = tuple(sorted(root.flags.items()))
    _check_hashable(config.fn, 'a scope flag', flags)
    root_keys.append(_RootKey(_hashable_filter(root.mutable), tuple(sorted(root.rngs)), flags))
  return CallKey(config, n_args, call.static_args, call.static_kwargs, treedef, paths,
                 tuple(root_keys))


def _types(fn, label: str, tree: Any) -> tuple[Any, ...]:
  """Shape, dtype and weak type of every leaf; a non-array leaf is an error naming it."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
  types = []
  for path, leaf in leaves:
    try:
      types.append(jax.typeof(leaf))
    except TypeError as error:
      what = f'{label}{jax.tree_util.keystr(path)}'
      fix = ('list it in static_argnames' if label == 'keyword arguments' else
             'list its position in static_argnums (the scope is 0)')
      raise errors.JitArgumentError(_NOT_AN_ARRAY.format(
          what=what, fn=_name(fn), value=leaf, type=type(leaf).__name__,
          error=error, fix=fix)) from None
  return treedef, tuple(types)


# -- tracing ---------------------------------------------------------------------------------

class _Recorded(NamedTuple):
  """What one structure's call draws, how far it advances each root's counters,
  and the size of the hash array its compiled function takes. ``concrete``: the
  call hashes keys while tracing, so it compiles per suffix and counts instead."""
  draws: tuple[Draw, ...]
  increments: tuple[CountSnapshot, ...]
  pool: int
  concrete: bool = False


class _Call:
  """One call of a lifted jit, as its compiled function's trace sees it."""

  def __init__(self, scope_fn, repack_fn, expected: tuple[Draw, ...] | None):
    self.scope_fn, self.repack_fn, self.expected = scope_fn, repack_fn, expected
    self.recorded: _Recorded | None = None


class _CallStack(threading.local):
  def __init__(self):
    self.calls: list[_Call] = []


_ACTIVE = _CallStack()
_RECORDED: collections.OrderedDict[Any, _Recorded] = collections.OrderedDict()
_POOL_HINT: dict[_Config, int] = {}  # the last hash-array size a config needed


@contextlib.contextmanager
def _active(call: _Call):
  _ACTIVE.calls.append(call)
  try:
    yield
  finally:
    _ACTIVE.calls.pop()


def _jit_body(key: CallKey, variable_groups, rngs, hashes, dyn_kwargs, *dyn_args):
  """The compiled function. ``rngs``: the raw keys, drawn through a tape of
  ``hashes`` from zeroed counters; or, with ``key.counts``, the streams
  themselves, drawn from the current counters."""
  if not _ACTIVE.calls:
    raise errors.LiftError(_NO_ACTIVE_CALL)
  call = _ACTIVE.calls[-1]
  if key.counts is None:
    tape = Tape(_name(key.config.fn), hashes, call.expected)
    rng_groups, counting = tape_streams(rngs, tape), zeroed
  else:
    tape, rng_groups, counting = None, (rngs,), measured
  scope_tree = call.scope_fn(variable_groups, rng_groups)
  args, kwargs = _merge_call(key, dyn_args, dyn_kwargs)
  with counting(counter_roots(scope_tree)) as increments:
    y = key.config.fn(scope_tree, *args, **kwargs)
    out_groups = call.repack_fn(scope_tree)
  if tape is not None:
    tape.check_complete()
    tape.close()
  draws = () if tape is None else tuple(tape.draws)
  call.recorded = _Recorded(draws, tuple(increments), hashes.shape[0])
  return y, out_groups


def _trace_first(key: CallKey, options, scope_fn, repack_fn, dynamic: tuple, pool: int) -> _Recorded:
  """Traces (without compiling) with a placeholder hash array; JAX keeps the trace for the call."""
  variable_groups, rngs, dyn_args, dyn_kwargs = dynamic
  args = (variable_groups, rngs, np.zeros(pool, np.uint32), dyn_kwargs, *dyn_args)
  call = _Call(scope_fn, repack_fn, None)
  with _active(call):
    try:
      _compiled(options).trace(key, *args)
    except ConcreteKeysNeeded:
      return _Recorded((), (), 0, concrete=True)
    if call.recorded is None:  # JAX still had this trace: record with an uncached one
      jax.eval_shape(functools.partial(_jit_body, key), *args)
  assert call.recorded is not None, 'tracing _jit_body records the call'
  return call.recorded


def _record(key: CallKey, options, scope_fn, repack_fn, dynamic: tuple) -> _Recorded:
  if not any(dynamic[1]):  # no rng streams: nothing to draw, the call itself traces
    return _Recorded((), (EMPTY,) * len(key.roots), 0)
  if key.counts is not None:
    return _trace_first(key, options, scope_fn, repack_fn, dynamic, 0)
  pool = _POOL_HINT.get(key.config, 16)
  recorded = _trace_first(key, options, scope_fn, repack_fn, dynamic, pool)
  if len(recorded.draws) > pool:
    pool = 1 << (len(recorded.draws) - 1).bit_length()
    recorded = _trace_first(key, options, scope_fn, repack_fn, dynamic, pool)
  _POOL_HINT[key.config] = pool
  return recorded


def _recorded(key: CallKey, options, scope_fn, repack_fn, dynamic: tuple) -> _Recorded:
  """The draws of ``key``'s structure, from the cache or from a first trace."""
  variable_groups, raw_keys, dyn_args, dyn_kwargs = dynamic
  fn = key.config.fn
  signature = (_types(fn, 'the variables', (variable_groups, raw_keys)),
               _types(fn, 'positional arguments', dyn_args),
               _types(fn, 'keyword arguments', dyn_kwargs))
  cache_key = (key, signature)
  if cache_key in _RECORDED:
    _RECORDED.move_to_end(cache_key)
    return _RECORDED[cache_key]
  recorded = _record(key, options, scope_fn, repack_fn, dynamic)
  _RECORDED[cache_key] = recorded
  if len(_RECORDED) > _RECORDED_CACHE_SIZE:
    _RECORDED.popitem(last=False)
  return recorded


class _JitOptions(NamedTuple):
  donate: tuple[int, ...]  # positions among the dynamic positional arguments
  device: Any
  backend: str | None


@functools.cache
def _compiled(options: _JitOptions) -> jax.stages.Wrapped:
  # Arguments of _jit_body before the dynamic positional ones: key, variables, keys, hashes, kwargs.
  placement: dict[str, Any] = {
      k: v for k, v in (('device', options.device), ('backend', options.backend))
               if v is not None}  # deprecated in jax.jit: passed only when given
  return jax.jit(_jit_body, static_argnums=0, donate_argnums=tuple(5 + i for i in options.donate),
                 **placement)


def _jit_groups(config: _Config, scope_fn, repack_fn, variable_groups, rng_groups,
                *args, **kwargs):
  scope_tree = scope_fn(variable_groups, rng_groups)
  if has_tape_streams(rng_groups):  # already compiled as part of an outer lift.jit
    return config.fn(scope_tree, *args, **kwargs), repack_fn(scope_tree)
  check_in_range('jit', 'donate_argnums', (i + 1 for i in config.donate_positions),
                 len(args) + 1, 'including the scope')
  call = _split_call(config, args, kwargs)
  key = _call_key(config, call, len(args), scope_tree)
  streams = rng_groups[0]
  raw_keys = tuple({name: s.key for name, s in group.items()} for group in streams)
  options = _JitOptions(
      tuple(p - sum(s < p for s in config.static_positions) for p in config.donate_positions),
      config.device, config.backend)
  dynamic = (variable_groups, raw_keys, call.dyn_args, call.dyn_kwargs)
  recorded = _recorded(key, options, scope_fn, repack_fn, dynamic)
  nodes = [root.rng_counters for root in _roots(scope_tree)[2]]
  rngs = raw_keys
  if recorded.concrete:  # compiled for these suffixes (in the streams' treedef) and counts
    key = key._replace(counts=tuple(frozen(snapshot(node)) for node in nodes))
    rngs = streams
    recorded = _recorded(key, options, scope_fn, repack_fn, (variable_groups, rngs) + dynamic[2:])
  hashes = draw_hashes(recorded.draws, streams, nodes, recorded.pool)
  with _active(_Call(scope_fn, repack_fn, recorded.draws)):
    y, out_groups = _compiled(options)(key, variable_groups, rngs, hashes,
                                      call.dyn_kwargs, *call.dyn_args)
  for node, increments in zip(nodes, recorded.increments):
    advance(node, increments)
  return y, out_groups


# -- building -----------------------------------------------------------------------------------

def _positional_names(fn: Callable[..., Any]) -> list[str]:
  """Names of ``fn``'s positional parameters after the scope, where it has them."""
  try:
    parameters = list(inspect.signature(fn).parameters.values())[1:]
  except (TypeError, ValueError):
    return []
  kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  return [p.name for p in parameters if p.kind in kinds]


def _config(fn, variables, rngs, static_argnums, static_argnames, donate_argnums,
            device, backend) -> _Config:
  static_nums = check_argnums('jit', 'static_argnums', static_argnums, _JIT_COUNTING)
  names = set(check_argnames('jit', 'static_argnames', static_argnames))
  donate_nums = check_argnums('jit', 'donate_argnums', donate_argnums, _JIT_COUNTING)
  positional = _positional_names(fn)
  # As jax.jit: a static position also makes its parameter name static, and vice versa.
  positions = {i - 1 for i in static_nums if i > 0}
  positions |= {positional.index(n) for n in names if n in positional}
  names |= {positional[p] for p in positions if p < len(positional)}
  donate = sorted({i - 1 for i in donate_nums if i > 0})
  for p in donate:
    if p in positions:
      raise errors.ArgnumsError(_DONATED_STATIC.format(index=p + 1))
  variables = validate_filter(variables, 'the `variables` of jit')
  rngs = validate_filter(rngs, 'the `rngs` of jit')
  return _Config(fn, _hashable_filter(variables), _hashable_filter(rngs), frozenset(positions),
                 frozenset(names), tuple(donate), device, backend)


def jit(fn: Callable[..., Any], variables: Filter = True, rngs: Filter = True,
        static_argnums: int | Iterable[int] = (), static_argnames: str | Iterable[str] = (),
        donate_argnums: int | Iterable[int] = (), device: Any = None,
        backend: str | None = None) -> Callable[..., Any]:
  """Lifted ``jax.jit`` of ``fn(scope, *args)``.

  Compiles once per distinct (argument shapes and dtypes, static arguments,
  variable structure, mutability, rng streams present); repeated calls, calls
  on other scopes of the same structure, and re-wrapping the same ``fn`` reuse
  the compiled function. Rng streams draw exactly the keys they draw without
  jit, and the counters advance as without jit.

  Args:
    fn: the scope function to compile.
    variables: the collections lifted in and out (default: all).
    rngs: the rng streams available inside (default: all).
    static_argnums: positions of hashable arguments to treat as static, with
      the scope as 0 (as ``flax.core.lift.jit``).
    static_argnames: names of keyword arguments to treat as static.
    donate_argnums: positions (scope = 0) of arguments whose buffers XLA may
      reuse for the outputs.
    device: as ``jax.jit``'s (deprecated there: prefer placing the inputs).
    backend: as ``jax.jit``'s (deprecated there too).

  Not worth it around a function that is already inside another ``lift.jit``:
  there it is inlined.

  Examples:
    >>> def dense(scope, x):
    ...   w = scope.param('w', jax.nn.initializers.lecun_normal(), (x.shape[-1], 2))
    ...   return x @ w
    >>> y, variables = lift.init(jit(dense))(jax.random.key(0), jnp.ones((1, 3)))
    >>> y.shape
    (1, 2)
  """
  config = _config(fn, variables, rngs, static_argnums, static_argnames, donate_argnums,
                   device, backend)
  inner = functools.partial(_jit_groups, config)
  functools.update_wrapper(inner, fn)
  return pack(inner, (variables,), (variables,), (rngs,), name='jit')


__all__ = ['jit', 'CallKey']
