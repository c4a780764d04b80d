"""PyTensor-style taps: step counts, values and gradients equal the unrolled Python loop.

Further oracle: outputs of PyTensor 3.0.7's ``scan``, recorded below.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lift import loops

from tests.helpers import assert_trees_close


S6 = jnp.arange(6.0)
digits = lambda *a: sum(v * 10 ** i for i, v in enumerate(a))
SMALL = {  # name: (call, expected values)
    'fibonacci-from-two-initial-values': (lambda: loops.scan_taps(
        lambda a, b: a + b, n_steps=8,
        outputs_info=[{"initial": jnp.array([0, 1]), "taps": [-2, -1]}]),
        [1, 2, 3, 5, 8, 13, 21, 34]),
    # steps = len - (max(maxtap, 0) - min(mintap, 0)) = 10 - (1 + 1)
    'past-and-future-taps': (lambda: loops.scan_taps(
        lambda prev, now, nxt: prev + 10 * now + 100 * nxt,
        sequences=[{"input": jnp.arange(10.0), "taps": [-1, 0, 1]}]),
        [t + 10 * (t + 1) + 100 * (t + 2) for t in range(8)]),
    'positive-taps-only-shift-the-start': (lambda: loops.scan_taps(
        lambda a, b: a * b, sequences={"input": S6, "taps": [2, 3]}), [6.0, 12.0, 20.0]),
    'go-backwards-iterates-reversed': (lambda: loops.scan_taps(
        lambda now, total: total + now, sequences=jnp.arange(5.0),
        outputs_info=jnp.float32(0.0), go_backwards=True), [4.0, 7.0, 9.0, 10.0, 10.0]),
    'n_steps-runs-the-first-steps': (lambda: loops.scan_taps(
        lambda x: x * 2.0, sequences=S6, n_steps=3), [0.0, 2.0, 4.0]),
    'no-outputs_info-returns-every-output': (lambda: loops.scan_taps(
        lambda x: (x, -x), sequences=jnp.arange(3.0)), ([0.0, 1.0, 2.0], [-0.0, -1.0, -2.0])),
    'under-jit': (lambda: jax.jit(lambda x0: loops.scan_taps(
        lambda a, b: a + b, n_steps=4, outputs_info={"initial": x0, "taps": [-2, -1]}))(
            jnp.array([1.0, 1.0])), [2.0, 3.0, 5.0, 8.0]),
    # PyTensor: {'initial': h0, 'taps': [-1]} is the same as a bare h0 (no time axis).
    **{f'lone-minus-one-tap-{kind}-as-pytensor': (lambda h0=h0: loops.scan_taps(
        lambda x, h: 0.5 * h + x, sequences=[jnp.arange(8.0).reshape(4, 2)], outputs_info=[h0]),
        [[0.5, 0.5], [2.25, 3.25], [5.125, 6.625], [8.5625, 10.3125]])
       for kind, h0 in [('bare', jnp.array([1.0, -1.0])),
                        ('explicit', {'initial': jnp.array([1.0, -1.0]), 'taps': [-1]})]},
    # Backwards, step t reads the window ending at the end: tap -1 is the element before.
    **{f'go-backwards-keeps-tap-order-n_steps={n}-as-pytensor': (lambda n=n: loops.scan_taps(
        lambda a, b, c: 100 * a + 10 * b + c, go_backwards=True, n_steps=n,
        sequences=[{'input': S6, 'taps': [-1, 0, 1]}]), [345.0, 234.0, 123.0, 12.0][:n or 4])
        for n in (None, 2)},
}


@pytest.mark.parametrize('case', SMALL)
def test_small_cases(case):
  call, expected = SMALL[case]
  np.testing.assert_array_equal(call(), jnp.array(expected))


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
  assert_trees_close(rnn_by_taps(*args), rnn_by_hand(*args), depth=8)
  assert_trees_close(jax.grad(rnn_by_taps, (0, 1, 2))(*args),
                     jax.jit(jax.grad(rnn_by_hand, (0, 1, 2)))(*args), depth=16)


def test_truncate_gradient_keeps_only_the_last_steps():
  args = rnn_inputs()
  got = jax.grad(lambda *a: rnn_by_taps(*a, truncate=3), (0, 1, 2))(*args)
  want = jax.jit(jax.grad(lambda *a: rnn_by_hand(*a, truncate=3), (0, 1, 2)))(*args)
  assert_trees_close(got, want, depth=16)
  assert float(jnp.abs(got[2]).sum()) == 0.0
  assert float(jnp.abs(got[1][:5]).sum()) == 0.0 and float(jnp.abs(got[1][5:]).sum()) > 0.0


def _unrolled_taps(fn, seqs, outs, nons, n_steps):
  """A Python loop with PyTensor's tap rules (forward direction)."""
  if n_steps is None:
    n_steps = min(v.shape[0] - (max(max(t), 0) - min(min(t), 0)) for v, t in seqs)
  history = [None if w is None else list(w) for w, _ in outs]
  ys = [[] for _ in outs]
  for t in range(n_steps):
    args = [v[t + k - min(min(taps), 0)] for v, taps in seqs for k in taps]
    args += [h[len(h) + k] for h, (_, taps) in zip(history, outs) if h is not None
             for k in taps]
    results = fn(*args, *nons)
    results = list(results) if isinstance(results, (list, tuple)) else [results]
    for i, value in enumerate(results):
      ys[i].append(value)
      if history[i] is not None:
        history[i].append(value)
  return [jnp.stack(y) for y in ys]


