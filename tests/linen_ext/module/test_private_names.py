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
