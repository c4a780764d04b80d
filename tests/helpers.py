"""Helpers shared by the tests: tree comparison, the Flax parity harness, a small model zoo.

Two differently compiled programs (a loop body and its unrolled copy, jit and eager)
round differently, so their results are compared with a tolerance that follows from
the dtype and the depth of the computation (`tolerance`), not with a fixed number.
The same program run by two libraries (ours and Flax's) is compared bit for bit
(`assert_trees_equal`) wherever both issue the same operations.
"""
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

import linen_ext

# Rounding error a layer may add, in units of its dtype's epsilon: a matmul, a mean
# and a normalisation each round a few times, and dividing by a standard deviation
# amplifies what came before.
ULPS_PER_LAYER = 32


def tolerance(dtype, depth: int) -> float:
  """Relative and absolute tolerance for results of ``depth`` layers computed in ``dtype``."""
  return ULPS_PER_LAYER * depth * float(np.finfo(dtype).eps)


def plain(tree):
  """FrozenDicts as dicts, all the way down (axis-metadata boxes are kept)."""
  if hasattr(tree, 'unfreeze'):
    tree = tree.unfreeze()
  if isinstance(tree, dict):
    return {k: plain(v) for k, v in tree.items()}
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


def run_in_child(call: str, timeout: int = 300) -> subprocess.CompletedProcess:
  """Runs ``import tests.<module> as t; t.<fn>()`` on 8 simulated CPU devices.

  JAX fixes the device count when it starts, so multi-device checks run in a child
  started with ``--xla_force_host_platform_device_count=8``. ``call`` is
  ``'<dotted module under tests>.<fn>'``, e.g. ``'lift.test_shard_map_multidevice.run'``.
  """
  module, fn = call.rsplit('.', 1)
  root = pathlib.Path(__file__).resolve().parents[1]
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=8',
         'JAX_PLATFORMS': 'cpu'}
  code = f'import tests.{module} as t; t.{fn}()'
  return subprocess.run([sys.executable, '-c', code], cwd=root, env=env,
                        capture_output=True, text=True, timeout=timeout)
