"""Properties of lift.vmap and lift.scan over random configurations, against their oracles.

Each property draws a configuration (shapes, axes, variable rules per collection, rng
splits, transform options), runs the lifted transform, and compares with hand-written
JAX on explicitly stacked (or passed) variables: values, the variable trees init
returns, mutated collections, rng keys and, for some examples, gradients. Where
`flax.core.lift` has the same transform it runs the same configuration too.

Every example is one compiled program (`run_compiled`): ours, the oracle and Flax's
side by side, so the cost of an example is one compile.
"""
import dataclasses
from typing import Any

import flax.core
import jax
import jax.numpy as jnp
import pytest
from flax.core import lift as flax_lift
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import lift
from tests.helpers import (SIZES, assert_trees_close, assert_trees_equal, axes, check_split, grid,
                           insert_axis, layer, layer_params, noise, property_settings, run_compiled,
                           sow, update_stats)
from tests.lift.test_flax_core_parity import marker

KP, KD, KD_APPLY = jax.random.key(0), jax.random.key(1), jax.random.key(2)
RNGS = {'params': KP, 'dropout': KD}


def _keys(key, split, n):
  """What item (step) i of a stream draws from: ``split(key, n)[i]``, or ``key`` unsplit."""
  return jax.random.split(key, n) if split else key


def _key_axis(split):
  return 0 if split else None


def _to_front(tree, axis):
  return jax.tree.map(lambda a: jnp.moveaxis(a, axis, 0), tree)


def _from_front(tree, axis):
  return jax.tree.map(lambda a: jnp.moveaxis(a, 0, axis), tree)


# -- vmap ---------------------------------------------------------------------------------


def vmap_body(scope, x, shift):
  """A layer, 'stats' reduced over the items (so that they may be shared), a sow, a draw."""
  h = scope.child(layer, 'dense')(x, shift.shape[0])
  update_stats(scope, jax.lax.pmean(h, 'batch'))
  sow(scope, h)
  drawn = noise(scope, shift.shape)
  return h + drawn[None], drawn, 2.0 * shift


@dataclasses.dataclass(frozen=True)
class VmapCase:
  n: int
  rows: int
  features_in: int
  features: int
  params_axis: int | None
  stats_axis: int | None
  sow_axis: int | None  # None: 'intermediates' is not lifted
  split_params: bool
  split_dropout: bool
  x_axis: int | None
  y_axis: int
  grad: bool

  def lifted(self, L):
    axes = {'params': self.params_axis, 'stats': self.stats_axis}
    if self.sow_axis is not None:
      axes['intermediates'] = self.sow_axis
    return L.vmap(vmap_body, variable_axes=axes,
                  split_rngs={'params': self.split_params, 'dropout': self.split_dropout},
                  in_axes=(self.x_axis, None), out_axes=(self.y_axis, self.y_axis, None),
                  axis_size=self.n if self.x_axis is None else None, axis_name='batch')

  def axis_of(self, collection):
    return {'params': self.params_axis, 'stats': self.stats_axis,
            'intermediates': self.sow_axis}[collection]

  def oracle(self, one, leading_axes, collections):
    """``jax.vmap`` of ``one(*leading, dropout_key, x) -> (outputs, {collection: tree})``."""
    return jax.vmap(
        one, in_axes=(*leading_axes, _key_axis(self.split_dropout), self.x_axis),
        out_axes=((self.y_axis, self.y_axis, None), {c: self.axis_of(c) for c in collections}),
        axis_name='batch', axis_size=self.n)

  def dropout_keys(self, key):
    return _keys(key, self.split_dropout, self.n)


RNG_RULES = {  # params' axis, and whether 'params' and 'dropout' are split
    'per item, split': (axes(), st.just(True), st.just(True)),
    'per item, one key': (axes(), st.just(False), st.just(False)),
    'shared': (st.just(None), st.just(False), st.booleans())}


@st.composite
def vmap_cases(draw, rng_rule):
  params_axis, split_params, split_dropout = (draw(s) for s in RNG_RULES[rng_rule])
  return VmapCase(
      n=draw(SIZES), rows=draw(SIZES), features_in=draw(SIZES), features=draw(SIZES),
      params_axis=params_axis, stats_axis=draw(axes(None)), sow_axis=draw(axes(None)),
      split_params=split_params, split_dropout=split_dropout, x_axis=draw(axes(None)),
      y_axis=draw(axes()), grad=draw(st.booleans()))


