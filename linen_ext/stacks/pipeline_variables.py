"""What a pipelined block writes: variables carried per layer, or created per microbatch.

A layer of the pipeline runs once per microbatch, in microbatch order. A mutable variable
the stack already holds (batch statistics, a counter, a ``sow`` collection passed back in)
is *carried*: each layer's row is updated by that layer's runs one after the other, so the
pipeline leaves what ``fold`` leaves when called on the microbatches in turn. A variable
the block creates (``sow`` into a collection not passed in) comes back per layer and
microbatch: ``[layers, microbatches, ...]``, row ``[i, m]`` what layer i wrote on
microbatch m.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax.core import meta
from flax.traverse_util import flatten_dict, unflatten_dict

from lift.metadata import add_axis

from linen_ext import errors

Path = tuple[str, ...]

_RESHAPED = (
    'Stacked.pipeline: the block changes variable "{name}" of collection "{collection}" '
    '(at "{path}") from {before} to {after}. The pipeline carries each layer\'s row of a '
    'variable the stack holds from one microbatch to the next, so a write must keep its '
    'structure, shape and dtype. Fix: keep them; for a sown collection, leave it out of '
    'the variables given to apply (it then comes back per layer and microbatch, '
    '[layers, microbatches, ...]), or run the stack unpipelined (fold).')


def flat(collections: Any) -> dict[Path, Any]:
  """``{collection: {name: ...}}`` as ``{(collection, name, ...): value}``."""
  return dict(flatten_dict(dict(collections)))


def unflat(variables: dict[Path, Any]) -> dict[str, Any]:
  return unflatten_dict(variables) if variables else {}


def _types(value: Any) -> Any:
  return jax.tree.map(lambda a: f'{a.dtype}[{",".join(map(str, a.shape))}]', value)


@dataclasses.dataclass(frozen=True)
class Writes:
  """The block's writes, sorted: ``carried`` paths, and ``created`` paths."""
  carried: tuple[Path, ...]
  created: tuple[Path, ...]

  def split(self, written: dict[str, Any]) -> tuple[dict[Path, Any], dict[Path, Any]]:
    """A layer's repacked collections as (carried rows, created values)."""
    variables = flat(written)
    return ({p: variables[p] for p in self.carried},
            {p: variables[p] for p in self.created})


def classify(row: dict[Path, Any], written: dict[str, Any]) -> Writes:
  """Sorts one layer's written variables (``written``, from a first trace) by ``row``,
  the layer's variables on entry; a carried one must keep its type."""
  carried, created = [], []
  for path, value in flat(written).items():
    if path not in row:
      created.append(path)
      continue
    if _types(value) != _types(row[path]) or (
        jax.tree.structure(value) != jax.tree.structure(row[path])):  # type: ignore[operator]
      raise errors.PipelineVariablesError(_RESHAPED.format(
          name=path[-1], collection=path[0], path='/'.join(path),
          before=_types(row[path]), after=_types(value)))
    carried.append(path)
  return Writes(tuple(carried), tuple(created))


def returned(carried: dict[Path, Any], created: dict[Path, Any],
             metadata_params: Any) -> dict[str, Any]:
  """The collections to commit: carried ``[layers, ...]``, created ``[layers, M, ...]``,
  with boxes told of the axes (the microbatch axis has no partition name)."""
  unnamed = {meta.PARTITION_NAME: None}
  created = {p: add_axis(add_axis(v, 0, unnamed), 0, metadata_params)
             for p, v in created.items()}
  carried = {p: add_axis(v, 0, metadata_params) for p, v in carried.items()}
  return unflat({**carried, **created})


__all__ = ['Writes', 'classify', 'flat', 'unflat', 'returned']
