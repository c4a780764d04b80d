"""Helpers shared by the tests: tree comparison, the Flax parity harness, a small model zoo.

Two differently compiled programs (a loop body and its unrolled copy, jit and eager)
round differently, so their results are compared with a tolerance that follows from
the dtype and the depth of the computation (`tolerance`), not with a fixed number.
The same program run by two libraries (ours and Flax's) is compared bit for bit
(`assert_trees_equal`) wherever both issue the same operations.
"""
import math
import os
import pathlib
import subprocess
import sys

import flax
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import meta
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

import lift
import linen_ext

# Rounding error a layer may add, in units of its dtype's epsilon: a matmul, a mean
# and a normalisation each round a few times, and dividing by a standard deviation
# amplifies what came before.
ULPS_PER_LAYER = 32


def tolerance(dtype, depth: int) -> float:
  """Relative and absolute tolerance for results of ``depth`` layers computed in ``dtype``."""
  return ULPS_PER_LAYER * depth * float(jnp.finfo(dtype).eps)


def plain(tree):
  """FrozenDicts as dicts, all the way down (axis-metadata boxes are kept)."""
  if hasattr(tree, 'unfreeze'):
    tree = tree.unfreeze()
  if isinstance(tree, dict):
    return {k: plain(v) for k, v in tree.items()}
  if isinstance(tree, tuple) and hasattr(tree, '_fields'):  # a named tuple (optax states)
    return type(tree)(*(plain(v) for v in tree))
  if isinstance(tree, (tuple, list)):
    return type(tree)(plain(v) for v in tree)
  return tree


def box_names(tree):
  """The axis-metadata boxes of ``tree`` as (class name, axis names), in leaf order."""
  boxes = [b for b in jax.tree.leaves(tree, is_leaf=meta.is_axis_metadata)
           if meta.is_axis_metadata(b)]
  return [(type(b).__name__, getattr(b, 'names', None)) for b in boxes]


def _leaf_pairs(a, b):
  a, b = plain(a), plain(b)
  assert box_names(a) == box_names(b)
  assert jax.tree.structure(a) == jax.tree.structure(b), (
      f'{jax.tree.structure(a)}\n!=\n{jax.tree.structure(b)}')
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    yield jax.tree_util.keystr(path), x, y


def _array(x):
  if hasattr(x, 'dtype') and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    return np.asarray(jax.random.key_data(x))
  return np.asarray(x)


def _is_array_like(x):
  return hasattr(x, 'shape') or isinstance(x, (bool, int, float, complex))


def assert_trees_equal(a, b) -> None:
  """Same structure, boxes, shapes and dtypes, and equal leaves (keys by their data)."""
  assert_trees_close(a, b, depth=0)


def assert_trees_close(a, b, depth: int = 4) -> None:
  """Same structure, boxes, shapes and dtypes; inexact leaves within `tolerance(dtype, depth)`
  (``depth=0``: equal), the others equal."""
  for where, x, y in _leaf_pairs(a, b):
    if not (_is_array_like(x) and _is_array_like(y)):
      assert x == y, where
      continue
    x, y = _array(x), _array(y)
    assert (x.shape, x.dtype) == (y.shape, y.dtype), where
    if np.issubdtype(x.dtype, np.inexact):
      tol = tolerance(x.dtype, depth)
      np.testing.assert_allclose(x, y, rtol=tol, atol=tol, err_msg=where)
    else:
      np.testing.assert_array_equal(x, y, err_msg=where)


# -- The Flax parity harness ------------------------------------------------------------


def check_linen_parity(build, depth: int | None = None):
  """``build(nn)`` gives the same result with ``nn = linen_ext`` and ``nn = flax.linen``.

  Bitwise by default; ``depth`` compares within `tolerance` instead (for programs the
  two libraries compile differently). Returns (ours, Flax's).
  """
  ours, theirs = build(linen_ext), build(flax_nn)
  if depth is None:
    assert_trees_equal(ours, theirs)
  else:
    assert_trees_close(ours, theirs, depth)
  return ours, theirs


def check_both_raise(build, our_error, flax_error=Exception):
  """Both libraries refuse ``build(nn)``: ours with ``our_error``, Flax with ``flax_error``.

  Returns (our exception, Flax's exception) for checks of the messages.
  """
  with pytest.raises(flax_error) as theirs:
    build(flax_nn)
  with pytest.raises(our_error) as ours:
    build(linen_ext)
  return ours.value, theirs.value


