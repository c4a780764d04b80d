"""Properties of the lifted transforms that add no axis, over random configurations.

checkpoint, jit, cond, switch, while_loop and map_variables, each against hand-written
JAX on the explicit variables (`jax.checkpoint`, the untransformed function under
`jax.jit`, `lax.cond` / `lax.switch` / `lax.while_loop`, the hand-applied map) and,
where it has the same transform, `flax.core.lift`: values, the variable trees init
returns, mutated collections, rng draws and, for some examples, derivatives. Each example
is one compiled program (`run_compiled`).
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
from lift import errors
from tests.helpers import (SIZES, assert_trees_close, assert_trees_equal, grid, layer,
                           layer_params, noise, plain, property_settings, run_compiled,
                           update_stats)
from tests.lift.test_flax_core_parity import flax_style_jit

KP, KD, KD_APPLY = jax.random.key(0), jax.random.key(1), jax.random.key(2)
RNGS = {'params': KP, 'dropout': KD}
ACTIVATIONS = {'tanh': jnp.tanh, 'relu': jax.nn.relu, 'sin': jnp.sin, 'identity': lambda h: h}
POLICIES = {None: None, 'nothing': jax.checkpoint_policies.nothing_saveable,
            'everything': jax.checkpoint_policies.everything_saveable,
            'dots': jax.checkpoint_policies.dots_saveable,
            'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def _sum_of_squares(tree):
  return sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree) if jnp.issubdtype(a.dtype, jnp.floating))


def _draws_after(count, shape, key):
  """What a scope's 'dropout' draw number ``count + 1`` gives (untransformed)."""
  return lift.apply(lambda scope: [noise(scope, shape) for _ in range(count + 1)][-1])(
      {}, rngs={'dropout': key})


# -- checkpoint ---------------------------------------------------------------------------


def remat_body(scope, x, n_layers, activation, *, scale):
  """``n_layers`` layers (a Python loop: static), 'stats', a draw, and a keyword array."""
  h = x
  for i in range(n_layers):
    h = ACTIVATIONS[activation](scope.child(layer, f'dense_{i}')(h, h.shape[-1]))
  update_stats(scope, h)
  return scale * h + noise(scope, h.shape[-1:])[None]


@dataclasses.dataclass(frozen=True)
class RematCase:
  rows: int
  features: int
  n_layers: int
  activation: str
  policy: str | None
  prevent_cse: bool
  static: str  # 'argnums' (Flax's form), 'argnames', or 'mixed'
  by_keyword: bool  # static_argnames arguments passed by keyword

  def lifted(self, L=lift):
    static = dict(argnums=dict(static_argnums=(1, 2)), argnames=dict(static_argnames=('n_layers', 'activation')),
                  mixed=dict(static_argnums=(1,), static_argnames=('activation',)))[self.static]
    rematted = L.checkpoint(remat_body, policy=POLICIES[self.policy], prevent_cse=self.prevent_cse, **static)
    if self.static == 'mixed':  # a static_argnums argument goes by position
      return lambda scope, x, scale: rematted(scope, x, self.n_layers, activation=self.activation,
                                              scale=scale)
    if self.by_keyword:
      return lambda scope, x, scale: rematted(scope, x, n_layers=self.n_layers,
                                              activation=self.activation, scale=scale)
    return lambda scope, x, scale: rematted(scope, x, self.n_layers, self.activation, scale=scale)

  def oracle(self, params, stats, x, scale, key):
    """`jax.checkpoint` of the untransformed function on the explicit variables."""
    def run(params, stats, x, scale, key):
      return lift.apply(remat_body, mutable='stats')(
          {'params': params, 'stats': stats}, x, self.n_layers, self.activation, scale=scale,
          rngs={'dropout': key})
    return jax.checkpoint(run, prevent_cse=self.prevent_cse, policy=POLICIES[self.policy])(
        params, stats, x, scale, key)


@st.composite
def remat_cases(draw):
  static = draw(st.sampled_from(['argnums', 'argnames', 'mixed']))
  return RematCase(
      rows=draw(SIZES), features=draw(SIZES), n_layers=draw(st.integers(1, 3)),
      activation=draw(st.sampled_from(sorted(ACTIVATIONS))), policy=draw(st.sampled_from(list(POLICIES))),
      prevent_cse=draw(st.booleans()), static=static,
      by_keyword=static == 'argnames' and draw(st.booleans()))


