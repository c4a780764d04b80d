"""`optimize_scans` and `explain_scans`: the rewrites as a function transformation."""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable, Sequence

import jax

from lift import _compat
from lift.errors import ScanRewriteError
from lift.scan_rewrites import program
from lift.scan_rewrites.names import Level, Naming, top_level
from lift.scan_rewrites.passes import optimize_jaxpr
from lift.scan_rewrites.registry import REWRITES, Context
from lift.scan_rewrites.report import ScanReport


def _selected(rewrites) -> tuple[tuple[str, ...], bool]:
  """(rewrite names, whether the cost model decides) for the `rewrites` argument."""
  known = ', '.join(REWRITES)
  if rewrites is None:
    return tuple(REWRITES), True
  if isinstance(rewrites, str) or not all(isinstance(r, str) for r in rewrites):
    raise ScanRewriteError(
        f'optimize_scans: `rewrites` must be None or a sequence of rewrite names, got '
        f'{rewrites!r}. Known rewrites: {known}. Fix: rewrites=[{rewrites!r}] for one rewrite.')
  unknown = [r for r in rewrites if r not in REWRITES]
  if unknown:
    raise ScanRewriteError(
        f'optimize_scans: unknown rewrite(s) {", ".join(map(repr, unknown))} in `rewrites`. '
        f'Known rewrites: {known}. Fix: name only those, or pass rewrites=None to let the cost '
        'model choose.')
  return tuple(rewrites), False


def check_optimize(optimize: Any, where: str = 'scan') -> None:
  """Validates a module-level ``optimize=`` (False, True or rewrite names) when a loop is built."""
  if isinstance(optimize, bool):
    return
  try:
    _selected(optimize)
  except (ScanRewriteError, TypeError):
    raise ScanRewriteError(
        f'{where}: `optimize` must be False, True (the cost model decides) or a sequence of '
        f'rewrite names, got {optimize!r}. Known rewrites: {", ".join(REWRITES)}. '
        'Fix: optimize=True, or name only known rewrites.') from None


def _trace(fn, args, kwargs):
  leaves, in_tree = jax.tree.flatten((args, kwargs))
  out_tree = []

  def flat(*xs):
    a, k = jax.tree.unflatten(in_tree, xs)
    outs, tree = jax.tree.flatten(fn(*a, **k))
    out_tree.append(tree)
    return outs
  return jax.make_jaxpr(flat)(*leaves), leaves, out_tree[0]


def _optimized(closed, leaves, names, cost_model, top: Level | None = None):
  """(`closed` rewritten, the context holding the decisions and the loops seen)."""
  differentiated = (any(_compat.is_differentiated(x) for x in [*leaves, *closed.consts])
                    or has_backward_pass(closed.jaxpr))
  ctx = Context(cost_model, differentiated, naming=Naming(top))
  return optimize_jaxpr(closed, names, ctx), ctx


def optimize_scans(fn: Callable, *, rewrites: Sequence[str] | None = None) -> Callable:
  """Rewrites the `lax.scan` loops of `fn` to run faster or in less memory.

  Returns a function with `fn`'s signature and values. At each call it traces
  `fn` to a jaxpr, rewrites every scan in it (also those inside `jit`, `remat`,
  `cond`, other scans, and the backward loops of a differentiated function)
  and evaluates the result, so it composes with `jax.jit`, `jax.grad` and
  `jax.vmap` both ways. Rewritten before differentiation
  (`grad(optimize_scans(f))`), the backward loops inherit the rewritten forward
  ones; a whole training step (`optimize_scans(value_and_grad(f))`) also has
  its backward loop's weight-gradient sums moved out.

  The rewrites, named after Aesara's: ``remove_unused_inputs``,
  ``merge_inouts``, ``push_out_non_seq``, ``push_out_seq``,
  ``push_out_scan_output``, ``push_out_dot1``, ``save_mem``, ``merge``.
  Equations with effects and random draws are never moved, batched or dropped.

  Args:
    fn: any function of arrays (pytrees) that JAX can trace.
    rewrites: None (the default) runs every rewrite where a cost model says it
      pays: batching a matrix product over the steps only where each step
      multiplies a few rows, in a training program (the call is
      differentiated, or it contains a backward pass). A sequence of names
      applies exactly those rewrites wherever they are legal, paying or not.

  Returns:
    The rewritten function.

  Raises:
    ScanRewriteError: `rewrites` names an unknown rewrite.

  Examples:
    >>> def rnn(w_x, w_h, xs):
    ...   def step(h, x):
    ...     h = jnp.tanh(x @ w_x + h @ w_h)
    ...     return h, h
    ...   return jax.lax.scan(step, jnp.zeros((2, 8)), xs)[1]
    >>> args = (jnp.ones((4, 8)), jnp.eye(8), jnp.ones((16, 2, 4)))
    >>> fast = jax.jit(lift.optimize_scans(rnn))
    >>> bool(jnp.allclose(fast(*args), rnn(*args), atol=1e-6))
    True

  Do not use it where the jaxpr of `fn` is unavailable (functions taking
  Python values that control tracing: close over them instead), or expect
  it to help a loop whose steps already multiply large matrices.
  """
  names, cost_model = _selected(rewrites)

  @functools.wraps(fn)
  def optimized(*args, **kwargs):
    closed, leaves, out_tree = _trace(fn, args, kwargs)
    optimized_jaxpr, _ = _optimized(closed, leaves, names, cost_model)
    return jax.tree.unflatten(out_tree, program.evaluate(optimized_jaxpr, leaves))
  return optimized


def explain_scans(fn: Callable, *args, rewrites: Sequence[str] | None = None, **kwargs) -> ScanReport:
  """Reports what `optimize_scans(fn, rewrites=rewrites)` does to ``fn(*args, **kwargs)``.

  The report lists every loop of the program by the function and line that
  wrote it and by its role: forward, the backward loop of a forward one (JAX
  derives it by transposing; nested remat writes its own), or a forward loop
  that the backward pass runs again; nested or not. It names values by what
  they hold: an argument's pytree path (``variables/params/cell/ii/kernel``),
  the gradient of one (a backward loop's carry whose final value is that
  gradient, found by matching output paths to input paths), or a loop's own
  state; and other moved work by the code that traced it (an expression of
  the user's code, with its function and line) or, for work no code wrote,
  by what it does (the rounding `jax.checkpoint` puts on a value it saves).

  Examples:
    >>> def total(xs):
    ...   return jax.lax.scan(lambda c, x: (c + x, c), 0.0, xs)[0]
    >>> report = lift.explain_scans(total, jnp.ones(5))
    >>> report.loops('before'), report.applied
    (1, ('remove_unused_inputs',))
    >>> print(report.decisions[0].detail)
    dropped what nothing reads: output 0 f32[5]

  Do not use it to time the rewrites: it only traces.
  """
  names, cost_model = _selected(rewrites)
  closed, leaves, out_tree = _trace(fn, args, kwargs)
  top = top_level(fn, args, kwargs, closed, out_tree)
  after, ctx = _optimized(closed, leaves, names, cost_model, top)
  return ScanReport(tuple(ctx.decisions), closed, after, tuple(ctx.naming.loops))


def has_backward_pass(jaxpr) -> bool:
  """Whether `jaxpr` (or one nested in it) sums cotangents: `add_any` is what
  JAX's transposition emits, so a program with it contains a backward pass."""
  return any(eqn.primitive.name == 'add_any' or any(has_backward_pass(sub) for sub in _compat.subjaxprs(eqn))
             for eqn in jaxpr.eqns)