def unfreeze(tree):
  return flax.core.unfreeze(tree)


# -- A small model zoo of scope functions -----------------------------------------------


def dense(scope, x, features):
  kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  bias = scope.param('bias', jax.nn.initializers.normal(), (features,))
  y = x @ kernel
  return y + bias.reshape((1,) * (y.ndim - 1) + (-1,))


def mlp(scope, x, hidden=4, out=2):
  h = jax.nn.relu(scope.child(dense, 'hidden')(x, hidden))
  h = jax.nn.relu(scope.push('mid').child(dense)(h, hidden))
  return scope.child(dense, 'out')(h, out)


def counter(scope, x):
  """Increments a counter in the 'counter' collection and returns x unchanged."""
  count = scope.variable('counter', 'count', lambda: jnp.zeros((), jnp.int32))
  count.value = count.value + 1
  return x


# -- Multi-device checks -----------------------------------------------------------------


def child_xla_flags(devices: int) -> str:
  """``XLA_FLAGS`` for a child on ``devices`` simulated CPU devices, compiled without LLVM's
  optimisation unless the caller's flags set a level.

  A child checks layouts, collectives and values against programs it compiles alike (one
  device, or the same job on another mesh), so the optimisation level moves no comparison;
  compiling at -O0 takes a third less of the children's time.
  """
  flags = os.environ.get('XLA_FLAGS', '')
  if 'xla_backend_optimization_level' not in flags:
    flags += ' --xla_backend_optimization_level=0'
  return f'{flags} --xla_force_host_platform_device_count={devices}'


def run_in_child(call: str, timeout: int = 300) -> subprocess.CompletedProcess:
  """Runs ``import tests.<module> as t; t.<fn>()`` on 8 simulated CPU devices.

  JAX fixes the device count when it starts, so multi-device checks run in a child
  started with ``--xla_force_host_platform_device_count=8`` (see `child_xla_flags`).
  ``call`` is ``'<dotted module under tests>.<fn>'``, e.g.
  ``'lift.test_shard_map_multidevice.run'``.
  """
  module, fn = call.rsplit('.', 1)
  root = pathlib.Path(__file__).resolve().parents[1]
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': child_xla_flags(8)}
  code = f'import tests.{module} as t; t.{fn}()'
  return subprocess.run([sys.executable, '-c', code], cwd=root, env=env,
                        capture_output=True, text=True, timeout=timeout)


# -- Property tests ----------------------------------------------------------------------
#
# Compiling is what a property test spends its time on, so each draws few, tiny examples.
# The default profile is derandomized (CI runs the same examples every time);
# ``LIFT_PROPERTIES=explore`` draws fresh examples, twenty times as many.

settings.register_profile('lift-ci', deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow],
                          phases=[Phase.explicit, Phase.generate])  # a shrink costs minutes
settings.register_profile('lift-explore', deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow])
_PROFILE = os.environ.get('LIFT_PROPERTIES', 'ci')
_EXAMPLE_SCALE = {'ci': 1, 'explore': 20}[_PROFILE]


def property_settings(max_examples: int) -> settings:
  """The settings of one property: ``max_examples`` examples (scaled by the profile)."""
  return settings(settings.get_profile(f'lift-{_PROFILE}'),
                  max_examples=max_examples * _EXAMPLE_SCALE)


SIZES = st.integers(min_value=1, max_value=4)
"""A dimension: sizes 1 to 4 (1 catches axes confused with a broadcast dimension)."""


def axes(*extra):
  """An axis of a mapped array, counted from either end, or one of ``extra`` (None, ...)."""
  return st.sampled_from([0, 1, -1, *extra])


def grid(shape, offset=0.0):
  """A deterministic array of ``shape`` with distinct entries in [-1 + offset, 1 - offset]."""
  size = math.prod(shape)
  return np.linspace(-1.0 + offset, 1.0 - offset, size, dtype=np.float32).reshape(shape)


def insert_axis(shape, axis, size):
  """``shape`` with ``size`` inserted at ``axis`` (counted in the result); as it is for None."""
  if axis is None:
    return tuple(shape)
  shape = list(shape)
  shape.insert(axis % (len(shape) + 1), size)
  return tuple(shape)


def check_split(stacked, axis, split, n):
  """Items 0 and 1 along ``axis`` of what a split stream drew differ; an unsplit one's are equal."""
  if n > 1:
    leaves = [np.asarray(a) for a in jax.tree.leaves(stacked)]
    same = all(np.array_equal(np.take(a, 0, axis), np.take(a, 1, axis)) for a in leaves)
    assert same != split, f'split={split}, yet items 0 and 1 are {"equal" if same else "different"}'


