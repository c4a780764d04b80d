"""Filter algebra: every operation agrees with the set it denotes."""
import itertools

import flax.core
import jax
import jax.numpy as jnp
import pytest

import lift
from lift import errors
from lift.filters import DenyList, validate_filter

from tests.helpers import assert_trees_equal, check_linen_parity

# 'zz' is mentioned by no filter: it stands for every other collection name.
UNIVERSE = ('a', 'b', 'c', 'zz')
FILTERS = [True, False, 'a', ['a', 'b'], ('b', 'c'), {'c'}, [], DenyList('a'),
           DenyList(['a', 'b']), DenyList([]), DenyList(True), DenyList(DenyList('c'))]


def denote(f, in_filter=lift.in_filter):
  return frozenset(x for x in UNIVERSE if in_filter(f, x))


def to_flax(f):
  return flax.core.DenyList(to_flax(f.deny)) if isinstance(f, DenyList) else f


@pytest.mark.parametrize('a,b', list(itertools.product(FILTERS, repeat=2)))
def test_operations_match_set_semantics_and_flax(a, b):
  for op, expected in [('union_filters', denote(a) | denote(b)),
                       ('intersect_filters', denote(a) & denote(b)),
                       ('subtract_filters', denote(a) - denote(b))]:
    assert denote(getattr(lift, op)(a, b)) == expected
    theirs = getattr(flax.core.scope, op)(to_flax(a), to_flax(b))
    assert denote(theirs, flax.core.scope.in_filter) == expected


@pytest.mark.parametrize('f', FILTERS)
def test_is_filter_empty_matches_denotation_and_flax(f):
  assert lift.is_filter_empty(f) == (denote(f) == frozenset())
  assert denote(f) == denote(to_flax(f), flax.core.scope.in_filter)
  if not isinstance(f, DenyList) or not isinstance(f.deny, DenyList):  # Flax guesses on nested ones
    assert lift.is_filter_empty(f) == flax.core.scope.is_filter_empty(to_flax(f))


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


@pytest.mark.parametrize('filters', [
    ('params', ['params', 'cache'], DenyList('intermediates')), (['params'], True),
    ('params', 'params'), (True,), (DenyList('params'), 'params'), (), ('cache', True),
    (True, 'cache'), (['intermediates', 'cache'], DenyList('intermediates')),
    (False, 'batch_stats', ['batch_stats', 'intermediates']),
    ('params', flax.core.DenyList(['intermediates', 'cache']))])
def test_group_collections_order_and_first_match_match_flax(filters):
  xs = {'params': 1, 'batch_stats': 2, 'cache': 3, 'intermediates': 4}
  ours = lift.group_collections(xs, filters)
  theirs = flax.core.scope.group_collections(xs, [to_flax(f) for f in filters])
  assert [list(g.items()) for g in ours] == [list(g.items()) for g in theirs]
  if len(filters) == 3 and filters[0] == 'params':
    assert ours == ({'params': 1}, {'cache': 3}, {'batch_stats': 2})


def test_denylist_equality_and_hash():
  assert DenyList(['a', 'b']) == DenyList(('b', 'a')) == DenyList({'a', 'b'})
  assert hash(DenyList('a')) == hash(DenyList(['a']))


# -- Flax's DenyList: accepted everywhere ours is, converted at the boundary ------------------

FLAX_FILTERS = [flax.core.DenyList('a'), flax.core.DenyList(['a', 'b']), flax.core.DenyList(True),
                flax.core.DenyList(False), flax.core.DenyList(flax.core.DenyList('c'))]


@pytest.mark.parametrize('f', FLAX_FILTERS)
def test_flax_denylist_denotes_what_it_denotes_in_flax(f):
  assert denote(f) == frozenset(x for x in UNIVERSE if flax.core.scope.in_filter(f, x))
  assert lift.is_filter_empty(f) == (denote(f) == frozenset())  # flax guesses on nested DenyLists
  assert isinstance(validate_filter(f), DenyList)


@pytest.mark.parametrize('a,b', list(itertools.product(FLAX_FILTERS, FILTERS)))
def test_flax_denylist_in_the_algebra_gives_our_filters(a, b):
  for x, y in [(a, b), (b, a)]:
    for op, expected in [(lift.union_filters, denote(x) | denote(y)),
                         (lift.intersect_filters, denote(x) & denote(y)),
                         (lift.subtract_filters, denote(x) - denote(y))]:
      result = op(x, y)
      assert denote(result) == expected
      assert not isinstance(result, flax.core.DenyList)


def test_flax_denylist_converts_to_ours_at_any_depth():  # bad ones: tests/misuse/
  assert DenyList(flax.core.DenyList('a')) == DenyList(DenyList('a'))
  assert validate_filter(flax.core.DenyList(flax.core.DenyList(['a']))) == DenyList(DenyList('a'))


def _stateful(scope):
  for col in ('params', 'stats', 'intermediates'):
    scope.variable(col, 'v', lambda: jnp.float32(1)).value += 1
  return 0


@pytest.mark.parametrize('mutable', [flax.core.DenyList('intermediates'), flax.core.DenyList(['params', 'stats']),
                                     flax.core.DenyList(flax.core.DenyList('stats'))])
def test_lift_apply_takes_flax_denylist_as_flax_core(mutable):
  variables = {col: {'v': jnp.float32(1)} for col in ('params', 'stats', 'intermediates')}
  def run(M):
    try:
      return M.apply(_stateful, mutable=mutable)(variables)
    except (errors.ImmutableCollectionError, flax.errors.ModifyScopeVariableError) as e:  # the same in both
      return type(e).__name__
  ours, theirs = run(lift), run(flax.core)
  assert (ours == 'ImmutableCollectionError') == (theirs == 'ModifyScopeVariableError')
  if not isinstance(ours, str):
    assert_trees_equal(ours, theirs)


def test_linen_ext_apply_takes_flax_denylist_as_flax_linen():
  def build(M):
    class Net(M.Module):
      @M.compact
      def __call__(self, x):
        x = M.Dense(2)(x)
        self.sow('intermediates', 'h', x)
        count = self.variable('counter', 'n', lambda: jnp.int32(0))
        count.value += 1
        return x
    x, runs = jnp.ones((1, 3)), []
    variables = Net().init(jax.random.key(0), x, mutable=flax.core.DenyList(flax.core.DenyList(['params', 'counter'])))
    for mutable in [flax.core.DenyList('intermediates'), flax.core.DenyList(['params', 'intermediates'])]:
      runs.append((variables, Net().apply(variables, x, mutable=mutable, capture_intermediates=True)))
    return runs
  check_linen_parity(build)
