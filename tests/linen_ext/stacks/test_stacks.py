"""Layer stacks: Stacked, BlockSeq, per_layer, layout conversion.

Oracles: the plain Python loop over per-layer variables, a hand-written
`lax.scan` over the stacked variables, and `flax.linen.scan` on the same block
(same variables and values for the same key).
"""
import functools
import warnings

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import meta

import linen_ext as nn
from lift import loops
from lift.errors import RematPolicyError
from linen_ext import errors

KEY = jax.random.key(0)
N = 4
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
POLICIES = [False, True, 'full', 'nested', 'offload', 'save_all',
            loops.ScanCheckpointPolicy(save_block_internals=['h']),
            loops.ScanCheckpointPolicy(nested=3)]


class Block(nn.Module):
  """A residual block with a wrapped flax Dense, a native parameter and a named internal."""
  features: int = 4

  @nn.compact
  def __call__(self, x, scale=1.0):
    h = loops.checkpoint_name(jnp.tanh(nn.Dense(self.features)(x)), 'h')
    gate = self.param('gate', nn.initializers.normal(0.5), (self.features,))
    return x + scale * h * gate[None]


class FlaxBlock(flax_nn.Module):
  features: int = 4

  @flax_nn.compact
  def __call__(self, x, _):
    h = jnp.tanh(flax_nn.Dense(self.features)(x))
    gate = self.param('gate', flax_nn.initializers.normal(0.5), (self.features,))
    return x + h * gate[None], None


class ScanBlock(nn.Module):
  """A block for ``scan``: returns (carry, out)."""

  @nn.compact
  def __call__(self, x):
    y = Block()(x)
    return y, jnp.sum(y, axis=-1)


class Loop(nn.Module):
  """The oracle: a Python loop over blocks at layers_0, layers_1, ..."""
  n: int = N

  def setup(self):
    self.layers = [Block() for _ in range(self.n)]

  def __call__(self, x, scales=None):
    for i, layer in enumerate(self.layers):
      x = layer(x) if scales is None else layer(x, scales[i])
    return x


def assert_close(a, b, tol=1e-5):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@functools.lru_cache
def stacked_variables():
  return nn.Stacked(Block, N).init(KEY, X)


def value_and_grad(model, variables, *args, **kwargs):
  """Output and gradient w.r.t. params of ``sum(model.apply(...) ** 2)``, jitted."""
  def loss(params):
    y = model.apply({**variables, 'params': params}, X, *args, **kwargs)
    return jnp.sum(y ** 2), y
  (_, y), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(variables['params'])
  return y, grads


def hand_written_fold(stacked):
  """lax.scan over the stacked variables, applying one Block per step."""
  step = lambda x, v: (Block().apply(v, x), None)
  return jax.lax.scan(step, X, stacked)[0]


# -- creation --------------------------------------------------------------------------


def test_stacked_init_is_a_vmapped_init_with_split_keys():
  ours = stacked_variables()
  assert jax.tree.map(jnp.shape, ours) == {
      'params': {'Dense_0': {'kernel': (N, 4, 4), 'bias': (N, 4)}, 'gate': (N, 4)}}
  vmapped = jax.vmap(lambda k: Block().init(k, X))(jax.random.split(KEY, N))
  assert_close(ours, vmapped, tol=1e-7)
  flax_stack = flax_nn.vmap(FlaxBlock, variable_axes={True: 0}, split_rngs={True: True},
                            in_axes=(None, None), axis_size=N)
  assert_close(ours, flax_stack().init(KEY, X, None), tol=1e-7)
  by_scan = nn.Stacked(ScanBlock, N).init(KEY, X, method='scan')
  assert_close(by_scan, nn.Stacked(ScanBlock, N).init(KEY, X, method='vmap'), tol=0)


# -- one semantics, four implementations -----------------------------------------------


def test_fold_agrees_across_stacked_blockseq_scan_layers_and_the_loop():
  stacked = stacked_variables()
  layers = nn.stacked_to_layers(stacked)

  class ScanLayersLoop(Loop):
    def __call__(self, x):
      return nn.scan_layers(self.layers, x)

  y_stacked, g_stacked = value_and_grad(nn.Stacked(Block, N), stacked)
  results = [value_and_grad(model, layers)
             for model in (Loop(), nn.BlockSeq(Block, N), ScanLayersLoop())]
  assert_close(y_stacked, hand_written_fold(stacked))
  for y, grads in results:
    assert_close(y, y_stacked)
    assert_close(grads, nn.stacked_to_layers({'params': g_stacked})['params'])