# A property compiles one small program per example, and XLA's CPU backend spends most of
# that compile optimising machine code that then runs for microseconds.
# The same goes for the heavier checks that compile a program, run it once and compare it
# within a tolerance. Not for bitwise comparisons of two programs (ours and Flax's): without
# LLVM's optimisation, their results may differ in the last bit.
CHEAP_COMPILE = {'xla_backend_optimization_level': 0, 'xla_llvm_disable_expensive_passes': True}


def cheap_jit(fn, **jit_kwargs):
  """``jax.jit(fn, **jit_kwargs)`` optimised little: for a program that runs once or twice
  and is compared within a tolerance."""
  return jax.jit(fn, compiler_options=CHEAP_COMPILE, **jit_kwargs)


def run_compiled(fn, *args):
  """``fn(*args)`` as one compiled program, optimised little (it runs once)."""
  return cheap_jit(fn)(*args)


def key_uniform(key, shape=(), dtype=jnp.float32):
  """Values in [-1, 1) of ``shape`` made from the bits of ``key``.

  An initializer, and a stand-in for `jax.random`'s samplers in properties: each value
  depends on which key was drawn, and it compiles to a few integer operations instead of
  a second Threefry hash.
  """
  words = jax.random.key_data(key).reshape(-1)
  bits = words[0] ^ (words[-1] * jnp.uint32(0x9E3779B1))  # every word of the key counts
  unit = (bits >> 9).astype(dtype) * (2.0 ** -23)  # 23 random bits in [0, 1)
  pattern = jnp.linspace(0.0, 1.0, math.prod(shape), endpoint=False, dtype=dtype).reshape(shape)
  return jnp.mod(unit + pattern, 1.0) * 2.0 - 1.0


ACTIVATIONS = {'tanh': jnp.tanh, 'relu': jax.nn.relu, 'sin': jnp.sin, 'identity': lambda h: h}
POLICIES = {None: None, 'nothing': jax.checkpoint_policies.nothing_saveable,
            'everything': jax.checkpoint_policies.everything_saveable,
            'dots': jax.checkpoint_policies.dots_saveable,
            'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def _on_floats(fn):
  return lambda tree: jax.tree.map(
      lambda a: fn(a) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


MAPS = {  # name: (map_in, map_out) of map_variables, with map_in(map_out(v)) == v exactly
    'transpose': (_on_floats(lambda a: a.T), _on_floats(lambda a: a.T)),
    'double': (_on_floats(lambda a: 2.0 * a), _on_floats(lambda a: 0.5 * a)),
    'negate': (_on_floats(jnp.negative), _on_floats(jnp.negative)),
    'identity': (lambda c: c, lambda c: c),
}


def sum_of_squares(tree):
  """A scalar loss of every floating leaf of ``tree``."""
  return sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree)
             if jnp.issubdtype(a.dtype, jnp.floating))


# Scope functions of the properties: each draws through `key_uniform`.

def layer(scope, x, features):
  """``x @ kernel``, the kernel drawn from the 'params' stream."""
  return x @ scope.param('kernel', key_uniform, (x.shape[-1], features))


def layer_params(key, features_in, features, draws_before=0):
  """The params `layer` creates at the child 'dense' of an untransformed scope, after
  ``draws_before`` draws from the 'params' stream there."""
  def model(scope):
    dense = scope.push('dense')
    for _ in range(draws_before):
      dense.make_rng('params')
    return layer(dense, jnp.zeros((1, features_in)), features)
  return lift.init(model)({'params': key})[1]['params']


def update_stats(scope, h):
  """A step counter and a running total of ``h`` in 'stats'."""
  count = scope.variable('stats', 'count', jnp.zeros, (1,), jnp.int32)
  count.value = count.value + 1
  total = scope.variable('stats', 'total', jnp.zeros, h.shape[-1:])
  total.value = total.value + h.mean(0)


def sow(scope, h):
  """Writes ``h`` to 'intermediates' where that collection is mutable, as Flax's ``sow``."""
  if scope.is_mutable_collection('intermediates'):
    scope.put_variable('intermediates', 'h', h)


def noise(scope, shape):
  """A draw from the 'dropout' stream."""
  return key_uniform(scope.make_rng('dropout'), shape)
