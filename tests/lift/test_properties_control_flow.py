"""Properties of lift.cond, lift.switch and lift.while_loop over random configurations.

Each against `lax.cond` / `lax.switch` / `lax.while_loop` over the functions applied by
hand to the explicit variables, and against `flax.core.lift` where it draws the same
keys: values, the variable trees init returns, mutated collections, rng draws and
derivatives. Each example is one compiled program (`run_compiled`).
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
from jax import lax

import lift
from tests.helpers import (ACTIVATIONS, SIZES, assert_trees_close, assert_trees_equal, grid,
                           layer, layer_params, noise, property_settings, run_compiled,
                           sum_of_squares)

KP, KD, KD_APPLY = jax.random.key(0), jax.random.key(1), jax.random.key(2)
RNGS = {'params': KP, 'dropout': KD}


def _draws_after(count, shape, key):
  """What a scope's 'dropout' draw number ``count + 1`` gives (untransformed)."""
  return lift.apply(lambda scope: [noise(scope, shape) for _ in range(count + 1)][-1])(
      {}, rngs={'dropout': key})


# -- cond and switch ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BranchCase:
  kind: str  # 'cond' or 'switch'
  scales: tuple  # one per branch
  activations: tuple
  draws: tuple
  index: int  # cond: 0 is True (the first branch)
  rows: int
  features_in: int
  features: int
  grad: bool

  @property
  def taken(self):
    if self.kind == 'cond':
      return 0 if self.index else 1
    return min(max(self.index, 0), len(self.scales) - 1)  # lax.switch clamps

  def branch(self, j):
    def fn(scope, x):
      h = scope.child(layer, 'dense')(x, self.features)
      h = self.scales[j] * ACTIVATIONS[self.activations[j]](h)
      count = scope.variable('state', f'count_{j}', jnp.zeros, (), jnp.int32)
      count.value = count.value + 1
      for _ in range(self.draws[j]):
        h = h + noise(scope, (self.features,))[None]
      return h
    return fn

  def model(self, L):
    branches = [self.branch(j) for j in range(len(self.scales))]
    def fn(scope, x, index):
      for j in range(len(branches)):
        scope.variable('state', f'count_{j}', jnp.zeros, (), jnp.int32)
      if self.kind == 'cond':
        y = L.cond(index, *branches, scope, x)
      else:
        y = L.switch(index, branches, scope, x)
      return y, noise(scope, (self.features,))  # a draw after: fresh whichever branch ran
    return fn

  def oracle(self, params, state, x, key):
    """`lax.cond` / `lax.switch` over the branches applied by hand, then the draw after them."""
    def applied(j):
      return lambda params, state: lift.apply(self.branch(j), mutable='state')(
          {'params': params, 'state': state}, x, rngs={'dropout': key})
    if self.kind == 'cond':
      y, mutated = lax.cond(jnp.asarray(self.index, bool), applied(0), applied(1), params, state)
    else:
      branches = [applied(j) for j in range(len(self.scales))]
      y, mutated = lax.switch(jnp.asarray(self.index), branches,
                              params, state)
    return (y, _draws_after(max(self.draws), (self.features,), key)), mutated


@st.composite
def branch_cases(draw, kind):
  k = 2 if kind == 'cond' else draw(st.integers(1, 4))
  per_branch = lambda strategy: tuple(draw(st.lists(strategy, min_size=k, max_size=k)))
  return BranchCase(
      kind=kind, scales=per_branch(st.sampled_from([-1.0, 0.5, 2.0])),
      activations=per_branch(st.sampled_from(sorted(ACTIVATIONS))),
      draws=per_branch(st.integers(0, 2)),
      index=draw(st.booleans()) if kind == 'cond' else draw(st.integers(-2, k + 1)),
      rows=draw(SIZES), features_in=draw(SIZES), features=draw(SIZES), grad=draw(st.booleans()))


@pytest.mark.parametrize('kind', ['cond', 'switch'])
@property_settings(4)
@given(data=st.data())
def test_cond_and_switch_equal_lax_on_the_explicit_variables(kind, data):
  case = data.draw(branch_cases(kind))
  x = grid((case.rows, case.features_in))
  index = jnp.asarray(case.index)
  zeros = {f'count_{j}': jnp.int32(0) for j in range(len(case.scales))}
  # Where branches draw, Flax's keys depend on the order JAX traces them (notes/0002)
  flax_draws = not any(case.draws)

  def example():
    params = layer_params(KP, case.features_in, case.features)
    results = {'init': lift.init(case.model(lift))(RNGS, x, index),
               'init_oracle': (lambda out, state: (out, {'params': params, **state}))(
                   *case.oracle(params, zeros, x, KD))}
    apply = lambda params, M=lift, L=lift: M.apply(case.model(L), mutable='state')(
        {'params': params, 'state': zeros}, x, index, rngs={'dropout': KD_APPLY})
    oracle = lambda params: case.oracle(params, zeros, x, KD_APPLY)
    results.update(apply=apply(params), apply_oracle=oracle(params))
    results['apply_flax'] = apply(params, flax.core, flax_lift)
    if case.taken == 0:  # Flax inits with the first branch whatever the index
      results['init_flax'] = flax.core.init(case.model(flax_lift))(RNGS, x, index)
    if case.grad:
      loss = lambda run: lambda params: sum_of_squares(run(params)[0])
      results['grads'] = [jax.grad(loss(run))(params) for run in (apply, oracle)]
    return results

  results = run_compiled(example)
  assert_trees_close(results['init'], results['init_oracle'], depth=1)
  assert_trees_close(results['apply'], results['apply_oracle'], depth=1)
  # only the taken branch's update survives
  assert {k: int(v) for k, v in results['apply'][1]['state'].items()} == {
      f'count_{j}': int(j == case.taken) for j in range(len(case.scales))}
  for name in ('init', 'apply'):
    if f'{name}_flax' in results:
      outputs, variables = results[name]
      outputs_flax, variables_flax = results[f'{name}_flax']
      assert_trees_equal(variables, variables_flax)
      if flax_draws:
        assert_trees_equal(outputs, outputs_flax)
  if case.grad:
    assert_trees_close(*results['grads'], depth=2)