@pytest.mark.parametrize('remat', POLICIES, ids=str)
def test_every_remat_policy_gives_the_same_values_and_grads(remat):
  stacked = stacked_variables()
  layers = nn.stacked_to_layers(stacked)
  expected = value_and_grad(nn.Stacked(Block, N), stacked)
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', loops.OffloadFallbackWarning)
    through_stacked = value_and_grad(nn.Stacked(Block, N, remat=remat), stacked)
    through_seq = value_and_grad(nn.BlockSeq(Block, N, remat=remat), layers)
  assert_close(through_stacked, expected)
  assert_close(through_seq[0], expected[0])
  assert_close(through_seq[1], nn.stacked_to_layers({'params': expected[1]})['params'])


def test_stacked_jaxpr_has_one_scan_with_the_block_once():
  jaxpr = jax.make_jaxpr(lambda v: nn.Stacked(Block, N).apply(v, X))(stacked_variables())
  scans = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == 'scan']
  assert len(scans) == 1 and scans[0].params['length'] == N
  body = scans[0].params['jaxpr'].jaxpr
  assert [e.primitive.name for e in body.eqns].count('dot_general') == 1
  assert 'dot_general' not in [e.primitive.name for e in jaxpr.jaxpr.eqns]


# -- per_layer -----------------------------------------------------------------------


def test_per_layer_rows_reach_their_layer():
  stacked = stacked_variables()
  layers = nn.stacked_to_layers(stacked)
  scales = jnp.array([0.5, -1.0, 2.0, 0.0])
  expected = Loop().apply(layers, X, scales)
  per = nn.per_layer(scales)
  assert_close(nn.Stacked(Block, N).apply(stacked, X, per), expected)
  assert_close(nn.Stacked(Block, N).apply(stacked, X, scale=per), expected)
  assert_close(nn.BlockSeq(Block, N).apply(layers, X, per), expected)
  assert_close(nn.BlockSeq(Block, N, remat='nested').apply(layers, X, scale=per), expected)
  # A shared argument goes whole to every layer.
  assert_close(nn.Stacked(Block, N).apply(stacked, X, 0.5), Loop().apply(layers, X, [0.5] * N))


def test_per_layer_with_the_wrong_number_of_rows_is_refused():
  with pytest.raises(errors.LayerStackError, match=r'leading axis 3 .* the stack has 4 layers'):
    nn.Stacked(Block, N).apply(stacked_variables(), X, nn.per_layer(jnp.ones(3)))
  with pytest.raises(errors.LayerStackError, match='scalar'):
    nn.per_layer(jnp.float32(1.0))


# -- scan, vmap, fold_via, scan_via, unstacked ------------------------------------------


def test_scan_stacks_the_outs_of_every_layer():
  variables = nn.Stacked(ScanBlock, N).init(KEY, X, method='scan')
  layers = nn.stacked_to_layers(variables)
  carry, outs = nn.Stacked(ScanBlock, N).apply(variables, X, method='scan')
  seq_carry, seq_outs = nn.BlockSeq(ScanBlock, N).apply(layers, X, method='scan')
  x, expected = X, []
  for i in range(N):
    x, out = ScanBlock().apply({'params': layers['params'][f'layers_{i}']}, x)
    expected.append(out)
  assert_close((carry, outs), (x, jnp.stack(expected)))
  assert_close((seq_carry, seq_outs), (x, jnp.stack(expected)))


def test_vmap_runs_every_layer_on_the_same_input():
  stacked = stacked_variables()
  layers = nn.stacked_to_layers(stacked)['params']
  expected = jnp.stack([Block().apply({'params': layers[f'layers_{i}']}, X) for i in range(N)])
  assert_close(nn.Stacked(Block, N).apply(stacked, X, method='vmap'), expected)
  assert_close(nn.BlockSeq(Block, N).apply({'params': layers}, X, method='vmap'), expected)


def test_fold_via_and_scan_via_call_fn_with_each_block():
  stacked = stacked_variables()
  layers = nn.stacked_to_layers(stacked)
  fn = lambda block, x, k: block(x) * k
  via = lambda stack: stack.fold_via(fn)(X, 0.5)
  scan_via = lambda stack: stack.scan_via(lambda b, x: (b(x), x.sum()))(X)
  x, sums = X, []
  for i in range(N):
    sums.append(x.sum())
    x = Block().apply({'params': layers['params'][f'layers_{i}']}, x) * 0.5
  assert_close(nn.Stacked(Block, N).apply(stacked, method=via), x)
  assert_close(nn.BlockSeq(Block, N).apply(layers, method=via), x)
  carry, outs = nn.Stacked(Block, N).apply(stacked, method=scan_via)
  assert_close(outs, nn.BlockSeq(Block, N).apply(layers, method=scan_via)[1])
  assert outs.shape == (N,)


