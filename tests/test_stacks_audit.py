"""Audit of layer stacks and loop transforms against Flax, hand-written JAX and PyTensor.

Oracles:
- `flax.linen.vmap` (``variable_axes={True: 0}``, ``split_rngs={True: True}``) for the
  values a `Stacked` initialises to, `flax.linen.scan` over the same block for what it
  computes (values, gradients, dropout draws, mutable state), a flax Python loop over
  ``layers_i`` for `BlockSeq` and `scan_layers`;
- hand-written `jax.lax.scan` over explicitly stacked variables, `jax.checkpoint`,
  unrolled Python loops;
- outputs of PyTensor 3.0.7's ``scan`` recorded for the taps tests.

Known differences are strict xfails: each flips to a failure when fixed.
"""
import functools
import warnings

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import linen_ext as nn
from lift import loops
from linen_ext import errors

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
RNGS = {'params': KEY, 'dropout': jax.random.key(1)}
DROP = {'dropout': jax.random.key(3)}


def assert_trees(a, b, tol=1e-5):
  assert jax.tree.structure(a) == jax.tree.structure(b), (
      f'{jax.tree.structure(a)}\n!=\n{jax.tree.structure(b)}')
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert np.shape(x) == np.shape(y)
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                               rtol=tol, atol=tol)