@property_settings(8)
@given(remat_cases())
def test_checkpoint_equals_jax_checkpoint_of_the_untransformed_function(case):
  x, scale = grid((case.rows, case.features)), np.float32(1.5)

  def example():
    results = {'init': lift.init(case.lifted())(RNGS, x, scale), 'init_untransformed': lift.init(remat_body)(
        RNGS, x, case.n_layers, case.activation, scale=scale)}
    variables = results['init'][1]
    apply = lambda params, scale, M=lift, L=lift: M.apply(case.lifted(L), mutable='stats')(
        {**variables, 'params': params}, x, scale, rngs={'dropout': KD_APPLY})
    oracle = lambda params, scale: case.oracle(params, variables['stats'], x, scale, KD_APPLY)
    loss = lambda run: lambda *args: _sum_of_squares(run(*args)[0])
    grad = lambda run: jax.grad(loss(run), argnums=(0, 1))(variables['params'], scale)
    results.update(apply=apply(variables['params'], scale), apply_oracle=oracle(variables['params'], scale),
                   grads=[grad(apply), grad(oracle)])
    if case.static == 'argnums' and not case.by_keyword:
      results['init_flax'] = flax.core.init(case.lifted(flax_lift))(RNGS, x, scale)
      results['grad_flax'] = grad(lambda params, scale: apply(params, scale, flax.core, flax_lift))
    return results

  results = run_compiled(example)
  # checkpoint changes no value: init creates the untransformed function's variables
  assert_trees_equal(results['init'], results['init_untransformed'])
  assert_trees_close(results['apply'], results['apply_oracle'], depth=case.n_layers)
  assert_trees_close(*results['grads'], depth=2 * case.n_layers)
  if 'init_flax' in results:
    assert_trees_equal(results['init'], results['init_flax'])
    assert_trees_equal(results['grads'][0], results['grad_flax'])


# -- jit ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JitCase:
  rows: int
  features_in: int
  features: dict  # per child name
  calls: tuple  # child names, in order; a name called again continues its rng counters
  activation: str
  draws: int
  static: str  # 'argnums' or 'argnames'

  def body(self, scope, x, features, activation):
    h = ACTIVATIONS[activation](scope.child(layer, 'dense')(x, features))
    update_stats(scope, h)
    for _ in range(self.draws):
      h = h + noise(scope, h.shape[-1:])[None]
    return h

  def model(self, wrap):
    """Calls ``wrap(body)`` on the children in `calls`, passing the static arguments
    by position (static_argnums) or by keyword (static_argnames)."""
    fn = wrap(self.body)
    def model(scope, x):
      ys, seen = [], set()
      for name in self.calls:
        child = scope.push(name, reuse=name in seen)
        seen.add(name)
        features = self.features[name]
        if self.static == 'argnums':
          ys.append(fn(child, x, features, self.activation))
        else:
          ys.append(fn(child, x, features=features, activation=self.activation))
      return ys
    return model

  def wraps(self):
    static = (dict(static_argnums=(2, 3)) if self.static == 'argnums'
              else dict(static_argnames=('features', 'activation')))
    yield 'ours', lambda fn: lift.jit(fn, **static)
    yield 'untransformed', lambda fn: fn
    if self.static == 'argnames':  # Flax's jit counts a module hash among the positions
      yield 'flax', lambda fn: flax_style_jit(flax_lift, fn, **static)


@st.composite
def jit_cases(draw):
  return JitCase(
      rows=draw(SIZES), features_in=draw(SIZES), features={'a': draw(SIZES), 'b': draw(SIZES)},
      calls=tuple(draw(st.lists(st.sampled_from('ab'), min_size=1, max_size=3))),
      activation=draw(st.sampled_from(sorted(ACTIVATIONS))), draws=draw(st.integers(0, 2)),
      static=draw(st.sampled_from(['argnums', 'argnames'])))


@property_settings(8)
@given(jit_cases())
def test_jit_equals_the_untransformed_function(case):
  x = grid((case.rows, case.features_in))

  def example():
    results = {}
    for name, wrap in case.wraps():
      M = flax.core if name == 'flax' else lift
      y, variables = M.init(case.model(wrap))(RNGS, x)
      results[name] = (y, variables), M.apply(case.model(wrap), mutable='stats')(
          variables, x, rngs={'dropout': KD_APPLY})
    return results

  results = run_compiled(example)
  # the same values, variables and rng draws as without jit: the same operations
  assert_trees_equal(results['ours'], results['untransformed'])
  if 'flax' in results:  # Flax's jit folds the path into its keys (SPEC): trees, not values
    shapes = lambda tree: jax.tree.map(jnp.shape, plain(tree))
    assert shapes(results['ours']) == shapes(results['flax'])
  (ys, _), _ = results['ours']
  if case.draws:  # every call draws new keys, a child called again too
    for i in range(len(ys)):
      assert not any(np.array_equal(ys[i], ys[j]) for j in range(i))


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
      h = self.scales[j] * ACTIVATIONS[self.activations[j]](scope.child(layer, 'dense')(x, self.features))
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
      y, mutated = lax.switch(jnp.asarray(self.index), [applied(j) for j in range(len(self.scales))],
                              params, state)
    return (y, _draws_after(max(self.draws), (self.features,), key)), mutated


