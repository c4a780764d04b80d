"""Properties of lift.map_variables over random configurations.

Against the untransformed function applied by hand to the mapped view of the variables
(and what it writes mapped back out), and against `flax.core.lift` where it draws the
same keys: values, the variable trees init returns, mutated collections and gradients.
Each example is one compiled program (`run_compiled`).
"""
import dataclasses

import flax.core
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import lift as flax_lift
from hypothesis import given
from hypothesis import strategies as st

import lift
from lift import errors
from tests.helpers import (MAPS, SIZES, assert_trees_close, assert_trees_equal, grid, layer,
                           layer_params, noise, property_settings, run_compiled, sum_of_squares)

KP, KD, KD_APPLY = jax.random.key(0), jax.random.key(1), jax.random.key(2)
RNGS = {'params': KP, 'dropout': KD}


# -- map_variables ------------------------------------------------------------------------


def mapped_body(scope, x, features):
  """A layer, a running mean in 'stats' (where 'stats' may be created or written), a draw."""
  h = scope.child(layer, 'dense')(x, features)
  if scope.is_mutable_collection('stats') or scope.has_variable('stats', 'mean'):
    mean = scope.variable('stats', 'mean', jnp.zeros, (features,))
    if scope.is_mutable_collection('stats'):
      mean.value = 0.5 * mean.value + h.mean(0)
  return h + noise(scope, (features,))[None]


@dataclasses.dataclass(frozen=True)
class MapCase:
  maps: str
  mapped: tuple  # the mapped collections
  init: bool
  mutable: bool
  rows: int
  features_in: int
  features: int
  grad: bool

  def lifted(self, L):
    mapped = L.map_variables(mapped_body, list(self.mapped), *MAPS[self.maps], init=self.init,
                             mutable=self.mutable)
    return lambda scope, x: mapped(scope, x, self.features)

  def oracle(self, variables, x, key):
    """The untransformed function on the view ``map_in(stored)`` of the mapped collections;
    what it writes to a mapped collection is stored as ``map_out(written)``.

    With ``init=True`` and a mapped collection mutable (here 'stats'), an init pass runs
    first, on the stored form, and the view is what it leaves mapped out and back in, as
    in Flax: `map_in(map_out(v)) == v` for these maps, so the view is the stored form
    after that pass. The main pass then draws the keys after the init pass's.
    """
    map_in, map_out = MAPS[self.maps]
    view = {c: map_in(v) if c in self.mapped else v for c, v in variables.items()}
    body = mapped_body
    if self.init and 'stats' in self.mapped:
      _, passed = lift.apply(mapped_body, mutable='stats')(
          variables, x, self.features, rngs={'dropout': key})
      view = {**variables, **{c: v for c, v in passed.items() if c in self.mapped}}
      body = after_one_draw
    writable = ['stats'] if 'stats' not in self.mapped or self.mutable or self.init else []
    y, written = lift.apply(body, mutable=writable)(
        view, x, self.features, rngs={'dropout': key})
    if 'stats' in written and 'stats' in self.mapped:
      written = {'stats': map_out(written['stats'])}
    return y, {'stats': variables['stats'], **written}

  def init_oracle(self, x):
    """Untransformed init (its keys, one update of 'stats'), stored mapped out.

    With ``init=True`` that is the init pass, and the main pass runs on what it created
    in the mapped collections (the view, `map_in(map_out(v)) == v`), creating the other
    collections again with the keys after the init pass's: its noise is the second
    'dropout' draw, its kernel (unless mapped) the second 'params' draw at 'dense'.
    """
    y, created = lift.init(mapped_body)(RNGS, x, self.features)
    if 'stats' in self.mapped and not (self.init or self.mutable):  # read-only: not created
      created = {'params': created['params']}
    elif self.init:
      kept = {c: v for c, v in created.items() if c in self.mapped}
      if 'params' not in kept:
        kept['params'] = layer_params(KP, self.features_in, self.features, draws_before=1)
      y, created = lift.apply(after_one_draw, mutable=True)(kept, x, self.features, rngs=RNGS)
    map_out = MAPS[self.maps][1]
    return y, {c: map_out(v) if c in self.mapped else v for c, v in created.items()}


def after_one_draw(scope, x, features):
  """`mapped_body` after one 'dropout' draw (an init pass's noise)."""
  scope.make_rng('dropout')
  return mapped_body(scope, x, features)


@st.composite
def map_cases(draw):
  return MapCase(
      maps=draw(st.sampled_from(sorted(MAPS))),
      mapped=draw(st.sampled_from([('params',), ('stats',), ('params', 'stats')])),
      init=draw(st.booleans()), mutable=draw(st.booleans()), rows=draw(SIZES),
      features_in=draw(SIZES), features=draw(SIZES), grad=draw(st.booleans()))


@property_settings(8)
@given(map_cases())
def test_map_variables_equals_the_hand_applied_map(case):
  x = grid((case.rows, case.features_in))
  if 'params' in case.mapped and not (case.init or case.mutable):  # nothing may create them
    with pytest.raises(errors.UnliftedCollectionError, match='"params".*init=True'):
      lift.init(case.lifted(lift))(RNGS, x)
    return
  stats = {'mean': np.linspace(-1.0, 1.0, case.features, dtype=np.float32)}
  # With init=True, applying with a mapped collection mutable runs the init pass on the
  # stored form: a transposed non-square kernel does not fit the function (nor in Flax).
  apply_fails = (case.init and case.mapped == ('params', 'stats') and case.maps == 'transpose'
                 and case.features_in != case.features)
  apply = lambda params, M=lift, L=lift: M.apply(case.lifted(L), mutable='stats')(
      {'params': params, 'stats': stats}, x, rngs={'dropout': KD_APPLY})

  def example():
    results = {'init': lift.init(case.lifted(lift))(RNGS, x), 'init_oracle': case.init_oracle(x)}
    stored = results['init_oracle'][1]['params']
    results['init_flax'] = flax.core.init(case.lifted(flax_lift))(RNGS, x)
    if apply_fails:
      return results
    oracle = lambda params: case.oracle({'params': params, 'stats': stats}, x, KD_APPLY)
    results.update(apply=apply(stored), apply_oracle=oracle(stored))
    # With init=True, Flax's init pass also runs where only 'stats' is mutable, and drops
    # the immutable mapped 'params' (docs/porting.md): compared where both run it alike.
    if not case.init or case.mapped == ('stats',):
      results['apply_flax'] = apply(stored, flax.core, flax_lift)
    if case.grad:
      loss = lambda run: lambda params: sum_of_squares(run(params)[0])
      results['grads'] = [jax.grad(loss(run))(stored) for run in (apply, oracle)]
    return results

  results = run_compiled(example)
  assert_trees_close(results['init'], results['init_oracle'], depth=1)
  if apply_fails:
    with pytest.raises(errors.ParamShapeError, match='"kernel"'):
      apply(results['init'][1]['params'])
    return
  assert_trees_close(results['apply'], results['apply_oracle'], depth=1)
  for name in ('init', 'apply'):
    if f'{name}_flax' in results:
      assert_trees_equal(results[name], results[f'{name}_flax'])
  if case.grad:
    assert_trees_close(*results['grads'], depth=2)
