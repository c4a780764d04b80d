"""Named PRNG streams: a raw key plus a static suffix of path names and counters.

A stream never splits eagerly. ``make_rng`` derives a key by hashing the static
suffix (the child-scope names on the way down, then the draw counter) and
folding the hash into the raw key, which gives the same keys as Flax for the
same program and lets a lifted transform carry the raw key through unchanged.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import jax
import jax.numpy as jnp

Foldable = str | int


def fold_in_static(key: jax.Array, data: tuple[Foldable, ...]) -> jax.Array:
  """Folds static strings and ints into ``key`` via the first 4 bytes of their SHA-1.

  >>> k = fold_in_static(jax.random.key(0), ('dense', 1))
  """
  if not data:
    return key
  digest = hashlib.sha1()
  for item in data:
    if isinstance(item, str):
      digest.update(item.encode('utf-8'))
    elif isinstance(item, int):
      digest.update(item.to_bytes((item.bit_length() + 7) // 8, 'big'))
    else:
      raise TypeError(f'rng suffix items must be str or int, got {item!r}')
  value = int.from_bytes(digest.digest()[:4], 'big')
  return jax.random.fold_in(key, jnp.uint32(value))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RngStream:
  """A PRNG stream: ``key`` is a pytree leaf (vmapped, split, traced), ``suffix`` is static.

  The n-th draw of a stream is ``fold_in`` of its raw key with a hash of its
  suffix and n, as Flax derives keys. Scopes manage their streams; draw keys
  with ``scope.make_rng(name)``, not by building streams yourself.

  Attributes:
    key: the raw PRNG key.
    suffix: the child-scope names, outermost first, hashed into each draw with its count.

  Examples:
    >>> stream = RngStream(jax.random.key(0)).child('dense')
    >>> stream.suffix
    ('dense',)
    >>> stream.draw(1).shape
    ()
  """
  key: Any
  suffix: tuple[Foldable, ...] = dataclasses.field(
      default=(), metadata=dict(static=True))

  def child(self, name: str) -> RngStream:
    return RngStream(self.key, self.suffix + (name,))

  def draw(self, count: int) -> jax.Array:
    """The key of the ``count``-th draw (counting from 1) of this stream."""
    return fold_in_static(self.key, self.suffix + (count,))


def as_stream(rng: Any) -> RngStream:
  return rng if isinstance(rng, RngStream) else RngStream(rng)


def is_prng_key(x: Any) -> bool:
  """A typed key array, or a raw ``uint32[2]`` key as made by ``jax.random.PRNGKey``."""
  if isinstance(x, RngStream):
    return True
  dtype = getattr(x, 'dtype', None)
  if dtype is None:
    return False
  if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    return True
  return dtype == jnp.uint32 and getattr(x, 'shape', None) == (2,)


class RngCounters:
  """Draw counters of one scope, per stream, plus those of its named children.

  Counters live in a tree keyed by child name, so a child pushed again (``reuse``,
  a rewound scope, the same scope rebuilt inside a lifted transform) continues
  where it left off instead of drawing the same keys twice.
  """

  def __init__(self):
    self.counts: dict[str, int] = {}
    self.children: dict[str, RngCounters] = {}

  def next(self, stream: str) -> int:
    self.counts[stream] = self.counts.get(stream, 0) + 1
    return self.counts[stream]

  def child(self, name: str) -> RngCounters:
    if name not in self.children:
      self.children[name] = RngCounters()
    return self.children[name]
