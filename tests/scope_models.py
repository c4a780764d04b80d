"""Small scope-level models shared by the tests (plain functions of a Scope)."""
import jax
import jax.numpy as jnp


def dense(scope, x, features):
  kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  bias = scope.param('bias', jax.nn.initializers.normal(), (features,))
  y = x @ kernel
  return y + bias.reshape((1,) * (y.ndim - 1) + (-1,))


def mlp(scope, x, hidden=4, out=2):
  h = jax.nn.relu(scope.child(dense, 'hidden')(x, hidden))
  h = jax.nn.relu(scope.push('mid').child(dense)(h, hidden))
  return scope.child(dense, 'out')(h, out)


def counter(scope, x):
  """Increments a counter in the 'counter' collection and returns x unchanged."""
  count = scope.variable('counter', 'count', lambda: jnp.zeros((), jnp.int32))
  count.value = count.value + 1
  return x


def assert_trees_close(a, b, **tolerances):
  """Same tree structure, leaves equal to rtol 1e-5 / atol 1e-6 unless overridden."""
  import functools

  import numpy as np
  tolerances = {'rtol': 1e-5, 'atol': 1e-6, **tolerances}
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(functools.partial(np.testing.assert_allclose, **tolerances), a, b)
