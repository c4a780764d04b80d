"""scan_layers: a list of equal submodules as one loop.

Oracle: the same module running the Python loop over the same layers
(``for layer in self.layers: x = layer(x)``), ours or Flax's: init values, outputs,
gradients, rng draws, mutable collections and rng counters afterwards must be equal.
"""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn
from lift import loops

from tests.helpers import assert_trees_close, assert_trees_equal

KEY = jax.random.key(0)
N = 4
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
RNGS = {'params': KEY, 'dropout': jax.random.key(1)}
DROP = {'dropout': jax.random.key(3)}


class Block(nn.Module):
  """Dense (a wrapped flax layer), native dropout, a counter and a sown value."""
  features: int = 4
  rate: float = 0.25

  @nn.compact
  def __call__(self, x, scale=1.0, train=False):
    h = jnp.tanh(nn.Dense(self.features)(x)) * scale
    h = nn.Dropout(self.rate, deterministic=not train)(h)
    count = self.variable('counter', 'calls', jnp.zeros, (), jnp.int32)
    if self.is_mutable_collection('counter') and not self.is_initializing():
      count.value += 1
    self.sow('intermediates', 'h', h)
    return x + h


class Model(nn.Module):
  """The same layers run by scan_layers or by the Python loop."""
  use_scan: bool = True
  n: int = N
  remat: object = False

  def setup(self):
    self.layers = [Block() for _ in range(self.n)]

  def __call__(self, x, scales=None, train=False):
    if self.use_scan:
      args = () if scales is None else (nn.per_layer(scales),)
      return nn.scan_layers(self.layers, x, *args, train=train, remat=self.remat)
    for i, layer in enumerate(self.layers):
      x = layer(x, *(() if scales is None else (scales[i],)), train=train)
    return x

  def again(self, x):
    """scan_layers then each layer once more: rng counters must continue as in the loop."""
    y = self(x, train=True)
    return y + sum(layer(x, train=True) for layer in self.layers)


def both(fn):
  return fn(Model(use_scan=True)), fn(Model(use_scan=False))


def test_init_outputs_grads_rngs_and_state_equal_the_python_loop():
  ours, loop = both(lambda m: m.init(RNGS, X))
  assert sorted(ours['params']) == [f'layers_{i}' for i in range(N)]
  assert_trees_equal(ours, loop)
  variables = loop
  scales = jnp.array([1.0, 0.5, -1.0, 2.0])

  def run(model):
    def loss(params):
      y, state = model.apply({**variables, 'params': params}, X, scales, train=True,
                             rngs={'dropout': jax.random.key(5)},
                             mutable=['counter', 'intermediates'])
      return jnp.sum(y ** 2), (y, state)
    return jax.jit(jax.grad(loss, has_aux=True))(variables['params'])

  (g_scan, (y_scan, s_scan)), (g_loop, (y_loop, s_loop)) = both(run)
  assert_trees_close((y_scan, g_scan), (y_loop, g_loop), depth=2 * N)
  assert_trees_equal(s_scan['counter'], s_loop['counter'])
  assert_trees_close(s_scan['intermediates'], s_loop['intermediates'], depth=N)
  assert s_scan['counter']['layers_3']['calls'] == 1
  assert not np.allclose(y_scan, Model().apply(variables, X, scales))  # dropout was on
  # rng counters continue as in the loop when each layer runs once more afterwards
  ours, loop = both(lambda m: m.apply(variables, X, method='again',
                                      rngs={'dropout': jax.random.key(2)}))
  assert_trees_close(ours, loop, depth=N)


def test_forward_mode_hessian_and_vmap_equal_the_python_loop():
  variables = Model(use_scan=False).init(RNGS, X)
  params = variables['params']
  tangent = jax.tree.map(jnp.cos, params)

  def run(model):
    f = lambda p, x: jnp.sum(model.apply({**variables, 'params': p}, x) ** 2)
    jvp = jax.jit(lambda p, t: jax.jvp(lambda q: f(q, X), (p,), (t,)))(params, tangent)
    hvp = jax.jvp(jax.grad(lambda q: f(q, X)), (params,), (tangent,))[1]
    batched = jax.vmap(lambda x: f(params, x))(jnp.stack([X, 2 * X, -X]))
    per_params = jax.vmap(lambda p: f(p, X))(jax.tree.map(lambda a: jnp.stack([a, 2 * a]), params))
    return jvp, hvp, batched, per_params

  ours, loop = both(run)
  assert_trees_close(ours, loop, depth=4 * N)


