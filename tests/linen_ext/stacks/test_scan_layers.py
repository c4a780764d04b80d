"""scan_layers: a list of equal submodules as one loop.

Oracle: the same module running the Python loop over the same layers
(``for layer in self.layers: x = layer(x)``): init values, outputs, gradients,
rng draws, mutable collections and rng counters afterwards must be equal.
"""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn
from lift import loops
from lift.errors import RematPolicyError
from linen_ext import errors

KEY = jax.random.key(0)
N = 4
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
RNGS = {'params': KEY, 'dropout': jax.random.key(1)}


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


def assert_close(a, b, tol=1e-5):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def both(fn):
  return fn(Model(use_scan=True)), fn(Model(use_scan=False))


def test_init_equals_the_python_loop():
  ours, loop = both(lambda m: m.init(RNGS, X))
  assert sorted(ours['params']) == [f'layers_{i}' for i in range(N)]
  assert_close(ours, loop, tol=0)


def test_outputs_grads_rngs_and_state_equal_the_python_loop():
  variables = Model(use_scan=False).init(RNGS, X)
  scales = jnp.array([1.0, 0.5, -1.0, 2.0])

  def run(model):
    def loss(params):
      y, state = model.apply({**variables, 'params': params}, X, scales, train=True,
                             rngs={'dropout': jax.random.key(5)},
                             mutable=['counter', 'intermediates'])
      return jnp.sum(y ** 2), (y, state)
    return jax.jit(jax.grad(loss, has_aux=True))(variables['params'])

  (g_scan, (y_scan, s_scan)), (g_loop, (y_loop, s_loop)) = both(run)
  assert_close(y_scan, y_loop)
  assert_close(g_scan, g_loop)
  assert_close(s_scan, s_loop, tol=0)
  assert s_scan['counter']['layers_3']['calls'] == 1
  assert not np.allclose(y_scan, Model().apply(variables, X, scales))  # dropout was on


def test_rng_counters_continue_as_in_the_loop():
  variables = Model(use_scan=False).init(RNGS, X)
  ours, loop = both(lambda m: m.apply(variables, X, method='again',
                                      rngs={'dropout': jax.random.key(2)}))
  assert_close(ours, loop)


@pytest.mark.parametrize('remat', [True, 'nested', 'save_all', loops.ScanCheckpointPolicy(nested=2)],
                         ids=str)
def test_remat_policies_keep_values_and_grads(remat):
  variables = Model(use_scan=False).init(RNGS, X)
  grad = lambda m: jax.jit(jax.value_and_grad(
      lambda p: jnp.sum(m.apply({**variables, 'params': p}, X) ** 2)))(variables['params'])
  assert_close(grad(Model(remat=remat)), grad(Model(use_scan=False)))


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
  assert_close(ours, loop, tol=1e-4)


def test_gradient_reaches_each_layer_through_one_unstack():
  """Per-layer gradients come from one `unstack_rows` for all variables, not one slice per layer."""
  variables = Model(use_scan=False).init(RNGS, X)
  grad = jax.grad(lambda p: jnp.sum(Model().apply({**variables, 'params': p}, X) ** 2))
  eqns = jax.make_jaxpr(grad)(variables['params']).jaxpr.eqns
  names = [e.primitive.name for e in eqns]
  assert names.count('stack_rows') == 1  # kernel and bias (the integer counter: jnp.stack)
  assert names.count('unstack_rows') == 1  # the gradients of kernel and bias
  assert 'slice' not in names


def test_jaxpr_has_one_scan_with_the_block_once():
  variables = Model(use_scan=False).init(RNGS, X)
  jaxpr = jax.make_jaxpr(lambda v: Model().apply(v, X))(variables).jaxpr
  scans = [e for e in jaxpr.eqns if e.primitive.name == 'scan']
  assert len(scans) == 1 and scans[0].params['length'] == N
  names = [e.primitive.name for e in scans[0].params['jaxpr'].jaxpr.eqns]
  assert names.count('dot_general') == 1 and names.count('tanh') == 1
  assert 'dot_general' not in [e.primitive.name for e in jaxpr.eqns]


