"""Filter algebra: every operation agrees with the set it denotes."""
import itertools
import re

import pytest

import lift
from lift.errors import InvalidFilterError
from lift.filters import DenyList, validate_filter

# 'zz' is mentioned by no filter: it stands for every other collection name.
UNIVERSE = ('a', 'b', 'c', 'zz')
FILTERS = [True, False, 'a', ['a', 'b'], ('b', 'c'), {'c'}, [], DenyList('a'),
           DenyList(['a', 'b']), DenyList([]), DenyList(True), DenyList(DenyList('c'))]


def denote(f):
  return frozenset(x for x in UNIVERSE if lift.in_filter(f, x))


@pytest.mark.parametrize('a,b', list(itertools.product(FILTERS, repeat=2)))
def test_operations_match_set_semantics(a, b):
  assert denote(lift.union_filters(a, b)) == denote(a) | denote(b)
  assert denote(lift.intersect_filters(a, b)) == denote(a) & denote(b)
  assert denote(lift.subtract_filters(a, b)) == denote(a) - denote(b)


@pytest.mark.parametrize('f', FILTERS)
def test_is_filter_empty_matches_denotation(f):
  assert lift.is_filter_empty(f) == (denote(f) == frozenset())


TABLE = [
    (lift.union_filters, DenyList(['a', 'b']), ['b', 'c'], DenyList({'a'})),
    (lift.intersect_filters, DenyList(['a', 'b']), ['b', 'c'], {'c'}),
    (lift.subtract_filters, DenyList(['a', 'b']), ['b', 'c'], DenyList({'a', 'b', 'c'})),
    (lift.union_filters, DenyList('a'), DenyList('b'), True),
    (lift.intersect_filters, DenyList('a'), DenyList('b'), DenyList({'a', 'b'})),
    (lift.subtract_filters, DenyList('a'), DenyList(['a', 'b']), {'b'}),
    (lift.union_filters, 'a', ['b'], {'a', 'b'}),
    (lift.intersect_filters, 'a', ['a', 'b'], {'a'}),
    (lift.subtract_filters, ['a', 'b'], 'a', {'b'}),
    (lift.union_filters, False, 'a', {'a'}),
    (lift.union_filters, True, 'a', True),
    (lift.intersect_filters, True, 'a', {'a'}),
    (lift.intersect_filters, False, True, set()),
    (lift.subtract_filters, True, 'a', DenyList('a')),
    (lift.subtract_filters, 'a', True, set()),
    (lift.subtract_filters, True, DenyList('a'), {'a'}),
    (lift.union_filters, DenyList(['a', 'b']), ['a', 'b'], True),
    (lift.intersect_filters, DenyList('a'), 'a', set()),
    (lift.union_filters, DenyList([]), False, True),
    (lift.subtract_filters, DenyList('a'), 'b', DenyList({'a', 'b'})),
    (lift.intersect_filters, ['a', 'b', 'c'], DenyList('b'), {'a', 'c'}),
    (lift.union_filters, [], [], set()),
]


@pytest.mark.parametrize('op,a,b,expected', TABLE)
def test_table(op, a, b, expected):
  assert op(a, b) == expected


def test_group_collections_first_match_wins_and_unmatched_dropped():
  xs = {'params': 1, 'batch_stats': 2, 'cache': 3, 'intermediates': 4}
  groups = lift.group_collections(xs, ['params', ['params', 'cache'], DenyList('intermediates')])
  assert groups == ({'params': 1}, {'cache': 3}, {'batch_stats': 2})


def test_denylist_equality_and_hash():
  assert DenyList(['a', 'b']) == DenyList(('b', 'a')) == DenyList({'a', 'b'})
  assert hash(DenyList('a')) == hash(DenyList(['a']))


@pytest.mark.parametrize('bad', [3, None, ['a', 1], {'a': 1}])
def test_invalid_filter_names_the_value(bad):
  with pytest.raises(InvalidFilterError, match=re.escape(f'Invalid filter {bad!r}')):
    validate_filter(bad)
  with pytest.raises(InvalidFilterError):
    lift.in_filter(bad, 'params')


def test_invalid_denylist_fails_at_construction():
  with pytest.raises(InvalidFilterError, match='Invalid filter 3'):
    DenyList(3)
