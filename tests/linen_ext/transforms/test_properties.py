"""Properties of the Module transforms over random configurations, against flax.linen.

Each example writes its model once as a function of ``nn`` and runs it with `linen_ext`
and `flax.linen` in one compiled program: the variable trees init returns, outputs,
mutated collections and (for some examples) gradients agree bit for bit. The oracles
on explicit variables are the properties of the lifted transforms these are built on
(tests/lift/test_properties_*.py).
"""
import dataclasses
from typing import Any

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

import linen_ext
from tests.helpers import (ACTIVATIONS, MAPS, POLICIES, SIZES, assert_trees_equal, axes,
                           check_split, grid, insert_axis, key_uniform, plain, property_settings,
                           run_compiled)

RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
DROPOUT = {'dropout': jax.random.key(2)}


def both(build):
  """``build(nn, variables)`` with linen_ext (``variables`` None), then with flax.linen on
  the variables ours initialised, as one compiled program."""
  def run():
    ours = build(linen_ext, None)
    return ours, build(flax_nn, ours['init'][1])
  return run_compiled(run)


def dense(nn, features, name=None):
  return nn.Dense(features, kernel_init=key_uniform, bias_init=key_uniform, name=name)


def draw(module, shape):
  return key_uniform(module.make_rng('dropout'), shape)


def init_and_apply(model, args, mutable, variables=None):
  """init's output and variables, and apply's with ``mutable`` and fresh dropout keys on
  ``variables`` (None: those init returned)."""
  init = model.init_with_output(RNGS, *args)
  variables = init[1] if variables is None else variables
  stored = {c: v for c, v in variables.items() if c != 'intermediates'}
  return {'init': init, 'apply': model.apply(stored, *args, rngs=DROPOUT, mutable=mutable)}


# -- vmap and scan ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MappedCase:
  transform: str  # 'vmap' or 'scan'
  n: int
  rows: int
  features: int
  params_axis: int | None  # None: shared (vmap) or broadcast (scan)
  split_params: bool
  stats_axis: int | None  # None: shared, reduced over the items (vmap only)
  sow: bool  # 'intermediates' lifted (axis 0)
  split_dropout: bool
  x_axis: int | None  # None: unmapped, the size given (vmap only)
  y_axis: int
  reverse: bool
  unroll: int

  def modules(self, nn):
    features = self.features

    class Item(nn.Module):  # one item of vmap
      @nn.compact
      def __call__(self, x, shift):
        h = dense(nn, features)(x)
        total = self.variable('stats', 'total', jnp.zeros, (features,))
        total.value = total.value + jax.lax.pmean(h.mean(0), 'batch')
        self.sow('intermediates', 'h', h)
        drawn = draw(self, (features,))
        return h + drawn[None], drawn, 2.0 * shift

    class Step(nn.Module):  # one step of scan
      @nn.compact
      def __call__(self, carry, x, shift):
        h = jnp.tanh(dense(nn, features)(carry + x)) + shift[None]
        total = self.variable('stats', 'total', jnp.zeros, (features,))
        total.value = total.value + h.mean(0)
        self.sow('intermediates', 'h', h)
        return h, (h, draw(self, (features,)))

    return Item, Step

  def model(self, nn):
    Item, Step = self.modules(nn)
    variable_axes = {'stats': self.stats_axis, **({'intermediates': 0} if self.sow else {})}
    splits = {'params': self.split_params, 'dropout': self.split_dropout}
    if self.transform == 'vmap':
      return nn.vmap(Item, variable_axes={'params': self.params_axis, **variable_axes},
                     split_rngs=splits,
                     in_axes=(self.x_axis, None), out_axes=(self.y_axis, self.y_axis, None),
                     axis_size=self.n if self.x_axis is None else None, axis_name='batch')()
    if self.params_axis is not None:
      variable_axes['params'] = self.params_axis
    return nn.scan(Step, variable_axes=variable_axes,
                   variable_broadcast='params' if self.params_axis is None else False,
                   split_rngs=splits, in_axes=(self.x_axis, nn.broadcast), out_axes=self.y_axis,
                   length=self.n, reverse=self.reverse, unroll=self.unroll)()

  def arguments(self):
    x = grid(insert_axis((self.rows, self.features), self.x_axis, self.n))
    shift = grid((self.features,), 0.5)
    if self.transform == 'vmap':
      return x, shift
    return grid((self.rows, self.features), 0.25), x, shift


