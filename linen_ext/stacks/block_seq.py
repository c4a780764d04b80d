"""`BlockSeq`: layers run one after another in Python, with `Stacked`'s interface.

The blocks sit at ``layers_0``, ``layers_1``, ... (the layout `stacked_to_layers`
produces). With ``remat`` each layer runs under the lifted checkpoint with the policy's
``jax.checkpoint`` policy; ``'nested'`` checkpoints groups of layers as the loop engine
does.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

import lift
from lift import loops
from lift.loops.policies import CARRY_NAME, INPUT_NAME, on_this_backend, step_policy

from linen_ext import errors
from linen_ext.transforms.lifting import call_lifted, is_module_class
from linen_ext.module.core import Module
from linen_ext.describe import one_line
from linen_ext.stacks.layout import (LayerArgs, check_rows, layer_name, row, split_layer_args,
                                    stack_trees)
from linen_ext.stacks.stacked import (LayerStack, Remat, check_length, check_remat,
                                      frozen_mapping, step_result)

_BAD_BLOCKS = (
    'BlockSeq: {detail}. Fix: BlockSeq(Block, 4) for 4 layers of one class, or '
    'BlockSeq([Block(), Other()]) for a list of modules (made in setup, or '
    'detached with parent=None).')


def _tag_roots(policy: loops.ScanCheckpointPolicy, carry: Any, rows: Any) -> tuple[Any, Any]:
  """Names a step's roots for an offloading policy, as the loop engine does."""
  if policy.save_carries == 'offload':
    carry = loops.checkpoint_name(carry, CARRY_NAME)
  if policy.save_inputs == 'offload':
    rows = loops.checkpoint_name(rows, INPUT_NAME)
  return carry, rows


def _lifted_checkpoint(policy: loops.ScanCheckpointPolicy, jax_policy: Any):
  return functools.partial(lift.checkpoint, policy=jax_policy, prevent_cse=policy.prevent_cse)


def _checkpointed_layer(block: Module, fn, mode: str, policy, layer_args: LayerArgs,
                        carry: Any, rows: tuple) -> tuple[Any, Any]:
  """One layer under the lifted checkpoint with the policy's ``jax.checkpoint`` policy."""

  def layer(module, carry):
    carry, layer_rows = _tag_roots(policy, carry, rows)
    args, kwargs = layer_args.for_layer(layer_rows)
    return step_result('BlockSeq', mode, carry, fn(module, carry, *args, **kwargs))

  build = _lifted_checkpoint(policy, step_policy(policy))
  return call_lifted('checkpoint', build, layer, block, (carry,), {})


def _segments(length: int, nested: bool | int) -> list[range]:
  """The layers of each outer block of the loop engine's nested plan, in loop order."""
  starts = np.cumsum((0,) + loops.plan_blocks(length, nested).lengths)
  return [range(int(start), int(stop)) for start, stop in zip(starts[:-1], starts[1:])]


