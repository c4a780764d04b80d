"""Collection and rng-stream filters, and their set algebra.

A filter names a set of collections (or rng streams):

* ``True``: every name; ``False``: none;
* a string: that one name; a list, tuple or set of strings: those names;
* ``DenyList(f)``: every name not matched by ``f``.

``union_filters``, ``intersect_filters`` and ``subtract_filters`` compose
filters exactly as the sets they denote. Finite results are ``set``s (``False``
for nothing); co-finite results are ``DenyList``s (``True`` for everything).

Every function here also accepts Flax's ``flax.core.DenyList`` and turns it
into ours (:func:`from_flax`), so Flax filters port unchanged.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Union

from flax.core import DenyList as FlaxDenyList

from lift.errors import InvalidFilterError

Filter = Union[bool, str, Collection[str], 'DenyList']
CollectionFilter = Filter
PRNGSequenceFilter = Filter


@dataclasses.dataclass(frozen=True)
class DenyList:
  """Matches every name except those matched by ``deny``.

  Not needed for a filter of every name (``True``) or of a few names (a list
  of strings): use those.

  Attributes:
    deny: the filter of the names not matched.

  Examples:
    >>> in_filter(DenyList('params'), 'batch_stats'), in_filter(DenyList('params'), 'params')
    (True, False)
  """
  deny: Filter

  def __post_init__(self):
    # Normalise finite denials to a frozenset so equal filters compare and hash equal.
    deny = from_flax(self.deny)
    if isinstance(deny, str):
      deny = frozenset({deny})
    elif not isinstance(deny, (bool, DenyList)):
      deny = frozenset(_finite(deny))
    object.__setattr__(self, 'deny', deny)


def from_flax(f: Any) -> Any:
  """``f`` with a Flax ``DenyList`` (at any depth) turned into ours; other values unchanged.

  >>> from_flax(flax.core.DenyList('params'))
  DenyList(deny=frozenset({'params'}))
  """
  return DenyList(from_flax(f.deny)) if isinstance(f, FlaxDenyList) else f


def _finite(f: Filter, where: str | None = None) -> frozenset[str]:
  """The set of names of a finite filter (not True, not a DenyList)."""
  if f is False:
    return frozenset()
  if isinstance(f, str):
    return frozenset({f})
  if isinstance(f, Collection) and not isinstance(f, (bool, Mapping)):
    if all(isinstance(x, str) for x in f):
      return frozenset(f)
  raise InvalidFilterError(f, where)


def validate_filter(f: Any, where: str | None = None) -> Filter:
  """Raises `InvalidFilterError` unless ``f`` is a filter; returns it (Flax's DenyList as ours).

  ``where`` names the argument that holds ``f``, for the message.

  >>> validate_filter(['params'])
  ['params']
  """
  f = from_flax(f)
  if f is True or f is False:
    return f
  if isinstance(f, DenyList):
    validate_filter(f.deny, where)
    return f
  _finite(f, where)
  return f


def in_filter(filter_like: Filter, name: str) -> bool:
  """Whether ``name`` is matched by the filter.

  Not for comparing two filters: compose them with `intersect_filters` or
  `subtract_filters` and test the result with `is_filter_empty`.

  Examples:
    >>> in_filter(['params', 'cache'], 'cache'), in_filter(False, 'params')
    (True, False)
  """
  filter_like = from_flax(filter_like)
  if filter_like is True or filter_like is False:
    return filter_like
  if isinstance(filter_like, DenyList):
    return not in_filter(filter_like.deny, name)
  return name in _finite(filter_like)


def is_filter_empty(filter_like: Filter) -> bool:
  """Whether the filter matches no name at all.

  Not the same as ``not f``: ``DenyList(True)`` is empty, and a list of
  names is not. Use it rather than truth tests on filters.

  Examples:
    >>> is_filter_empty([]), is_filter_empty(DenyList(True)), is_filter_empty('a')
    (True, True, False)
  """
  filter_like = from_flax(filter_like)
  if filter_like is True or filter_like is False:
    return not filter_like
  if isinstance(filter_like, DenyList):
    return _is_everything(filter_like.deny)
  return not _finite(filter_like)


def _is_everything(f: Filter) -> bool:
  if f is True:
    return True
  if isinstance(f, DenyList):
    return is_filter_empty(f.deny)
  validate_filter(f)
  return False


def union_filters(a: Filter, b: Filter) -> Filter:
  """The filter matching names matched by ``a`` or ``b``.

  Not for splitting collections into groups: `group_collections` does that,
  first match first.

  Examples:
    >>> union_filters(DenyList(['a', 'b']), ['b', 'c']) == DenyList({'a'})
    True
    >>> sorted(union_filters('params', ['cache']))
    ['cache', 'params']
  """
  a, b = from_flax(a), from_flax(b)
  if _is_everything(a) or _is_everything(b):
    return True
  if isinstance(a, DenyList) and isinstance(b, DenyList):
    return _deny(intersect_filters(a.deny, b.deny))
  if isinstance(b, DenyList):
    a, b = b, a
  if isinstance(a, DenyList):
    return _deny(subtract_filters(a.deny, b))
  return set(_finite(a) | _finite(b))


def intersect_filters(a: Filter, b: Filter) -> Filter:
  """The filter matching names matched by both ``a`` and ``b``.

  Not for testing one name: `in_filter` does that without building a filter.

  Examples:
    >>> intersect_filters(DenyList(['a', 'b']), ['b', 'c'])
    {'c'}
  """
  a, b = from_flax(a), from_flax(b)
  if _is_everything(a):
    return _normalise(b)
  if _is_everything(b):
    return _normalise(a)
  if isinstance(a, DenyList) and isinstance(b, DenyList):
    return _deny(union_filters(a.deny, b.deny))
  if isinstance(a, DenyList):
    a, b = b, a
  if isinstance(b, DenyList):
    return subtract_filters(a, b.deny)
  return set(_finite(a) & _finite(b))


def subtract_filters(a: Filter, b: Filter) -> Filter:
  """The filter matching names matched by ``a`` but not by ``b``.

  Not needed to write "everything but x": ``DenyList('x')`` says it directly.

  Examples:
    >>> subtract_filters(True, 'params') == DenyList('params')
    True
    >>> subtract_filters(['params', 'cache'], 'cache')
    {'params'}
  """
  a, b = from_flax(a), from_flax(b)
  if _is_everything(b):
    return set()
  if _is_everything(a):
    return _deny(b)
  if isinstance(a, DenyList) and isinstance(b, DenyList):
    return subtract_filters(b.deny, a.deny)
  if isinstance(a, DenyList):
    return _deny(union_filters(a.deny, b))
  if isinstance(b, DenyList):
    return intersect_filters(a, b.deny)
  return set(_finite(a) - _finite(b))


def _deny(f: Filter) -> Filter:
  """``DenyList(f)``, simplified: denying nothing is ``True``; denying a DenyList is its inner filter."""
  if is_filter_empty(f):
    return True
  if isinstance(f, DenyList):
    return _normalise(f.deny)
  return DenyList(f)


def _normalise(f: Filter) -> Filter:
  if f is True or isinstance(f, DenyList):
    return f
  if f is False:
    return set()
  return set(_finite(f))


def group_collections(xs: Mapping[str, Any],
                      filters: Sequence[Filter]) -> tuple[dict[str, Any], ...]:
  """Splits the keys of ``xs`` into one dict per filter; the first match wins.

  A key matched by no filter is left out of every group. Not for overlapping
  filters whose order you do not control: each key goes to the first match only.

  Examples:
    >>> group_collections({'params': 1, 'stats': 2, 'cache': 3}, ['params', True])
    ({'params': 1}, {'stats': 2, 'cache': 3})
  """
  remaining = list(xs.keys())
  groups = []
  for f in filters:
    groups.append({k: xs[k] for k in remaining if in_filter(f, k)})
    remaining = [k for k in remaining if k not in groups[-1]]
  return tuple(groups)