def test_jaxpr_has_one_scan_with_the_block_once_and_gradients_leave_by_one_unstack():
  """Per-layer gradients come from one `unstack_rows` for all variables, not one slice per layer."""
  variables = Model(use_scan=False).init(RNGS, X)
  jaxpr = jax.make_jaxpr(lambda v: Model().apply(v, X))(variables).jaxpr
  scans = [e for e in jaxpr.eqns if e.primitive.name == 'scan']
  assert len(scans) == 1 and scans[0].params['length'] == N
  names = [e.primitive.name for e in scans[0].params['jaxpr'].jaxpr.eqns]
  assert names.count('dot_general') == 1 and names.count('tanh') == 1
  assert 'dot_general' not in [e.primitive.name for e in jaxpr.eqns]
  grad = jax.grad(lambda p: jnp.sum(Model().apply({**variables, 'params': p}, X) ** 2))
  names = [e.primitive.name for e in jax.make_jaxpr(grad)(variables['params']).jaxpr.eqns]
  assert names.count('stack_rows') == 1  # kernel and bias (the integer counter: jnp.stack)
  assert names.count('unstack_rows') == 1  # the gradients of kernel and bias
  assert 'slice' not in names


def test_works_under_jit_and_with_layers_made_in_a_compact_method():
  class Compact(nn.Module):
    scanned: bool = True

    @nn.compact
    def __call__(self, x):
      layers = [Block(rate=0.0) for _ in range(3)]
      if self.scanned:
        return nn.scan_layers(layers, x)
      for layer in layers:
        x = layer(x)
      return x

  variables = Compact(scanned=False).init(KEY, X)
  assert sorted(variables['params']) == ['Block_0', 'Block_1', 'Block_2']
  assert_trees_close(jax.jit(Compact().apply)(variables, X),
                     Compact(scanned=False).apply(variables, X), depth=3)


# -- errors -----------------------------------------------------------------------------