class BlockSeq(LayerStack):
  """Layers run one after another in Python, with the interface of `Stacked`.

  ``BlockSeq(Block, 4, block_kwargs=...)`` makes four blocks,
  ``BlockSeq([Block(), Other()])`` takes detached modules (possibly
  heterogeneous); either way the blocks sit at ``layers_0``, ``layers_1``, ...
  (the layout `stacked_to_layers` produces and `scan_layers` runs). With
  ``remat`` each layer runs under the lifted checkpoint with the policy's
  ``jax.checkpoint`` policy; ``'nested'`` (or ``nested=b``) checkpoints groups
  of layers around the checkpointed layers, keeping only the carries that
  enter groups, as the loop engine does.

  Compiles in time linear in the depth: not for many equal blocks, use
  `Stacked` or `scan_layers` there.

  Attributes:
    layers: a Module class (or ``functools.partial`` of one), or a list of detached modules.
    length: the number of layers made of a class (with a list: None or its length).
    remat: checkpoint policy of each layer, as `Stacked`'s.
    block_kwargs: options of the block class.

  Examples:
    >>> class Block(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return x + jnp.tanh(nn.Dense(3)(x))
    >>> variables = nn.BlockSeq(Block, 3, remat=True).init(jax.random.key(0), jnp.ones((2, 3)))
    >>> list(variables['params'])
    ['layers_0', 'layers_1', 'layers_2']
  """
  layers: Any
  length: int | None = None
  remat: Remat = dataclasses.field(default=False, kw_only=True)
  block_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict, kw_only=True)

  def __post_init__(self):
    self._check_layers()
    check_remat(self.remat, self.num_layers)
    object.__setattr__(self, 'block_kwargs',
                       frozen_mapping('BlockSeq', 'block_kwargs', self.block_kwargs))
    super().__post_init__()

  def _check_layers(self):
    if is_module_class(self.layers):
      check_length('BlockSeq', self.length)
      return
    if not isinstance(self.layers, Sequence) or not self.layers or not all(
        isinstance(m, Module) for m in self.layers):
      raise errors.LayerStackError(_BAD_BLOCKS.format(
          detail=f'layers={one_line(self.layers)} is neither a Module class nor a '
          'non-empty list of Modules'))
    if self.length is not None and self.length != len(self.layers):
      raise errors.LayerStackError(_BAD_BLOCKS.format(
          detail=f'length={self.length} but {len(self.layers)} modules were given'))

  @property
  def num_layers(self) -> int:
    if is_module_class(self.layers):
      assert self.length is not None  # __post_init__ checked it
      return self.length
    return len(self.layers)

  def setup(self):
    if is_module_class(self.layers):
      self.blocks = tuple(self.layers(name=layer_name('layers', i), **self.block_kwargs)
                          for i in range(self.num_layers))

  @property
  def _blocks(self) -> tuple[Module, ...]:
    return self.blocks if is_module_class(self.layers) else tuple(self.layers)

  def unstacked(self) -> tuple[Module, ...]:
    """The blocks themselves (bound: calling one runs that layer)."""
    return self._blocks

  def _loop(self, fn: Callable[..., Any], mode: str, x: Any, *args, **kwargs) -> Any:
    layer_args = split_layer_args(args, kwargs)
    check_rows(layer_args, self.num_layers, 'BlockSeq')
    policy = loops.resolve_remat(self.remat)
    if policy is not None:
      policy = on_this_backend(policy)
    if policy is not None and policy.nested and mode != 'vmap':
      carry, outs = self._nested(fn, mode, policy, layer_args, x)
    else:
      carry, outs = self._layers(self._blocks, range(self.num_layers), fn, mode, policy,
                                 layer_args, x)
    if mode == 'fold':
      return carry
    outs = stack_trees(outs)
    return outs if mode == 'vmap' else (carry, outs)

  def _layers(self, blocks, indices: range, fn, mode: str, policy, layer_args: LayerArgs,
              x: Any) -> tuple[Any, list[Any]]:
    carry, outs = x, []
    for i in indices:
      rows = row(layer_args.rows, i)
      if policy is None:
        args, kwargs = layer_args.for_layer(rows)
        result = step_result('BlockSeq', mode, carry, fn(blocks[i], carry, *args, **kwargs))
      else:
        result = _checkpointed_layer(blocks[i], fn, mode, policy, layer_args, carry, rows)
      if mode == 'vmap':
        outs.append(result[0])
      else:
        carry, out = result
        outs.append(out)
    return carry, outs

  def _nested(self, fn, mode: str, policy, layer_args: LayerArgs, x: Any):
    """Groups of layers under a checkpoint that saves nothing, each layer checkpointed inside."""
    build = _lifted_checkpoint(policy, None)
    carry, outs = x, []
    for indices in _segments(self.num_layers, policy.nested):

      def group(seq, carry, indices=indices):
        return seq._layers(seq._blocks, indices, fn, mode, policy, layer_args, carry)

      carry, group_outs = call_lifted('checkpoint', build, group, self, (carry,), {})
      outs.extend(group_outs)
    return carry, outs


__all__ = ['BlockSeq']
