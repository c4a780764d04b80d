"""Layer stacks with one interface: `Stacked` (one loop) and `BlockSeq` (a Python loop,
in `block_seq.py`), whose shared calling interface is `LayerStack` here.

Both take a block class and a number of layers (`BlockSeq` also a list of
blocks) and offer ``fold(x, *args)`` (the block returns the next carry),
``scan(x, *args)`` (it returns ``(carry, out)``; outs are stacked),
``vmap(x, *args)`` (every layer on the same input), ``fold_via(fn)`` and
``scan_via(fn)`` (``fn(block, carry, *args)`` instead of calling the block),
and ``unstacked()``. Arguments go whole to every layer except those wrapped
by `per_layer`, whose row i goes to layer i. ``remat=`` is any value
`lift.loops.resolve_remat` accepts and means the same in both.

`Stacked` keeps one copy of the block whose variables carry a leading layer
axis (the layout of ``nn.scan``/``flax.linen.scan`` with ``variable_axes={True:
0}``) and runs it with `lift.scan`, hence `lift.loops.run_scan`: the block is
traced once whatever the depth. `BlockSeq` keeps blocks at ``layers_0``,
``layers_1``, ... and unrolls; use it for heterogeneous blocks.
`stacked_to_layers`/`layers_to_stacked` convert between the two layouts.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.core import FrozenDict, meta

import lift
from lift import loops

from linen_ext import errors
from linen_ext.transforms.lifting import is_module_class
from linen_ext.module.core import Module
from linen_ext.describe import loop_name, one_line
from linen_ext.stacks.pipeline_run import run_pipeline
from linen_ext.stacks.layout import (LayerArgs, check_rows, layer_name, name_layer_axis,
                                    split_layer_args, stacked_to_layers)

_BAD_BLOCK = (
    '{stack}: block {value} is not a Module class. Fix: pass the class '
    '(or functools.partial of it) and its options as block_kwargs, e.g. '
    '{stack}(Block, 4, block_kwargs={{"features": 8}}).')
_BAD_LENGTH = (
    '{stack}: length={value!r} is not a positive int. Fix: the number of '
    'layers, e.g. {stack}(Block, 4).')
_BAD_MAPPING = (
    '{stack}: {field}={value!r} is not a dict. Fix: e.g. '
    'metadata_params={{nn.PARTITION_NAME: "layers"}}, block_kwargs={{"features": 8}}.')
_CARRY_CHANGED = (
    '{stack} at "{path}": a layer takes the carry {before} and returns {after}. One loop '
    'runs every layer, passing the carry from each to the next, so the block must return '
    'what it takes (the same structure, shapes and dtypes). Fix: make the block keep its '
    "input's type (the same features, `dtype=x.dtype`), or use nn.BlockSeq for layers "
    'that change it.')
_BAD_STEP = (
    '{stack}.{mode}: the block returned {kind}, but {mode} needs {needed}. Fix: '
    'use fold for blocks that return the next carry, scan for blocks that '
    'return (carry, out), or adapt it with fold_via/scan_via(fn).')

Remat = Any  # anything lift.loops.resolve_remat accepts


def frozen_mapping(stack: str, field: str, value: Mapping[Any, Any]) -> FrozenDict:
  # Hashable, so that a stack inside nn.jit can be part of the cache key.
  if not isinstance(value, Mapping):
    raise errors.LayerStackError(_BAD_MAPPING.format(stack=stack, field=field, value=value))
  return value if isinstance(value, FrozenDict) else FrozenDict(dict(value))


def check_remat(remat: Remat, length: int) -> loops.ScanCheckpointPolicy | None:
  """Validates ``remat`` for ``length`` layers when the stack is built."""
  policy = loops.resolve_remat(remat)
  if policy is not None and policy.nested is not True and policy.nested:
    loops.plan_blocks(length, policy.nested)
  return policy


def check_length(stack: str, length: Any) -> int:
  if not isinstance(length, int) or isinstance(length, bool) or length < 1:
    raise errors.LayerStackError(_BAD_LENGTH.format(stack=stack, value=length))
  return length


def _call_block(block: Module, carry: Any, *args, **kwargs) -> Any:
  return block(carry, *args, **kwargs)


def step_result(stack: str, mode: str, carry: Any, result: Any) -> tuple[Any, Any]:
  """``(next carry, out)`` of one layer (fold and vmap have no out); checks its shape."""
  if mode == 'vmap':
    return result, None
  pair = isinstance(result, tuple) and len(result) == 2
  if mode == 'scan' and not pair:
    raise errors.LayerStackError(_BAD_STEP.format(
        stack=stack, mode=mode, kind=f'a {type(result).__name__}',
        needed='a (carry, out) pair'))
  new_carry, out = result if mode == 'scan' else (result, None)
  # jaxlib ships no type stubs: mypy cannot resolve PyTreeDef, nor its comparison.
  if jax.tree.structure(new_carry) != jax.tree.structure(carry):  # type: ignore[operator]
    raise errors.LayerStackError(_BAD_STEP.format(
        stack=stack, mode=mode, kind=f'a carry {jax.tree.structure(new_carry)}',
        needed=f'the structure of its carry, {jax.tree.structure(carry)}'))
  return new_carry, out


# -- Stacked ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _BlockFactory:
  """Makes the block bound to a scope: its variables sit at the scope itself."""
  block_cls: Any
  kwargs: Mapping[str, Any]

  def __call__(self, scope: lift.Scope) -> Module:
    return self.block_cls(parent=scope, **self.kwargs)


def _carry_types(tree: Any) -> Any:
  # Shapes and dtypes, as lax.scan compares them (weak types aside).
  return jax.tree.map(lambda a: f'{jnp.result_type(a).name}{list(np.shape(a))}', tree)


def _scan_step(make_block, fn, mode, layer_args: LayerArgs, scope, carry, rows):
  args, kwargs = layer_args.for_layer(rows)
  stack = loop_name('Stacked', make_block.block_cls)
  new_carry, out = step_result(stack, mode, carry,
                               fn(make_block(scope), carry, *args, **kwargs))
  if _carry_types(new_carry) != _carry_types(carry):
    raise errors.LayerStackError(_CARRY_CHANGED.format(
        stack=stack, path='/' + '/'.join(scope.path), before=_carry_types(carry),
        after=_carry_types(new_carry)))
  return new_carry, out


def _vmap_step(make_block, fn, layer_args: LayerArgs, scope, x, rows):
  args, kwargs = layer_args.for_layer(rows)
  return fn(make_block(scope), x, *args, **kwargs)


class LayerStack(Module):
  """The calling interface `Stacked` and `BlockSeq` share; each defines ``_loop``."""

  def __call__(self, x: Any, *args, **kwargs) -> Any:
    """Same as ``fold``."""
    return self._loop(_call_block, 'fold', x, *args, **kwargs)

  def fold(self, x: Any, *args, **kwargs) -> Any:
    """``x = block_i(x, *args)`` for each layer i; returns the last ``x``."""
    return self._loop(_call_block, 'fold', x, *args, **kwargs)

  def scan(self, x: Any, *args, **kwargs) -> tuple[Any, Any]:
    """``x, out_i = block_i(x, *args)`` for each layer; returns ``(x, outs)`` (outs stacked)."""
    return self._loop(_call_block, 'scan', x, *args, **kwargs)

  def vmap(self, x: Any, *args, **kwargs) -> Any:
    """Every layer on the same ``x``; outputs stacked along a new axis 0."""
    return self._loop(_call_block, 'vmap', x, *args, **kwargs)

  def fold_via(self, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fold`` with ``fn(block, carry, *args) -> carry`` in place of calling the block.

    Examples:
      >>> class Block(nn.Module):
      ...   @nn.compact
      ...   def __call__(self, x):
      ...     return x + nn.Dense(3)(x)
      ...   def scaled(self, x, s):
      ...     return s * self(x)
      >>> stack, x = nn.Stacked(Block, 2), jnp.ones((1, 3))
      >>> bound = stack.bind(stack.init(jax.random.key(0), x))
      >>> bound.fold_via(lambda block, x, s: block.scaled(x, s))(x, 0.5).shape
      (1, 3)
    """
    return functools.partial(self._loop, fn, 'fold')

  def scan_via(self, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``scan`` with ``fn(block, carry, *args) -> (carry, out)``."""
    return functools.partial(self._loop, fn, 'scan')


class Stacked(LayerStack):
  """``length`` copies of a block with stacked variables, run as one loop (`lift.scan`).

  The block's variables get a leading layer axis, at the stack's own path:
  ``Stacked(Block, 4, name='blocks')`` has ``params/blocks/Dense_0/kernel`` of
  shape ``(4, ...)``, as ``nn.scan(Block, variable_axes={True: 0},
  split_rngs={True: True}, length=4)`` and `flax.linen.scan`. Under ``init``
  the variables are created inside the loop, each block running once on its
  carry as in ``apply``, and layer i draws its parameters from
  ``split(key, length)[i]``: the values are those of
  ``jax.vmap(Block().init)(split(key, length))`` (and of `flax.linen.vmap`
  with ``split_rngs``), whichever method runs first. Other streams (dropout)
  draw as in `flax.linen.scan`, in ``init`` as in ``apply``. (`flax.linen.scan`
  also draws its parameters after a first trace of the body, and so gives
  other values for the same key.)
  Block options go in ``block_kwargs`` (the block is constructed inside the
  loop, once); every layer shares them. What differs per layer is a call
  argument wrapped in `per_layer`.

  Attributes:
    block_cls: a Module class (or ``functools.partial`` of one).
    length: the number of layers.
    remat: checkpoint policy of each layer (False, True, 'full', 'nested',
      'offload', 'save_all' or a `lift.loops.ScanCheckpointPolicy`).
    metadata_params: given to axis-metadata boxes for the layer axis, e.g.
      ``{nn.PARTITION_NAME: 'layers'}``. With the name, every variable the stack holds
      carries it on its layer axis: one the block left unboxed is boxed at ``init``
      (unlike `flax.linen.scan`), so that no variable is replicated silently.
    block_kwargs: options of the block class.
    optimize: rewrite the layer loop with `lift.optimize_scans` (True: its cost
      model decides; a sequence of rewrite names: those). Default False.

  Calling the stack is ``fold``. Not for blocks that differ in code or
  variable shapes: use `BlockSeq`.

  Examples:
    >>> class Block(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return x + jnp.tanh(nn.Dense(3)(x))
    >>> stack = nn.Stacked(Block, 4, remat=True)
    >>> y, variables = stack.init_with_output(jax.random.key(0), jnp.ones((2, 3)))
    >>> y.shape, variables['params']['Dense_0']['kernel'].shape   # one kernel per layer
    ((2, 3), (4, 3, 3))
  """
  block_cls: Any
  length: int
  remat: Remat = dataclasses.field(default=False, kw_only=True)
  metadata_params: Mapping[Any, Any] = dataclasses.field(default_factory=dict, kw_only=True)
  block_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict, kw_only=True)
  optimize: Any = dataclasses.field(default=False, kw_only=True)

  def __post_init__(self):
    if not is_module_class(self.block_cls):
      raise errors.LayerStackError(_BAD_BLOCK.format(stack='Stacked',
                                                     value=one_line(self.block_cls)))
    check_remat(self.remat, check_length('Stacked', self.length))
    object.__setattr__(self, 'metadata_params',
                       frozen_mapping('Stacked', 'metadata_params', self.metadata_params))
    object.__setattr__(self, 'block_kwargs',
                       frozen_mapping('Stacked', 'block_kwargs', self.block_kwargs))
    super().__post_init__()

  def vmap(self, x: Any, *args, **kwargs) -> Any:
    """Every layer on the same ``x``, in parallel; outputs stacked along a new axis 0."""
    return self._vmapped(_call_block, x, self._layer_args(args, kwargs))

  def pipeline(self, x: Any, *args, stages: int, microbatches: int, schedule: str = 'gpipe',
               repeats: int = 1, mesh_axis: str | None = None, **kwargs) -> Any:
    """``fold(x, *args, **kwargs)`` as a pipeline of ``stages`` stages, ``microbatches``.

    The batch (leading axis of ``x``) splits into ``microbatches`` that flow through the
    stages, one stage per tick, in ``microbatches * repeats + stages - 1`` ticks;
    notes/0006-pipeline.md gives the schedule. Values, gradients and rng draws (dropout)
    are those of ``fold`` on the whole batch. Arguments: `per_layer` values give row i to
    layer i; arrays are per example like ``x`` (split into the same microbatches); Python
    values go to every layer as they are. Under ``'gpipe'`` the variables are
    the stack's own (a checkpoint moves between the two unchanged); under
    ``'circular'`` (``repeats`` groups of layers per stage) they are stored in the order
    of `circular_order` (convert with `stacked_to_circular` / `circular_to_stacked`).
    ``remat`` applies to each tick. ``mesh_axis``: the mesh axis the stage axis is
    sharded over (its size must be ``stages``): name the layer axis of the variables
    for it with ``metadata_params``. Under ``init`` the stack runs as ``fold``.
    Mutable collections: a variable the stack holds (batch statistics) is updated by
    each layer's microbatches in turn, as by ``fold`` on each microbatch in turn; one
    the block creates (``sow``) comes back as ``[layers, microbatches, ...]``.

    Examples:
      >>> class Block(nn.Module):
      ...   @nn.compact
      ...   def __call__(self, x):
      ...     return x + jnp.tanh(nn.Dense(3)(x))
      >>> stack, x = nn.Stacked(Block, 4), jnp.ones((8, 3))
      >>> variables = stack.init(jax.random.key(0), x)
      >>> y = stack.apply(variables, x, stages=2, microbatches=4, method='pipeline')
      >>> bool(jnp.allclose(y, stack.apply(variables, x), atol=1e-6))
      True
    """
    return run_pipeline(self, x, args, kwargs, stages=stages, microbatches=microbatches,
                        schedule=schedule, repeats=repeats, mesh_axis=mesh_axis)

  def unstacked(self) -> tuple[Module, ...]:
    """Read-only per-layer views: layer i's block bound to row i of the variables.

    For inspection and debugging; writes to a view do not reach the stack.
    """
    variables = stacked_to_layers(self.variables, metadata_params=self.metadata_params)
    detached = self.block_cls(parent=None, **self.block_kwargs)
    return tuple(
        detached.bind({col: tree[layer_name('layers', i)] for col, tree in variables.items()})
        for i in range(self.length))

  def _factory(self) -> _BlockFactory:
    return _BlockFactory(self.block_cls, self.block_kwargs)

  def _layer_args(self, args: tuple, kwargs: dict) -> LayerArgs:
    layer_args = split_layer_args(args, kwargs)
    check_rows(layer_args, self.length, 'Stacked')
    return layer_args

  def _name_layer_axis_at_init(self) -> None:
    """Under ``init`` with the layer axis named in ``metadata_params``, every variable the
    stack holds carries that name (`name_layer_axis`); sown values are left as they are."""
    name = self.metadata_params.get(meta.PARTITION_NAME)
    if name is None or not self.is_initializing():
      return
    for col, tree in self.variables.items():
      if col != 'intermediates' and self.is_mutable_collection(col):
        for key, value in tree.items():
          self.put_variable(col, key, name_layer_axis(value, name))

  def _vmapped(self, fn: Callable[..., Any], x: Any, layer_args: LayerArgs) -> Any:
    step = functools.partial(_vmap_step, self._factory(), fn, layer_args)
    mapped = lift.vmap(step, variable_axes={True: 0}, split_rngs={True: True},
                       in_axes=(None, 0), axis_size=self.length,
                       metadata_params=self.metadata_params,
                       _name=loop_name('Stacked', self.block_cls))
    out = mapped(self._bound_scope('Calling Stacked'), x, layer_args.rows)
    self._name_layer_axis_at_init()
    return out

  def _loop(self, fn: Callable[..., Any], mode: str, x: Any, *args, **kwargs) -> Any:
    layer_args = self._layer_args(args, kwargs)
    step = functools.partial(_scan_step, self._factory(), fn, mode, layer_args)
    loop = lift.scan(step, variable_axes={True: 0}, split_rngs={True: True},
                     length=self.length, metadata_params=self.metadata_params,
                     remat=self.remat, optimize=self.optimize, _draw_once='params',
                     _name=loop_name('Stacked', self.block_cls))
    carry, outs = loop(self._bound_scope(f'Calling Stacked.{mode}'), x, layer_args.rows)
    self._name_layer_axis_at_init()
    return carry if mode == 'fold' else (carry, outs)


__all__ = ['Stacked', 'check_remat']
