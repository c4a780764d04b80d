"""`intercept_methods` against flax.linen's: the same calls seen, in the same order, same results."""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn

X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)


def model(lib, lifted):
  class Block(lib.Module):
    def setup(self):
      self.dense = lib.Dense(3)

    def helper(self, x):
      return x * 2

    def __call__(self, x):
      return self.helper(self.dense(x))

  class Model(lib.Module):
    @lib.compact
    def __call__(self, x):
      block = (lib.vmap(Block, variable_axes={'params': 0}, split_rngs={'params': True})
               if lifted else Block)
      return lib.Dense(2)(block()(x))
  return Model()


def intercepted_run(lib, lifted):
  """Two interceptors: the first logs, the second short-circuits `helper` and scales Dense."""
  log = []

  def first(next_fun, args, kwargs, context):
    log.append(('first', type(context.module).__name__, context.method_name))
    return next_fun(*args, **kwargs)

  def second(next_fun, args, kwargs, context):
    log.append(('second', type(context.module).__name__, context.method_name))
    if context.method_name == 'helper':
      return context.orig_method(*args, **kwargs) + 1.0
    if isinstance(context.module, lib.Dense):
      return next_fun(*args, **kwargs) * 10
    return next_fun(*args, **kwargs)

  net = model(lib, lifted)
  variables = net.init(jax.random.key(0), X)
  with lib.intercept_methods(first), lib.intercept_methods(second):
    y = net.apply(variables, X)
  return log, y, net.apply(variables, X)


@pytest.mark.parametrize('lifted', [False, True], ids=['plain', 'in_vmap'])
def test_intercepted_calls_and_results_equal_flax(lifted):
  log, y, plain = intercepted_run(nn, lifted)
  flax_log, flax_y, flax_plain = intercepted_run(flax_nn, lifted)
  # Flax also intercepts the methods of its generated `VmapBlock` wrapper class.
  assert log == [entry for entry in flax_log if not entry[1].startswith('Vmap')]
  assert ('first', 'Block', 'helper') in log and log[:2] == [('first', 'Model', '__call__'),
                                                              ('second', 'Model', '__call__')]
  np.testing.assert_array_equal(y, flax_y)
  np.testing.assert_array_equal(plain, flax_plain)  # removed after the block
  assert not np.allclose(y, plain)
