"""Flax's private names that real clients reach, used as those clients use them, give what
flax.linen gives (docs/porting.md, "Private Flax names we keep").

Each program is written once as a function of the ``nn`` namespace and run with
``linen_ext`` and with ``flax.linen`` (`check_linen_parity`). Trace-time reads are kept as
sets: the two libraries may trace a transformed body a different number of times.
"""
import copy
import dataclasses

import jax
import jax.numpy as jnp

from linen_ext import errors
from tests.helpers import check_both_raise, check_linen_parity

KEY = jax.random.key(0)
X = jnp.linspace(-1, 1, 6).reshape(2, 3)


def current(nn):
  """The module whose method runs, or None (a bridge's ``current_linen_module``)."""
  stack = nn.module._context.module_stack
  return stack[-1] if stack else None


def stack_reads(nn):
  """A layer under nn.scan and nn.remat reads the running module off the stack, creates a
  parameter on it (``param_with_axes`` style), renames its path for a while (a quantization
  bridge's path fix-up), lists its rng streams, and reads the stack's resting value
  outside any module."""
  seen = set()

  class Layer(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      module = current(nn)
      w = module.param('w', nn.initializers.normal(1.0), (3, 3))
      old = module.path
      module.scope.path += ('renamed',)
      seen.add(('/'.join(module.path), module is self, module.is_initializing(),
                module.is_mutable_collection('params'), len(nn.module._context.module_stack),
                tuple(sorted(module.scope.rngs))))
      module.scope.path = old
      return jnp.tanh(x @ w), None

  class Stack(nn.Module):
    @nn.compact
    def __call__(self, x):
      seen.add(('/'.join(current(nn).path), current(nn) is self))
      layers = nn.scan(nn.remat(Layer), variable_axes={'params': 0}, split_rngs={'params': True},
                       length=2)
      return layers(name='layers')(x, None)[0]

  outside = list(nn.module._context.module_stack)
  variables = Stack().init(KEY, X)
  y = Stack().apply(variables, X, rngs={'dropout': KEY})
  return {'outside': outside, 'after': list(nn.module._context.module_stack),
          'variables': variables, 'y': y, 'seen': sorted(seen)}


def detached_factory(nn):
  """A module built under a pushed ``None`` is detached: its fields are read to rebuild it
  elsewhere (a factory transform's re-instantiation)."""
  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      nn.module._context.module_stack.append(None)
      try:
        detached = nn.Dense(2, use_bias=False)
        fields = {f.name: getattr(detached, f.name) for f in dataclasses.fields(detached)
                  if f.name not in ('parent', 'name')}
      finally:
        nn.module._context.module_stack.pop()
      return nn.Dense(**fields)(x), detached.parent is None, detached.scope is None

  variables = Net().init(KEY, X)
  return variables, Net().apply(variables, X)


def test_context_module_stack_reads_and_pushes_as_flax():
  ours, _ = check_linen_parity(stack_reads)
  assert ours['outside'] == ours['after'] == [None]
  assert ('layers/renamed', True, True, True, 3, ('params',)) in ours['seen']  # Stack, Layer
  _, (_, detached_parent, detached_scope) = check_linen_parity(detached_factory)[0]
  assert detached_parent and detached_scope


def unbound_fn(nn):
  """``_get_unbound_fn`` resolves a bound method for the functional ``nn.apply``."""
  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2)(x)

    def double(self, x):
      return 2 * self(x)

  model = Net()
  variables = model.init(KEY, X)
  fn = nn.module._get_unbound_fn(model.double)
  return fn is Net.double, nn.apply(fn, model)(variables, X)


def test_get_unbound_fn_as_flax():
  ours, _ = check_linen_parity(unbound_fn)
  assert ours[0]
  check_both_raise(lambda nn: nn.module._get_unbound_fn(42), errors.InvalidMethodError)


def sentinel(nn):
  """``_Sentinel`` is the type of an unspecified ``parent`` (a config system's validator)."""
  default = {f.name: f.default for f in dataclasses.fields(nn.Dense)}['parent']
  return (isinstance(default, nn.module._Sentinel), copy.deepcopy(default) is default,
          isinstance(None, nn.module._Sentinel))


def test_sentinel_as_flax():
  assert check_linen_parity(sentinel)[0] == (True, True, False)


def wrapped_helper(nn):
  """A ``nowrap`` helper still wrapped by ``wrap_method_once`` runs as a module method (on
  the module stack, after ``setup``); ``_state`` (a ``_ModuleInternalState``) tells setup
  from the rest."""
  in_setup = []

  class Net(nn.Module):
    def setup(self):
      in_setup.append(self._state.in_setup)
      self.dense = nn.Dense(2)

    def __call__(self, x):
      in_setup.append(self._state.in_setup)
      assert isinstance(self._state, nn.module._ModuleInternalState)
      assert self._state.setup_called == nn.module.SetupState.DONE
      return self.dense(x)

    @nn.nowrap
    @nn.module.wrap_method_once
    def kernel_shape(self):
      return self.dense.variables['params']['kernel'].shape, current(nn) is self

  variables = Net().init(KEY, X)
  return Net().bind(variables).kernel_shape(), sorted(set(in_setup))


