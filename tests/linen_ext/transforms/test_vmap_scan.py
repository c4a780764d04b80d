"""vmap, scan, sow inside them, remat_scan and axis metadata: the same model under linen_ext and flax.linen.

Each test writes its model once, as ``build(nn)``, and `check_linen_parity` runs it with
both libraries: variable trees, values for the same keys, outputs, mutated collections.
"""
import math

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import errors as flax_errors

import linen_ext as nn
from tests.helpers import assert_trees_close, box_names, check_linen_parity

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
XS = jnp.stack([X, 2.0 * X, 3.0 * X])  # (3, 2, 4): three steps or three items
RNGS = {'params': KEY, 'dropout': jax.random.key(1), 'noise': jax.random.key(2)}


def init_apply(model, *args, **apply_kw):
  """(output, variables) of init_with_output, and apply's result on those variables."""
  y, variables = model.init_with_output(RNGS, *args)
  return y, variables, model.apply(variables, *args, **apply_kw)


# -- vmap --------------------------------------------------------------------------------


def test_vmap_several_collections_split_or_not_axis_name_in_axes_and_out_axes_tuples():
  def build(nn):
    class Inner(nn.Module):
      @nn.compact
      def __call__(self, x, y):
        count = self.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))
        count.value += 1
        mean = self.variable('stats', 'mean', lambda: jnp.zeros(x.shape[-1:]))
        mean.value = jax.lax.pmean(x, 'batch').mean(0)
        state = self.variable('state', 's', lambda: jnp.zeros((3,)))  # created inside
        state.value = state.value + x.sum()
        return nn.Dense(2)(x - mean.value[None]) + y.sum(), x.sum()

    axes = {'params': 0, 'counter': None, 'stats': 1, 'state': 0}
    mapped = [init_apply(nn.vmap(Inner, variable_axes=axes, split_rngs={'params': split},
                                 in_axes=(0, None), out_axes=(1, 0), axis_name='batch')(),
                         XS, jnp.ones(2), mutable=['counter', 'stats', 'state'])
              for split in (True, False)]
    bn = nn.vmap(nn.BatchNorm, variable_axes={'params': None, 'batch_stats': None},
                 split_rngs={'params': False}, axis_name='batch')
    return mapped, init_apply(bn(use_running_average=False, axis_name='batch'), X,
                              mutable=['batch_stats'])
  check_linen_parity(build)


def test_nested_vmap_of_batch_norm_naming_both_axes_shares_its_statistics():
  """google/flax#3319 done right: the statistics reduce over both vmaps' axes."""
  def build(nn):
    shared = dict(variable_axes={'params': None, 'batch_stats': None},
                  split_rngs={'params': False})

    class Inner(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.BatchNorm(use_running_average=False, axis_name=('inner', 'outer'))(x)

    inner = nn.vmap(Inner, axis_name='inner', **shared)
    outer = nn.vmap(lambda m, x: m(x), axis_name='outer', **shared)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, xs):
        return outer(inner(), xs)

    return init_apply(Model(), XS, mutable=['batch_stats'])
  check_linen_parity(build)


def test_vmap_pytree_in_out_axes_shared_params_and_negative_variable_axis():
  def build(nn):
    class Inner(nn.Module):
      @nn.compact
      def __call__(self, d):
        return {'y': nn.Dense(2)(d['a']) + d['b'], 'const': d['b']}

    class Outer(nn.Module):
      @nn.compact
      def __call__(self, x):
        tree = nn.vmap(Inner, variable_axes={'params': 0}, split_rngs={'params': True},
                       in_axes=({'a': 0, 'b': None},), out_axes={'y': 1, 'const': None})
        shared = nn.vmap(nn.Dense, variable_axes={'params': None}, split_rngs={'params': False},
                         in_axes=1, out_axes=1)
        last = nn.vmap(nn.Dense, variable_axes={'params': -1}, split_rngs={'params': True})
        return (tree()({'a': x, 'b': jnp.ones((2, 2))}), shared(3)(x[:, :, None]),
                last(3)(x[0]))
    return init_apply(Outer(), XS)
  check_linen_parity(build)


def test_vmap_methods_list_and_per_method_options():
  def build(nn, by_dict=False):
    class Enc(nn.Module):
      def setup(self):
        self.dense = nn.Dense(3)

      def encode(self, x):
        return self.dense(x)

      def decode(self, z):
        return 2.0 * z

      def __call__(self, x):
        return self.decode(self.encode(x))

    axes = dict(variable_axes={'params': 0}, split_rngs={'params': True})
    mapped = (nn.vmap(Enc, methods={'encode': axes, 'decode': axes}) if by_dict else
              nn.vmap(Enc, methods=['encode', 'decode'], **axes))
    variables = mapped().init(KEY, XS, method='encode')
    return (variables, mapped().apply(variables, XS),
            mapped().apply(variables, XS, method=lambda m, x: m.decode(m.encode(x))))
  ours, _ = check_linen_parity(build)
  check_linen_parity(lambda nn: build(nn, by_dict=True))  # per-method options, as Flax
  assert ours[0]['params']['dense']['kernel'].shape == (3, 4, 3)


