"""The `NamedSharding` of every variable of a tree, and initialisation directly sharded.

A variable declared with `nn.with_partitioning` (mesh axis names) or
`nn.with_logical_partitioning` (logical names, mapped by axis rules) is a box
that keeps its names through every lifted transform and layer stack (a stack
adds the name of its layer axis, ``metadata_params={nn.PARTITION_NAME: ...}``).
`variable_shardings` turns a tree of such boxes (variables, their
`jax.eval_shape`, or an optax state made from them) into `NamedSharding`\\ s
for a mesh, checking each against its variable; `init_sharded` creates the
variables directly on the mesh.

>>> abstract = jax.eval_shape(model.init, key, x)
>>> shardings = nn.variable_shardings(abstract, mesh, rules)
>>> opt_shardings = nn.variable_shardings(jax.eval_shape(tx.init, abstract['params']),
...                                       mesh, rules)
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax.core import meta
from flax.linen import LogicallyPartitioned, get_logical_axis_rules, logical_to_mesh_axes
from jax.sharding import NamedSharding, PartitionSpec

from lift import errors
from lift.sharding import check_spec, spec_axes

Rules = Sequence[tuple[str, Any]]


def _is_box(x: Any) -> bool:
  return isinstance(x, meta.AxisMetadata)


def _path_text(path: Any) -> str:
  keys = [getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k))) for k in path]
  return '/'.join(str(k) for k in keys)


def _mesh_spec(path: str, box: meta.Partitioned, rules: Rules | None) -> PartitionSpec:
  """The box's names as mesh axes: through the rules where there are rules (or the box is
  logical), else the names are mesh axes already."""
  if rules is None and isinstance(box, LogicallyPartitioned):
    rules = box.rules if box.rules is not None else ()
  if rules is None:
    return PartitionSpec(*box.names)
  known = {rule[0] for rule in rules}
  for entry in box.names:
    for name in spec_axes(entry):
      if name not in known:
        raise errors.LogicalAxisRuleError(path, name, rules)
  spec = logical_to_mesh_axes(box.names, tuple(rules))
  assert spec is not None  # names is a tuple
  return spec


def _context_rules() -> Rules | None:
  rules = get_logical_axis_rules()
  return tuple(rules) if rules else None


def variable_shardings(tree: Any, mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh,
                       rules: Rules | None = None) -> Any:
  """The `NamedSharding` tree of ``tree``'s variables on ``mesh``.

  ``tree`` holds `nn.Partitioned` / `nn.LogicallyPartitioned` boxes and plain
  leaves: model variables from ``init``, their `jax.eval_shape` (no memory), or
  the state of an optax optimizer initialised from boxed params (its moments
  keep the boxes; counts are plain). A box gets the spec its names give; a
  plain leaf is replicated; ``None`` stays ``None``. The result has the tree's
  structure with boxes removed, as `nn.unbox` gives the values.

  Names are logical (each must have a rule) when ``rules`` is given, when
  `nn.logical_axis_rules` is active, or for a `LogicallyPartitioned` box (its
  own rules); otherwise they are mesh axes.

  Args:
    tree: variables, abstract variables or an optimizer state.
    mesh: the device mesh.
    rules: ``[(logical name, mesh axis | tuple of axes | None), ...]`` in
      Flax's order of precedence; default: the active `nn.logical_axis_rules`.

  Returns:
    A tree of `NamedSharding`, for ``jax.jit(..., in_shardings=..., out_shardings=...)``,
    `jax.device_put` or an orbax restore.

  Raises:
    LogicalAxisRuleError: a logical name has no rule.
    MeshAxisError: a spec names an axis the mesh lacks.
    ShardingShapeError: a dimension does not divide over its mesh axes.

  Examples:
    >>> mesh = jax.make_mesh((1,), ('model',), axis_types=(jax.sharding.AxisType.Auto,))
    >>> init = nn.with_logical_partitioning(nn.initializers.ones, ('embed', 'mlp'))
    >>> dense = nn.Dense(4, kernel_init=init)
    >>> abstract = jax.eval_shape(dense.init, jax.random.key(0), jnp.ones((1, 2)))
    >>> shardings = nn.variable_shardings(abstract, mesh, [('embed', None), ('mlp', 'model')])
    >>> shardings['params']['kernel'].spec
    P(None, 'model')
  """
  rules = tuple(rules) if rules is not None else _context_rules()

  def one(path: Any, leaf: Any) -> NamedSharding | None:
    if leaf is None:
      return None
    if not isinstance(leaf, meta.Partitioned):
      return NamedSharding(mesh, PartitionSpec())
    where = _path_text(path)
    spec = _mesh_spec(where, leaf, rules)
    check_spec(f'variable {where}', leaf.value.shape, spec, mesh)
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, tree, is_leaf=lambda x: x is None or _is_box(x))


def strip_boxes(tree: Any) -> Any:
  """``tree`` with every axis-metadata box replaced by its value, no constraint applied."""
  return jax.tree.map(lambda x: x.value if _is_box(x) else x, tree, is_leaf=_is_box)


def init_sharded(init_fn: Callable[..., Any], *args: Any,
                 mesh: jax.sharding.Mesh, rules: Rules | None = None) -> tuple[Any, Any]:
  """Runs ``init_fn(*args)`` with every variable created directly in its shards.

  The shapes come from `jax.eval_shape` (nothing is allocated), the shardings
  from `variable_shardings`, and ``init_fn`` runs under
  ``jax.jit(..., out_shardings=shardings)``: XLA creates each device's shard on
  that device, so no device ever holds a whole sharded variable.

  Args:
    init_fn: e.g. ``model.init``, or a function returning ``{'params': ...,
      'opt_state': ...}``; its result may hold boxes.
    *args: its arguments (keys, example inputs).
    mesh: the device mesh.
    rules: the logical axis rules (default: the active ones).

  Returns:
    ``(values, shardings)``: the result with boxes removed, laid out on the mesh,
    and its `NamedSharding` tree (reuse it for the training step's
    ``in_shardings``/``out_shardings``).

  Examples:
    >>> mesh = jax.make_mesh((1,), ('model',), axis_types=(jax.sharding.AxisType.Auto,))
    >>> init = nn.with_partitioning(nn.initializers.ones, (None, 'model'))
    >>> dense = nn.Dense(4, kernel_init=init)
    >>> variables, shardings = nn.init_sharded(dense.init, jax.random.key(0), jnp.ones((1, 2)),
    ...                                        mesh=mesh)
    >>> variables['params']['kernel'].sharding.spec
    P(None, 'model')
  """
  shardings = variable_shardings(jax.eval_shape(init_fn, *args), mesh, rules)
  create = jax.jit(lambda *a: strip_boxes(init_fn(*a)), out_shardings=shardings)
  return create(*args), shardings


__all__ = ['init_sharded', 'strip_boxes', 'variable_shardings']
