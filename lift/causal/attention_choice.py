"""Which form `causal_self_attention` computes, and where the flash kernel runs.

With ``implementation=None`` the attention is the Pallas flash kernel when all of these
hold, and the XLA form otherwise (never an error):

- the target is a TPU: the devices of the mesh in context (`jax.set_mesh`,
  `jax.sharding.use_mesh`, `jax.sharding.use_abstract_mesh`; an abstract TPU mesh
  compiled for ahead of time on a CPU counts), else `jax.default_backend()`;
- the kernel takes the shapes: a length that is a multiple of 128 (its blocks hold 128
  to 512 positions) and features under 128 or a multiple of 128;
- under a mesh whose axes of more than one device are not all manual, the kernel can run
  per shard (`jax.shard_map`: XLA cannot split a kernel call itself, and gathering
  every shard onto each chip would hold the whole batch): on ``mesh_axes`` when given,
  else on the mesh axes the logical axis rules in context
  (`flax.linen.logical_axis_rules`) give to the names ``('batch', 'length', 'heads',
  'kv')``, with the length and features unsharded and the batch and heads dividing.

``implementation='flash'`` forces the kernel (placed by the same rule when it can be,
else run on the whole arrays); ``'xla'`` forces the XLA form. `choose_attention` says
which form a call would take, and why.
"""
import math
from typing import Any, NamedTuple

import jax
from flax.core import spmd
from jax.sharding import PartitionSpec

KERNEL_BLOCK = 128
LOGICAL_NAMES = ('batch', 'length', 'heads', 'kv')


class AttentionChoice(NamedTuple):
  """The form a `causal_self_attention` call computes.

  Attributes:
    implementation: ``'flash'`` or ``'xla'``.
    mesh_axes: the mesh axes of ``[batch, length, heads, features]`` the kernel runs on,
      one shard per device; ``None``: the whole arrays.
    reason: why, in words.

  Examples:
    >>> x = jax.ShapeDtypeStruct((2, 128, 4, 16), jnp.float32)
    >>> lift.choose_attention(x, x, implementation='flash')
    AttentionChoice(implementation='flash', mesh_axes=None, reason="implementation='flash', on the whole arrays (no mesh axis splits them)")
  """
  implementation: str
  mesh_axes: tuple | None
  reason: str


def target_platform() -> str:
  """The platform a computation traced now compiles for: the mesh's in context, else the
  default backend's."""
  mesh = jax.sharding.get_abstract_mesh()
  device = getattr(mesh, 'abstract_device', None)
  if not mesh.empty and device is not None:
    return device.platform
  return jax.default_backend()


def _kernel_refuses(shape: tuple[int, ...]) -> str | None:
  length, features = shape[-3], shape[-1]
  if length % KERNEL_BLOCK:
    return f'the length {length} is not a multiple of {KERNEL_BLOCK}'
  if features > KERNEL_BLOCK and features % KERNEL_BLOCK:
    return f'the features {features} are over {KERNEL_BLOCK} and not a multiple of it'
  return None


def _split_axes() -> tuple[str, ...]:
  """The axes of the mesh in context that split the arrays: more than one device, and
  not manual (inside `shard_map` the arrays are already the shard)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return ()
  manual = set(mesh.manual_axes)
  return tuple(name for name, size in mesh.shape.items() if size > 1 and name not in manual)


def _entry_axes(entry) -> tuple[str, ...]:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _from_rules() -> tuple | None:
  """The rules' mesh axes of `LOGICAL_NAMES` (each name's first rule, as Flax reads
  them; `flax.linen.spmd` itself is not for this package to import)."""
  rules = spmd.get_logical_axis_rules()
  if not rules:
    return None
  first: dict[str, object] = {}
  for name, axes in rules:
    first.setdefault(name, axes)
  return tuple(first.get(name) for name in LOGICAL_NAMES)


def _placeable(mesh_axes: tuple, q_shape, k_shape) -> bool:
  """Whether the kernel can run on ``mesh_axes``'s shards of ``q`` and ``k``."""
  mesh = jax.sharding.get_abstract_mesh()
  if len(mesh_axes) != 4 or mesh_axes[1] or mesh_axes[3]:
    return False
  if any(a not in mesh.axis_names for e in mesh_axes for a in _entry_axes(e)):
    return False
  ways = [math.prod(mesh.shape[a] for a in _entry_axes(e)) for e in mesh_axes]
  batch = math.prod(q_shape[:-3])
  return batch % ways[0] == 0 and q_shape[-2] % ways[2] == 0 and k_shape[-2] % ways[2] == 0


def _placement(q_shape, k_shape, mesh_axes) -> tuple[tuple | None, str]:
  """Where the kernel runs: given axes, the rules' axes, or the whole arrays (``None``
  with the reason when the mesh splits the arrays and no placement fits)."""
  if mesh_axes is not None:
    return tuple(mesh_axes), 'per shard on the mesh_axes given'
  if not _split_axes():
    return None, 'on the whole arrays (no mesh axis splits them)'
  derived = _from_rules()
  if derived is None:
    return None, (f'the mesh splits the arrays over {_split_axes()} and no logical axis '
                  f'rules name {LOGICAL_NAMES} to place the kernel per shard')
  if not _placeable(derived, q_shape, k_shape):
    return None, (f'the logical axis rules place {LOGICAL_NAMES} on {derived}, which the '
                  'kernel cannot run on (length or features sharded, or a size that does '
                  'not divide)')
  return derived, f'per shard on {derived} (the logical axis rules of {LOGICAL_NAMES})'


def choose_attention(q: Any, k: Any, implementation: str | None = None,
                     mesh_axes: PartitionSpec | tuple | None = None) -> AttentionChoice:
  """Which form `causal_self_attention` computes for these arguments, here and now.

  Args:
    q: the queries (an array or anything with a ``shape``).
    k: the keys.
    implementation: as `causal_self_attention` takes it.
    mesh_axes: as `causal_self_attention` takes it.

  Returns:
    An `AttentionChoice`: the form, the kernel's placement and the reason.

  Examples:
    >>> x = jax.ShapeDtypeStruct((2, 128, 4, 16), jnp.float32)
    >>> choose_attention(x, x).implementation  # on a CPU
    'xla'

  Not for forcing a form: pass ``implementation=`` to `causal_self_attention`.
  """
  q_shape, k_shape = tuple(q.shape), tuple(k.shape)
  if implementation == 'xla':
    return AttentionChoice('xla', None, "implementation='xla'")
  if implementation == 'flash':
    axes, where = _placement(q_shape, k_shape, mesh_axes)
    if axes is None and _split_axes():
      where = 'on the whole arrays'
    return AttentionChoice('flash', axes, f"implementation='flash', {where}")
  platform = target_platform()
  if platform != 'tpu':
    return AttentionChoice('xla', None, f'the target is {platform}, not a TPU')
  refused = _kernel_refuses(q_shape)
  if refused:
    return AttentionChoice('xla', None, f'the flash kernel cannot take it: {refused}')
  axes, where = _placement(q_shape, k_shape, mesh_axes)
  if axes is None and _split_axes():
    return AttentionChoice('xla', None, where)
  return AttentionChoice('flash', axes, f'the target is a TPU: the flash kernel, {where}')


__all__ = ['AttentionChoice', 'KERNEL_BLOCK', 'LOGICAL_NAMES', 'choose_attention',
           'target_platform']
