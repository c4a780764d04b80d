"""Properties of lift.checkpoint and lift.jit over random configurations.

checkpoint against `jax.checkpoint` of the untransformed function on the explicit
variables, jit against the untransformed function, both against `flax.core.lift` where
it draws the same keys: values, the variable trees init returns, mutated collections,
rng draws and gradients. Each example is one compiled program (`run_compiled`).
"""
import dataclasses

import flax.core
import jax
import numpy as np
import pytest
from flax.core import lift as flax_lift
from hypothesis import given
from hypothesis import strategies as st

import lift
from tests.helpers import (ACTIVATIONS, POLICIES, SIZES, assert_trees_close, assert_trees_equal,
                           grid, layer, noise, plain, property_settings, run_compiled,
                           sum_of_squares, update_stats)
from tests.lift.test_flax_core_parity import flax_style_jit

KP, KD, KD_APPLY = jax.random.key(0), jax.random.key(1), jax.random.key(2)
RNGS = {'params': KP, 'dropout': KD}


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
    static = dict(argnums=dict(static_argnums=(1, 2)),
                  argnames=dict(static_argnames=('n_layers', 'activation')),
                  mixed=dict(static_argnums=(1,), static_argnames=('activation',)))[self.static]
    rematted = L.checkpoint(remat_body, policy=POLICIES[self.policy],
                            prevent_cse=self.prevent_cse, **static)
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
      activation=draw(st.sampled_from(sorted(ACTIVATIONS))),
      policy=draw(st.sampled_from(list(POLICIES))),
      prevent_cse=draw(st.booleans()), static=static,
      by_keyword=static == 'argnames' and draw(st.booleans()))


@pytest.mark.tracer_leaks_outside  # flax.core.lift.checkpoint's body, cached by JAX, keeps them
@property_settings(6)
@given(remat_cases())
def test_checkpoint_equals_jax_checkpoint_of_the_untransformed_function(case):
  x, scale = grid((case.rows, case.features)), np.float32(1.5)

  def example():
    results = {'init': lift.init(case.lifted())(RNGS, x, scale),
               'init_untransformed': lift.init(remat_body)(
                   RNGS, x, case.n_layers, case.activation, scale=scale)}
    variables = results['init'][1]
    apply = lambda params, scale, M=lift, L=lift: M.apply(case.lifted(L), mutable='stats')(
        {**variables, 'params': params}, x, scale, rngs={'dropout': KD_APPLY})
    oracle = lambda params, scale: case.oracle(params, variables['stats'], x, scale, KD_APPLY)
    loss = lambda run: lambda *args: sum_of_squares(run(*args)[0])
    grad = lambda run: jax.grad(loss(run), argnums=(0, 1))(variables['params'], scale)
    results.update(apply=apply(variables['params'], scale),
                   apply_oracle=oracle(variables['params'], scale),
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


@property_settings(6)
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
    shapes = lambda tree: jax.tree.map(np.shape, plain(tree))
    assert shapes(results['ours']) == shapes(results['flax'])
  (ys, _), _ = results['ours']
  if case.draws:  # every call draws new keys, a child called again too
    for i in range(len(ys)):
      assert not any(np.array_equal(ys[i], ys[j]) for j in range(i))