_TAPS = st.lists(st.integers(-3, 3), min_size=1, max_size=3, unique=True).map(sorted)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(taps1=_TAPS, taps2=_TAPS,
       out_taps=st.lists(st.integers(-3, -1), min_size=1, max_size=2, unique=True).map(sorted),
       n=st.integers(1, 5), extra=st.integers(0, 2), use_n_steps=st.booleans(),
       second=st.booleans(), seed=st.integers(0, 50))
@example(taps1=[-1, 0, 1], taps2=[0], out_taps=[-3, -1], n=5, extra=0, use_n_steps=False,
         second=True, seed=0)  # past, present and future inputs, a gap in the fed-back window
def test_random_taps_are_the_unrolled_loop_with_its_gradients(taps1, taps2, out_taps, n, extra,
                                                              use_n_steps, second, seed):
  if out_taps == [-1]:
    out_taps = [-2, -1]  # an explicit [-1] window is the state itself: tested above
  r = np.random.RandomState(seed)
  span = lambda taps: max(max(taps), 0) - min(min(taps), 0)
  extra = extra if use_n_steps else 0
  s1 = jnp.asarray(r.randn(n + span(taps1) + extra, 2), jnp.float32)
  s2 = jnp.asarray(r.randn(n + span(taps2) + extra, 2), jnp.float32)
  x0 = jnp.asarray(r.randn(-min(out_taps), 2), jnp.float32)
  n1, n2 = len(taps1), len(taps2)
  n_steps = n if use_n_steps else None

  def fn(*a):
    y = jnp.tanh(sum(a[:n1]) * a[-1] + 0.5 * sum(a[n1:n1 + n2]) + 0.3 * sum(a[n1 + n2:-1]))
    return (y, jnp.sum(y)) if second else y

  def ours(s1, s2, x0, w):
    outputs = [{'initial': x0, 'taps': out_taps}] + ([None] if second else [])
    return loops.scan_taps(fn, sequences=[{'input': s1, 'taps': taps1},
                                          {'input': s2, 'taps': taps2}],
                           outputs_info=outputs if second else outputs[0],
                           non_sequences=[w], n_steps=n_steps)

  def oracle(s1, s2, x0, w):
    outs = [(x0, out_taps)] + ([(None, ())] if second else [])
    ys = _unrolled_taps(fn, [(s1, taps1), (s2, taps2)], outs, [w], n_steps)
    return ys if second else ys[0]

  args = (s1, s2, x0, jnp.float32(0.7))
  assert_trees_close(ours(*args), oracle(*args), depth=n)
  loss = lambda f: lambda *a: sum(jnp.sum(jnp.sin(y)) for y in jax.tree.leaves(f(*a)))
  assert_trees_close(jax.grad(loss(ours), (0, 1, 2, 3))(*args),
                     jax.grad(loss(oracle), (0, 1, 2, 3))(*args), depth=4 * n)


# Outputs of PyTensor 3.0.7: scan(lambda *taps: sum(v * 10**i), sequences=[{'input':
# arange(6.), 'taps': taps}], go_backwards=...), n_steps=3 for 'n3', and an output fed back
# at taps [-2, -1] from initial [1., 2.] (fn = a + 0.5 * p1 + 0.25 * p2).
PYTENSOR = {
    False: {(-1, 0): [10.0, 21.0, 32.0, 43.0, 54.0], (0, 2): [20.0, 31.0, 42.0, 53.0],
            (-2, 1): [30.0, 41.0, 52.0], 'n3': [10.0, 21.0, 32.0],
            'fed': [1.25, 2.125, 3.375, 5.21875, 7.453125, 10.03125]},
    True: {(-1, 0): [54.0, 43.0, 32.0, 21.0, 10.0], (0, 2): [53.0, 42.0, 31.0, 20.0],
           (-2, 1): [52.0, 41.0, 30.0], 'n3': [54.0, 43.0, 32.0],
           'fed': [6.25, 7.625, 8.375, 8.09375, 7.140625, 5.59375]},
}


@pytest.mark.parametrize('go_backwards', [False, True])
def test_sequence_taps_and_fed_back_outputs_match_pytensor(go_backwards):
  s = S6
  got = {taps: loops.scan_taps(digits, sequences=[{'input': s, 'taps': list(taps)}],
                               go_backwards=go_backwards)
         for taps in [(-1, 0), (0, 2), (-2, 1)]}
  got['n3'] = loops.scan_taps(lambda a, b: a + 10 * b, sequences=[{'input': s, 'taps': [-1, 0]}],
                              n_steps=3, go_backwards=go_backwards)
  got['fed'] = loops.scan_taps(lambda a, p2, p1: a + 0.5 * p1 + 0.25 * p2, sequences=[s],
                               outputs_info=[{'initial': jnp.array([1.0, 2.0]),
                                              'taps': [-2, -1]}],
                               go_backwards=go_backwards)
  for case, expected in PYTENSOR[go_backwards].items():
    np.testing.assert_array_equal(got[case], jnp.array(expected), err_msg=str(case))
