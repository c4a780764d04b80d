"""PyTensor-style taps: step counts, values and gradients equal the unrolled Python loop."""
import jax
import jax.numpy as jnp
import numpy as np

from lift import loops


def test_fibonacci_from_two_initial_values():
  fib = loops.scan_taps(lambda a, b: a + b, n_steps=8,
                        outputs_info=[{"initial": jnp.array([0, 1]), "taps": [-2, -1]}])
  assert fib.tolist() == [1, 2, 3, 5, 8, 13, 21, 34]


def test_sequence_past_and_future_taps():
  x = jnp.arange(10.0)
  out = loops.scan_taps(lambda prev, now, nxt: prev + 10 * now + 100 * nxt,
                        sequences=[{"input": x, "taps": [-1, 0, 1]}])
  # steps = len - (max(maxtap, 0) - min(mintap, 0)) = 10 - (1 + 1)
  want = [x[t] + 10 * x[t + 1] + 100 * x[t + 2] for t in range(8)]
  np.testing.assert_allclose(out, jnp.stack(want))


def test_positive_taps_only_shift_the_start():
  x = jnp.arange(6.0)
  out = loops.scan_taps(lambda a, b: a * b, sequences={"input": x, "taps": [2, 3]})
  np.testing.assert_allclose(out, x[2:5] * x[3:6])


def rnn_step(x_prev, x_now, h2, h1, count, w):
  h = jnp.tanh(w * h1 + 0.5 * h2 + x_prev - x_now)
  return h, count + 1, h * x_now


def rnn_by_hand(w, xs, h0, truncate=None):
  """The oracle: the same recurrence unrolled in Python (steps before `truncate` are constants)."""
  hist, count, ys, hs = [h0[0], h0[1]], jnp.int32(0), [], []
  steps = xs.shape[0] - 1
  for t in range(steps):
    args = (xs[t], xs[t + 1], hist[-2], hist[-1], count, w)
    if truncate is not None and t < steps - truncate:
      args = jax.tree.map(jax.lax.stop_gradient, args)
    h, count, y = rnn_step(*args)
    hist.append(h)
    hs.append(h)
    ys.append(y)
  return jnp.sum(jnp.stack(hs) ** 2) + jnp.sum(jnp.stack(ys))


def rnn_by_taps(w, xs, h0, truncate=-1):
  hs, counts, ys = loops.scan_taps(
      rnn_step, sequences=[{"input": xs, "taps": [-1, 0]}],
      outputs_info=[{"initial": h0, "taps": [-2, -1]}, jnp.int32(0), None],
      non_sequences=[w], truncate_gradient=truncate)
  assert counts.tolist() == list(range(1, xs.shape[0]))
  return jnp.sum(hs ** 2) + jnp.sum(ys)


def rnn_inputs():
  return jnp.float32(0.7), jnp.linspace(-1.0, 1.0, 9), jnp.array([0.1, -0.2], jnp.float32)


def test_mixed_outputs_values_and_gradients_match_python_loop():
  args = rnn_inputs()
  np.testing.assert_allclose(rnn_by_taps(*args), rnn_by_hand(*args), rtol=1e-6)
  got = jax.grad(rnn_by_taps, (0, 1, 2))(*args)
  want = jax.jit(jax.grad(rnn_by_hand, (0, 1, 2)))(*args)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_truncate_gradient_keeps_only_the_last_steps():
  args = rnn_inputs()
  got = jax.grad(lambda *a: rnn_by_taps(*a, truncate=3), (0, 1, 2))(*args)
  want = jax.jit(jax.grad(lambda *a: rnn_by_hand(*a, truncate=3), (0, 1, 2)))(*args)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(got[2]).sum()) == 0.0
  assert float(jnp.abs(got[1][:5]).sum()) == 0.0 and float(jnp.abs(got[1][5:]).sum()) > 0.0


def test_go_backwards_iterates_reversed_sequences():
  x = jnp.arange(5.0)
  out = loops.scan_taps(lambda now, total: total + now, sequences=x,
                        outputs_info=jnp.float32(0.0), go_backwards=True)
  assert out.tolist() == [4.0, 7.0, 9.0, 10.0, 10.0]


def test_n_steps_runs_the_first_steps_of_longer_sequences():
  out = loops.scan_taps(lambda x: x * 2.0, sequences=jnp.arange(6.0), n_steps=3)
  assert out.tolist() == [0.0, 2.0, 4.0]


def test_no_outputs_info_returns_every_output():
  a, b = loops.scan_taps(lambda x: (x, -x), sequences=jnp.arange(3.0))
  assert a.tolist() == [0.0, 1.0, 2.0] and b.tolist() == [-0.0, -1.0, -2.0]


def test_taps_under_jit():
  fib = jax.jit(lambda x0: loops.scan_taps(
      lambda a, b: a + b, n_steps=4, outputs_info={"initial": x0, "taps": [-2, -1]}))
  assert fib(jnp.array([1.0, 1.0])).tolist() == [2.0, 3.0, 5.0, 8.0]


def test_a_lone_minus_one_tap_takes_the_state_itself_as_pytensor():
  """PyTensor: {'initial': h0, 'taps': [-1]} is the same as a bare h0 (no time axis)."""
  s = jnp.arange(8.0).reshape(4, 2)
  h0 = jnp.array([1.0, -1.0])
  step = lambda x, h: 0.5 * h + x
  bare = loops.scan_taps(step, sequences=[s], outputs_info=[h0])
  explicit = loops.scan_taps(step, sequences=[s], outputs_info=[{'initial': h0, 'taps': [-1]}])
  np.testing.assert_allclose(explicit, bare)
  np.testing.assert_allclose(bare, [[0.5, 0.5], [2.25, 3.25], [5.125, 6.625], [8.5625, 10.3125]])


def test_go_backwards_keeps_each_tap_in_the_sequence_order_as_pytensor():
  """Backwards, step t reads the window ending at the end: tap -1 is the element before."""
  s = jnp.arange(6.0)
  ys = loops.scan_taps(lambda a, b, c: 100 * a + 10 * b + c, go_backwards=True,
                       sequences=[{'input': s, 'taps': [-1, 0, 1]}])
  np.testing.assert_allclose(ys, [345.0, 234.0, 123.0, 12.0])
  short = loops.scan_taps(lambda a, b, c: 100 * a + 10 * b + c, go_backwards=True, n_steps=2,
                          sequences=[{'input': s, 'taps': [-1, 0, 1]}])
  np.testing.assert_allclose(short, [345.0, 234.0])