# -- scan ---------------------------------------------------------------------------------


def scan_cases(nn):
  """name -> (cell, scan options, arguments, apply options)."""
  class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, *xs):
      h = nn.tanh(nn.Dense(4)(xs[0] if xs else c) + c)
      return h, h

  class Broadcast(nn.Module):  # broadcast inputs and outputs, None leaves
    @nn.compact
    def __call__(self, c, x, bias):
      h = nn.tanh(nn.Dense(4)(x) + c[0] + bias)
      return (h, None), (h, h.sum(-1), None, jnp.ones(3))

  class NormDrop(nn.Module):  # per-step batch stats, split dropout
    @nn.compact
    def __call__(self, c, x):
      h = nn.BatchNorm(use_running_average=False)(nn.Dense(4)(x))
      h = nn.Dropout(0.5, deterministic=False)(h)
      return c + h.sum(), h

  stacked = dict(variable_axes={'params': 0}, split_rngs={'params': True})
  carry = jnp.zeros((2, 4))
  return {
      'reverse_unroll2': (Cell, dict(reverse=True, unroll=2, **stacked), (carry, XS), {}),
      'length_without_xs_unroll_true': (Cell, dict(length=3, in_axes=(), unroll=True, **stacked),
                                        (carry,), {}),
      'broadcast_in_out_tuple_out_axes': (
          Broadcast, dict(variable_broadcast='params', split_rngs={'params': False},
                          in_axes=(1, nn.broadcast), out_axes=(2, 0, 0, nn.broadcast)),
          ((jnp.zeros((3, 4)), None), XS, jnp.ones((3, 4))), {}),
      'batch_norm_per_step_stats_dropout_split': (
          NormDrop, dict(variable_axes={'params': 0, 'batch_stats': 0},
                         split_rngs={'params': True, 'dropout': True}),
          (jnp.zeros(()), XS), dict(rngs=RNGS, mutable=['batch_stats']))}


@pytest.mark.parametrize('case', sorted(scan_cases(nn)))
def test_scan_options_match_flax(case):
  def build(nn):
    cell, options, args, apply_kw = scan_cases(nn)[case]
    return init_apply(nn.scan(cell, **options)(name='s'), *args, **apply_kw)
  check_linen_parity(build)


def test_scan_carry_variables_existing_and_created_in_the_body():
  def build(nn, create=False):
    class Cell(nn.Module):
      @nn.compact
      def __call__(self, c, x):
        if create or self.has_variable('counter', 'n'):
          count = self.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))
          count.value = count.value + 1
          return c + nn.Dense(4)(x), count.value
        return c + nn.Dense(4)(x), jnp.zeros((), jnp.int32)

    scanned = nn.scan(Cell, variable_broadcast='params', variable_carry='counter',
                      split_rngs={'params': False})(name='s')
    (_, counts), variables = scanned.init_with_output(KEY, jnp.zeros((2, 4)), XS)
    if not create:
      variables = {**variables, 'counter': {'n': jnp.array(5)}}
    return counts, variables, scanned.apply(variables, jnp.zeros((2, 4)), XS, mutable=['counter'])

  _, variables, ((_, counts), updated) = check_linen_parity(build)[0]
  assert list(counts) == [6, 7, 8] and int(updated['counter']['n']) == 8
  # Created in the body at init (Flax's scan refuses: its carry changes structure).
  counts, variables, (_, updated) = build(nn, create=True)
  assert list(counts) == [1, 2, 3] and int(variables['counter']['n']) == 3
  assert int(updated['counter']['n']) == 6


