"""A custom lifted transform written with `lift.pack`: transpose every 2-D param.

This is the `pack` example of the lifting design note, run against `lift`:
variables matched by `target` are transposed on the way in, everything else
passes through, and every mutable collection is returned unchanged in layout.
"""
import jax
import jax.numpy as jnp

import lift


def dense(scope, x, features):
  kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  bias = scope.param('bias', jax.nn.initializers.zeros, (features,))
  return x @ kernel + bias[None]


def lift_transpose(fn, target='params', variables=True, rngs=True):
  """Runs ``fn`` with every 2-D variable of ``target`` transposed."""
  def wrapper(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    target, rest = variable_groups
    target = jax.tree_util.tree_map(lambda x: x.T if x.ndim == 2 else x, target)
    scope = scope_fn((target, rest), rng_groups)
    y = fn(scope, *args)
    return y, repack_fn(scope)

  return lift.pack(wrapper, in_variable_filters=(target, variables),
                   out_variable_filters=(variables,), rng_filters=(rngs,))


def main():
  x = jnp.ones((3, 2))
  y, variables = lift.init(lift_transpose(dense))(jax.random.key(0), x, 4)
  print('created:', jax.tree_util.tree_map(jnp.shape, variables))
  stored = {'params': {'kernel': variables['params']['kernel'].T, 'bias': variables['params']['bias']}}
  y_again = lift.apply(lift_transpose(dense))(stored, x, 4)
  print('stored (transposed) kernel:', stored['params']['kernel'].shape,
        '| same output:', bool(jnp.allclose(y, y_again)))


if __name__ == '__main__':
  main()