@pytest.mark.parametrize('rng_rule', sorted(RNG_RULES))
@property_settings(3)
@given(data=st.data())
def test_vmap_equals_jax_vmap_over_stacked_variables(rng_rule, data):
  case = data.draw(vmap_cases(rng_rule))
  x = grid(insert_axis((case.rows, case.features_in), case.x_axis, case.n))
  shift = grid((case.features,), 0.5)
  sown = [] if case.sow_axis is None else ['intermediates']
  mutable = ['stats', 'intermediates']

  def init_oracle():  # item i creates what an unmapped init creates with item i's keys
    def one(kp, kd, x):
      return lift.init(vmap_body, mutable=['params', 'stats', *sown])(
          {'params': kp, 'dropout': kd}, x, shift)
    return case.oracle(one, [_key_axis(case.split_params)], ['params', 'stats', *sown])(
        _keys(KP, case.split_params, case.n), case.dropout_keys(KD), x)

  def apply(params, stats, M=lift, L=lift):
    return M.apply(case.lifted(L), mutable=mutable)(
        {'params': params, 'stats': stats}, x, shift, rngs={'dropout': KD_APPLY})

  def apply_oracle(params, stats):
    def one(params, stats, kd, x):
      return lift.apply(vmap_body, mutable=['stats', *sown])(
          {'params': params, 'stats': stats}, x, shift, rngs={'dropout': kd})
    return case.oracle(one, [case.params_axis, case.stats_axis], ['stats', *sown])(
        params, stats, case.dropout_keys(KD_APPLY), x)

  def example():
    results = {'init': lift.init(case.lifted(lift))(RNGS, x, shift), 'init_oracle': init_oracle(),
               'init_flax': flax.core.init(case.lifted(flax_lift))(RNGS, x, shift)}
    params, stats = results['init'][1]['params'], results['init'][1]['stats']
    results.update(apply=apply(params, stats), apply_oracle=apply_oracle(params, stats),
                   apply_flax=apply(params, stats, flax.core, flax_lift))
    if case.grad:
      loss = lambda run: lambda params: jnp.sum(run(params, stats)[0][0] ** 2)
      results['grads'] = [jax.grad(loss(run))(params) for run in (apply, apply_oracle)]
    return results

  results = run_compiled(example)
  (outputs, variables), (_, mutated) = results['init'], results['apply']
  assert_trees_close(results['init'], results['init_oracle'], depth=2)
  assert_trees_equal(results['init'], results['init_flax'])
  kernel_shape = insert_axis((case.features_in, case.features), case.params_axis, case.n)
  assert variables['params']['dense']['kernel'].shape == kernel_shape
  if case.params_axis is not None:
    check_split(variables['params'], case.params_axis, case.split_params, case.n)
  check_split(outputs[1], case.y_axis, case.split_dropout, case.n)
  assert sorted(mutated) == sorted(['stats', *sown])  # only the lifted collections come back
  assert_trees_close(results['apply'], results['apply_oracle'], depth=2)
  assert_trees_equal(results['apply'], results['apply_flax'])
  if case.grad:
    assert_trees_close(*results['grads'], depth=4)


# -- scan ---------------------------------------------------------------------------------


def _carry_h(carry):
  return carry['h'] if isinstance(carry, dict) else carry[0] if isinstance(carry, tuple) else carry


def _next_carry(carry, h):
  if isinstance(carry, dict):
    return {'h': h, 'steps': carry['steps'] + 1}
  return (h, carry[1] + 1) if isinstance(carry, tuple) else h


def scan_step(scope, carry, x, shift):
  """A layer on the carry (plus x), 'stats', a sow and a draw; ys are (h, draw)."""
  h = _carry_h(carry) if x is None else _carry_h(carry) + x
  h = jnp.tanh(scope.child(layer, 'dense')(h, shift.shape[0])) + shift[None]
  update_stats(scope, h)
  sow(scope, h)
  drawn = noise(scope, shift.shape)
  return _next_carry(carry, h), (h, drawn)