class Layers(nn.Module):
  """scan_layers over the layers ``make()`` returns; ``loop`` runs the Python loop instead."""
  make: object

  def setup(self):
    self.layers = self.make()

  def __call__(self, x):
    return nn.scan_layers(self.layers, x)

  def loop(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


def test_init_runs_the_python_loop_over_layers_one_loop_would_refuse():
  """Init makes the variables by the loop, so it accepts layers `scan_layers` refuses once they
  exist (their variables differ, or they change the carry's dtype: the misuse catalogue)."""
  variables = Layers(lambda: [nn.Dense(4, dtype=jnp.bfloat16) for _ in range(3)]).init(KEY, X)
  assert sorted(variables['params']) == ['layers_0', 'layers_1', 'layers_2']


def test_no_layers_return_the_carry():
  assert not Layers(list).init(KEY, X)
  run = lambda remat: nn.apply(lambda m: nn.scan_layers(m.layers, X, remat=remat), Layers(list))({})
  np.testing.assert_array_equal(run('nested'), X)


# -- a wrapped flax layer in the loop ------------------------------------------------------


class FlaxDropoutBlock(nn.Module):
  """A block whose dropout is a wrapped flax layer: flax hashes its keys in Python."""
  deterministic: bool

  @nn.compact
  def __call__(self, x):
    dropout = nn.from_flax(flax_nn.Dropout(0.5, deterministic=self.deterministic))
    return dropout(nn.Dense(4)(x))


@pytest.mark.parametrize('jit', [False, True])
def test_a_wrapped_flax_layer_without_draws_runs_in_the_loop_as_in_the_python_loop(jit):
  """With draws, it is refused (the misuse catalogue): flax hashes its keys in Python."""
  net = lambda deterministic: (nn.jit(Layers) if jit else Layers)(
      lambda: [FlaxDropoutBlock(deterministic) for _ in range(3)])
  variables = net(False).init(RNGS, X, method='loop')
  assert_trees_close(net(True).apply(variables, X, rngs={'dropout': KEY}),
                     Layers(lambda: [FlaxDropoutBlock(True) for _ in range(3)]).apply(
                         variables, X, method='loop'), depth=3)


# -- against a flax Python loop -------------------------------------------------------------


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

  ours_layer, flax_layer = block(nn), block(flax_nn)

  class Ours(nn.Module):
    def setup(self):
      self.layers = [ours_layer() for _ in range(3)]

    def __call__(self, x, gains, train=True):
      return nn.scan_layers(self.layers, (x, jnp.zeros(())), gain=nn.per_layer(gains),
                            train=train, remat=remat)

  class Theirs(flax_nn.Module):
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
  assert_trees_equal(ours().init(RNGS, X, GAINS), variables)
  for train in (True, False):
    def run(model):
      def loss(p):
        (y, aux), state = model().apply({**variables, 'params': p}, X, GAINS, train=train,
                                        rngs=DROP, mutable=['batch_stats', 'intermediates'])
        return jnp.sum(y ** 2) + aux, (y, state)
      return jax.jit(jax.grad(loss, has_aux=True))(variables['params'])
    assert_trees_close(run(ours), run(theirs), depth=9)


def test_scan_layers_under_nn_vmap_nn_remat_and_nn_jit_is_the_flax_loop():
  ours, theirs = _layer_models()
  axes = dict(variable_axes={'params': 0, 'batch_stats': 0},
              split_rngs={'params': True, 'dropout': True}, in_axes=(0, None), axis_size=2)
  xs = jnp.stack([X, -X])
  variables = flax_nn.vmap(theirs, **axes)().init(RNGS, xs, GAINS)
  assert_trees_equal(nn.vmap(ours, **axes)().init(RNGS, xs, GAINS), variables)
  run = lambda model, v, x: model.apply(v, x, GAINS, rngs=DROP, mutable=['batch_stats'])
  assert_trees_close(run(nn.vmap(ours, **axes)(), variables, xs),
                     run(flax_nn.vmap(theirs, **axes)(), variables, xs), depth=3)
  single = theirs().init(RNGS, X, GAINS)
  assert_trees_close(run(nn.remat(ours)(), single, X), run(theirs(), single, X), depth=3)
  assert_trees_close(nn.jit(ours, static_argnums=(3,))().apply(single, X, GAINS, False),
                     theirs().apply(single, X, GAINS, False), depth=3)


def _dense_and_norms(n):
  def dense_and_norms(m, module):
    module.layers = [m.Dense(4, use_bias=False) for _ in range(n)]
    module.norms = [m.LayerNorm() for _ in range(n)]
  return dense_and_norms


def _equal_closures(m, module):  # found by the audit (fixed in c5a77a3): was 'other code'
  module.layers = [m.Dense(4, kernel_init=m.initializers.normal(0.02)) for _ in range(3)]


def _shared_from_the_parent(m, module):
  class Layer(m.Module):
    shared: m.Module

    @m.compact
    def __call__(self, x):
      return x + jnp.tanh(self.shared(m.Dense(4)(x)))

  module.shared = m.Dense(4)
  module.layers = [Layer(module.shared) for _ in range(3)]


@pytest.mark.parametrize('make_layers', [_dense_and_norms(1), _dense_and_norms(2),
                                         _dense_and_norms(13), _equal_closures,
                                         _shared_from_the_parent],
                         ids=['ready-made-1', 'ready-made-2', 'ready-made-13', 'equal-closures',
                              'shared-module'])
def test_layer_lists_are_the_flax_loop(make_layers):
  def model(m, scanned):
    class Model(m.Module):
      def setup(self):
        make_layers(m, self)

      def __call__(self, x):
        for group in (self.layers, getattr(self, 'norms', [])):
          if scanned:
            x = nn.scan_layers(group, x)
          else:
            for layer in group:
              x = layer(x)
        return x
    return Model()

  variables = model(flax_nn, False).init(KEY, X)
  assert_trees_equal(model(nn, True).init(KEY, X), variables)
  grad = lambda m: jax.value_and_grad(lambda p: jnp.sum(
      m.apply({'params': p}, X) ** 2))(variables['params'])
  assert_trees_close(grad(model(nn, True)), grad(model(flax_nn, False)), depth=52)
  jaxpr = jax.make_jaxpr(lambda v: model(nn, True).apply(v, X))(variables).jaxpr
  groups = 2 if make_layers.__name__ == 'dense_and_norms' else 1  # one scan per group
  assert sum(e.primitive.name == 'scan' for e in jaxpr.eqns) == groups


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
    return Model()

  class FlaxStep(block(flax_nn)):
    def __call__(self, x):
      return super().__call__(x), None

  flax_scan = flax_nn.scan(FlaxStep, variable_axes={True: 0}, split_rngs={True: True}, length=3)()
  x = jnp.linspace(-1.0, 1.0, 16).reshape(1, 4, 4)
  variables = model(flax_nn, False).init(KEY, x)
  assert_trees_equal(model(nn, True).init(KEY, x), variables)
  scan_vars = flax_scan.init(KEY, x)
  assert_trees_equal(nn.Stacked(block(nn), 3).init(KEY, x)['cache'], scan_vars['cache'])
  states = [variables, variables, scan_vars, scan_vars]
  for t in range(4):
    token = x[:, t:t + 1]
    outs = [model(nn, True).apply(states[0], token, mutable=['cache']),
            model(flax_nn, False).apply(states[1], token, mutable=['cache']),
            nn.Stacked(block(nn), 3).apply(states[2], token, mutable=['cache']),
            flax_scan.apply(states[3], token, mutable=['cache'])]
    outs[3] = (outs[3][0][0], outs[3][1])
    assert_trees_close(outs[0], outs[1], depth=3 * (t + 1))
    assert_trees_close(outs[2], outs[3], depth=3 * (t + 1))
    states = [{**s, **new} for s, (_, new) in zip(states, outs)]