def test_works_under_jit_and_with_layers_made_in_a_compact_method():
  class Compact(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.scan_layers([Block(rate=0.0) for _ in range(3)], x)

  class CompactLoop(nn.Module):
    @nn.compact
    def __call__(self, x):
      for layer in [Block(rate=0.0) for _ in range(3)]:
        x = layer(x)
      return x

  variables = CompactLoop().init(KEY, X)
  assert sorted(variables['params']) == ['Block_0', 'Block_1', 'Block_2']
  assert_close(jax.jit(Compact().apply)(variables, X), CompactLoop().apply(variables, X))


# -- errors -----------------------------------------------------------------------------


class Mixed(nn.Module):
  """Layers that differ in shape (features) or only in code (rate)."""
  features: tuple = (4, 4, 4)
  rates: tuple = (0.25, 0.25, 0.25)

  def setup(self):
    self.layers = [Block(f, r) for f, r in zip(self.features, self.rates)]

  def __call__(self, x):
    return nn.scan_layers(self.layers, x)

  def loop(self, x):
    for layer in self.layers:
      x = layer(x)
    return x


def test_layers_with_different_shapes_are_refused_naming_index_path_and_shapes():
  model = Mixed()
  variables = model.init(KEY, X)
  bad = jax.tree.map(lambda a: a, variables)
  bad['params']['layers_2']['Dense_0']['kernel'] = jnp.zeros((4, 5))  # e.g. a wrong checkpoint
  with pytest.raises(errors.LayerMismatchError,
                     match=(r'layer 2 does not match layer 0: variable '
                            r'params/Dense_0/kernel is shape \(4, 5\) dtype float32 in layer 2 '
                            r'but shape \(4, 4\) dtype float32 in layer 0')):
    model.apply(bad, X)


def test_layers_with_different_code_are_refused():
  model = Mixed(rates=(0.25, 0.5, 0.25))
  variables = model.init(KEY, X, method='loop')
  with pytest.raises(errors.LayerMismatchError,
                     match=r"layer 1 runs other code than layer 0: field 'rate' is 0.5"):
    model.apply(variables, X)
  with pytest.raises(errors.LayerMismatchError, match='layer 1 runs other code'):
    model.init(KEY, X)


def test_no_layers_return_the_carry():
  class Empty(nn.Module):
    remat: object = 'nested'

    def setup(self):
      self.layers = []

    def __call__(self, x):
      return nn.scan_layers(self.layers, x, remat=self.remat)

  variables = Empty().init(KEY, X)
  assert not variables
  np.testing.assert_array_equal(Empty().apply(variables, X), X)
  with pytest.raises(RematPolicyError, match="remat='sometimes'"):
    Empty(remat='sometimes').apply({}, X)
  with pytest.raises(errors.LayerStackError, match='not a list'):
    nn.scan_layers(Block(), X)


def test_misuse_is_refused():
  class Shared(nn.Module):
    def setup(self):
      block = Block()
      self.layers = [block, block]

    def __call__(self, x):
      return nn.scan_layers(self.layers, x)

  with pytest.raises(errors.LayerStackError, match='layers 0 and 1 are the same module'):
    Shared().init(KEY, X)
  with pytest.raises(errors.LayerStackError, match='not a bound Module'):
    nn.scan_layers([Block()], X)
  with pytest.raises(RematPolicyError, match="remat='sometimes'"):
    Model(remat='sometimes').init(KEY, X)
  with pytest.raises(RematPolicyError, match='nested=5 outer blocks for a loop of 4 steps'):
    Model(remat=loops.ScanCheckpointPolicy(nested=5)).init(KEY, X)
  with pytest.raises(errors.LayerStackError, match='has 4 layers'):
    Model().init(RNGS, X, jnp.ones(3))


@pytest.mark.parametrize('stddevs, same', [((0.02, 0.02, 0.02), True), ((0.02, 0.03, 0.02), False)])
def test_fresh_initializer_closures_compare_by_what_they_compute(stddevs, same):
  """`normal(0.02)` is a new closure per layer: equal code and closed-over values are the same."""
  class Model(nn.Module):
    def setup(self):
      self.layers = [nn.Dense(4, kernel_init=nn.initializers.normal(s)) for s in stddevs]

    def __call__(self, x):
      return nn.scan_layers(self.layers, x)

  if same:
    variables = Model().init(KEY, X)
    assert variables['params']['layers_1']['kernel'].shape == (4, 4)
    Model().apply(variables, X)
  else:
    with pytest.raises(errors.LayerMismatchError, match="layer 1.*kernel_init"):
      Model().init(KEY, X)


def test_a_layer_that_changes_the_carry_type_is_a_clear_error():
  class Model(nn.Module):
    def setup(self):
      self.layers = [nn.Dense(4, dtype=jnp.bfloat16) for _ in range(3)]

    def __call__(self, x):
      return nn.scan_layers(self.layers, x)

  variables = Model().init(KEY, X)  # init runs the Python loop
  with pytest.raises(errors.LayerStackError, match='bfloat16.*dtype=x.dtype'):
    Model().apply(variables, X)


# -- a module shared by the layers (a field of each, bound outside them) --------------------


class SharedUser(nn.Module):
  """A layer that calls a module its parent owns and hands to every layer."""
  shared: nn.Module

  @nn.compact
  def __call__(self, x, train=False):
    return x + jnp.tanh(self.shared(nn.Dense(4)(x), train))


class SharedHolder(nn.Module):
  shared_cls: type
  scanned: bool = True

  def setup(self):
    self.shared = self.shared_cls()
    self.layers = [SharedUser(self.shared) for _ in range(N)]

  def __call__(self, x, train=False):
    if self.scanned:
      return nn.scan_layers(self.layers, x, train=train)
    for layer in self.layers:
      x = layer(x, train)
    return x


class Projection(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    del train
    return nn.Dense(4, name='proj')(x)


class CountingProjection(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    count = self.variable('counter', 'calls', jnp.zeros, (), jnp.int32)
    if not self.is_initializing():
      count.value += 1
    return nn.Dense(4)(x)


class DroppingProjection(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    return nn.Dropout(0.5, deterministic=not train)(nn.Dense(4)(x))


def test_a_shared_module_is_read_by_every_step_and_gets_every_layers_gradient():
  loop, scanned = SharedHolder(Projection, scanned=False), SharedHolder(Projection)
  variables = loop.init(KEY, X)
  assert jax.tree.map(jnp.shape, scanned.init(KEY, X)) == jax.tree.map(jnp.shape, variables)
  loss = lambda model: lambda p: jnp.sum(model.apply({'params': p}, X) ** 2)
  value, grads = jax.value_and_grad(loss(scanned))(variables['params'])
  expected_value, expected = jax.value_and_grad(loss(loop))(variables['params'])
  np.testing.assert_allclose(value, expected_value, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grads, expected)
  assert np.any(np.asarray(grads['shared']['proj']['kernel']) != 0)
  jaxpr = jax.make_jaxpr(lambda p: scanned.apply({'params': p}, X))(variables['params'])
  assert sum(e.primitive.name == 'scan' for e in jaxpr.jaxpr.eqns) == 1


@pytest.mark.parametrize('shared_cls, train, mutable, match', [
    (CountingProjection, False, ['counter'], 'writes variable "calls" of collection "counter"'),
    (DroppingProjection, True, False, 'draws from rng stream "dropout"'),
])
def test_a_shared_module_writing_or_drawing_inside_the_loop_is_a_clear_error(
    shared_cls, train, mutable, match):
  variables = SharedHolder(shared_cls, scanned=False).init(KEY, X)
  with pytest.raises(errors.LayerStackError, match=match) as info:
    SharedHolder(shared_cls).apply(variables, X, train, rngs={'dropout': KEY},
                                   mutable=mutable)
  assert '/shared' in str(info.value)


class FlaxDropoutBlock(nn.Module):
  """A block whose dropout is a wrapped flax layer: flax hashes its keys in Python."""
  deterministic: bool

  @nn.compact
  def __call__(self, x):
    dropout = nn.from_flax(flax_nn.Dropout(0.5, deterministic=self.deterministic))
    return dropout(nn.Dense(4)(x))


@pytest.mark.parametrize('jit', [False, True])
def test_a_wrapped_flax_layer_drawing_inside_the_loop_is_a_clear_error(jit):
  class Net(nn.Module):
    deterministic: bool
    scanned: bool = True

    def setup(self):
      self.layers = [FlaxDropoutBlock(self.deterministic) for _ in range(3)]

    def __call__(self, x):
      if self.scanned:
        return nn.scan_layers(self.layers, x)
      for layer in self.layers:
        x = layer(x)
      return x

  wrap = nn.jit if jit else (lambda cls: cls)
  variables = Net(False, scanned=False).init(RNGS, X)
  with pytest.raises(errors.LayerStackError, match=r'flax layer at .*layers_0/Dropout_0.*nn.Dropout'):
    wrap(Net)(False).apply(variables, X, rngs={'dropout': KEY})
  # Without draws the wrapped layer runs in the loop as it does in the Python loop.
  assert_close(wrap(Net)(True).apply(variables, X, rngs={'dropout': KEY}),
               Net(True, scanned=False).apply(variables, X))