@st.composite
def branch_cases(draw, kind):
  k = 2 if kind == 'cond' else draw(st.integers(1, 4))
  per_branch = lambda strategy: tuple(draw(st.lists(strategy, min_size=k, max_size=k)))
  return BranchCase(
      kind=kind, scales=per_branch(st.sampled_from([-1.0, 0.5, 2.0])),
      activations=per_branch(st.sampled_from(sorted(ACTIVATIONS))), draws=per_branch(st.integers(0, 2)),
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
      loss = lambda run: lambda params: _sum_of_squares(run(params)[0])
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
    h = jnp.tanh(scope.child(layer, 'dense')(h, self.features)) + noise(scope, (self.features,))[None]
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
      scope.child(layer, 'dense')(jnp.zeros((1, self.features)), self.features)  # the params, before
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
      carry=draw(st.sampled_from(['array', 'tuple', 'dict'] if carry_variables else ['tuple', 'dict'])),
      carry_variables=carry_variables, split_dropout=draw(st.booleans()), grad=draw(st.booleans()))


@property_settings(6)
@given(while_cases())
def test_while_loop_equals_lax_while_loop_on_the_explicit_variables(case):
  zeros = {'steps': np.int32(0), 'total': np.zeros((case.features,), np.float32)}

  def example():
    params = layer_params(KP, case.features, case.features)
    carry, state = case.oracle(params, zeros, KD)
    results = {'init': lift.init(case.model(lift))(RNGS), 'init_oracle': (carry, {'params': params, **state}),
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


# -- map_variables ------------------------------------------------------------------------


def _on_floats(fn):
  return lambda collections: jax.tree.map(lambda a: fn(a) if jnp.issubdtype(a.dtype, jnp.floating) else a,
                                          collections)


MAPS = {  # name: (map_in, map_out), map_in(map_out(v)) == v exactly
    'transpose': (_on_floats(lambda a: a.T), _on_floats(lambda a: a.T)),
    'double': (_on_floats(lambda a: 2.0 * a), _on_floats(lambda a: 0.5 * a)),
    'negate': (_on_floats(jnp.negative), _on_floats(jnp.negative)),
    'identity': (lambda c: c, lambda c: c),
}


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
    after that pass.
    """
    map_in, map_out = MAPS[self.maps]
    view = {c: map_in(v) if c in self.mapped else v for c, v in variables.items()}
    if self.init and 'stats' in self.mapped:
      _, passed = lift.apply(mapped_body, mutable='stats')(variables, x, self.features, rngs={'dropout': key})
      view = {**variables, **{c: v for c, v in passed.items() if c in self.mapped}}
    writable = ['stats'] if 'stats' not in self.mapped or self.mutable or self.init else []
    y, written = lift.apply(mapped_body, mutable=writable)(view, x, self.features, rngs={'dropout': key})
    if 'stats' in written and 'stats' in self.mapped:
      written = {'stats': map_out(written['stats'])}
    return y, {'stats': variables['stats'], **written}

  def init_oracle(self, x):
    """Untransformed init (its keys, one update of 'stats'), stored mapped out. Where the
    init pass may write mapped 'stats', the pass on the view updates them a second time."""
    y, created = lift.init(mapped_body)(RNGS, x, self.features)
    if 'stats' in self.mapped and not (self.init or self.mutable):  # read-only: not created
      created = {'params': created['params']}
    elif 'stats' in self.mapped and self.init:
      _, updated = lift.apply(mapped_body, mutable='stats')(created, x, self.features, rngs={'dropout': KD})
      created = {**created, **updated}
    map_out = MAPS[self.maps][1]
    return y, {c: map_out(v) if c in self.mapped else v for c, v in created.items()}


@st.composite
def map_cases(draw):
  return MapCase(
      maps=draw(st.sampled_from(sorted(MAPS))),
      mapped=draw(st.sampled_from([('params',), ('stats',), ('params', 'stats')])),
      init=draw(st.booleans()), mutable=draw(st.booleans()), rows=draw(SIZES),
      features_in=draw(SIZES), features=draw(SIZES), grad=draw(st.booleans()))


@property_settings(10)
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
    if not case.init:  # Flax's init pass draws keys that its second pass then skips
      results['init_flax'] = flax.core.init(case.lifted(flax_lift))(RNGS, x)
    if apply_fails:
      return results
    oracle = lambda params: case.oracle({'params': params, 'stats': stats}, x, KD_APPLY)
    results.update(apply=apply(stored), apply_oracle=oracle(stored))
    if not case.init:
      results['apply_flax'] = apply(stored, flax.core, flax_lift)
    if case.grad:
      loss = lambda run: lambda params: _sum_of_squares(run(params)[0])
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