def looped_step(scope, carry, x, shift):
  """`scan_step` as the lifted scan runs it in the loop: like `flax.core.lift.scan`, the
  scan traces the step once before the loop, and every step draws from the rng counters
  that trace left (notes/0002): here one 'dropout' draw further."""
  scope.make_rng('dropout')
  return scan_step(scope, carry, x, shift)


def _zero_stats(features):
  return {'count': jnp.zeros((1,), jnp.int32), 'total': jnp.zeros((features,))}


@dataclasses.dataclass(frozen=True)
class ScanCase:
  length: int
  rows: int
  features: int
  params_axis: int | None  # None: broadcast
  split_params: bool
  stats_axis: int | None  # None: carried
  stats_outside: bool  # carried stats created before the loop (Flax needs this)
  sow_axis: int | None  # None: 'intermediates' is not lifted
  split_dropout: bool
  x_axis: int | None  # None: no xs, the length alone
  pass_length: bool
  y_axis: int
  carry: str
  reverse: bool
  unroll: int
  remat: Any
  grad: bool

  @property
  def sown(self):
    return [] if self.sow_axis is None else ['intermediates']

  @property
  def runs_in_flax(self):  # Flax cannot create carry variables inside the body
    return self.stats_axis is not None or self.stats_outside

  def lifted(self, L):
    variable_axes = {'params': self.params_axis, 'stats': self.stats_axis,
                     'intermediates': self.sow_axis}
    scanned = L.scan(
        scan_step, variable_axes={c: a for c, a in variable_axes.items() if a is not None},
        variable_broadcast='params' if self.params_axis is None else False,
        variable_carry='stats' if self.stats_axis is None else False,
        split_rngs={'params': self.split_params, 'dropout': self.split_dropout},
        in_axes=(0 if self.x_axis is None else self.x_axis, marker(L)), out_axes=self.y_axis,
        length=self.length if self.pass_length else None, reverse=self.reverse,
        unroll=self.unroll, **({'remat': self.remat} if L is lift else {}))
    def model(scope, carry, xs, shift):
      if self.stats_outside:
        for name, value in _zero_stats(self.features).items():
          scope.variable('stats', name, lambda v=value: v)
      return scanned(scope, carry, xs, shift)
    return model

  def init_params(self):
    """What init creates: one set of broadcast params, made before the loop; or each step's
    params from its key, drawn after the draw of the trace before the loop."""
    if self.params_axis is None:
      return layer_params(KP, self.features, self.features)
    one = lambda key: layer_params(key, self.features, self.features, draws_before=1)
    if self.split_params:
      stacked = jax.vmap(one)(jax.random.split(KP, self.length))
    else:
      stacked = jax.tree.map(lambda a: jnp.stack([a] * self.length), one(KP))
    return _from_front(stacked, self.params_axis)

  def oracle(self, params, stats, carry, xs, shift, dropout_key):
    """`lax.scan` over the explicitly stacked variables, carried stats in the carry."""
    stacked = lambda tree, axis: None if axis is None else _to_front(tree, axis)
    def step(loop, inputs):
      carry, carried = loop
      params_i, stats_i, x, key = inputs
      variables = {'params': params if params_i is None else params_i,
                   'stats': carried if stats_i is None else stats_i}
      (carry, ys), mutated = lift.apply(looped_step, mutable=['stats', *self.sown])(
          variables, carry, x, shift, rngs={'dropout': dropout_key if key is None else key})
      per_step = {c: v for c, v in mutated.items() if c != 'stats' or stats_i is not None}
      return (carry, None if stats_i is not None else mutated['stats']), (ys, per_step)
    keys = jax.random.split(dropout_key, self.length) if self.split_dropout else None
    (carry, carried), (ys, per_step) = lax.scan(
        step, (carry, stats if self.stats_axis is None else None),
        (stacked(params, self.params_axis), stacked(stats, self.stats_axis),
         stacked(xs, self.x_axis), keys), length=self.length, reverse=self.reverse)
    mutated = {c: _from_front(v, self.axis_of(c)) for c, v in per_step.items()}
    if self.stats_axis is None:
      mutated['stats'] = carried
    return (carry, _from_front(ys, self.y_axis)), mutated

  def axis_of(self, collection):
    return {'stats': self.stats_axis, 'intermediates': self.sow_axis}[collection]


STATS_RULES = {'scanned': axes(), 'carried': st.just(None),
               'carried, created outside': st.just(None)}


