"""FLOPs of a program from its jaxpr, loops counted as many times as they run.

XLA's cost analysis counts a loop's body once, however many times it runs: for a
layer stack compiled as one loop it reports about one layer's work. The jaxpr of a
training step holds the whole step (the backward pass, and the forward work a
checkpoint policy recomputes inside it), with every loop's trip count: its products,
summed with their multiplicities, are the FLOPs the step performs.
"""
from __future__ import annotations

import math
from typing import Any

from jax.extend import core

# Sub-jaxprs run once per call (`cond` runs one branch: the costliest is counted).
_CALL_PARAMS = ('jaxpr', 'call_jaxpr', 'fun_jaxpr')


def _jaxpr_of(value: Any) -> core.Jaxpr | None:
  if isinstance(value, core.ClosedJaxpr):
    return value.jaxpr
  return value if isinstance(value, core.Jaxpr) else None


def _dot_flops(eqn: core.JaxprEqn) -> int:
  (contracting, _), _ = eqn.params['dimension_numbers']
  lhs = eqn.invars[0].aval.shape  # type: ignore[attr-defined]
  out = eqn.outvars[0].aval.shape  # type: ignore[attr-defined]
  return 2 * math.prod(out) * math.prod(lhs[d] for d in contracting)


def _manual_devices(eqn: core.JaxprEqn) -> int:
  """How many shards a `shard_map` body runs on (its shapes are one shard's)."""
  mesh, axes = eqn.params.get('mesh'), eqn.params.get('manual_axes', ())
  return math.prod(mesh.shape[a] for a in axes) if mesh is not None else 1


def jaxpr_flops(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> int:
  """Floating-point operations of matrix products (``dot_general``) and Pallas kernels
  (their declared cost) in ``jaxpr``: ``scan`` bodies times their length, ``cond`` its
  costliest branch, ``shard_map`` bodies times their shards. Elementwise work is left
  out (on accelerators the products dominate); a ``while`` loop, whose trip count is
  not known, counts once."""
  open_jaxpr = _jaxpr_of(jaxpr)
  assert open_jaxpr is not None
  total = 0
  for eqn in open_jaxpr.eqns:
    name = eqn.primitive.name
    if name == 'dot_general':
      total += _dot_flops(eqn)
    elif name == 'pallas_call':
      cost = eqn.params.get('cost_estimate')
      total += cost.flops if cost is not None else 0
    elif name == 'scan':
      total += eqn.params['length'] * jaxpr_flops(eqn.params['jaxpr'])
    elif name == 'cond':
      total += max(jaxpr_flops(branch) for branch in eqn.params['branches'])
    elif name == 'while':
      total += jaxpr_flops(eqn.params['body_jaxpr']) + jaxpr_flops(eqn.params['cond_jaxpr'])
    else:
      inner = [_jaxpr_of(eqn.params[p]) for p in _CALL_PARAMS if p in eqn.params]
      times = _manual_devices(eqn) if name == 'shard_map' else 1
      total += times * sum(jaxpr_flops(j) for j in inner if j is not None)
  return total


__all__ = ['jaxpr_flops']