def test_unstacked_views_are_the_layers():
  stacked = stacked_variables()
  layers = nn.stacked_to_layers(stacked)['params']
  views = nn.Stacked(Block, N).apply(stacked, method=lambda s: [v(X) for v in s.unstacked()])
  for i, y in enumerate(views):
    assert_close(y, Block().apply({'params': layers[f'layers_{i}']}, X))
  seq = nn.BlockSeq(Block, N).apply({'params': layers},
                                    method=lambda s: [v(X) for v in s.unstacked()])
  assert_close(seq, views)


# -- rngs, state, metadata --------------------------------------------------------------


class DropBlock(nn.Module):
  @nn.compact
  def __call__(self, x, _=None):
    y = nn.Dropout(0.5, deterministic=False)(Block()(x))
    return (y, None) if _ is not None else y


class FlaxDropBlock(flax_nn.Module):
  @flax_nn.compact
  def __call__(self, x, _):
    h = jnp.tanh(flax_nn.Dense(4, name='Dense_0')(x))
    gate = self.param('gate', flax_nn.initializers.normal(0.5), (4,))
    return flax_nn.Dropout(0.5, deterministic=False)(x + h * gate[None]), None


def test_each_layer_draws_its_own_dropout_keys_as_flax_linen_scan():
  rngs = {'params': KEY, 'dropout': jax.random.key(7)}
  variables = nn.Stacked(DropBlock, N).init(rngs, X)
  ours = nn.Stacked(DropBlock, N).apply(variables, X, rngs={'dropout': jax.random.key(3)})
  flax_stack = flax_nn.scan(FlaxDropBlock, variable_axes={True: 0}, split_rngs={True: True},
                            length=N)()
  nested = {'params': {'Dense_0': variables['params']['Block_0']['Dense_0'],
                       'gate': variables['params']['Block_0']['gate']}}
  theirs, _ = flax_stack.apply(nested, X, None, rngs={'dropout': jax.random.key(3)})
  assert_close(ours, theirs)


class CountingBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    count = self.variable('counter', 'n', jnp.zeros, (), jnp.int32)
    if not self.is_initializing():
      count.value += 1
    self.sow('intermediates', 'x', x)
    return Block()(x)


def test_mutable_collections_are_stacked_per_layer():
  variables = nn.Stacked(CountingBlock, N).init(KEY, X)
  _, state = nn.Stacked(CountingBlock, N).apply(variables, X,
                                                mutable=['counter', 'intermediates'])
  assert state['counter']['n'].tolist() == [1] * N
  assert state['intermediates']['x'][0].shape == (N,) + X.shape
  seq_vars = nn.stacked_to_layers(variables)
  _, seq_state = nn.BlockSeq(CountingBlock, N).apply(seq_vars, X, mutable=['counter'])
  assert_close(nn.layers_to_stacked(seq_state), {'counter': state['counter']})


class PartitionedBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param('w', nn.with_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp')),
                   (4, 4))
    return jnp.tanh(x @ w)


def test_metadata_params_name_the_layer_axis_and_conversion_round_trips():
  params = {nn.PARTITION_NAME: 'layers'}
  variables = nn.Stacked(PartitionedBlock, N, metadata_params=params).init(KEY, X)
  box = variables['params']['w']
  assert isinstance(box, meta.Partitioned) and box.names == ('layers', 'embed', 'mlp')
  layers = nn.stacked_to_layers(variables, metadata_params=params)
  assert layers['params']['layers_2']['w'].names == ('embed', 'mlp')
  assert layers['params']['layers_2']['w'].value.shape == (4, 4)
  back = nn.layers_to_stacked(layers, metadata_params=params)
  assert back['params']['w'].names == ('layers', 'embed', 'mlp')
  assert_close(back, variables, tol=0)
  assert_close(nn.Stacked(PartitionedBlock, N, metadata_params=params).apply(variables, X),
               nn.BlockSeq(PartitionedBlock, N).apply(layers, X))


def test_layout_conversion_round_trips_and_names_layers():
  stacked = stacked_variables()
  layers = nn.stacked_to_layers(stacked, prefix='blocks')
  assert sorted(layers['params']) == [f'blocks_{i}' for i in range(N)]
  assert_close(nn.layers_to_stacked(layers, prefix='blocks'), stacked, tol=0)


