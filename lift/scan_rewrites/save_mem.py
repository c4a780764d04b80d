"""`save_mem`: keep only the steps of a stacked output that are read.

If every reader of a stacked output ``ys`` (length T) is a static slice along
the steps, together reading steps ``[lo, hi)`` with ``hi - lo < T``, the loop
carries a buffer ``b`` of ``hi - lo`` steps instead, written at step t when
``lo <= t < hi``: ``b[t - lo] = y_t``. Then ``ys[a:z] = b[a - lo:z - lo]``.
Read only at its last step, the output becomes one carried value.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from lift.scan_rewrites import program
from lift.scan_rewrites.loop import Loop, is_scan
from lift.scan_rewrites.passes import outer_of
from lift.scan_rewrites.registry import rewrite

NAME = 'save_mem'


@dataclasses.dataclass(frozen=True)
class Window:
  """Steps ``[start, start + len(buffer))`` of a stacked output, all that is read of it."""
  buffer: object
  start: int


def _window(var, outer, eqns) -> tuple[int, int] | None:
  """The steps read of stacked output `var`, if static slices are its only readers."""
  readers = outer.readers.get(var, [])
  if not readers or any(i >= len(eqns) for i in readers):
    return None
  starts, limits = [], []
  for i in readers:
    eqn = eqns[i]
    strides = eqn.params.get('strides')
    if eqn.primitive.name != 'slice' or (strides and any(s != 1 for s in strides)):
      return None
    starts.append(eqn.params['start_indices'][0])
    limits.append(eqn.params['limit_indices'][0])
  return min(starts), max(limits)


def _slice_step(eqn) -> program.Step:
  def run(window):
    start = list(eqn.params['start_indices'])
    limit = list(eqn.params['limit_indices'])
    start[0] -= window.start
    limit[0] -= window.start
    return [lax.slice(window.buffer, start, limit)]
  return program.Step(eqn.invars, eqn.outvars, run, eqn)


def _loop_step(loop: Loop, windows: dict) -> program.Step:
  """The loop with stacked outputs ``j`` (keys of `windows`) kept as carried buffers."""
  body = loop.body.jaxpr
  n_carry = loop.counts[1]

  def run(*invals):
    c_vals, init, x_vals = loop.split_inputs(invals)
    ys_avals = [v.aval for v in loop.split_outputs(body.outvars)[1]]
    buffers = [jnp.zeros((hi - lo, *ys_avals[j].shape), ys_avals[j].dtype)
               for j, (lo, hi) in windows.items()]

    def step(carry, x):
      outs = program.evaluate(loop.body, [*c_vals, *carry[:n_carry], *x[:-1]])
      carry_out, ys = loop.split_outputs(outs)
      t = x[-1]
      new = [_write(buf, ys[j], t, lo, hi) for buf, (j, (lo, hi)) in zip(carry[n_carry:], windows.items())]
      return carry_out + new, [y for j, y in enumerate(ys) if j not in windows]
    final, ys = loop.scan(step, [*init, *buffers], [*x_vals, jnp.arange(loop.length)])
    kept, bufs = iter(ys), iter(final[n_carry:])
    starts = {j: lo for j, (lo, _) in windows.items()}
    stacked = [Window(next(bufs), starts[j]) if j in windows else next(kept)
               for j in range(len(ys_avals))]
    return final[:n_carry] + stacked
  return program.Step(loop.eqn.invars, loop.eqn.outvars, run, loop.eqn)


def _write(buffer, y, t, lo, hi):
  inside = (t >= lo) & (t < hi)
  written = lax.dynamic_update_index_in_dim(buffer, y.astype(buffer.dtype), jnp.clip(t - lo, 0, hi - lo - 1), 0)
  return jnp.where(inside, written, buffer)


@rewrite(NAME)
def save_mem(closed, ctx):
  outer = outer_of(closed)
  eqns = closed.jaxpr.eqns
  steps, changed = [program.equation_step(e) for e in eqns], False
  for i, eqn in enumerate(eqns):
    if not is_scan(eqn) or eqn.params['length'] < 2:
      continue
    loop = Loop(eqn)
    windows = {}
    for j, var in enumerate(loop.split_outputs(eqn.outvars)[1]):
      window = _window(var, outer, eqns)
      if window is not None and window[1] - window[0] < loop.length:
        windows[j] = window
        ctx.record(NAME, loop, True, f'{ctx.describe(loop, "output", j)} keeps only steps '
                   f'[{window[0]}, {window[1]}) of {loop.length}, all that is read of it')
    if windows:
      changed = True
      steps[i] = _loop_step(loop, windows)
      for j in windows:
        for r in outer.readers[loop.split_outputs(eqn.outvars)[1][j]]:
          steps[r] = _slice_step(eqns[r])
  return program.retrace(closed, steps) if changed else None