@st.composite
def mapped_cases(draw_from, transform):
  scan = transform == 'scan'
  params_axis = draw_from(axes(None))
  return MappedCase(
      transform=transform, n=draw_from(SIZES), rows=draw_from(SIZES), features=draw_from(SIZES),
      params_axis=params_axis, split_params=params_axis is not None and draw_from(st.booleans()),
      stats_axis=draw_from(axes() if scan else axes(None)), sow=draw_from(st.booleans()),
      split_dropout=draw_from(st.booleans()), x_axis=draw_from(axes() if scan else axes(None)),
      y_axis=draw_from(axes()), reverse=scan and draw_from(st.booleans()),
      unroll=draw_from(st.sampled_from([1, 2])) if scan else 1)


@pytest.mark.parametrize('transform', ['vmap', 'scan'])
@property_settings(3)
@given(data=st.data())
def test_vmap_and_scan_of_a_module_match_flax_linen(transform, data):
  case = data.draw(mapped_cases(transform))
  ours, theirs = both(lambda nn, variables: init_and_apply(
      case.model(nn), case.arguments(), ['stats', 'intermediates'], variables))
  assert_trees_equal(ours, theirs)
  outputs, variables = ours['init']
  kernel = variables['params']['Dense_0']['kernel']
  axis = case.params_axis
  assert kernel.shape == insert_axis((case.features, case.features), axis, case.n)
  if axis is not None:
    check_split(kernel, axis, case.split_params, case.n)
  drawn = outputs[1] if case.transform == 'vmap' else outputs[1][1]
  check_split(drawn, case.y_axis, case.split_dropout, case.n)


# -- checkpoint, jit, cond, switch, while_loop, map_variables -----------------------------


@dataclasses.dataclass(frozen=True)
class Case:
  kind: str
  rows: int
  features_in: int
  features: int
  options: Any  # per kind (see `other_cases`)
  grad: bool

  def block(self, nn):
    """Dense layers (the count is a static argument), a 'stats' counter and a draw."""
    features, activation = self.features, ACTIVATIONS[self.options.get('activation', 'tanh')]

    class Block(nn.Module):
      @nn.compact
      def __call__(self, x, n_layers):
        for i in range(n_layers):
          x = activation(dense(nn, features, f'dense_{i}')(x))
        count = self.variable('stats', 'count', jnp.zeros, (), jnp.int32)
        count.value = count.value + 1
        return x + draw(self, (features,))[None]

    return Block

  @property
  def taken(self):
    index, k = self.options['index'], len(self.options['scales'])
    return (0 if index else 1) if self.kind == 'cond' else min(max(index, 0), k - 1)

  def model(self, nn):
    """The transformed model, and the arguments after x."""
    options = self.options
    if self.kind == 'remat':
      return nn.remat(self.block(nn), static_argnums=(2,), prevent_cse=options['prevent_cse'],
                      policy=POLICIES[options['policy']])(), (options['n_layers'],)
    if self.kind == 'jit':  # Flax's jit folds the path into its keys: ours draws the unjitted keys
      block = nn.jit(self.block(nn), static_argnums=(2,)) if nn is linen_ext else self.block(nn)
      calls = options['calls']

      class Twice(nn.Module):
        @nn.compact
        def __call__(self, x, n_layers):
          children = {name: block(name=name) for name in sorted(set(calls))}
          return [children[name](x, n_layers) for name in calls]

      return Twice(), (options['n_layers'],)
    if self.kind in ('cond', 'switch'):
      return self.branching(nn), (options['index'],)
    if self.kind == 'while_loop':
      return self.looping(nn), ()
    return nn.map_variables(self.block(nn), 'params', *MAPS[options['maps']], mutable=True)(), (1,)

  def branching(self, nn):
    scales, activations, kind, features = (
        self.options['scales'], self.options['activations'], self.kind, self.features)

    class Branching(nn.Module):
      @nn.compact
      def __call__(self, x, index):
        for j in range(len(scales)):
          self.variable('stats', f'count_{j}', jnp.zeros, (), jnp.int32)
        def branch(j):
          def fn(module, x):
            count = module.variable('stats', f'count_{j}')
            count.value = count.value + 1
            return scales[j] * ACTIVATIONS[activations[j]](dense(nn, features, 'dense')(x))
          return fn
        branches = [branch(j) for j in range(len(scales))]
        if kind == 'cond':
          y = nn.cond(index, *branches, self, x)
        else:
          y = nn.switch(index, branches, self, x)
        return y, draw(self, (features,))

    return Branching()

  def looping(self, nn):
    options, features = self.options, self.features
    trips, carried, split = options['trips'], options['carry_variables'], options['split']

    class Looping(nn.Module):
      @nn.compact
      def __call__(self, x):
        self.variable('stats', 'total', jnp.zeros, (features,))
        layer = dense(nn, features, 'dense')
        h = layer(x)

        def body(module, carry):
          h, i = carry
          h = jnp.tanh(layer(h)) + draw(module, (features,))[None]
          if module.is_mutable_collection('stats'):
            total = module.variable('stats', 'total')
            total.value = total.value + h.mean(0)
          return h, i + 1

        return nn.while_loop(lambda module, carry: carry[1] < trips, body, self, (h, jnp.int32(0)),
                             carry_variables='stats' if carried else False,
                             split_rngs={'dropout': split})

    return Looping()


