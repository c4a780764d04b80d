"""Small loops shared by the scan-rewrite tests, and the checks they run."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import lift
from lift.scan_rewrites import REWRITES
from tests.helpers import tolerance

ALL = list(REWRITES)
B, I, H, T = 2, 3, 4, 6
_keys = jax.random.split(jax.random.key(0), 5)
W_X = jax.random.normal(_keys[0], (I, H))
W_H = jax.random.normal(_keys[1], (H, H)) * 0.5
W_O = jax.random.normal(_keys[2], (H, I))
XS = jax.random.normal(_keys[3], (T, B, I))


def rnn(w_x, w_h, w_o, xs):
  """An RNN language-model step: input projection, recurrence, output projection."""
  def step(h, x):
    h = jnp.tanh(x @ w_x + h @ w_h)
    return h, h @ w_o
  h, ys = lax.scan(step, jnp.zeros((xs.shape[1], w_h.shape[0]), xs.dtype), xs)
  return ys, h


RNN_ARGS = (W_X, W_H, W_O, XS)


def loss(fn):
  return lambda *args: sum(jnp.sum(jnp.sin(y)) for y in jax.tree.leaves(fn(*args)))


def check_same(fn, args, rewrites=ALL, depth=8, grad=True):
  """`optimize_scans(fn)` gives `fn`'s values (and gradients w.r.t. float arguments)."""
  fast = lift.optimize_scans(fn, rewrites=rewrites)
  _close(fast(*args), fn(*args), depth)
  floats = tuple(i for i, a in enumerate(args) if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating))
  if grad and floats:
    _close(jax.grad(loss(fast), floats)(*args), jax.grad(loss(fn), floats)(*args), depth)


def _close(a, b, depth):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, y.shape, x.dtype, y.dtype)
    tol = tolerance(x.dtype, depth) if jnp.issubdtype(x.dtype, jnp.floating) else 0
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                               rtol=tol, atol=tol)


def scans(jaxpr) -> list:
  """The scan equations of `jaxpr` and of the jaxprs nested in it."""
  from lift import _compat
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'scan':
      found.append(eqn)
    for sub in _compat.subjaxprs(eqn):
      found += scans(sub)
  return found


def body_primitives(eqn) -> list[str]:
  """The primitives of a scan's body (nested jaxprs included)."""
  from lift import _compat
  def walk(jaxpr):
    out = []
    for e in jaxpr.eqns:
      out.append(e.primitive.name)
      for sub in _compat.subjaxprs(e):
        out += walk(sub)
    return out
  return walk(eqn.params['jaxpr'].jaxpr)


def optimized_scans(fn, *args, rewrites=ALL):
  report = lift.explain_scans(fn, *args, rewrites=rewrites)
  return scans(report.after.jaxpr), report
