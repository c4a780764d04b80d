"""The arguments of `Stacked.pipeline` besides ``x``.

As in ``fold``, a `per_layer` value gives row i to layer i, and other arguments go to
every layer. An array argument (a mask, positions) is per example, like ``x``: its leading
axis is the batch and splits into the same microbatches, so microbatch m's layers see
its rows of it. Python values (flags, sizes) go whole to every layer and microbatch.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from linen_ext.stacks.layout import LayerArgs, is_row_slot, split_layer_args


def _is_per_example(leaf: Any) -> bool:
  return isinstance(leaf, jax.Array | np.ndarray) and leaf.ndim >= 1


def _name(path: tuple) -> str:
  where = 'args' if path[0].idx == 0 else 'kwargs'
  return f'{where}{jax.tree_util.keystr(path[1:])}'


@dataclasses.dataclass(frozen=True)
class PipelineArgs:
  """A call's arguments as a template, its per-example arrays and its per-layer rows."""
  treedef: Any
  template: tuple  # the flat leaves; None where a per-example array goes
  slots: tuple[int, ...]  # the positions of the per-example arrays among the leaves
  names: tuple[str, ...]  # their names in messages ('args[0]', "kwargs['mask']")

  def for_layer(self, per_example: tuple, rows: tuple) -> tuple[tuple, dict]:
    """One layer's (args, kwargs) on one microbatch: its rows of the per-example arrays
    and of the `per_layer` values."""
    leaves = list(self.template)
    for slot, value in zip(self.slots, per_example):
      leaves[slot] = value
    args, kwargs = jax.tree.unflatten(self.treedef, leaves)
    return LayerArgs(args, kwargs, ()).for_layer(rows)


def split(args: tuple, kwargs: dict) -> tuple[PipelineArgs, tuple, LayerArgs]:
  """``(PipelineArgs, per-example arrays, LayerArgs)`` of a pipeline call (the last holds
  the `per_layer` values as ``.rows``)."""
  layer_args = split_layer_args(args, kwargs)
  flat, treedef = jax.tree_util.tree_flatten_with_path(
      (layer_args.args, layer_args.kwargs), is_leaf=is_row_slot)
  slots = tuple(i for i, (_, leaf) in enumerate(flat) if _is_per_example(leaf))
  template = tuple(None if i in slots else leaf for i, (_, leaf) in enumerate(flat))
  names = tuple(_name(flat[i][0]) for i in slots)
  per_example = tuple(flat[i][1] for i in slots)
  return PipelineArgs(treedef, template, slots, names), per_example, layer_args


__all__ = ['PipelineArgs', 'split']