def test_scan_carries_batch_stats_created_inside_at_init():
  class Step(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      y = nn.BatchNorm(use_running_average=False, momentum=0.5)(nn.Dense(4)(x))
      return y, y.mean()

  class Unrolled(nn.Module):  # the oracle: the same three steps, unrolled
    @nn.compact
    def __call__(self, x):
      step = Step(name='steps')
      for _ in range(3):
        x, _ = step(x, None)
      return x

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.scan(Step, variable_broadcast='params', variable_carry='batch_stats',
                     split_rngs={'params': False}, length=3)(name='steps')(x, None)

  variables = Net().init(KEY, X)
  assert variables['batch_stats']['steps']['BatchNorm_0']['mean'].shape == (4,)
  (y, means), updated = Net().apply(variables, X, mutable=['batch_stats'])
  assert means.shape == (3,)
  # A loop body and its unrolled copy round differently: 3 Dense + BatchNorm layers.
  assert_trees_close((y, updated), Unrolled().apply(variables, X, mutable=['batch_stats']), 3)


def test_native_params_and_split_or_shared_rngs_inside_scan_vmap_and_vmap_in_scan():
  def build(nn):
    class Native(nn.Module):
      @nn.compact
      def __call__(self, x):
        w = self.param('w', nn.initializers.normal(1.0), (4, 4))
        b = self.param('b', lambda k, s: jax.random.uniform(k, s), (4,))
        noise = jax.random.normal(self.make_rng('noise'), x.shape)
        return x @ w + b[None] + noise + jax.random.normal(self.make_rng('dropout'), x.shape)

    class Cell(nn.Module):
      @nn.compact
      def __call__(self, c, x):
        return Native()(c) + x, Native()(x)

    class Nested(nn.Module):
      @nn.compact
      def __call__(self, c, x):
        mapped = nn.vmap(Native, variable_axes={'params': 0},
                         split_rngs={'params': True, 'noise': True}, in_axes=None, axis_size=2)
        return c + mapped()(x).sum(0), c

    class Outer(nn.Module):
      @nn.compact
      def __call__(self, x):
        xs = jnp.stack([x, x, x])
        c, ys = nn.scan(Cell, variable_axes={'params': 0},
                        split_rngs={'params': True, 'noise': True})()(x, xs)
        splits = [{'params': True, 'noise': False}, {True: True}, {nn.DenyList('noise'): True}]
        mapped = [nn.vmap(Native, variable_axes={'params': 0}, split_rngs=s)()(xs) for s in splits]
        nested = nn.scan(Nested, variable_axes={'params': 1}, split_rngs={'params': True,
                         'noise': True}, length=3, in_axes=nn.broadcast)
        return c, ys, mapped, Native()(x) + Native()(x), nested()(x, x)
    return init_apply(Outer(), X, rngs=RNGS)
  check_linen_parity(build)


def test_scan_over_a_setup_cell_and_a_module_argument():
  """Scanning the passed module's params too is refused (the misuse catalogue)."""
  def build(nn):
    class Cell(nn.Module):
      def setup(self):
        self.dense = nn.Dense(4)
        self.norm = nn.LayerNorm()

      def __call__(self, c, x, *head):
        h = self.norm(self.dense(x) + c)
        return (h + head[0](x) if head else h), h

    class Outer(nn.Module):
      @nn.compact
      def __call__(self, xs):
        head = nn.Dense(4, name='head')
        head(xs[0])
        stacked = nn.scan(Cell, variable_axes={'params': 0}, split_rngs={'params': True})
        shared = nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False},
                         in_axes=(0, nn.broadcast))
        return stacked()(jnp.zeros((2, 4)), xs), shared()(jnp.zeros((2, 4)), xs, head)
    return init_apply(Outer(), XS)
  check_linen_parity(build)


# -- sow and intermediates inside transforms ---------------------------------------------


def sowing_models(nn):
  def sow(module, h):  # the output, and whether 'intermediates' is writable and was written
    sown = [module.sow('intermediates', 'h', h), module.sow('intermediates', 'h', 2.0 * h)]
    return h, jnp.array([module.is_mutable_collection('intermediates'), *sown])

  class Inner(nn.Module):
    @nn.compact
    def __call__(self, x):
      return sow(self, nn.Dense(2)(x))

  class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, x):
      h = nn.tanh(nn.Dense(4)(x) + c)
      return h, sow(self, h)[1]

  vmap = lambda axes: nn.vmap(Inner, variable_axes=axes, split_rngs={'params': True})
  scan = lambda **axes: nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False},
                                **axes)
  return {'vmap': (vmap({'params': 0, 'intermediates': 0}), (XS,)),
          'scan': (scan(variable_axes={'intermediates': 0}), (jnp.zeros((2, 4)), XS)),
          # not lifted: immutable inside, sow returns False and writes nothing
          'vmap_unlifted': (vmap({'params': 0}), (XS,)),
          'scan_unlifted': (scan(), (jnp.zeros((2, 4)), XS))}


@pytest.mark.parametrize('kind', ['vmap', 'scan', 'vmap_unlifted', 'scan_unlifted'])
def test_sow_inside_vmap_and_scan(kind):
  def build(nn):
    transformed, args = sowing_models(nn)[kind]
    return (init_apply(transformed(name='t'), *args, mutable=['intermediates']),
            transformed(name='t').init_with_output(KEY, *args, mutable=True))
  ours, _ = check_linen_parity(build)
  (_, _, ((_, flags), state)), _ = ours
  assert ('intermediates' in state) == np.all(flags) == ('unlifted' not in kind)
  assert np.all(flags) or not np.any(flags)


