"""The Module system's errors are `LiftError`s. Each mistake, its error and its message: the
misuse catalogue (tests/misuse/)."""
import jax
import jax.numpy as jnp
import numpy as np

import linen_ext as nn
from lift.errors import LiftError
from linen_ext import errors

KEY = jax.random.key(0)


def test_module_errors_are_lift_errors():
  assert issubclass(errors.ModuleError, LiftError)


def test_lazy_init_runs_the_variables_on_a_concrete_value_of_an_input_they_read():
  """With a `jax.ShapeDtypeStruct` for ``scale`` it raises `LazyInitError` (the catalogue)."""
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x, *, scale):
      return self.param('w', lambda key: scale.sum() * jnp.ones(2))

  shape = jax.ShapeDtypeStruct((2,), jnp.float32)
  variables = Model().lazy_init(KEY, shape, scale=jnp.ones(2))
  np.testing.assert_array_equal(variables['params']['w'], 2.0 * np.ones(2))