@st.composite
def scan_cases(draw, stats_rule):
  params_axis, x_axis = draw(axes(None)), draw(axes(None))
  stats = draw(STATS_RULES[stats_rule])
  return ScanCase(
      length=draw(SIZES), rows=draw(SIZES), features=draw(SIZES), params_axis=params_axis,
      split_params=params_axis is not None and draw(st.booleans()),
      stats_axis=stats, stats_outside=stats_rule == 'carried, created outside',
      sow_axis=draw(axes(None)),
      split_dropout=draw(st.booleans()), x_axis=x_axis,
      pass_length=x_axis is None or draw(st.booleans()), y_axis=draw(axes()),
      carry=draw(st.sampled_from(['array', 'tuple', 'dict'])), reverse=draw(st.booleans()),
      unroll=draw(st.sampled_from([1, 2, 3])), remat=draw(st.sampled_from([False, True, 'nested'])),
      grad=draw(st.booleans()))


def _initial_carry(case):
  h = jnp.asarray(grid((case.rows, case.features), 0.25))
  steps = jnp.int32(0)
  return {'array': h, 'tuple': (h, steps), 'dict': {'h': h, 'steps': steps}}[case.carry]


@pytest.mark.parametrize('stats_rule', sorted(STATS_RULES))
@property_settings(3)
@given(data=st.data())
def test_scan_equals_lax_scan_over_stacked_variables(stats_rule, data):
  case = data.draw(scan_cases(stats_rule))
  n, features = case.length, case.features
  carry = _initial_carry(case)
  xs = None if case.x_axis is None else grid(insert_axis((case.rows, features), case.x_axis, n))
  shift = grid((features,), 0.5)
  mutable = ['stats', 'intermediates']

  def apply(params, stats, M=lift, L=lift):
    return M.apply(case.lifted(L), mutable=mutable)(
        {'params': params, 'stats': stats}, carry, xs, shift, rngs={'dropout': KD_APPLY})

  def example():
    params = case.init_params()
    zeros = _zero_stats(features)
    if case.stats_axis is not None:
      zeros = _from_front(jax.tree.map(lambda a: jnp.stack([a] * n), zeros), case.stats_axis)
    outputs, mutated = case.oracle(params, zeros, carry, xs, shift, KD)
    results = {'init': lift.init(case.lifted(lift))(RNGS, carry, xs, shift),
               'init_oracle': (outputs, {'params': params, **mutated})}
    stats = results['init'][1]['stats']
    results.update(apply=apply(params, stats),
                   apply_oracle=case.oracle(params, stats, carry, xs, shift, KD_APPLY))
    if case.runs_in_flax:
      results.update(init_flax=flax.core.init(case.lifted(flax_lift))(RNGS, carry, xs, shift),
                     apply_flax=apply(params, stats, flax.core, flax_lift))
    if case.grad:
      loss = lambda run: lambda p: jnp.sum(_carry_h(run(p)[0][0]) ** 2) + jnp.sum(run(p)[0][1][0])
      results['grads'] = [jax.grad(loss(run))(params) for run in (
          lambda p: apply(p, stats), lambda p: case.oracle(p, stats, carry, xs, shift, KD_APPLY))]
    return results

  results = run_compiled(example)
  (outputs, variables), (_, mutated) = results['init'], results['apply']
  depth = 2 * n  # each step adds a layer of rounding
  assert_trees_close(results['init'], results['init_oracle'], depth)
  kernel_shape = insert_axis((features, features), case.params_axis, n)
  assert variables['params']['dense']['kernel'].shape == kernel_shape
  assert variables['stats']['total'].shape == insert_axis((features,), case.stats_axis, n)
  if case.params_axis is not None:
    check_split(variables['params'], case.params_axis, case.split_params, n)
  check_split(outputs[1][1], case.y_axis, case.split_dropout, n)
  assert sorted(mutated) == sorted(['stats', *case.sown])
  assert_trees_close(results['apply'], results['apply_oracle'], depth)
  if case.runs_in_flax:
    assert_trees_equal(results['init'], results['init_flax'])
    assert_trees_equal(results['apply'], results['apply_flax'])
  if case.grad:
    assert_trees_close(*results['grads'], depth=2 * depth)
