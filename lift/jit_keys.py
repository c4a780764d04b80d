"""Rng streams inside `lift.jit`: draws are recorded in a structure's first trace
and replayed, with hashes computed on the host, in every later call.

A key drawn without jit is ``fold_in(raw, h(suffix ‖ count))`` with ``h`` the
first 4 bytes of SHA-1 (see `lift.rng.fold_in_static`). Inside a compiled
function neither the lifted stream's suffix nor its counter is known (they
differ from call to call), so a :class:`TapeStream` asks its :class:`Tape` for
the hash of each draw, in order; :func:`draw_hashes` computes them outside.
"""
from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from lift import errors
from lift.rng_counters import count_at
from lift.rng import Foldable, RngStream

_REPLAY_MISMATCH = (
    'jit: {fn} drew rng keys differently in two traces of the same structure: '
    'draw {index} was {expected} in the first trace and is {seen} now. lift.jit '
    'learns the draws once per structure (argument shapes and dtypes, static '
    'arguments, variable structure, mutability, rng streams, flags) and replays '
    'them; draws that depend on anything else (a global, a Python random choice) '
    'cannot be replayed. Fix: make that value a static argument '
    '(static_argnums/static_argnames), or decide it outside the jitted function.')


class ConcreteKeysNeeded(Exception):
  """Raised while `lift.jit` traces on tape streams by code that hashes its own draws.

  Flax's scopes (and `scan_layers`' per-layer hashes) derive keys from a
  stream's suffix and counts in Python, which the tape does not know. `lift.jit`
  catches it and compiles that structure for the concrete suffixes and counts.
  ``where`` is the path of the code that drew, for error messages.
  """

  def __init__(self, where: str = ''):
    super().__init__(where)
    self.where = where


def require_concrete(streams: Any, where: str = '') -> None:
  """Raises `ConcreteKeysNeeded` (drawn at ``where``) if any stream in ``streams`` is a tape stream."""
  if has_tape_streams(streams):
    raise ConcreteKeysNeeded(where)


class _OuterSuffix:
  """Stands for the lifted stream's suffix, which is only known at call time."""

  def __repr__(self):
    return ('<suffix of a lift.jit stream: to change a stream\'s key inside jit use '
            'dataclasses.replace(stream, key=...), which keeps its type>')


_OUTER = _OuterSuffix()


def static_hash(data: Sequence[Foldable]) -> int:
  """The 32-bit value ``lift.rng.fold_in_static`` folds in: the first 4 bytes of SHA-1.

  >>> static_hash(('dense', 1)) < 2 ** 32
  True
  """
  digest = hashlib.sha1()
  for item in data:
    if isinstance(item, str):
      digest.update(item.encode('utf-8'))
    else:
      digest.update(item.to_bytes((item.bit_length() + 7) // 8, 'big'))
  return int.from_bytes(digest.digest()[:4], 'big')


class Draw(NamedTuple):
  """One ``make_rng`` inside a jitted function."""
  root: int
  stream: str
  suffix: tuple[Any, ...]  # may hold _OUTER, the lifted stream's own suffix
  node: tuple[str, ...]  # counter path below the lifted root
  # Relative to the counter when the call starts. A field may shadow tuple.count.
  count: int  # type: ignore[assignment]


class Tape:
  """Hands out the hashes of one trace's draws in order, and records the draws.

  With ``expected`` None the trace is the first of its structure; otherwise
  every draw must be the expected one.
  """

  def __init__(self, fn_name: str, hashes: Any, expected: Sequence[Draw] | None):
    self.fn_name, self.hashes, self.expected = fn_name, hashes, expected
    self.draws: list[Draw] = []

  def hash_of(self, draw: Draw) -> Any:
    index = len(self.draws)
    self.draws.append(draw)
    if self.expected is not None:
      expected = self.expected[index] if index < len(self.expected) else 'no draw'
      if expected != draw:
        self.mismatch(index, expected, draw)
    # Past the end of the pool (first trace only) the value is unused: the caller retraces.
    return self.hashes[min(index, self.hashes.shape[0] - 1)]

  def close(self):
    """Lets go of the traced hashes once the trace is done: the tape stays in the static part
    of streams that inner transforms saw, and JAX caches those."""
    self.hashes = None

  def check_complete(self):
    if self.expected is not None and len(self.draws) < len(self.expected):
      self.mismatch(len(self.draws), self.expected[len(self.draws)], 'no draw')

  def mismatch(self, index, expected, seen):
    raise errors.RngReplayError(_REPLAY_MISMATCH.format(
        fn=self.fn_name, index=index, expected=expected, seen=seen))


@dataclasses.dataclass(frozen=True)
class TapeStream(RngStream):
  """A stream inside a jitted function: draws go through a tape instead of hashing."""
  stream: str = ''
  root: int = 0
  node: tuple[str, ...] = ()
  tape: Any = None

  def child(self, name: str) -> TapeStream:
    return dataclasses.replace(self, suffix=self.suffix + (name,), node=self.node + (name,))

  def draw(self, count: int) -> jax.Array:
    draw = Draw(self.root, self.stream, self.suffix, self.node, count)
    return jax.random.fold_in(self.key, self.tape.hash_of(draw))


jax.tree_util.register_dataclass(
    TapeStream, data_fields=['key'], meta_fields=['suffix', 'stream', 'root', 'node', 'tape'])


def draw_hashes(draws: Sequence[Draw], streams: Sequence[dict[str, RngStream]],
                nodes: Sequence[Any], pool: int) -> np.ndarray:
  """The hash of every draw at the outer scopes' suffixes and counters, zero-padded to ``pool``."""
  values = np.zeros(pool, np.uint32)
  for i, draw in enumerate(draws):
    outer = streams[draw.root][draw.stream].suffix
    suffix = tuple(item for x in draw.suffix for item in (outer if x is _OUTER else (x,)))
    count = count_at(nodes[draw.root], draw.node, draw.stream) + draw.count
    values[i] = static_hash(suffix + (count,))
  return values


def tape_streams(raw_keys: Sequence[dict[str, Any]], tape: Tape) -> tuple[Any, ...]:
  """Rng groups of tape streams: ``((root 0 streams, root 1 streams, ...),)``."""
  # A tape stream's suffix holds _OUTER, not hashed: draw_hashes puts the real one in.
  return (tuple({name: TapeStream(key, (_OUTER,), name, r, (),  # type: ignore[arg-type]
                                  tape)
                 for name, key in keys.items()} for r, keys in enumerate(raw_keys)),)


def has_tape_streams(streams: Any) -> bool:
  """Whether any stream in ``streams`` (a pytree, e.g. rng groups) is from a `lift.jit` trace."""
  leaves = jax.tree.leaves(streams, is_leaf=lambda x: isinstance(x, RngStream))
  return any(isinstance(s, TapeStream) for s in leaves)


__all__ = ['ConcreteKeysNeeded', 'Draw', 'Tape', 'TapeStream', 'draw_hashes', 'has_tape_streams',
           'require_concrete', 'static_hash', 'tape_streams']