def test_capture_intermediates_through_remat_jit_vmap_and_scan():
  def model(nn):
    class Outer(nn.Module):
      @nn.compact
      def __call__(self, xs):
        y = nn.vmap(nn.Dense, variable_axes={'params': 0}, split_rngs={'params': True})(4)(xs)
        cell = nn.scan(nn.LSTMCell, variable_broadcast='params', split_rngs={'params': False},
                       in_axes=1, out_axes=1)(features=3)
        carry = cell.initialize_carry(jax.random.key(2), y[:, 0].shape)
        return cell(carry, y)[1] + nn.remat(nn.Dense)(3)(xs) + nn.jit(nn.Dense)(3)(xs)
    return Outer()
  variables = model(flax_nn).init(KEY, XS)
  check_linen_parity(lambda nn: model(nn).apply(variables, XS, capture_intermediates=True,
                                                mutable=['intermediates']))


# -- remat_scan and axis metadata ---------------------------------------------------------


@pytest.mark.parametrize('lengths', [(3,), (2, 2), (1, 2, 3), 'broadcast'])
def test_remat_scan_lengths_and_broadcast_params(lengths):
  def build(nn):
    class Block(nn.Module):
      @nn.compact
      def __call__(self, x):
        h = nn.Dense(4)(x)
        return nn.tanh(h if lengths == 'broadcast' else nn.BatchNorm(use_running_average=False)(h))

    if lengths == 'broadcast':
      stack = nn.remat_scan(Block, lengths=(2, 2), variable_broadcast='params',
                            variable_axes={}, split_rngs={'params': False})(name='rs')
      return init_apply(stack, X)
    stack = nn.remat_scan(Block, lengths=lengths)(name='rs')
    loss = lambda v: stack.apply(v, X, mutable=['batch_stats'])[0].sum()
    return (*init_apply(stack, X, mutable=['batch_stats']),
            jax.grad(loss)(stack.init(KEY, X)))
  # Our innermost level is rematerialized (Flax's is not): the gradients are computed by
  # another program, equal within the tolerance of the depth (3 layers per block).
  blocks = math.prod((2, 2) if lengths == 'broadcast' else lengths)
  ours, _ = check_linen_parity(build, depth=3 * blocks)
  if lengths != 'broadcast':
    kernel = ours[1]['params']['Dense_0']['kernel']
    assert kernel.shape == (*lengths, 4, 4)


@pytest.mark.parametrize('kind, logical, axis', [
    (kind, *case) for kind in ('scan', 'vmap', 'add_metadata_axis')
    for case in [(False, 0), (False, 1), (True, 0)]] + [('remat_scan', False, 0)])
def test_partitioned_params_get_the_axis_name(kind, logical, axis):
  def build(nn):
    class Block(nn.Module):
      @nn.compact
      def __call__(self, x, *_):
        init = (nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp'))
                if logical else nn.with_partitioning(nn.initializers.lecun_normal(), ('in', None)))
        y = x @ self.param('k', init, (4, 4))
        return (y, None) if kind == 'scan' else y

    common = dict(variable_axes={'params': axis}, metadata_params={nn.PARTITION_NAME: 'layers'})
    if kind == 'remat_scan' and nn is flax_nn:  # Flax's remat_scan has no metadata_params
      del common['metadata_params']
    split = dict(split_rngs={'params': True})
    layers = {'scan': lambda: nn.scan(Block, length=3, **split, **common),
              'vmap': lambda: nn.vmap(Block, in_axes=None, axis_size=2, **split, **common),
              'add_metadata_axis': lambda: nn.add_metadata_axis(Block, **common),
              'remat_scan': lambda: nn.remat_scan(Block, lengths=(2, 2), **common)}[kind]()
    y, variables = layers(name='s').init_with_output(KEY, X)
    with nn.logical_axis_rules([('embed', 'data'), ('mlp', 'model'), ('layers', None)]):
      specs = str(nn.get_partition_spec(variables))
    return (y, variables, specs, layers(name='s').apply(variables, X),
            layers(name='s').apply(nn.unbox(variables), X))

  if kind == 'remat_scan':  # and fails on Partitioned params
    with pytest.raises(flax_errors.PartitioningUnspecifiedError):
      build(flax_nn)
    _, variables, specs, _, _ = build(nn)
    assert box_names(variables) == [('Partitioned', ('layers', None, 'in', None))]
    assert variables['params']['k'].value.shape == (2, 2, 4, 4)
    return
  ours, _ = check_linen_parity(build)
  names = ('embed', 'mlp') if logical else ('in', None)
  names = names[:axis] + ('layers',) + names[axis:]
  assert [n for _, n in box_names(ours[1])] == [names]
