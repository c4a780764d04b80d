"""What the at-scale figures are computed from: FLOPs from a jaxpr with every loop's trip
count (checkpointed recomputation included), and the collectives and cross-slice
transfers read from a compiled program's text."""
import jax
import jax.numpy as jnp

from linen_ext.scale.compiled import count_collectives, cross_slice_transfers
from linen_ext.scale.flops import jaxpr_flops

STEP_FLOPS = 2 * 2 * 4 * 4  # one [2, 4] @ [4, 4] product


def stack(weights, x, remat=False):
  def body(carry, w):
    return jnp.tanh(carry @ w), None
  return jax.lax.scan(jax.checkpoint(body) if remat else body, x, weights)[0].sum()


def test_loops_count_as_often_as_they_run_and_recomputation_counts():
  weights, x = jnp.ones((3, 4, 4)), jnp.ones((2, 4))
  assert jaxpr_flops(jax.make_jaxpr(stack)(weights, x)) == 3 * STEP_FLOPS
  # The backward pass: two products per step; with remat, the forward product again.
  plain = jaxpr_flops(jax.make_jaxpr(jax.grad(stack))(weights, x))
  remat = jaxpr_flops(jax.make_jaxpr(jax.grad(lambda w, x: stack(w, x, True)))(weights, x))
  assert plain == 3 * 3 * STEP_FLOPS
  assert remat == plain + 3 * STEP_FLOPS


HLO = '''\
%all-reduce-scatter.1 (p: f32[8]) -> f32[2] {
  %all-reduce.1 = f32[8] all-reduce(%p), replica_groups={{0,1,2,3}}
}

%tick (p: f32[4]) -> f32[4] {
  %send.1 = (f32[4], u32[], token[]) send(%p), _xla_megascale_transfer_type="ONE_TO_ONE"}
  %fusion = f32[4] fusion(%p), kind=kLoop, calls=%inner
}

%inner (p: f32[4]) -> f32[4] {
  %send.2 = (f32[4], u32[], token[]) send(%p), _xla_megascale_transfer_type="ONE_TO_ONE"}
  %all-gather-start.1 = f32[8] all-gather-start(%p), dimensions={0}
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %while.1 = f32[4] while(%p), condition=%cond, body=%tick
  %send.3 = (f32[4], u32[], token[]) send(%p), _xla_megascale_transfer_type="ALL_REDUCE"}
  %all-gather-done.1 = f32[8] all-gather-done(%p)
  %collective-permute.1 = f32[4] collective-permute(%p), source_target_pairs={{0,1}}
}
'''


def test_collectives_and_cross_slice_transfers_are_counted_by_kind_and_place():
  assert count_collectives(HLO) == {'all-gather': 1, 'reduce-scatter': 1,
                                    'collective-permute': 1}
  every, in_loops = cross_slice_transfers(HLO)
  assert every == {'collective-permute': 2, 'all-reduce': 1}
  assert in_loops == {'collective-permute': 2}  # the tick body and what it calls
