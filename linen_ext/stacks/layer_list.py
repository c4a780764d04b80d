"""`scan_layers`: a Python list of equal submodules run as one compiled loop.

``scan_layers(self.layers, x)`` replaces ``for layer in self.layers: x =
layer(x)`` where ``self.layers = [Block() for _ in range(n)]`` (variables at
``layers_0``, ``layers_1``, ...). It is a client of `lift.pack` over the
layers' scopes:

1. the layers are checked to match (variables: names, shapes, dtypes; code:
   class and fields), and their variables are stacked along a new axis 0;
2. the rng draws of one layer are recorded by tracing it once abstractly
   (``jax.eval_shape``), and their hashes are computed on the host for every
   layer at its own path and counters (as `lift.jit` does), so each layer
   draws exactly the keys it draws in the Python loop;
3. `lift.loops.run_scan` runs layer 0's code once per layer: each step
   rebuilds layer 0 on a scope holding that layer's slice of the variables
   and its hashes, and returns what the layer created or updated;
4. each layer's slice of those outputs is committed to its own scope.

A wrapped flax layer that draws rng keys in the loop is a `LayerStackError`:
flax derives its keys from each layer's own path in Python, which the loop
cannot follow (native layers such as `nn.Dropout` draw as in the Python loop).

A module that every layer holds as a field but that lives outside the layers
(``Layer(self.shared)`` in the parent's ``setup``) is lifted too: each step
reads its variables whole, and its gradient sums every layer's. It is
read-only in the loop: a write or an rng draw below it is a `LayerStackError`.

Under ``init`` the layers run one after another instead (the Python loop):
their variables do not exist yet, and this gives exactly the loop's values
and rng draws, wrapped flax layers included. Gradients reach each layer's own
variables through the stacking.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from lift import errors as lift_errors
from lift import loops
from lift.rng_counters import advance, zeroed
from lift.jit_keys import (ConcreteKeysNeeded, Tape, draw_hashes, require_concrete,
                             tape_streams)
from lift.loops.stacking import stack_rows, unstack_rows
from lift.pack import pack
from lift.rng import RngCounters

from linen_ext import errors
from linen_ext.module.core import Module, map_modules
from linen_ext.describe import loop_name, one_line
from linen_ext.stacks.layout import (LayerArgs, check_rows, check_same_code,
                                    check_same_variables, row, split_layer_args,
                                    stack_trees)
from linen_ext.stacks.stacked import check_remat

_NOT_LAYERS = (
    'scan_layers: layers={value} is not a list of bound modules '
    '({reason}). Fix: define them in setup, self.layers = [Block() for _ in '
    'range(n)], and call scan_layers(self.layers, x) from a method of that module.')
_SHARED_LAYER = (
    'scan_layers: layers {first} and {second} are the same module (at {path}), '
    'so they share variables. scan_layers stacks the variables of distinct '
    'layers. Fix: call the shared module in a Python loop, or create one '
    'module per layer.')
_CARRY_CHANGED = (
    'scan_layers: a layer returns {after} for input {before}; one loop runs the '
    'layers, so each must return what it takes (same structure, shapes and '
    'dtypes). Fix: make the layer keep its input type (e.g. dtype=x.dtype), or '
    'call the layers in a Python loop.')
_SHARED_MODULE_WRITES = (
    'scan_layers: the module at {path}, which every layer holds as a field, {what} '
    'inside the loop. scan_layers gives a module shared by the layers its '
    'variables read-only and no rng streams. Fix: call it outside scan_layers and '
    'pass its result to the layers, or call the layers in a Python loop.')
_FLAX_LAYER_DRAWS = (
    'scan_layers: the wrapped flax layer at {path} draws rng keys inside the loop. '
    'Flax derives its keys in Python from each layer\'s own path, which one loop '
    'running layer 0\'s code cannot reproduce. Fix: use the native layer '
    '(nn.Dropout rather than nn.from_flax(flax.linen.Dropout(...))), or call the '
    'layers in a Python loop.')


def _check_layers(layers: Any) -> tuple[Module, ...]:
  if not isinstance(layers, Sequence) or isinstance(layers, (str, bytes)):
    raise errors.LayerStackError(_NOT_LAYERS.format(value=one_line(layers),
                                                    reason='not a list'))
  for layer in layers:
    if not isinstance(layer, Module) or layer.scope is None:
      raise errors.LayerStackError(_NOT_LAYERS.format(
          value=one_line(layers), reason=f'{one_line(layer, 40)} is not a bound Module'))
  seen: dict[Any, int] = {}
  for i, layer in enumerate(layers):
    first = seen.setdefault(layer.scope.identity, i)
    if first != i:
      raise errors.LayerStackError(_SHARED_LAYER.format(
          first=first, second=i, path=layer.scope.path_text))
  return tuple(layers)


class LayerInputs(NamedTuple):
  """What each step of the loop reads: one layer's slice of each."""
  variables: dict[str, Any]  # the layer's variables, {collection: tree}
  keys: dict[str, Any]  # the raw key of each rng stream
  hashes: Any  # uint32[draws]: the hash folded into the raw key at each draw
  rows: tuple  # the per_layer arguments


