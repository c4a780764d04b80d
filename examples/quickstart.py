"""A short tour of `lift`: scopes, init/apply, mutable state, and a custom `pack` transform.

Run: python examples/quickstart.py
"""
import jax
import jax.numpy as jnp

import lift


# 1. A model is a plain function of a Scope. Parameters are created on first use.
def dense(scope, x, features):
  kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  bias = scope.param('bias', jax.nn.initializers.zeros, (features,))
  return x @ kernel + bias[None]


def mlp(scope, x):
  calls = scope.variable('stats', 'calls', lambda: jnp.zeros((), jnp.int32))
  calls.value += 1  # mutable state lives in its own collection
  h = jax.nn.relu(scope.child(dense, 'hidden')(x, 8))
  return scope.child(dense, 'out')(h, 1)


# 2. A custom lifted transform: run `fn` on scaled parameters, pass the rest through.
def lift_scale(fn, factor):
  def transform(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    params, rest = variable_groups
    params = jax.tree_util.tree_map(lambda p: p * factor, params)
    scope = scope_fn((params, rest), rng_groups)
    y = fn(scope, *args)
    return y, repack_fn(scope)

  return lift.pack(transform, in_variable_filters=('params', True),
                   out_variable_filters=(lift.DenyList('params'),), rng_filters=(True,),
                   name='scale')


def main():
  x = jnp.ones((4, 3))
  y, variables = lift.init(mlp)(jax.random.key(0), x)
  print('variables:', jax.tree_util.tree_map(jnp.shape, variables))

  # apply: params are read-only; 'stats' is mutable and comes back updated.
  y, updated = lift.apply(mlp, mutable=['stats'])(variables, x)
  print('calls after one apply:', int(updated['stats']['calls']))

  # The lifted transform sees doubled params; its 'stats' update still lands outside.
  doubled = lambda scope, x: lift_scale(mlp, 2.0)(scope, x)
  y2, updated = lift.apply(doubled, mutable=['stats'])(variables, x)
  print('calls after the lifted call:', int(updated['stats']['calls']))
  print('outputs differ under scaled params:', not bool(jnp.allclose(y, y2)))

  # Gradients: apply is a pure function of the variables.
  loss = lambda p: jnp.mean(lift.apply(mlp, mutable=['stats'])({**variables, 'params': p}, x)[0] ** 2)
  grads = jax.grad(loss)(variables['params'])
  print('grad norm:', float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree_util.tree_leaves(grads)))))


if __name__ == '__main__':
  main()
