"""`RNN` and `Bidirectional` against flax.linen's (same tree and values) and a Python loop."""
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn
from tests.helpers import assert_trees_close, check_linen_parity

KEY = jax.random.key(0)
LENGTHS = jnp.array([4, 6])


def inputs(time_major):
  return jnp.linspace(-1, 1, 36).reshape((6, 2, 3) if time_major else (2, 6, 3))


def rnn_model(lib, **options):
  class Model(lib.Module):
    @lib.compact
    def __call__(self, xs, lengths=None):
      return lib.RNN(lib.LSTMCell(5), return_carry=True, **options)(xs, seq_lengths=lengths)
  return Model()


@pytest.mark.parametrize('options, with_lengths', [
    ({}, False), ({}, True), ({'time_major': True}, True), ({'reverse': True}, True),
    ({'reverse': True, 'keep_order': True, 'time_major': True}, True),
], ids=['default', 'padded', 'time_major', 'reverse', 'reverse-keep_order-time_major'])
def test_rnn_equals_flax(options, with_lengths):
  xs, lengths = inputs(options.get('time_major', False)), LENGTHS if with_lengths else None
  def build(lib):
    variables = rnn_model(lib, **options).init(KEY, xs, lengths)
    return variables, rnn_model(lib, **options).apply(variables, xs, lengths)
  check_linen_parity(build)


def test_bidirectional_equals_flax_with_padding():
  def make(lib):
    class Model(lib.Module):
      @lib.compact
      def __call__(self, xs, lengths):
        layer = lib.Bidirectional(lib.RNN(lib.GRUCell(4)), lib.RNN(lib.LSTMCell(3)),
                                  return_carry=True)
        return layer(xs, seq_lengths=lengths)
    return Model()

  def build(lib):
    variables = make(lib).init(KEY, inputs(False), LENGTHS)
    return variables, make(lib).apply(variables, inputs(False), LENGTHS)
  assert check_linen_parity(build)[0][1][1].shape == (2, 6, 7)


def test_rnn_and_its_gradient_equal_a_python_loop_over_the_cell():
  xs = inputs(False)
  model = rnn_model(nn)
  variables = model.init(KEY, xs)
  cell_variables = {'params': variables['params']['LSTMCell_0']}

  def looped(params):
    cell = nn.LSTMCell(5)
    carry = cell.initialize_carry(jax.random.key(0), xs[:, 0].shape)
    ys = []
    for t in range(xs.shape[1]):
      carry, y = cell.apply({'params': params}, carry, xs[:, t])
      ys.append(y)
    return carry, jnp.stack(ys, axis=1)

  # scan against the unrolled loop: six steps of a cell, each a few layers deep
  assert_trees_close(model.apply(variables, xs), looped(cell_variables['params']), depth=12)
  loss = lambda y: jnp.sum(y[1] ** 2)
  grad = jax.grad(lambda v: loss(model.apply(v, xs)))(variables)
  assert_trees_close(grad['params']['LSTMCell_0'],
                     jax.grad(lambda p: loss(looped(p)))(cell_variables['params']), depth=24)


def test_flip_sequences_keeps_padding_at_the_end():
  xs = jnp.array([[1, 0, 0], [2, 3, 0], [4, 5, 6]])
  flipped = nn.flip_sequences(xs, jnp.array([1, 2, 3]), num_batch_dims=1, time_major=False)
  assert flipped.tolist() == [[1, 0, 0], [3, 2, 0], [6, 5, 4]]
  time_major = nn.flip_sequences(xs.T, jnp.array([1, 2, 3]), num_batch_dims=1, time_major=True)
  assert time_major.T.tolist() == flipped.tolist()
  assert nn.flip_sequences(xs, None, 1, False).tolist() == xs[:, ::-1].tolist()


def test_a_cell_subclassing_rnncellbase_runs_and_a_missing_initialize_carry_says_so():
  class Accumulate(nn.RNNCellBase):
    @nn.compact
    def __call__(self, carry, x):
      carry = carry + nn.Dense(3, use_bias=False)(x)
      return carry, 2 * carry

  class WithCarry(Accumulate):
    def initialize_carry(self, rng, input_shape):
      return jnp.zeros(input_shape[:-1] + (3,))

  xs = inputs(False)
  variables = nn.RNN(WithCarry()).init(KEY, xs)
  kernel = variables['params']['cell']['Dense_0']['kernel']
  assert_trees_close(nn.RNN(WithCarry()).apply(variables, xs), 2 * jnp.cumsum(xs @ kernel, axis=1), depth=3)
  with pytest.raises(NotImplementedError, match='Accumulate does not define initialize_carry'):
    nn.RNN(Accumulate()).init(KEY, xs)


def test_optimize_rewrites_the_loop_with_the_values_and_gradients_as_written():
  """nn.RNN, nn.scan and Stacked with optimize=: the loop is rewritten (the input
  projection leaves it under grad), values and gradients stay."""
  from tests.lift.scan_rewrites.programs import body_primitives, scans
  x = jax.random.normal(jax.random.key(1), (2, 5, 3))
  plain, fast = nn.RNN(nn.LSTMCell(4)), nn.RNN(nn.LSTMCell(4), optimize=True)
  variables = plain.init(jax.random.key(0), x)
  loss = lambda rnn: lambda v: jnp.sum(rnn.apply(v, x) ** 2)
  assert jnp.allclose(fast.apply(variables, x), plain.apply(variables, x), atol=1e-5)
  grads = jax.grad(loss(fast))(variables), jax.grad(loss(plain))(variables)
  assert all(jnp.allclose(a, b, atol=1e-5) for a, b in zip(*map(jax.tree.leaves, grads)))
  dots = [body_primitives(scans(jax.make_jaxpr(jax.grad(loss(rnn)))(variables).jaxpr)[0])
          .count('dot_general') for rnn in (plain, fast)]
  assert dots == [8, 4]     # the 4 input-gate products left the forward loop

  class Block(nn.Module):
    @nn.compact
    def __call__(self, h):
      return h + jnp.tanh(nn.Dense(3)(h))
  stack, stack_fast = nn.Stacked(Block, 3), nn.Stacked(Block, 3, optimize=['push_out_non_seq'])
  v = stack.init(jax.random.key(0), x)
  assert jnp.allclose(stack_fast.apply(v, x), stack.apply(v, x), atol=1e-5)