def test_wrap_method_once_and_state_as_flax():
  assert check_linen_parity(wrapped_helper)[0] == (((3, 2), True), [False, True])


def lora(nn):
  """A low-rank adapter normalizing its axes with ``nn.linear``'s private helpers."""
  class LoRA(nn.Module):
    features: int | tuple[int, ...]
    axis: int | tuple[int, ...] = -1

    @nn.compact
    def __call__(self, x):
      axis = nn.linear._normalize_axes(nn.linear._canonicalize_tuple(self.axis), x.ndim)
      features = nn.linear._canonicalize_tuple(self.features)
      a = self.param('a', nn.initializers.normal(1.0), (*(x.shape[i] for i in axis), 2))
      b = self.param('b', nn.initializers.normal(1.0), (2, *features))
      return jnp.tensordot(jnp.tensordot(x, a, (axis, tuple(range(len(axis))))), b, 1)

  model = LoRA(features=(2, 2), axis=(-1,))
  variables = model.init(KEY, X)
  return variables, model.apply(variables, X), nn.linear._normalize_axes((-1, 0), 3)


def test_linear_helpers_as_flax():
  assert check_linen_parity(lora)[0][2] == (0, 2)


def batch_renorm_ensemble(nn):
  """A BatchRenorm written as SBX's CrossQ writes it, after Flax's BatchNorm, with
  ``nn.normalization``'s private helpers, in an ``nn.vmap`` ensemble of two critics: init,
  two training steps (the second past warm-up, renormalizing) and an evaluation."""
  class BatchRenorm(nn.Module):
    use_running_average: bool | None = None
    momentum: float = 0.9
    epsilon: float = 1e-3
    warmup_steps: int = 1

    @nn.compact
    def __call__(self, x, use_running_average=None):
      use_running_average = nn.merge_param('use_running_average', self.use_running_average,
                                           use_running_average)
      feature_axes = nn.normalization._canonicalize_axes(x.ndim, -1)
      reduction_axes = tuple(i for i in range(x.ndim) if i not in feature_axes)
      shape = [x.shape[ax] for ax in feature_axes]
      ra_mean = self.variable('batch_stats', 'mean', lambda s: jnp.zeros(s, jnp.float32), shape)
      ra_var = self.variable('batch_stats', 'var', lambda s: jnp.ones(s, jnp.float32), shape)
      steps = self.variable('batch_stats', 'steps', lambda s: s, 0)
      if use_running_average:
        mean, var = ra_mean.value, ra_var.value
      else:
        batch_mean, batch_var = nn.normalization._compute_stats(x, reduction_axes, dtype=None)
        mean, var = batch_mean, batch_var
        if not self.is_initializing():
          ra_std = jnp.sqrt(ra_var.value + self.epsilon)
          r = jnp.clip(jax.lax.stop_gradient(jnp.sqrt(batch_var + self.epsilon) / ra_std), 1 / 3, 3)
          d = jnp.clip(jax.lax.stop_gradient((batch_mean - ra_mean.value) / ra_std), -5, 5)
          warm = jnp.greater_equal(steps.value, self.warmup_steps).astype(jnp.float32)
          mean = warm * (batch_mean - d * jnp.sqrt(batch_var) / r) + (1 - warm) * batch_mean
          var = warm * (batch_var / r ** 2) + (1 - warm) * batch_var
          ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * batch_mean
          ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * batch_var
          steps.value += 1
      return nn.normalization._normalize(
          self, x, mean, var, reduction_axes, feature_axes, None, jnp.float32, self.epsilon,
          True, True, nn.initializers.zeros, nn.initializers.ones)

  class Critic(nn.Module):
    @nn.compact
    def __call__(self, x, train):
      x = BatchRenorm(use_running_average=not train)(x)
      return nn.Dense(1)(nn.relu(nn.Dense(4)(x)))

  Ensemble = nn.vmap(Critic, variable_axes={'params': 0, 'batch_stats': 0},
                     split_rngs={'params': True}, in_axes=None, axis_size=2)
  x = jnp.linspace(-1, 2, 12).reshape(4, 3)
  variables = Ensemble().init(KEY, x, False)
  outputs = []
  for step in (1, 2):
    y, updates = Ensemble().apply(variables, step * x, True, mutable=['batch_stats'])
    variables = {**variables, **updates}
    outputs.append(y)
  return variables, outputs, Ensemble().apply(variables, x, False)


def test_normalization_helpers_in_a_vmapped_batch_renorm_as_flax():
  variables, outputs, _ = check_linen_parity(batch_renorm_ensemble)[0]
  stats = variables['batch_stats']['BatchRenorm_0']
  assert stats['steps'].tolist() == [2, 2] and stats['mean'].shape == (2, 3)
  assert outputs[0].shape == (2, 4, 1)