@dataclasses.dataclass(eq=False)  # lax.scan hashes its body
class _LayerStep:
  """One layer: layer 0's code on a scope holding that layer's variables and rng hashes."""
  first: Module
  layer_args: LayerArgs
  scope_fn: Any
  repack_fn: Any
  layers: int
  counters: RngCounters  # layer 0's counter node, which the inner scope shares
  shared: tuple[Module, ...]  # modules outside the layers that every layer holds
  shared_variables: tuple[dict, ...]  # their variables, read by every step whole
  draws: list | None = None  # None: this trace records them
  recorded: tuple = ()  # (draws, counter increments) of the last trace

  def __call__(self, carry: Any, x: LayerInputs) -> tuple[Any, dict[str, Any]]:
    tape = Tape('scan_layers', x.hashes, self.draws)
    empty: tuple[dict, ...] = ({},) * (self.layers - 1)
    no_rngs: tuple[dict, ...] = ({},) * len(self.shared)
    with zeroed([self.counters]) as increments:
      scopes, shared_scopes = self.scope_fn(
          ((x.variables,) + empty + self.shared_variables,),
          ((tape_streams([x.keys], tape)[0][0],) + empty + no_rngs,))
      layer = self.first.clone(parent=scopes[0], _deep_clone=_rebound(self.shared, shared_scopes))
      args, kwargs = self.layer_args.for_layer(x.rows)
      with _read_only(self.shared), _flax_draws_refused():
        carry = layer(carry, *args, **kwargs)
      out = self.repack_fn((scopes, shared_scopes))[0][0]
      tape.check_complete()
    self.recorded = (tape.draws, increments[0])
    return carry, out


def _rebound(shared: Sequence[Module], scopes: Sequence[Any]) -> dict[int, Module]:
  """The deep clone's cache: each shared module bound to its read-only inner scope."""
  for scope in scopes:
    scope.mutable = False
  return {module._id: module.clone(parent=scope) for module, scope in zip(shared, scopes)}


@contextlib.contextmanager
def _read_only(shared: Sequence[Module]):
  """Turns a write or a draw below a shared module's path into a `LayerStackError`."""
  try:
    yield
  except (lift_errors.ImmutableCollectionError, lift_errors.UnknownRngError) as e:
    where = _names(e.path)
    for module in shared:
      assert module.scope is not None  # shared modules are bound
      path = module.scope.path
      if where[:len(path)] == path:
        what = (f'draws from rng stream "{e.rng_name}"' if hasattr(e, 'rng_name')
                else f'writes variable "{e.name}" of collection "{e.collection}"')
        raise errors.LayerStackError(_SHARED_MODULE_WRITES.format(
            path='/' + '/'.join(path), what=what)) from e
    raise


@contextlib.contextmanager
def _flax_draws_refused():
  """Turns a wrapped flax layer's draw (its keys follow each layer's path) into an error."""
  try:
    yield
  except ConcreteKeysNeeded as e:
    raise errors.LayerStackError(_FLAX_LAYER_DRAWS.format(path=e.where)) from None


def _names(path_text: str) -> tuple[str, ...]:
  """``('a', 'b')`` from an error's scope path: ``'/a/b'``, ``'scan(/a/b)'`` or
  ``'/a/b (in nn.scan_layers(Block))'`` (see `lift.Scope.path_text`)."""
  path_text = path_text.split(' (in ', 1)[0]
  if path_text.endswith(')') and '(' in path_text:
    path_text = path_text[path_text.index('(') + 1:-1]
  return tuple(name for name in path_text.split('/') if name)


def _shared_modules(layer: Module) -> tuple[Module, ...]:
  """The bound modules among the layer's fields that live outside it (shared by the layers)."""
  found: dict[int, Module] = {}
  own = layer._bound_scope('Calling scan_layers').path

  def visit(_, sub):
    path = None if sub.scope is None else sub.scope.path
    if path is not None and path[:len(own)] != own and own[:len(path)] != path:
      found.setdefault(sub._id, sub)  # neither inside the layer nor one of its ancestors
    return sub

  for field in dataclasses.fields(layer):
    if field.init and field.name not in ('parent', 'name'):
      map_modules(visit, getattr(layer, field.name))
  return tuple(found.values())


def _step_shapes(tree: Any) -> Any:
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[1:], a.dtype), tree)


def _layer_hashes(draws: list, layer_rngs: Sequence[dict], counters: Sequence[RngCounters]):
  """``uint32[layers, draws]``: each draw's hash at each layer's stream suffix and counters."""
  return np.stack([draw_hashes(draws, [rngs], [node], len(draws))
                   for rngs, node in zip(layer_rngs, counters)])