# -- while_loop ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WhileCase:
  trips: int
  rows: int
  features: int
  carry: str  # 'array' (the trip count in 'state'), 'tuple' or 'dict' (the count in the carry)
  carry_variables: bool  # 'state' carried, else broadcast (read-only)
  split_dropout: bool
  grad: bool

  def initial_carry(self):
    h = jnp.asarray(grid((self.rows, self.features), 0.25))
    return {'array': h, 'tuple': (h, jnp.int32(0)), 'dict': {'h': h, 'i': jnp.int32(0)}}[self.carry]

  def cond_fn(self, scope, carry):
    if self.carry == 'array':
      return scope.get_variable('state', 'steps') < self.trips
    return (carry[1] if self.carry == 'tuple' else carry['i']) < self.trips

  def body_fn(self, scope, carry):
    h = carry if self.carry == 'array' else carry[0] if self.carry == 'tuple' else carry['h']
    h = jnp.tanh(scope.child(layer, 'dense')(h, self.features))
    h = h + noise(scope, (self.features,))[None]
    if scope.is_mutable_collection('state'):
      scope.put_variable('state', 'steps', scope.get_variable('state', 'steps') + 1)
      scope.put_variable('state', 'total', scope.get_variable('state', 'total') + h.mean(0))
    if self.carry == 'array':
      return h
    return (h, carry[1] + 1) if self.carry == 'tuple' else {'h': h, 'i': carry['i'] + 1}

  def model(self, L):
    def fn(scope):
      scope.variable('state', 'steps', jnp.zeros, (), jnp.int32)
      scope.variable('state', 'total', jnp.zeros, (self.features,))
      # the params, created before the loop
      scope.child(layer, 'dense')(jnp.zeros((1, self.features)), self.features)
      return L.while_loop(self.cond_fn, self.body_fn, scope, self.initial_carry(),
                          carry_variables='state' if self.carry_variables else False,
                          split_rngs={'dropout': self.split_dropout})
    return fn

  def oracle(self, params, state, key):
    """`lax.while_loop` over (carry, state, i), the body applied by hand; iteration i of a
    split stream draws from ``fold_in(key, i)``."""
    variables = lambda state: {'params': params, 'state': state}
    def cond(loop):
      carry, state, _ = loop
      return lift.apply(self.cond_fn)(variables(state), carry)
    def body(loop):
      carry, state, i = loop
      rngs = {'dropout': jax.random.fold_in(key, i) if self.split_dropout else key}
      if not self.carry_variables:
        return lift.apply(self.body_fn)(variables(state), carry, rngs=rngs), state, i + 1
      carry, mutated = lift.apply(self.body_fn, mutable='state')(variables(state), carry, rngs=rngs)
      return carry, mutated['state'], i + 1
    carry, state, _ = lax.while_loop(cond, body, (self.initial_carry(), state, jnp.int32(0)))
    return carry, {'state': state}


@st.composite
def while_cases(draw):
  carry_variables = draw(st.booleans())
  return WhileCase(
      trips=draw(st.integers(0, 4)), rows=draw(SIZES), features=draw(SIZES),
      carry=draw(st.sampled_from(['array', 'tuple', 'dict'][0 if carry_variables else 1:])),
      carry_variables=carry_variables, split_dropout=draw(st.booleans()), grad=draw(st.booleans()))


@property_settings(6)
@given(while_cases())
def test_while_loop_equals_lax_while_loop_on_the_explicit_variables(case):
  zeros = {'steps': np.int32(0), 'total': np.zeros((case.features,), np.float32)}

  def example():
    params = layer_params(KP, case.features, case.features)
    carry, state = case.oracle(params, zeros, KD)
    results = {'init': lift.init(case.model(lift))(RNGS),
               'init_oracle': (carry, {'params': params, **state}),
               'init_flax': flax.core.init(case.model(flax_lift))(RNGS)}
    apply = lambda params, M=lift, L=lift: M.apply(case.model(L), mutable='state')(
        {'params': params, 'state': zeros}, rngs={'dropout': KD_APPLY})
    oracle = lambda params: case.oracle(params, zeros, KD_APPLY)
    results.update(apply=apply(params), apply_oracle=oracle(params),
                   apply_flax=apply(params, flax.core, flax_lift))
    if case.grad:  # lax.while_loop has no reverse mode: forward-mode derivatives
      tangent = jax.tree.map(jnp.ones_like, params)
      results['jvps'] = [jax.jvp(run, (params,), (tangent,)) for run in (apply, oracle)]
    return results

  results = run_compiled(example)
  depth = max(case.trips, 1)
  assert_trees_close(results['init'], results['init_oracle'], depth)
  assert_trees_close(results['apply'], results['apply_oracle'], depth)
  assert_trees_equal(results['init'], results['init_flax'])
  assert_trees_equal(results['apply'], results['apply_flax'])
  if case.carry_variables:
    assert int(results['apply'][1]['state']['steps']) == case.trips
  if case.grad:
    assert_trees_close(*results['jvps'], depth=2 * depth)
