"""A custom lifted transform written with `lift.pack`: transpose every 2-D param.

This is the `pack` example of the lifting design note, run against `lift`:
variables matched by `target` are transposed on the way in, everything else
passes through.

The rule it shows: what `fn` creates inside a `pack` transform is returned
(by ``repack_fn``) in the view `fn` saw. `lift_transpose`, as the design note
writes it, transposes only on the way in, so the kernel `init` creates comes
back in the transformed view and its own `apply` would transpose it again.
`lift_transpose_both_ways` maps the returned groups back as well, so that
`init` stores what `apply` reads; `lift.map_variables(..., init=True)` is the
ready-made form of that pattern.

Run: python examples/lift_transpose.py
"""
import jax
import jax.numpy as jnp

import lift


def dense(scope, x, features):
  kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  bias = scope.param('bias', jax.nn.initializers.zeros, (features,))
  return x @ kernel + bias[None]


def transpose_2d(tree):
  return jax.tree_util.tree_map(lambda x: x.T if x.ndim == 2 else x, tree)


def lift_transpose(fn, target='params', variables=True, rngs=True):
  """Runs ``fn`` with every 2-D variable of ``target`` transposed (on the way in only)."""
  def wrapper(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    target, rest = variable_groups
    scope = scope_fn((transpose_2d(target), rest), rng_groups)
    y = fn(scope, *args)
    return y, repack_fn(scope)

  return lift.pack(wrapper, in_variable_filters=(target, variables),
                   out_variable_filters=(variables,), rng_filters=(rngs,))


def lift_transpose_both_ways(fn, target='params', variables=True, rngs=True):
  """As `lift_transpose`, and what ``fn`` creates in ``target`` is stored transposed back."""
  def wrapper(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    target_in, rest = variable_groups
    scope = scope_fn((transpose_2d(target_in), rest), rng_groups)
    y = fn(scope, *args)
    target_out, rest_out = repack_fn(scope)
    return y, (transpose_2d(target_out), rest_out)

  return lift.pack(wrapper, in_variable_filters=(target, variables),
                   out_variable_filters=(target, variables), rng_filters=(rngs,))


def main():
  x = jnp.ones((3, 2))
  y, created = lift.init(lift_transpose(dense))(jax.random.key(0), x, 4)
  print('one way, init stores the kernel as dense created it:',
        created['params']['kernel'].shape)
  stored = {'params': transpose_2d(created['params'])}  # what its apply reads
  same = bool(jnp.allclose(lift.apply(lift_transpose(dense))(stored, x, 4), y))
  print('one way, apply on the kernel transposed by hand gives the same output:', same)

  both_ways = lift_transpose_both_ways(dense)
  y, stored = lift.init(both_ways)(jax.random.key(0), x, 4)
  round_trip = bool(jnp.allclose(lift.apply(both_ways)(stored, x, 4), y))
  print('both ways, init stores the transposed kernel', stored['params']['kernel'].shape,
        'and apply(init) gives the same output:', round_trip)
  return same and round_trip


if __name__ == '__main__':
  assert main()