def _check_carry(x: Any, out: Any):
  types = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), tree)
  if types(x) != types(out):
    raise errors.LayerStackError(_CARRY_CHANGED.format(before=types(x), after=types(out)))


def _loop_groups(first: Module, shared: tuple[Module, ...], layer_args: LayerArgs, remat: Any,
                 counters: list, scope_fn, repack_fn, variable_groups, rng_groups, x):
  """The `pack` client: stack, record the draws, run the loop, hand each layer its slice."""
  (variables,), (rngs,) = variable_groups, rng_groups
  n = len(counters)
  layer_variables, layer_rngs = variables[:n], rngs[:n]
  step = _LayerStep(first, layer_args, scope_fn, repack_fn, n, counters[0], shared,
                    tuple(variables[n:]))
  keys = stack_trees([{name: s.key for name, s in rngs.items()} for rngs in layer_rngs])
  xs = LayerInputs(stack_rows(layer_variables), keys, np.zeros((n, 1), np.uint32),
                   layer_args.rows)
  carry_shape, _ = jax.eval_shape(step, x, _step_shapes(xs))
  _check_carry(x, carry_shape)
  step.draws, increments = step.recorded
  if step.draws:  # hashed per layer here: lift.jit must give concrete suffixes and counts
    require_concrete(rng_groups)
  xs = xs._replace(hashes=_layer_hashes(step.draws, layer_rngs, counters))
  carry, outs = loops.run_scan(step, x, xs, remat=remat)
  for node in counters:
    advance(node, increments)
  rows = unstack_rows(outs) if jax.tree.leaves(outs) else [outs] * n  # no leaves: no axis
  return carry, (tuple(rows) + ({},) * len(shared),)


def _unrolled(layers: tuple[Module, ...], layer_args: LayerArgs, x: Any) -> Any:
  for i, layer in enumerate(layers):
    args, kwargs = layer_args.for_layer(row(layer_args.rows, i))
    x = layer(x, *args, **kwargs)
  return x


def scan_layers(layers: Sequence[Module], x: Any, *args, remat: Any = False, **kwargs) -> Any:
  """Runs ``for layer in layers: x = layer(x, *args)`` as one loop over stacked variables.

  The layers (equal submodules, ``self.layers = [Block() for _ in range(n)]``
  in ``setup``; none returns ``x``) keep their variables (``layers_0``, ...);
  each call stacks them, traces layer 0 once and writes back what the layers
  create or update. Values, gradients and rng draws are the Python loop's;
  compile time no longer grows with depth. ``init`` runs the Python loop.

  Args:
    layers: the bound submodules, all of one class with equal fields and
      variables of equal names, shapes and dtypes.
    x: the carry; each layer returns the next one (same shapes).
    *args (Any): go whole to every layer (keyword arguments too); `per_layer`
      values row by row.
    remat: checkpoint policy of each layer, as `lift.loops.run_scan`.

  A module shared by the layers (a field of each, bound outside them) is
  read by every step; it may not write variables or draw rng keys there.

  Raises:
    LayerMismatchError: two layers differ in variables (the message names the
      layer index, the variable path and both shapes) or in class or fields.
    LayerStackError: a shared module writes or draws inside the loop, a layer
      changes the carry's type, or layers are not a list of bound modules.

  Not for layers that differ: keep the Python loop or use `BlockSeq`.

  Examples:
    >>> class Block(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return x + jnp.tanh(nn.Dense(3)(x))
    >>> class Model(nn.Module):
    ...   def setup(self):
    ...     self.layers = [Block() for _ in range(3)]
    ...   def __call__(self, x):
    ...     return nn.scan_layers(self.layers, x, remat=True)
    >>> model, x = Model(), jnp.ones((2, 3))
    >>> variables = model.init(jax.random.key(0), x)
    >>> list(variables['params']), model.apply(variables, x).shape
    (['layers_0', 'layers_1', 'layers_2'], (2, 3))
  """
  layers = _check_layers(layers)
  layer_args = split_layer_args(args, kwargs)
  check_rows(layer_args, len(layers), 'scan_layers')
  if not layers:  # a loop over no layers returns its carry, as PyTorch/XLA's scan_layers
    loops.resolve_remat(remat)
    return x
  check_remat(remat, len(layers))
  if layers[0].is_initializing():
    check_same_code(layers, 'scan_layers')
    return _unrolled(layers, layer_args, x)
  check_same_variables([layer.variables for layer in layers], 'scan_layers')
  check_same_code(layers, 'scan_layers')
  counters = [layer._bound_scope('Calling scan_layers').rng_counters for layer in layers]
  shared = _shared_modules(layers[0])
  core = functools.partial(_loop_groups, layers[0], shared, layer_args, remat, counters)
  return pack(core, (True,), (True,), (True,), name=loop_name('scan_layers', type(layers[0])))(
      ([layer.scope for layer in layers], [module.scope for module in shared]), x)


__all__ = ['scan_layers']