def _options(kind):
  if kind == 'remat':
    return st.fixed_dictionaries({'n_layers': st.integers(1, 3),
                                  'policy': st.sampled_from(list(POLICIES)),
                                  'prevent_cse': st.booleans(),
                                  'activation': st.sampled_from(sorted(ACTIVATIONS))})
  if kind == 'jit':
    return st.fixed_dictionaries({'n_layers': st.integers(1, 2),
                                  'calls': st.lists(st.sampled_from('ab'), min_size=1, max_size=3)})
  if kind in ('cond', 'switch'):
    k = st.just(2) if kind == 'cond' else st.integers(1, 4)
    return k.flatmap(lambda k: st.fixed_dictionaries({
        'scales': st.lists(st.sampled_from([-1.0, 0.5, 2.0]), min_size=k, max_size=k),
        'activations': st.lists(st.sampled_from(sorted(ACTIVATIONS)), min_size=k, max_size=k),
        'index': st.booleans() if kind == 'cond' else st.integers(-2, k + 1)}))
  if kind == 'while_loop':
    return st.fixed_dictionaries({'trips': st.integers(0, 3), 'carry_variables': st.booleans(),
                                  'split': st.booleans()})
  return st.fixed_dictionaries({'maps': st.sampled_from(sorted(MAPS))})


@st.composite
def other_cases(draw_from, kind):
  features_in = draw_from(SIZES)
  return Case(kind=kind, rows=draw_from(SIZES), features_in=features_in,
              features=features_in if kind == 'while_loop' else draw_from(SIZES),
              options=draw_from(_options(kind)),
              grad=kind != 'while_loop' and draw_from(st.booleans()))


@pytest.mark.parametrize('kind', ['remat', 'jit', 'cond', 'switch', 'while_loop', 'map_variables'])
@property_settings(2)
@given(data=st.data())
def test_other_transforms_of_a_module_match_flax_linen(kind, data):
  case = data.draw(other_cases(kind))
  x = grid((case.rows, case.features_in))

  def build(nn, variables):
    model, args = case.model(nn)
    results = init_and_apply(model, (x, *args), 'stats', variables)
    variables = results['init'][1] if variables is None else variables
    if case.grad:
      loss = lambda params: sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(model.apply(
          {**variables, 'params': params}, x, *args, rngs=DROPOUT, mutable='stats')[0]))
      results['grad'] = jax.grad(loss)(variables['params'])
    return results

  ours, theirs = both(build)
  if case.kind in ('cond', 'switch') and case.taken != 0:
    # Flax inits with the first branch, then traces the others with the counters it left:
    # ours creates the variables of untransformed code (SPEC), whichever branch runs.
    shapes = lambda tree: jax.tree.map(jnp.shape, plain(tree))
    assert shapes(ours.pop('init')) == shapes(theirs.pop('init'))
  assert_trees_equal(ours, theirs)
