"""Moving body equations in front of their loop (shared by the push-out rewrites)."""
from __future__ import annotations

from collections.abc import Sequence

import jax

from lift.scan_rewrites import program
from lift.scan_rewrites.loop import Loop, split_body


def hoisted(loop: Loop, outside: Sequence[bool], removed: Sequence[bool], *, per_step: bool
            ) -> program.Step | None:
  """The loop with the `outside` body equations computed before it.

  With ``per_step=False`` they read only constants and run once; their results
  become new loop constants. With ``per_step=True`` they read sequences too and
  run batched over all steps (`jax.vmap` over the sequences' leading axis);
  their results become new sequences. None if nothing inside reads them.
  """
  body = loop.body.jaxpr
  out_eqns, in_eqns, cut = split_body(loop, outside, removed)
  if not cut:
    return None
  consts, carries, xs = loop.split_inputs(body.invars)

  def outside_part(c_vals, x_vals):
    env: dict = {}
    program.write(env, body.constvars, loop.body.consts)
    program.write(env, consts, c_vals)
    if per_step:
      program.write(env, xs, x_vals)
    program.run_equations(out_eqns, env)
    return [program.read(env, v) for v in cut]

  def run(*invals):
    c_vals, init, x_vals = loop.split_inputs(invals)
    if per_step:
      extra = jax.vmap(outside_part, in_axes=(None, 0))(c_vals, x_vals)
      seqs = [*x_vals, *extra]
    else:
      extra = outside_part(c_vals, [])
      seqs = x_vals

    def step(carry, x):
      env: dict = {}
      program.write(env, body.constvars, loop.body.consts)
      program.write(env, body.invars, [*c_vals, *carry, *x[:len(xs)]])
      program.write(env, cut, x[len(xs):] if per_step else extra)
      program.run_equations(in_eqns, env)
      return loop.split_outputs([program.read(env, v) for v in body.outvars])
    final, ys = loop.scan(step, init, seqs)
    return final + ys
  return program.Step(loop.eqn.invars, loop.eqn.outvars, run, loop.eqn)