def test_layers_to_stacked_errors_name_what_is_wrong():
  layers = nn.stacked_to_layers(stacked_variables())['params']
  bad = dict(layers, layers_2={**layers['layers_2'], 'gate': jnp.zeros(5)})
  with pytest.raises(errors.LayerMismatchError,
                     match=r'layer 2 .*params/gate is shape \(5,\).* but shape \(4,\)'):
    nn.layers_to_stacked({'params': bad})
  with pytest.raises(errors.LayerStackError, match=r'not 0\.\.2 without gaps'):
    nn.layers_to_stacked({'params': {k: layers[k] for k in ('layers_0', 'layers_1', 'layers_3')}})
  with pytest.raises(errors.LayerStackError, match="holds \\['head'\\] besides"):
    nn.layers_to_stacked({'params': dict(layers, head=jnp.ones(2))})


# -- BlockSeq ---------------------------------------------------------------------------


class Wide(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(6)(x)


class Narrow(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(3)(x)


def test_blockseq_runs_heterogeneous_blocks_and_inits_as_the_loop():
  seq = nn.BlockSeq([Wide(parent=None), Narrow(parent=None)], remat=True)
  variables = seq.init(KEY, X)
  assert jax.tree.map(jnp.shape, variables)['params']['layers_1']['Dense_0']['kernel'] == (6, 3)
  expected = Narrow().apply({'params': variables['params']['layers_1']},
                            Wide().apply({'params': variables['params']['layers_0']}, X))
  assert_close(seq.apply(variables, X), expected)
  assert_close(nn.BlockSeq(Block, N).init(KEY, X), Loop().init(KEY, X), tol=0)


def _checkpoints(jaxpr) -> list:
  """The checkpoint equations of ``jaxpr`` as (policy, nested checkpoints), in order."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ('checkpoint', 'remat2'):  # jax.checkpoint's primitive
      found.append((eqn.params['policy'], _checkpoints(eqn.params['jaxpr'])))
  return found


def test_blockseq_runs_each_layer_under_a_checkpoint_with_the_policy():
  variables = nn.stacked_to_layers(stacked_variables())
  jaxpr = lambda remat: jax.make_jaxpr(
      lambda v: nn.BlockSeq(Block, N, remat=remat).apply(v, X))(variables).jaxpr
  full = _checkpoints(jaxpr(True))
  assert len(full) == N and all(p.saveable_names == frozenset() and not inner
                                for p, inner in full)
  named = _checkpoints(jaxpr(loops.ScanCheckpointPolicy(save_block_internals=['h'])))
  assert [p.saveable_names for p, _ in named] == [frozenset({'h'})] * N
  nested = _checkpoints(jaxpr('nested'))
  lengths = loops.plan_blocks(N, True).lengths
  assert [len(inner) for _, inner in nested] == list(lengths)
  assert all(policy is None for policy, _ in nested)


# -- errors -----------------------------------------------------------------------------


def test_unknown_remat_is_refused_when_the_stack_is_built():
  with pytest.raises(RematPolicyError, match="remat='sometimes'"):
    nn.Stacked(Block, N, remat='sometimes')
  with pytest.raises(RematPolicyError, match="remat='sometimes'"):
    nn.BlockSeq(Block, N, remat='sometimes')


def test_more_nested_blocks_than_layers_is_refused_when_the_stack_is_built():
  with pytest.raises(RematPolicyError, match='nested=5 outer blocks for a loop of 4 steps'):
    nn.Stacked(Block, N, remat=loops.ScanCheckpointPolicy(nested=5))
  with pytest.raises(RematPolicyError, match='nested=5'):
    nn.BlockSeq(Block, N, remat=loops.ScanCheckpointPolicy(nested=5))


def test_bad_stack_arguments_are_refused():
  with pytest.raises(errors.LayerStackError, match='not a Module class'):
    nn.Stacked(Block(parent=None), N)
  with pytest.raises(errors.LayerStackError, match='length=0 is not a positive int'):
    nn.Stacked(Block, 0)
  with pytest.raises(errors.LayerStackError, match='length=3 but 2 modules'):
    nn.BlockSeq([Wide(parent=None), Narrow(parent=None)], 3)
  with pytest.raises(errors.LayerStackError, match='scan needs a \\(carry, out\\) pair'):
    nn.Stacked(Block, N).apply(stacked_variables(), X, method='scan')
  with pytest.raises(errors.LayerStackError, match='fold needs the structure of its carry'):
    nn.Stacked(ScanBlock, N).init(KEY, X)
