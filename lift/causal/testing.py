"""`check_scan`: the test oracle of `as_scan`, for rules and custom steps."""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

import jax
from jax import lax
import numpy as np

from lift.causal.api import as_scan, as_scan_with_prefill


def _assert_close(got: Any, want: Any, rtol: float, atol: float,
                  what: str) -> None:
  got_leaves, got_tree = jax.tree.flatten(got)
  want_leaves, want_tree = jax.tree.flatten(want)
  # jaxlib ships no type stubs: mypy cannot resolve PyTreeDef, nor its ==.
  assert got_tree == want_tree, (  # type: ignore[operator]
      f"{what}: tree {got_tree} != {want_tree}")
  for g, w in zip(got_leaves, want_leaves):
    assert g.shape == w.shape and g.dtype == w.dtype, (
        f"{what}: {g.dtype}{g.shape} != {w.dtype}{w.shape}")
    np.testing.assert_allclose(
        np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=rtol,
        atol=atol, err_msg=what)


def _scan_outputs(g: Callable, xs: Any, prefill: Sequence[int]):
  """`g(xs)`, the scanned step's outputs, and per prefill length its
  `(out_prefill, continuation)`."""
  f, carry = as_scan(g, xs)
  prefilled = []
  for length in prefill:
    head = jax.tree.map(lambda x: x[:length], xs)
    rest = jax.tree.map(lambda x: x[length:], xs)
    f_rest, carry_rest, out = as_scan_with_prefill(g, xs, head)
    prefilled.append((out, lax.scan(f_rest, carry_rest, rest)[1]))
  return g(xs), lax.scan(f, carry, xs)[1], prefilled


def check_scan(g: Callable, xs: Any, *, prefill: Sequence[int] = (),
               rtol: float = 1e-5, atol: float = 1e-5) -> None:
  """Asserts `lax.scan(*as_scan(g, xs), xs)[1] == g(xs)`, and with prefill.

  For each `P` in `prefill`, also asserts that `as_scan_with_prefill` gives
  `g(xs)[:P]` for the prefill and `g(xs)[P:]` for the continuation. Runs
  under one `jax.jit`, so `g` must be jittable.

  >>> import jax.numpy as jnp
  >>> check_scan(lambda xs: jnp.cumsum(xs, 0), jnp.ones((4, 2)), prefill=[2])
  """
  run = jax.jit(_scan_outputs, static_argnums=(0, 2))
  want, got, prefilled = jax.tree.map(np.asarray,
                                      run(g, xs, tuple(prefill)))
  _assert_close(got, want, rtol, atol, "as_scan")
  for length, (out, rest) in zip(prefill, prefilled):
    _assert_close(out, jax.tree.map(lambda y: y[:length], want), rtol, atol,
                  f"prefill {length}: out_prefill")
    _assert_close(rest, jax.tree.map(lambda y: y[length:], want), rtol, atol,
                  f"prefill {length}: continuation")
