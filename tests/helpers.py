"""Helpers shared by the tests.

Two differently compiled programs (a loop body and its unrolled copy, jit and eager)
round differently, so their results are compared with a tolerance that follows from
the dtype and the depth of the computation, not with a fixed number.
"""
import jax
import numpy as np

# Rounding error a layer may add, in units of its dtype's epsilon: a matmul, a mean
# and a normalisation each round a few times, and dividing by a standard deviation
# amplifies what came before.
ULPS_PER_LAYER = 32


def tolerance(dtype, depth: int) -> float:
  """Relative and absolute tolerance for results of ``depth`` layers computed in ``dtype``."""
  return ULPS_PER_LAYER * depth * float(np.finfo(dtype).eps)


def assert_trees_close(a, b, depth: int) -> None:
  """Same tree structure, and every pair of leaves within `tolerance` of its dtype."""
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype, (x.dtype, y.dtype)
    tol = tolerance(x.dtype, depth) if np.issubdtype(x.dtype, np.inexact) else 0
    np.testing.assert_allclose(x, y, rtol=tol, atol=tol)