def quiet(fn):
  """Runs ``fn`` with the CPU offload fallback warning silenced."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with warnings.catch_warnings():
      warnings.simplefilter('ignore', loops.OffloadFallbackWarning)
      return fn(*args, **kwargs)
  return wrapped


def flax_stack_init(block, n, in_axes=None, **kw):
  """The values a stack of ``n`` flax blocks gets from `flax.linen.vmap` with split rngs."""
  return fnn.vmap(block, variable_axes={True: 0}, split_rngs={True: True}, in_axes=in_axes,
                  axis_size=n, **kw)


def flax_scan_of(block, n, **kw):
  """`flax.linen.scan` over a block returning the next carry (wrapped to return (carry, None))."""

  class Step(block):
    def __call__(self, x, *args, **kwargs):
      return super().__call__(x, *args, **kwargs), None

  Step.__name__ = block.__name__
  return fnn.scan(Step, variable_axes={True: 0}, split_rngs={True: True}, length=n, **kw)


# -- blocks, written once per module system ------------------------------------------------


def dense_block(m):
  class Block(m.Module):
    @m.compact
    def __call__(self, x):
      return x + jnp.tanh(m.Dense(4)(x))
  return Block


def setup_block(m):
  class SetupBlock(m.Module):
    features: int = 4

    def setup(self):
      self.d = m.Dense(self.features)
      self.g = self.param('g', m.initializers.normal(1.0), (self.features,))

    def __call__(self, x):
      return x + jnp.tanh(self.d(x)) * self.g[None]
  return SetupBlock


def dropout_block(m):
  class DropBlock(m.Module):
    @m.compact
    def __call__(self, x, train: bool = True):
      h = m.Dropout(0.5, deterministic=not train)(m.Dense(4)(x))
      return x + jnp.tanh(h)
  return DropBlock


def batchnorm_block(m):
  class BNBlock(m.Module):
    @m.compact
    def __call__(self, x, train: bool = True):
      h = m.BatchNorm(use_running_average=not train, momentum=0.7)(m.Dense(4)(x))
      return x + jnp.tanh(h)
  return BNBlock


def full_block(m):
  """Dense, BatchNorm, dropout, a named internal and a keyword-only argument."""
  class FullBlock(m.Module):
    @m.compact
    def __call__(self, x, scale=1.0, *, train=True):
      h = loops.checkpoint_name(m.Dense(4)(x), 'h')
      h = m.BatchNorm(use_running_average=not train, momentum=0.5)(h)
      h = m.Dropout(0.3, deterministic=not train)(jnp.sin(h))
      return x + scale * h
  return FullBlock


def partitioned_block(m):
  class PBlock(m.Module):
    @m.compact
    def __call__(self, x):
      w = self.param('w', m.with_partitioning(m.initializers.lecun_normal(), ('embed', 'mlp')),
                     (4, 4))
      kernel_init = m.with_partitioning(m.initializers.lecun_normal(), (None, 'mlp'))
      return jnp.tanh(x @ w + m.Dense(4, kernel_init=kernel_init)(x))
  return PBlock


def named(m, stack, name='s'):
  """A parent module holding ``stack`` at ``name`` (rng paths then agree with flax's)."""
  class Parent(m.Module):
    @m.compact
    def __call__(self, x, *args, **kwargs):
      return stack(name=name)(x, *args, **kwargs)
  return Parent


# -- Stacked: creation and computation against flax -----------------------------------------


@pytest.mark.parametrize('make', [dense_block, setup_block], ids=['compact', 'setup'])
@pytest.mark.parametrize('n', [1, 2, 5, 7, 13])
def test_stacked_inits_as_flax_vmap_and_applies_as_flax_scan(make, n):
  ours = nn.Stacked(make(nn), n).init(KEY, X)
  assert_trees(ours, flax_stack_init(make(fnn), n)().init(KEY, X), tol=0)
  assert_trees(nn.Stacked(make(nn), n).apply(ours, X),
               flax_scan_of(make(fnn), n)().apply(ours, X)[0])


def test_stacked_of_a_partial_defined_in_setup_inits_as_flax():
  class Ours(nn.Module):
    def setup(self):
      self.stack = nn.Stacked(functools.partial(setup_block(nn), features=4), 3)

    def __call__(self, x):
      return self.stack(x)

  class Theirs(fnn.Module):
    def setup(self):
      self.stack = flax_stack_init(functools.partial(setup_block(fnn), features=4), 3)()

    def __call__(self, x):
      return self.stack(x)

  assert_trees(Ours().init(KEY, X), Theirs().init(KEY, X), tol=0)


def test_stacked_dropout_draws_as_flax_scan_and_vmap():
  ours, theirs = named(nn, functools.partial(nn.Stacked, dropout_block(nn), 3)), named(
      fnn, flax_scan_of(dropout_block(fnn), 3, in_axes=(fnn.broadcast,)))
  variables = ours().init(RNGS, X)
  assert_trees(variables, named(fnn, flax_stack_init(dropout_block(fnn), 3))().init(RNGS, X),
               tol=0)
  for train in (True, False):
    assert_trees(ours().apply(variables, X, train=train, rngs=DROP),
                 theirs().apply(variables, X, train, rngs=DROP)[0])
  assert_trees(ours().apply(variables, X, True, rngs=DROP),  # positional
               theirs().apply(variables, X, True, rngs=DROP)[0])
  stacked = {'params': variables['params']['s']}
  assert_trees(nn.Stacked(dropout_block(nn), 3).apply(stacked, X, rngs=DROP, method='vmap'),
               flax_stack_init(dropout_block(fnn), 3)().apply(stacked, X, rngs=DROP))


def test_stacked_batchnorm_state_as_flax():
  ours = nn.Stacked(batchnorm_block(nn), 3)
  variables = ours.init(KEY, X)
  assert_trees(variables, flax_stack_init(batchnorm_block(fnn), 3)().init(KEY, X), tol=0)
  theirs = flax_scan_of(batchnorm_block(fnn), 3)()
  y, state = ours.apply(variables, X, mutable=['batch_stats'])
  (fy, _), fstate = theirs.apply(variables, X, mutable=['batch_stats'])
  assert_trees((y, state), (fy, fstate))
  updated = {**variables, **state}
  assert_trees(ours.apply(updated, X, train=False),
               flax_scan_of(batchnorm_block(fnn), 3, in_axes=(fnn.broadcast,))().apply(
                   updated, X, False)[0])
  y, state = ours.apply(variables, X, mutable=['batch_stats'], method='vmap')
  assert_trees((y, state), flax_stack_init(batchnorm_block(fnn), 3)().apply(
      variables, X, mutable=['batch_stats']))


def test_stacked_partition_names_get_the_layer_axis_as_in_flax():
  params = {nn.PARTITION_NAME: 'layers'}
  ours = nn.Stacked(partitioned_block(nn), 3, metadata_params=params).init(KEY, X)
  theirs = flax_stack_init(partitioned_block(fnn), 3, metadata_params=params)().init(KEY, X)
  assert_trees(ours, theirs, tol=0)
  assert nn.get_partition_spec(ours) == fnn.get_partition_spec(theirs)
  assert ours['params']['w'].names == ('layers', 'embed', 'mlp')

  stacked = named(nn, functools.partial(nn.Stacked, partitioned_block(nn), 3,
                                        metadata_params=params))
  scanned = named(fnn, flax_scan_of(partitioned_block(fnn), 3, metadata_params=params))
  variables = scanned().init(KEY, X)
  assert jax.tree.structure(stacked().init(KEY, X)) == jax.tree.structure(variables)
  assert nn.get_partition_spec(stacked().init(KEY, X)) == fnn.get_partition_spec(variables)
  ours = jax.value_and_grad(lambda p: jnp.sum(stacked().apply({'params': p}, X) ** 2))
  theirs = jax.value_and_grad(lambda p: jnp.sum(scanned().apply({'params': p}, X)[0] ** 2))
  assert_trees(ours(variables['params']), theirs(variables['params']))


def test_stacked_without_metadata_params_refuses_partitioned_boxes_as_flax():
  with pytest.raises(Exception) as ours:
    nn.Stacked(partitioned_block(nn), 3).init(KEY, X)
  with pytest.raises(Exception) as theirs:
    flax_stack_init(partitioned_block(fnn), 3)().init(KEY, X)
  assert type(ours.value) is type(theirs.value)


def test_stacked_in_an_outer_vmap_names_both_axes_as_flax():
  inner = {nn.PARTITION_NAME: 'layers'}
  outer = {nn.PARTITION_NAME: 'ens'}

  class Ours(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Stacked(partitioned_block(nn), 3, metadata_params=inner, name='s')(x)

  class Theirs(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      return flax_stack_init(partitioned_block(fnn), 3, metadata_params=inner)(name='s')(x)[-1]

  ours = nn.vmap(Ours, variable_axes={'params': 1}, split_rngs={'params': True}, axis_size=2,
                 metadata_params=outer)().init(KEY, jnp.stack([X, -X]))
  theirs = fnn.vmap(Theirs, variable_axes={'params': 1}, split_rngs={'params': True},
                    axis_size=2, metadata_params=outer)().init(KEY, jnp.stack([X, -X]))
  assert_trees(ours, theirs, tol=0)
  assert nn.get_partition_spec(ours) == fnn.get_partition_spec(theirs)


def test_stacked_scan_mode_with_state_and_dropout_as_flax_scan():
  n = 5

  def make(m):
    base = full_block(m)

    class ScanBlock(base):
      def __call__(self, x, train=True):
        y = super().__call__(x, train=train)
        return y, {'s': jnp.sum(y, -1)}
    return ScanBlock

  variables = nn.Stacked(make(nn), n).init(RNGS, X, method='scan')
  theirs = fnn.scan(make(fnn), variable_axes={True: 0}, split_rngs={True: True}, length=n,
                    in_axes=(fnn.broadcast,))()

  def run(fn):
    def loss(p):
      (c, ys), state = fn({**variables, 'params': p})
      return jnp.sum(c ** 2) + jnp.sum(jnp.sin(ys['s'])), ((c, ys), state)
    return jax.jit(jax.grad(loss, has_aux=True))(variables['params'])

  expected = run(lambda v: theirs.apply(v, X, True, rngs=DROP, mutable=['batch_stats']))
  ours = nn.Stacked(make(nn), n)
  assert_trees(run(lambda v: ours.apply(v, X, rngs=DROP, mutable=['batch_stats'],
                                        method='scan')), expected, tol=1e-4)
  via = lambda s, x: s.scan_via(lambda block, c: block(c))(x)
  assert_trees(run(lambda v: ours.apply(v, X, rngs=DROP, mutable=['batch_stats'], method=via)),
               expected, tol=1e-4)


def test_fold_via_another_method_inits_as_flax_vmap_methods_and_runs_as_lax_scan():
  def make(m):
    class Two(m.Module):
      def setup(self):
        self.d = m.Dense(4)

      def __call__(self, x):
        return x + self.d(x)

      def decode(self, x, k):
        return x + jnp.tanh(self.d(x)) * k
    return Two

  via = lambda s: s.fold_via(lambda block, x, k: block.decode(x, k))(X, 0.5)
  y, variables = nn.Stacked(make(nn), 3).init_with_output(KEY, method=via)
  theirs = flax_stack_init(make(fnn), 3, in_axes=(None, None), methods=['decode'])()
  assert_trees(variables, theirs.init(KEY, X, 0.5, method='decode'), tol=0)
  step = lambda x, v: (make(fnn)().apply(v, x, 0.5, method='decode'), None)
  expected = lax.scan(step, X, variables)[0]
  assert_trees(y, expected)
  assert_trees(nn.Stacked(make(nn), 3).apply(variables, method=via), expected)


def test_unstacked_views_are_flax_bound_layers():
  params = {nn.PARTITION_NAME: 'layers'}
  stack = nn.Stacked(partitioned_block(nn), 3, metadata_params=params)
  variables = stack.init(KEY, X)
  ys = stack.apply(variables, method=lambda s: [view(X) for view in s.unstacked()])
  rows = nn.unbox(variables)
  for i, y in enumerate(ys):
    assert_trees(y, partitioned_block(fnn)().apply(jax.tree.map(lambda a: a[i], rows), X))
  bn = nn.Stacked(batchnorm_block(nn), 3)
  bn_vars = bn.init(KEY, X)
  flax_bound = batchnorm_block(fnn)().bind(jax.tree.map(lambda a: a[0], bn_vars))
  with pytest.raises(Exception) as theirs:
    flax_bound(X, train=True)
  with pytest.raises(Exception) as ours:
    bn.apply(bn_vars, method=lambda s: s.unstacked()[0](X, train=True))
  assert isinstance(ours.value, type(theirs.value))  # ours subclasses flax's
  assert str(ours.value).startswith(str(theirs.value).split(' (https://')[0])


def test_a_stack_called_twice_draws_as_flax_scan_called_twice():
  class Ours(nn.Module):
    @nn.compact
    def __call__(self, x):
      stack = nn.Stacked(dropout_block(nn), 3, name='s')
      y = stack(x)
      z = stack(y)
      return y, z, nn.Dropout(0.5, deterministic=False)(z)

  class Theirs(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      stack = flax_scan_of(dropout_block(fnn), 3)(name='s')
      y = stack(x)[0]
      z = stack(y)[0]
      return y, z, fnn.Dropout(0.5, deterministic=False)(z)

  variables = Ours().init(RNGS, X)
  assert_trees(Ours().apply(variables, X, rngs=DROP), Theirs().apply(variables, X, rngs=DROP))


def test_nested_stacks_init_as_nested_flax_vmaps_and_run_as_nested_lax_scans():
  bn = batchnorm_block

  class Inner(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Stacked(bn(nn), 2)(x, train=False)

  class FlaxInner(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      return flax_stack_init(bn(fnn), 2, in_axes=(None, None))(name='Stacked_0')(x, False)[0]

  variables = nn.Stacked(Inner, 3).init(KEY, X)
  assert_trees(variables, flax_stack_init(FlaxInner, 3)().init(KEY, X), tol=0)

  def outer(x, v):
    inner = lambda x, w: (bn(fnn)().apply(w, x, False), None)
    return lax.scan(inner, x, jax.tree.map(lambda t: t['Stacked_0'], v,
                                           is_leaf=lambda t: 'Stacked_0' in t))[0], None

  assert_trees(nn.Stacked(Inner, 3).apply(variables, X), lax.scan(outer, X, variables)[0])


def test_stacked_inside_an_outer_broadcast_scan_as_flax():
  n, steps = 3, 5

  class OurCell(nn.Module):
    @nn.compact
    def __call__(self, c, x):
      c = nn.Stacked(dropout_block(nn), n, name='stack')(c + x)
      return c, jnp.sum(c)

  class FlaxCell(fnn.Module):
    init_by_vmap: bool = False

    @fnn.compact
    def __call__(self, c, x):
      if self.init_by_vmap:
        c = flax_stack_init(dropout_block(fnn), n)(name='stack')(c + x)[-1]
      else:
        c = flax_scan_of(dropout_block(fnn), n)(name='stack')(c + x)[0]
      return c, jnp.sum(c)

  def outer(m, cell, **kw):
    class Outer(m.Module):
      @m.compact
      def __call__(self, c, xs):
        return m.scan(cell, variable_broadcast='params',
                      split_rngs={'params': False, 'dropout': True}, length=steps)(
                          name='cell', **kw)(c, xs)
    return Outer

  xs = jnp.linspace(-1.0, 1.0, steps * 8).reshape(steps, 2, 4)
  c0 = jnp.zeros((2, 4))
  variables = outer(nn, OurCell)().init(RNGS, c0, xs)
  assert_trees(variables, outer(fnn, FlaxCell, init_by_vmap=True)().init(RNGS, c0, xs), tol=0)
  grad = lambda model: jax.value_and_grad(lambda p: jnp.sum(
      model().apply({'params': p}, c0, xs, rngs=DROP)[1] ** 2))(variables['params'])
  assert_trees(grad(outer(nn, OurCell)), grad(outer(fnn, FlaxCell)), tol=1e-4)


# -- remat: every policy gives the values and gradients of remat=False -----------------------


POLICIES = [True, 'full', 'nested', 'offload', 'save_all',
            loops.ScanCheckpointPolicy(save_block_internals=['h']),
            loops.ScanCheckpointPolicy(offload_block_internals=['h']),
            loops.ScanCheckpointPolicy(save_carries='offload'),
            loops.ScanCheckpointPolicy(save_inputs='offload'),
            loops.ScanCheckpointPolicy(nested=1),
            loops.ScanCheckpointPolicy(nested=3),
            loops.ScanCheckpointPolicy(nested=True, save_carries='offload'),
            loops.ScanCheckpointPolicy(prevent_cse=True),
            loops.ScanCheckpointPolicy(jax_policy=jax.checkpoint_policies.dots_saveable)]


@quiet
def _stack_grads(cls, remat, variables, n):
  model = cls(full_block(nn), n, remat=remat)
  scales = nn.per_layer(jnp.arange(n, dtype=jnp.float32) / n + 0.5)

  def loss(p):
    y, state = model.apply({**variables, 'params': p}, X, scales, rngs=DROP,
                           mutable=['batch_stats'])
    return jnp.sum(y ** 2), (y, state)
  return jax.jit(jax.grad(loss, has_aux=True))(variables['params'])


@pytest.mark.parametrize('remat', POLICIES, ids=str)
def test_every_policy_keeps_values_grads_and_state_of_a_stateful_dropout_block(remat):
  n = 3
  variables = nn.Stacked(full_block(nn), n).init(RNGS, X)
  assert_trees(_stack_grads(nn.Stacked, remat, variables, n),
               _stack_grads(nn.Stacked, False, variables, n), tol=1e-4)
  layers = nn.stacked_to_layers(variables)
  assert_trees(_stack_grads(nn.BlockSeq, remat, layers, n),
               _stack_grads(nn.BlockSeq, False, layers, n), tol=1e-4)


@pytest.mark.parametrize('n', [1, 2, 13])
@pytest.mark.parametrize('remat', [True, 'nested', 'save_all',
                                   loops.ScanCheckpointPolicy(nested=2)], ids=str)
def test_policies_at_length_one_two_and_thirteen(n, remat):
  if isinstance(remat, loops.ScanCheckpointPolicy) and remat.nested > n:
    pytest.skip('more outer blocks than layers is refused')
  variables = nn.Stacked(full_block(nn), n).init(RNGS, X)
  assert_trees(_stack_grads(nn.Stacked, remat, variables, n),
               _stack_grads(nn.Stacked, False, variables, n), tol=1e-4)


def _native_block():
  class Native(nn.Module):
    @nn.compact
    def __call__(self, x):
      w = self.param('w', nn.initializers.normal(0.5), (4, 4))
      return x + jnp.tanh(loops.checkpoint_name(x @ w, 'h'))
  return Native


@pytest.mark.parametrize('remat', [True, 'nested', 'offload', 'save_all',
                                   loops.ScanCheckpointPolicy(nested=2)], ids=str)
@quiet
def test_policies_keep_hessians_and_vmapped_input_gradients(remat):
  block = _native_block()
  variables = nn.Stacked(block, 3).init(KEY, X)

  def run(policy):
    f = lambda w: jnp.sum(nn.Stacked(block, 3, remat=policy).apply({'params': {'w': w}}, X) ** 2)
    g = lambda x: jnp.sum(nn.Stacked(block, 3, remat=policy).apply(variables, x) ** 2)
    return jax.hessian(f)(variables['params']['w']), jax.vmap(jax.grad(g))(jnp.stack([X, -X]))

  assert_trees(run(remat), run(False), tol=1e-4)


# -- Stacked under module and function transforms ----------------------------------------------


class _OurModel(nn.Module):
  remat: object = False

  @nn.compact
  def __call__(self, x, train=True):
    x = nn.Dense(4, name='inp')(x)
    return nn.Stacked(dropout_block(nn), 3, remat=self.remat, name='stack')(x, train=train)


class _FlaxModel(fnn.Module):
  init_by_vmap: bool = False

  @fnn.compact
  def __call__(self, x, train=True):
    x = fnn.Dense(4, name='inp')(x)
    if self.init_by_vmap:
      return flax_stack_init(dropout_block(fnn), 3, in_axes=(None, None))(name='stack')(x, train)
    return flax_scan_of(dropout_block(fnn), 3, in_axes=(fnn.broadcast,))(name='stack')(x, train)[0]


def test_stacked_model_under_nn_vmap_as_flax():
  def vmapped(cls, **kw):
    return fnn.vmap(cls, variable_axes={'params': 0},
                    split_rngs={'params': True, 'dropout': True}, axis_size=2, **kw)

  xs = jnp.stack([X, -X])
  ours = nn.vmap(_OurModel, variable_axes={'params': 0},
                 split_rngs={'params': True, 'dropout': True}, axis_size=2)
  variables = ours().init(RNGS, xs)
  theirs_init = fnn.vmap(_FlaxModel, variable_axes={'params': 0},
                         split_rngs={'params': True, 'dropout': True}, axis_size=2)
  assert_trees(variables, theirs_init(init_by_vmap=True).init(RNGS, xs), tol=0)
  assert_trees(ours().apply(variables, xs, rngs=DROP),
               vmapped(_FlaxModel)().apply(variables, xs, rngs=DROP))


def test_stacked_model_under_nn_remat_and_jax_transforms_as_flax():
  variables = _OurModel().init(RNGS, X)
  assert_trees(variables, _FlaxModel(init_by_vmap=True).init(RNGS, X), tol=0)
  assert_trees(nn.remat(_OurModel)().init(RNGS, X), variables, tol=0)
  grad = lambda model: jax.value_and_grad(lambda p: jnp.sum(
      model.apply({'params': p}, X, rngs=DROP) ** 2))(variables['params'])
  assert_trees(grad(nn.remat(_OurModel)()), grad(_FlaxModel()))
  xs = jnp.stack([X, -X, 2 * X])
  per_example = lambda model: jax.jit(jax.vmap(jax.grad(lambda p, x: jnp.sum(
      model.apply({'params': p}, x, rngs=DROP) ** 2)), in_axes=(None, 0)))(
          variables['params'], xs)
  assert_trees(per_example(_OurModel()), per_example(_FlaxModel()), tol=1e-4)
  params2 = jax.tree.map(lambda a: jnp.stack([a, 2 * a]), variables['params'])
  per_params = lambda model: jax.vmap(lambda p: model.apply({'params': p}, X, rngs=DROP))(params2)
  assert_trees(per_params(_OurModel()), per_params(_FlaxModel()))
  tangent = jax.tree.map(jnp.cos, variables['params'])
  hvp = lambda model: jax.jvp(jax.grad(lambda p: jnp.sum(
      model.apply({'params': p}, X, train=False) ** 2)), (variables['params'],), (tangent,))[1]
  assert_trees(hvp(_OurModel()), hvp(_FlaxModel()), tol=1e-4)


def test_stacked_model_under_nn_jit_draws_as_flax_without_jit():
  # Flax's own nn.jit draws other dropout keys (a known Flax failure SPEC fixes), so the
  # oracle is flax without jit; parameters are native so init values are comparable too.
  class Native(nn.Module):
    @nn.compact
    def __call__(self, x):
      w = self.param('w', nn.initializers.normal(1.0), (4, 4))
      return x + nn.Dropout(0.5, deterministic=False)(jnp.tanh(x @ w))

  class FlaxNative(fnn.Module):
    @fnn.compact
    def __call__(self, x):
      w = self.param('w', fnn.initializers.normal(1.0), (4, 4))
      return x + fnn.Dropout(0.5, deterministic=False)(jnp.tanh(x @ w))

  ours = named(nn, functools.partial(nn.Stacked, Native, 3))
  variables = nn.jit(ours)().init(RNGS, X)
  assert_trees(variables, named(fnn, flax_stack_init(FlaxNative, 3))().init(RNGS, X), tol=0)
  assert_trees(nn.jit(ours)().apply(variables, X, rngs=DROP),
               named(fnn, flax_scan_of(FlaxNative, 3))().apply(variables, X, rngs=DROP)[0])
  assert_trees(nn.Stacked(nn.jit(Native), 3).apply({'params': variables['params']['s']}, X,
                                                    rngs=DROP),
               flax_scan_of(FlaxNative, 3)().apply({'params': variables['params']['s']}, X,
                                                   rngs=DROP)[0])


@pytest.mark.parametrize('remat', [True, 'nested', 'save_all',
                                   loops.ScanCheckpointPolicy(nested=3)], ids=str)
def test_remat_inside_nn_vmap_and_nn_remat_keeps_values_and_grads(remat):
  class Model(nn.Module):
    policy: object = False

    @nn.compact
    def __call__(self, x):
      return nn.Stacked(_native_block(), 3, remat=self.policy, name='s')(x)

  xs = jnp.stack([X, -X])
  variables = nn.vmap(Model, variable_axes={'params': 0}, split_rngs={'params': True},
                      axis_size=2)().init(KEY, xs)

  def run(policy):
    model = nn.remat(nn.vmap(Model, variable_axes={'params': 0}, split_rngs={'params': True},
                             axis_size=2))(policy=policy)
    return jax.jit(jax.value_and_grad(lambda p: jnp.sum(
        model.apply({'params': p}, xs) ** 2)))(variables['params'])

  assert_trees(run(remat), run(False), tol=1e-4)


# -- BlockSeq against a flax Python loop --------------------------------------------------------


_FLAX_FULL = full_block(fnn)


class _FlaxSeq(fnn.Module):
  def setup(self):
    self.layers = [_FLAX_FULL() for _ in range(3)]

  def __call__(self, x, scales, train=True):
    for i, layer in enumerate(self.layers):
      x = layer(x, scales[i], train=train)
    return x


@pytest.mark.parametrize('remat', [False, True, 'nested'], ids=str)
def test_blockseq_inits_and_runs_as_a_flax_python_loop(remat):
  ours = nn.BlockSeq(full_block(nn), 3, remat=remat)
  variables = _FlaxSeq().init(RNGS, X, jnp.ones(3))
  assert_trees(ours.init(RNGS, X), variables, tol=0)
  scales = jnp.array([1.0, -0.5, 2.0])
  for train in (True, False):
    def run(fn):
      def loss(p):
        y, state = fn({**variables, 'params': p})
        return jnp.sum(y ** 2), (y, state)
      return jax.grad(loss, has_aux=True)(variables['params'])

    assert_trees(run(lambda v: ours.apply(v, X, nn.per_layer(scales), train=train, rngs=DROP,
                                          mutable=['batch_stats'])),
                 run(lambda v: _FlaxSeq().apply(v, X, scales, train=train, rngs=DROP,
                                                mutable=['batch_stats'])), tol=1e-4)


def test_blockseq_of_detached_modules_as_a_flax_module_with_a_layers_field():
  class FlaxList(fnn.Module):
    layers: tuple

    def __call__(self, x):
      for layer in self.layers:
        x = layer(x)
      return x

  ours = nn.BlockSeq([dropout_block(nn)(parent=None), setup_block(nn)(parent=None)])
  theirs = FlaxList((dropout_block(fnn)(parent=None), setup_block(fnn)(parent=None)))
  variables = theirs.init(RNGS, X)
  assert_trees(ours.init(RNGS, X), variables, tol=0)
  assert_trees(ours.apply(variables, X, rngs=DROP), theirs.apply(variables, X, rngs=DROP))


# -- scan_layers against a flax Python loop -----------------------------------------------------


def _layer_models(remat=False):
  def block(m):
    class Layer(m.Module):
      def setup(self):
        self.d = m.Dense(4)
        self.bn = m.BatchNorm(momentum=0.7)
        self.drop = m.Dropout(0.3)

      def __call__(self, carry, *, gain, train=True):
        x, aux = carry
        h = self.bn(self.d(x) * gain, use_running_average=not train)
        h = self.drop(h, deterministic=not train)
        self.sow('intermediates', 'h', h)
        return x + jnp.tanh(h), aux + jnp.sum(h)
    return Layer

  ours_layer, flax_layer = block(nn), block(fnn)

  class Ours(nn.Module):
    def setup(self):
      self.layers = [ours_layer() for _ in range(3)]

    def __call__(self, x, gains, train=True):
      return nn.scan_layers(self.layers, (x, jnp.zeros(())), gain=nn.per_layer(gains),
                            train=train, remat=remat)

  class Theirs(fnn.Module):
    def setup(self):
      self.layers = [flax_layer() for _ in range(3)]

    def __call__(self, x, gains, train=True):
      carry = (x, jnp.zeros(()))
      for i, layer in enumerate(self.layers):
        carry = layer(carry, gain=gains[i], train=train)
      return carry

  return Ours, Theirs


GAINS = jnp.array([1.0, 0.5, -1.0])


@pytest.mark.parametrize('remat', [False, True, 'nested', 'save_all',
                                   loops.ScanCheckpointPolicy(nested=3)], ids=str)
def test_scan_layers_is_the_flax_python_loop(remat):
  ours, theirs = _layer_models(remat)
  variables = theirs().init(RNGS, X, GAINS)
  assert_trees(ours().init(RNGS, X, GAINS), variables, tol=0)
  for train in (True, False):
    def run(model):
      def loss(p):
        (y, aux), state = model().apply({**variables, 'params': p}, X, GAINS, train=train,
                                        rngs=DROP, mutable=['batch_stats', 'intermediates'])
        return jnp.sum(y ** 2) + aux, (y, state)
      return jax.jit(jax.grad(loss, has_aux=True))(variables['params'])
    assert_trees(run(ours), run(theirs), tol=1e-4)


def test_scan_layers_under_nn_vmap_and_nn_remat_is_the_flax_loop():
  ours, theirs = _layer_models()
  axes = dict(variable_axes={'params': 0, 'batch_stats': 0},
              split_rngs={'params': True, 'dropout': True}, in_axes=(0, None), axis_size=2)
  xs = jnp.stack([X, -X])
  variables = fnn.vmap(theirs, **axes)().init(RNGS, xs, GAINS)
  assert_trees(nn.vmap(ours, **axes)().init(RNGS, xs, GAINS), variables, tol=0)
  run = lambda model, v, x: model.apply(v, x, GAINS, rngs=DROP, mutable=['batch_stats'])
  assert_trees(run(nn.vmap(ours, **axes)(), variables, xs),
               run(fnn.vmap(theirs, **axes)(), variables, xs))
  single = theirs().init(RNGS, X, GAINS)
  assert_trees(run(nn.remat(ours)(), single, X), run(theirs(), single, X))
  assert_trees(nn.jit(ours, static_argnums=(3,))().apply(single, X, GAINS, False),
               theirs().apply(single, X, GAINS, False))


@pytest.mark.parametrize('n', [1, 2, 13])
def test_scan_layers_of_ready_made_layers_is_the_flax_loop(n):
  def model(m, scanned):
    class Model(m.Module):
      def setup(self):
        self.layers = [m.Dense(4, use_bias=False) for _ in range(n)]
        self.norms = [m.LayerNorm() for _ in range(n)]

      def __call__(self, x):
        if scanned:
          x = nn.scan_layers(self.layers, x)
          return nn.scan_layers(self.norms, x)
        for layer in self.layers:
          x = layer(x)
        for layer in self.norms:
          x = layer(x)
        return x
    return Model

  variables = model(fnn, False)().init(KEY, X)
  assert_trees(model(nn, True)().init(KEY, X), variables, tol=0)
  grad = lambda m: jax.value_and_grad(lambda p: jnp.sum(
      m().apply({'params': p}, X) ** 2))(variables['params'])
  assert_trees(grad(model(nn, True)), grad(model(fnn, False)), tol=1e-3)


def test_decoding_with_a_kv_cache_through_scan_layers_and_stacked_is_flax_decoding():
  def block(m):
    class Attn(m.Module):
      @m.compact
      def __call__(self, x):
        return x + m.MultiHeadDotProductAttention(num_heads=2, qkv_features=4, decode=True)(x)
    return Attn

  def model(m, scanned):
    layer_cls = block(m)

    class Model(m.Module):
      def setup(self):
        self.layers = [layer_cls() for _ in range(3)]

      def __call__(self, x):
        if scanned:
          return nn.scan_layers(self.layers, x)
        for layer in self.layers:
          x = layer(x)
        return x
    return Model

  x = jnp.linspace(-1.0, 1.0, 16).reshape(1, 4, 4)
  theirs = model(fnn, False)()
  variables = theirs.init(KEY, x)
  assert_trees(model(nn, True)().init(KEY, x), variables, tol=0)
  scan_vars = flax_scan_of(block(fnn), 3)().init(KEY, x)
  ours_state, theirs_state, stack_state, scan_state = variables, variables, scan_vars, scan_vars
  for t in range(4):
    token = x[:, t:t + 1]
    y, new = model(nn, True)().apply(ours_state, token, mutable=['cache'])
    fy, fnew = theirs.apply(theirs_state, token, mutable=['cache'])
    assert_trees((y, new), (fy, fnew))
    ours_state, theirs_state = {**ours_state, **new}, {**theirs_state, **fnew}
    y, new = nn.Stacked(block(nn), 3).apply(stack_state, token, mutable=['cache'])
    (fy, _), fnew = flax_scan_of(block(fnn), 3)().apply(scan_state, token, mutable=['cache'])
    assert_trees((y, new), (fy, fnew))
    stack_state, scan_state = {**stack_state, **new}, {**scan_state, **fnew}


def test_scan_layers_refuses_mismatched_layers_naming_the_layer():
  class Mixed(nn.Module):
    features: tuple

    def setup(self):
      self.layers = [nn.Dense(f) for f in self.features]

    def __call__(self, x):
      return nn.scan_layers(self.layers, x)

  with pytest.raises(errors.LayerMismatchError, match="layer 2 runs other code .*'features'"):
    Mixed((4, 4, 5)).init(KEY, X)
  variables = fnn.Dense(4).init(KEY, X)['params']
  bad = {'params': {'layers_0': variables, 'layers_1': variables,
                    'layers_2': {**variables, 'bias': jnp.zeros(5)}}}
  with pytest.raises(errors.LayerMismatchError,
                     match=r'layer 2 does not match layer 0: variable params/bias is shape \(5,\)'):
    Mixed((4, 4, 4)).apply(bad, X)


# -- per_layer arguments against a hand-written lax.scan ----------------------------------------


def _per_layer_block(m):
  class PerLayer(m.Module):
    @m.compact
    def __call__(self, x, cfg, idx, *, shift):
      h = m.Dense(4)(x) * cfg['scale'] + cfg['bias'][None] + shift[None]
      return x + jnp.tanh(h) * (idx.astype(jnp.float32) + 1.0)
  return PerLayer


@pytest.mark.parametrize('remat', [False, True, 'nested', loops.ScanCheckpointPolicy(nested=2)],
                         ids=str)
def test_per_layer_pytrees_and_their_gradients_as_a_hand_written_scan(remat):
  n = 5
  r = np.random.RandomState(0)
  cfg = {'scale': jnp.asarray(r.randn(n), jnp.float32),
         'bias': jnp.asarray(r.randn(n, 4), jnp.float32)}
  shift = jnp.asarray(r.randn(n, 1), jnp.float32)
  idx = jnp.arange(n)
  block = _per_layer_block(nn)
  variables = nn.Stacked(block, n).init(KEY, X, nn.per_layer(cfg), nn.per_layer(idx),
                                        shift=nn.per_layer(shift))

  def hand(p, cfg, shift):
    step = lambda x, s: (_per_layer_block(fnn)().apply({'params': s[0]}, x, s[1], s[2],
                                                      shift=s[3]), None)
    return lax.scan(step, X, (p, cfg, idx, shift))[0]

  def stack(cls, p, cfg, shift):
    return cls(block, n, remat=remat).apply({'params': p}, X, nn.per_layer(cfg),
                                            nn.per_layer(idx), shift=nn.per_layer(shift))

  class Layers(nn.Module):
    def setup(self):
      self.layers = [block() for _ in range(n)]

    def __call__(self, x, cfg, shift):
      return nn.scan_layers(self.layers, x, nn.per_layer(cfg), nn.per_layer(idx),
                            shift=nn.per_layer(shift), remat=remat)

  loss = lambda f: jax.value_and_grad(lambda p, c, s: jnp.sum(f(p, c, s) ** 2), (0, 1, 2))
  expected = loss(hand)(variables['params'], cfg, shift)
  to_stacked = lambda g: nn.layers_to_stacked({'params': g})['params']
  assert_trees(loss(functools.partial(stack, nn.Stacked))(variables['params'], cfg, shift),
               expected, tol=1e-4)
  per_layer_params = nn.stacked_to_layers(variables)['params']
  for f in (functools.partial(stack, nn.BlockSeq),
            lambda p, c, s: Layers().apply({'params': p}, X, c, s)):
    value, (gp, gc, gs) = loss(f)(per_layer_params, cfg, shift)
    np.testing.assert_allclose(value, expected[0], rtol=1e-5)
    assert_trees((to_stacked(gp), gc, gs), expected[1], tol=2e-3)


# -- layouts ------------------------------------------------------------------------------------


def test_layouts_round_trip_logical_boxes_and_carry_flax_loop_variables_to_stacked():
  def block(m):
    class LBlock(m.Module):
      @m.compact
      def __call__(self, x):
        w = self.param('w', m.with_logical_partitioning(m.initializers.lecun_normal(),
                                                        ('embed', 'mlp')), (4, 4))
        return jnp.tanh(m.BatchNorm(use_running_average=False)(x) @ w)
    return LBlock

  params = {nn.PARTITION_NAME: 'layers'}
  stacked = nn.Stacked(block(nn), 3, metadata_params=params).init(KEY, X)
  assert_trees(stacked, flax_stack_init(block(fnn), 3, metadata_params=params)().init(KEY, X),
               tol=0)
  layers = nn.stacked_to_layers(stacked, metadata_params=params)
  assert layers['params']['layers_1']['w'].names == ('embed', 'mlp')
  assert_trees(nn.layers_to_stacked(layers, metadata_params=params), stacked, tol=0)

  flax_layer = block(fnn)

  class FlaxLoop(fnn.Module):
    def setup(self):
      self.layers = [flax_layer() for _ in range(3)]

    def __call__(self, x):
      for layer in self.layers:
        x = layer(x)
      return x

  loop_vars = FlaxLoop().init(KEY, X)
  y, state = nn.Stacked(block(nn), 3, metadata_params=params).apply(
      nn.layers_to_stacked(loop_vars, metadata_params=params), X, mutable=['batch_stats'])
  fy, fstate = FlaxLoop().apply(loop_vars, X, mutable=['batch_stats'])
  assert_trees((y, nn.stacked_to_layers(state)), (fy, fstate))


# -- lift.loops against lax.scan, unrolled loops and jax.checkpoint ----------------------------


REMATS = [False, True, 'full', 'nested', 'offload', 'save_all',
          loops.ScanCheckpointPolicy(nested=2),
          loops.ScanCheckpointPolicy(save_block_internals=['t']),
          loops.ScanCheckpointPolicy(nested=True, save_carries='offload')]


def _loop_body(c, x):
  t = loops.checkpoint_name(jnp.sin(c * jnp.sum(x['a'][..., :1]) + x['s']), 't')
  return c * 0.9 + t, (t * 2, jnp.sum(x['a']))


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 7), k=st.integers(1, 3), axis=st.sampled_from([0, 1, -1, -2]),
       reverse=st.booleans(), unroll=st.sampled_from([1, 2, 3, True]),
       remat=st.sampled_from(range(len(REMATS))), seed=st.integers(0, 100))
@quiet
def test_curried_scan_fold_map_are_lax_scan_and_the_unrolled_loop(n, k, axis, reverse, unroll,
                                                                   remat, seed):
  remat = REMATS[remat]
  if isinstance(remat, loops.ScanCheckpointPolicy) and remat.nested is not True and (
      remat.nested and remat.nested > n):
    return
  r = np.random.RandomState(seed)
  shape = [k, k]
  shape[axis % 2] = n
  a = jnp.asarray(r.randn(*shape), jnp.float32)
  c0 = jnp.asarray(r.randn(k), jnp.float32)
  at_axis = lambda y: jnp.moveaxis(y, 0, axis) if -y.ndim <= axis < y.ndim else y

  def ours(c0, a):
    return loops.scan(_loop_body, axis, remat=remat, reverse=reverse, unroll=unroll)(
        c0, {'a': a, 's': 0.3})

  def oracle(c0, a):
    step = lambda c, row: _loop_body(c, {'a': row, 's': 0.3})
    c, ys = lax.scan(step, c0, jnp.moveaxis(a, axis, 0), reverse=reverse)
    return c, jax.tree.map(at_axis, ys)

  def unrolled(c0, a):
    rows, c, ys = jnp.moveaxis(a, axis, 0), c0, [None] * n
    for i in (reversed(range(n)) if reverse else range(n)):
      c, ys[i] = _loop_body(c, {'a': rows[i], 's': 0.3})
    return c, jax.tree.map(lambda *y: at_axis(jnp.stack(y)), *ys)

  expected = oracle(c0, a)
  assert_trees(ours(c0, a), expected)
  assert_trees(unrolled(c0, a), expected)
  loss = lambda f: lambda c, a: sum(jnp.sum(jnp.cos(y)) for y in jax.tree.leaves(f(c, a)))
  assert_trees(jax.grad(loss(ours), (0, 1))(c0, a), jax.grad(loss(oracle), (0, 1))(c0, a),
               tol=1e-4)
  folded = loops.fold(lambda c, x: _loop_body(c, x)[0], axis, remat=remat, reverse=reverse)(
      c0, {'a': a, 's': 0.3})
  assert_trees(folded, expected[0])
  mapped = loops.map(lambda x: jnp.sum(x['a'] * 2), axis)({'a': a, 's': 0.3})
  assert_trees(mapped, jnp.sum(jnp.moveaxis(a, axis, 0).reshape(n, -1) * 2, axis=1))


def test_scan_with_no_xs_and_a_length_is_lax_scan():
  body = lambda c, _: (c * 2 + 1, c)
  for remat in (False, 'nested'):
    for reverse in (False, True):
      assert_trees(loops.scan(body, length=5, remat=remat, reverse=reverse)(jnp.float32(1), None),
                   lax.scan(body, jnp.float32(1), None, length=5, reverse=reverse))


@pytest.mark.parametrize('n', [1, 2, 3, 13])
def test_nested_remat_is_lax_scan_of_jax_checkpoint_for_every_block_count(n):
  def body(c, x):
    h = jnp.sin(c @ x['w']) + x['b']
    return h, jnp.sum(h * c)

  r = np.random.RandomState(n)
  xs = {'w': jnp.asarray(r.randn(n, 3, 3) * 0.5, jnp.float32),
        'b': jnp.asarray(r.randn(n, 3), jnp.float32)}
  c0 = jnp.asarray(r.randn(3), jnp.float32)
  loss = lambda f: lambda c, x: (lambda out: jnp.sum(out[0] ** 2) + jnp.sum(jnp.cos(out[1])))(
      f(c, x))
  for reverse in (False, True):
    oracle = lambda c, x: lax.scan(jax.checkpoint(body), c, x, reverse=reverse)
    expected = jax.value_and_grad(loss(oracle), (0, 1))(c0, xs)
    for blocks in [True] + sorted({1, 2, 3, n // 2 or 1, n} & set(range(1, n + 1))):
      policy = loops.ScanCheckpointPolicy(nested=blocks)
      ours = lambda c, x: loops.run_scan(body, c, x, remat=policy, reverse=reverse, unroll=2)
      assert_trees(ours(c0, xs), oracle(c0, xs))
      assert_trees(jax.value_and_grad(loss(ours), (0, 1))(c0, xs), expected, tol=1e-4)


def _unrolled_taps(fn, seqs, outs, nons, n_steps):
  """A Python loop with PyTensor's tap rules (forward direction)."""
  if n_steps is None:
    n_steps = min(v.shape[0] - (max(max(t), 0) - min(min(t), 0)) for v, t in seqs)
  history = [None if w is None else list(w) for w, _ in outs]
  ys = [[] for _ in outs]
  for t in range(n_steps):
    args = [v[t + k - min(min(taps), 0)] for v, taps in seqs for k in taps]
    args += [h[len(h) + k] for h, (_, taps) in zip(history, outs) if h is not None
             for k in taps]
    results = fn(*args, *nons)
    results = list(results) if isinstance(results, (list, tuple)) else [results]
    for i, value in enumerate(results):
      ys[i].append(value)
      if history[i] is not None:
        history[i].append(value)
  return [jnp.stack(y) for y in ys]


_TAPS = st.lists(st.integers(-3, 3), min_size=1, max_size=3, unique=True).map(sorted)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(taps1=_TAPS, taps2=_TAPS,
       out_taps=st.lists(st.integers(-3, -1), min_size=1, max_size=2, unique=True).map(sorted),
       n=st.integers(1, 5), extra=st.integers(0, 2), use_n_steps=st.booleans(),
       second=st.booleans(), seed=st.integers(0, 50))
def test_scan_taps_is_the_unrolled_loop_with_its_gradients(taps1, taps2, out_taps, n, extra,
                                                           use_n_steps, second, seed):
  if out_taps == [-1]:
    out_taps = [-2, -1]  # an explicit [-1] window is covered by the PyTensor test below
  r = np.random.RandomState(seed)
  span = lambda taps: max(max(taps), 0) - min(min(taps), 0)
  extra = extra if use_n_steps else 0
  s1 = jnp.asarray(r.randn(n + span(taps1) + extra, 2), jnp.float32)
  s2 = jnp.asarray(r.randn(n + span(taps2) + extra, 2), jnp.float32)
  x0 = jnp.asarray(r.randn(-min(out_taps), 2), jnp.float32)
  w = jnp.float32(0.7)
  n1, n2, no = len(taps1), len(taps2), len(out_taps)

  def fn(*a):
    y = jnp.tanh(sum(a[:n1]) * a[-1] + 0.5 * sum(a[n1:n1 + n2]) + 0.3 * sum(a[n1 + n2:-1]))
    return (y, jnp.sum(y)) if second else y

  assert len(out_taps) == no
  n_steps = n if use_n_steps else None

  def ours(s1, s2, x0, w):
    outputs = [{'initial': x0, 'taps': out_taps}] + ([None] if second else [])
    return loops.scan_taps(fn, sequences=[{'input': s1, 'taps': taps1},
                                          {'input': s2, 'taps': taps2}],
                           outputs_info=outputs if second else outputs[0],
                           non_sequences=[w], n_steps=n_steps)

  def oracle(s1, s2, x0, w):
    outs = [(x0, out_taps)] + ([(None, ())] if second else [])
    ys = _unrolled_taps(fn, [(s1, taps1), (s2, taps2)], outs, [w], n_steps)
    return ys if second else ys[0]

  assert_trees(ours(s1, s2, x0, w), oracle(s1, s2, x0, w))
  loss = lambda f: lambda *a: sum(jnp.sum(jnp.sin(y)) for y in jax.tree.leaves(f(*a)))
  assert_trees(jax.grad(loss(ours), (0, 1, 2, 3))(s1, s2, x0, w),
               jax.grad(loss(oracle), (0, 1, 2, 3))(s1, s2, x0, w), tol=1e-4)


# Outputs of PyTensor 3.0.7: scan(lambda *taps: sum(v * 10**i), sequences=[{'input':
# arange(6.), 'taps': taps}], go_backwards=...), n_steps=3 for 'n3', and an output fed back
# at taps [-2, -1] from initial [1., 2.] (fn = a + 0.5 * p1 + 0.25 * p2).
PYTENSOR_FORWARD = {
    (-1, 0): [10.0, 21.0, 32.0, 43.0, 54.0],
    (0, 2): [20.0, 31.0, 42.0, 53.0],
    (-2, 1): [30.0, 41.0, 52.0],
    'n3': [10.0, 21.0, 32.0],
    'fed': [1.25, 2.125, 3.375, 5.21875, 7.453125, 10.03125],
}
PYTENSOR_BACKWARDS = {
    (-1, 0): [54.0, 43.0, 32.0, 21.0, 10.0],
    (0, 2): [53.0, 42.0, 31.0, 20.0],
    (-2, 1): [52.0, 41.0, 30.0],
    'n3': [54.0, 43.0, 32.0],
    'fed': [6.25, 7.625, 8.375, 8.09375, 7.140625, 5.59375],
}


def _pytensor_cases(go_backwards):
  s = jnp.arange(6.0)
  digits = lambda *a: sum(v * 10 ** i for i, v in enumerate(a))
  got = {taps: loops.scan_taps(digits, sequences=[{'input': s, 'taps': list(taps)}],
                               go_backwards=go_backwards).tolist()
         for taps in [(-1, 0), (0, 2), (-2, 1)]}
  got['n3'] = loops.scan_taps(lambda a, b: a + 10 * b, sequences=[{'input': s, 'taps': [-1, 0]}],
                              n_steps=3, go_backwards=go_backwards).tolist()
  got['fed'] = loops.scan_taps(lambda a, p2, p1: a + 0.5 * p1 + 0.25 * p2, sequences=[s],
                               outputs_info=[{'initial': jnp.array([1.0, 2.0]),
                                              'taps': [-2, -1]}],
                               go_backwards=go_backwards).tolist()
  return got


def test_scan_taps_forward_matches_pytensor():
  got = _pytensor_cases(False)
  for case, expected in PYTENSOR_FORWARD.items():
    np.testing.assert_allclose(got[case], expected, rtol=1e-6, err_msg=str(case))


def test_scan_taps_go_backwards_with_tap_zero_and_fed_back_outputs_matches_pytensor():
  s = jnp.arange(6.0)
  np.testing.assert_allclose(
      loops.scan_taps(lambda a: a * 2, sequences=[s], go_backwards=True), s[::-1] * 2)
  np.testing.assert_allclose(_pytensor_cases(True)['fed'], PYTENSOR_BACKWARDS['fed'], rtol=1e-6)


# -- Stacked.init runs each block once, in the loop ---------------------------------------------


def _counting_block(m):
  class Counting(m.Module):
    @m.compact
    def __call__(self, x):
      h = m.Dense(4)(x)
      self.sow('intermediates', 'h', h)
      count = self.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))
      count.value += 1
      return x + jnp.tanh(h)
  return Counting


def test_stacked_init_runs_the_block_once_as_flax():
  ours = nn.Stacked(_counting_block(nn), 3).init(KEY, X, mutable=True)
  scanned = flax_scan_of(_counting_block(fnn), 3)().init(KEY, X, mutable=True)
  vmapped = flax_stack_init(_counting_block(fnn), 3)().init(KEY, X, mutable=True)
  assert_trees(jax.tree.map(jnp.shape, scanned), jax.tree.map(jnp.shape, vmapped))
  assert scanned['counter']['n'].tolist() == [1, 1, 1]
  assert ours['counter']['n'].tolist() == [1, 1, 1]
  assert len(ours['intermediates']['h']) == len(scanned['intermediates']['h']) == 1


def _decode_block(m):
  class Attn(m.Module):
    @m.compact
    def __call__(self, x):
      return x + m.MultiHeadDotProductAttention(num_heads=1, qkv_features=4, decode=True)(x)
  return Attn


def test_stacked_init_of_a_decoding_block_makes_an_empty_cache_as_flax():
  x = jnp.ones((1, 3, 4))
  theirs = flax_scan_of(_decode_block(fnn), 2)().init(KEY, x)
  ours = nn.Stacked(_decode_block(nn), 2).init(KEY, x)
  assert jax.tree.map(jnp.shape, ours['cache']) == jax.tree.map(jnp.shape, theirs['cache'])
  assert_trees(ours['cache'], theirs['cache'], tol=0)


def test_stacked_init_output_equals_apply_with_the_same_rngs_as_flax():
  theirs = flax_scan_of(dropout_block(fnn), 3)()
  (fy, _), fv = theirs.init_with_output(RNGS, X)
  assert_trees(fy, theirs.apply(fv, X, rngs={'dropout': RNGS['dropout']})[0])
  y, variables = nn.Stacked(dropout_block(nn), 3).init_with_output(RNGS, X)
  assert_trees(y, nn.Stacked(dropout_block(nn), 3).apply(
      variables, X, rngs={'dropout': RNGS['dropout']}))


@pytest.mark.parametrize('remat', [True, 'nested', 'save_all'])
def test_stacked_init_under_every_remat_policy_as_without(remat):
  plain = nn.Stacked(_counting_block(nn), 4).init(KEY, X, mutable=True)
  assert_trees(nn.Stacked(_counting_block(nn), 4, remat=remat).init(KEY, X, mutable=True),
               plain, tol=0)


# -- known differences (strict xfails) ---------------------------------------------------------


# Found by this audit (fixed in ec56a13): nested remat left integer/bool/key tracers closed
# over in its custom_vjp, so grad of a jitted loss whose loop body read such a jit argument
# failed with 'No constant handler for type: DynamicJaxprTracer'.
def test_nested_remat_grad_of_jit_with_an_integer_read_by_the_body():
  xs = jnp.ones((3, 2))

  def f(c0, k, remat):
    body = lambda c, x: (jnp.sin(c * x) + k.astype(jnp.float32), None)
    return jnp.sum(loops.run_scan(body, c0, xs, remat=remat)[0])

  expected = jax.grad(jax.jit(functools.partial(f, remat=False)))(jnp.ones(2), jnp.int32(2))
  got = jax.grad(jax.jit(functools.partial(f, remat='nested')))(jnp.ones(2), jnp.int32(2))
  assert_trees(got, expected)


# Found by this audit (fixed in ec56a13): same cause, a bool mask given to every layer.
def test_stacked_nested_remat_with_a_shared_mask_under_grad_of_jit():
  class Masked(nn.Module):
    @nn.compact
    def __call__(self, x, mask):
      return x + jnp.where(mask[None], jnp.tanh(nn.Dense(4)(x)), 0.0)

  mask = jnp.array([True, False, True, True])
  variables = nn.Stacked(Masked, 3).init(KEY, X, mask)
  grad = lambda remat: jax.grad(jax.jit(lambda p, m: jnp.sum(
      nn.Stacked(Masked, 3, remat=remat).apply({'params': p}, X, m) ** 2)))(
          variables['params'], mask)
  assert_trees(grad('nested'), grad(False), tol=1e-5)


# Found by this audit (fixed in ec56a13): same cause, dropout keys under nn.jit.
def test_stacked_nested_remat_with_dropout_inside_nn_jit_under_grad():
  class Model(nn.Module):
    remat: object = False

    @nn.compact
    def __call__(self, x):
      return nn.Stacked(dropout_block(nn), 3, remat=self.remat)(x)

  variables = Model().init(RNGS, X)
  grad = lambda remat: jax.grad(lambda p: jnp.sum(nn.jit(Model)(remat=remat).apply(
      {'params': p}, X, rngs=DROP) ** 2))(variables['params'])
  assert_trees(grad('nested'), grad(False), tol=1e-5)


@pytest.mark.xfail(strict=True, reason=(
    'remat="nested" is a jax.custom_vjp, so jax.jvp through a nested-remat stack raises; '
    'flax.linen.remat/jax.checkpoint support forward mode (documented in '
    'lift/loops/nested.py, not in SPEC)'))
def test_nested_remat_supports_forward_mode_as_jax_checkpoint():
  block = _native_block()
  variables = nn.Stacked(block, 3).init(KEY, X)
  tangent = jax.tree.map(jnp.cos, variables['params'])
  jvp = lambda remat: jax.jvp(lambda p: nn.Stacked(block, 3, remat=remat).apply(
      {'params': p}, X), (variables['params'],), (tangent,))
  assert_trees(jvp('nested'), jvp(False), tol=1e-5)


# Found by this audit (fixed in c5a77a3): scan_layers refused layers built with a fresh
# initializer closure each (kernel_init=normal(0.02)) as 'other code'.
def _layer_list_model(m, scanned, make_layers):
  """A module whose ``setup`` makes ``make_layers(m, self)``, run by scan_layers or the loop."""
  class Model(m.Module):
    def setup(self):
      make_layers(m, self)

    def __call__(self, x):
      if scanned:
        return nn.scan_layers(self.layers, x)
      for layer in self.layers:
        x = layer(x)
      return x
  return Model()


def _assert_scan_layers_is_the_flax_loop(make_layers):
  variables = _layer_list_model(fnn, False, make_layers).init(KEY, X)
  assert_trees(_layer_list_model(nn, True, make_layers).init(KEY, X), variables, tol=0)
  assert_trees(_layer_list_model(nn, True, make_layers).apply(variables, X),
               _layer_list_model(fnn, False, make_layers).apply(variables, X))


def test_scan_layers_accepts_layers_with_equal_initializer_closures():
  def make_layers(m, module):
    module.layers = [m.Dense(4, kernel_init=m.initializers.normal(0.02)) for _ in range(3)]
  _assert_scan_layers_is_the_flax_loop(make_layers)


def test_scan_layers_with_a_module_shared_from_the_parent_as_the_flax_loop():
  def make_layers(m, module):
    class Layer(m.Module):
      shared: m.Module

      @m.compact
      def __call__(self, x):
        return x + jnp.tanh(self.shared(m.Dense(4)(x)))

    module.shared = m.Dense(4)
    module.layers = [Layer(module.shared) for _ in range(3)]
  _assert_scan_layers_is_the_flax_loop(make_layers)


# Found by this audit (fixed in f63e322): a carry-dtype-changing layer gave lax.scan's raw
# TypeError at apply.
def test_scan_layers_carry_dtype_change_is_a_clear_error():
  class Model(nn.Module):
    def setup(self):
      self.layers = [nn.Dense(4, dtype=jnp.bfloat16) for _ in range(3)]

    def __call__(self, x):
      return nn.scan_layers(self.layers, x)

  class FlaxLoop(fnn.Module):
    def setup(self):
      self.layers = [fnn.Dense(4, dtype=jnp.bfloat16) for _ in range(3)]

    def __call__(self, x):
      for layer in self.layers:
        x = layer(x)
      return x

  variables = FlaxLoop().init(KEY, X)
  with pytest.raises(errors.LayerStackError):
    Model().apply(variables, X)


# Found by this audit (fixed in df7f3cc): go_backwards reversed a sequence before taking its
# taps, so tap -1 was the element visited before; PyTensor cuts each tap, then reverses.
def test_scan_taps_go_backwards_with_taps_matches_pytensor():
  got = _pytensor_cases(True)
  for case, expected in PYTENSOR_BACKWARDS.items():
    np.testing.assert_allclose(got[case], expected, rtol=1e-6, err_msg=str(case))


# Found by this audit (fixed in 138d95b): {'initial': h0, 'taps': [-1]} was read as a
# one-step window (h0[:1]); PyTensor takes h0 as the state.
def test_scan_taps_explicit_minus_one_tap_takes_the_state_as_pytensor():
  s = jnp.arange(8.0).reshape(4, 2)
  h0 = jnp.array([1.0, -1.0])
  pytensor = [[0.5, 0.5], [2.25, 3.25], [5.125, 6.625], [8.5625, 10.3125]]  # PyTensor 3.0.7
  bare = loops.scan_taps(lambda x, h: 0.5 * h + x, sequences=[s], outputs_info=[h0])
  np.testing.assert_allclose(bare, pytensor)
  explicit = loops.scan_taps(lambda x, h: 0.5 * h + x, sequences=[s],
                             outputs_info=[{'initial': h0, 'taps': [-1]}])
  np.testing.assert_allclose(explicit, pytensor)
