"""Curried scan, fold and map: any axis, unscanned leaves, same results as lax.scan and the unrolled loop."""
import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

from lift import loops

from tests.helpers import assert_trees_close


def step(carry, x):
  new = jnp.tanh(carry * 0.5 + x["a"] * x["scale"]) + x["bias"]
  return new, new * 2.0


def data():
  return {"a": jnp.linspace(-1.0, 1.0, 24).reshape(2, 4, 3),
          "scale": 0.5,
          "bias": jnp.float32(0.1)}


def test_signatures():
  kw = inspect.Parameter.KEYWORD_ONLY
  for fn in (loops.scan, loops.fold):
    sig = inspect.signature(fn).parameters
    assert list(sig)[:2] == ['f', 'axis'] and sig['axis'].default == 0
    for name, default in [('remat', False), ('reverse', False), ('unroll', 1), ('length', None)]:
      assert sig[name].kind is kw and sig[name].default == default
  sig = inspect.signature(loops.map).parameters
  assert list(sig) == ['f', 'axis'] and sig['axis'].default == 0
  sig = inspect.signature(loops.scan_taps).parameters
  assert list(sig)[:6] == ['fn', 'sequences', 'outputs_info', 'non_sequences', 'n_steps',
                           'go_backwards']
  assert sig['n_steps'].default is None and sig['go_backwards'].default is False


@pytest.mark.parametrize("remat", [False, True, "nested"])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_over_axis_1_is_lax_scan_over_moved_axis(remat, reverse):
  xs = data()
  init = jnp.zeros((2, 3))
  carry, ys = loops.scan(step, axis=1, remat=remat, reverse=reverse)(init, xs)
  moved = lambda c, a: step(c, dict(xs, a=a))
  want_carry, want_ys = lax.scan(moved, init, jnp.moveaxis(xs["a"], 1, 0), reverse=reverse)
  assert_trees_close((carry, ys), (want_carry, jnp.moveaxis(want_ys, 0, 1)), depth=4)


def test_negative_axis_and_gradients():
  xs = {"a": jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), "scale": 2.0, "bias": jnp.float32(0.0)}
  loss = lambda a, remat: jnp.sum(loops.scan(step, axis=-1, remat=remat)(
      jnp.zeros(4), dict(xs, a=a))[1] ** 2)
  assert_trees_close(jax.grad(loss)(xs["a"], "nested"), jax.grad(loss)(xs["a"], False), depth=3)


REMATS = [False, True, 'full', 'nested', 'offload', 'save_all',
          loops.ScanCheckpointPolicy(nested=2),
          loops.ScanCheckpointPolicy(save_block_internals=['t']),
          loops.ScanCheckpointPolicy(nested=True, save_carries='offload')]


def _body(c, x):
  t = loops.checkpoint_name(jnp.sin(c * jnp.sum(x['a'][..., :1]) + x['s']), 't')
  return c * 0.9 + t, (t * 2, jnp.sum(x['a']))


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 7), k=st.integers(1, 3), axis=st.sampled_from([0, 1, -1, -2]),
       reverse=st.booleans(), unroll=st.sampled_from([1, 2, 3, True]),
       remat=st.sampled_from(REMATS), seed=st.integers(0, 100))
def test_scan_fold_map_are_lax_scan_and_the_unrolled_loop(n, k, axis, reverse, unroll, remat,
                                                          seed):
  if isinstance(remat, loops.ScanCheckpointPolicy) and remat.nested is not True and (
      remat.nested and remat.nested > n):
    return
  r = np.random.RandomState(seed)
  shape = [k, k]
  shape[axis % 2] = n
  a = jnp.asarray(r.randn(*shape), jnp.float32)
  c0 = jnp.asarray(r.randn(k), jnp.float32)
  at_axis = lambda y: jnp.moveaxis(y, 0, axis) if -y.ndim <= axis < y.ndim else y

  def ours(c0, a):
    return loops.scan(_body, axis, remat=remat, reverse=reverse, unroll=unroll)(
        c0, {'a': a, 's': 0.3})

  def oracle(c0, a):
    step = lambda c, row: _body(c, {'a': row, 's': 0.3})
    c, ys = lax.scan(step, c0, jnp.moveaxis(a, axis, 0), reverse=reverse)
    return c, jax.tree.map(at_axis, ys)

  def unrolled(c0, a):
    rows, c, ys = jnp.moveaxis(a, axis, 0), c0, [None] * n
    for i in (reversed(range(n)) if reverse else range(n)):
      c, ys[i] = _body(c, {'a': rows[i], 's': 0.3})
    return c, jax.tree.map(lambda *y: at_axis(jnp.stack(y)), *ys)

  with warnings.catch_warnings():
    warnings.simplefilter('ignore', loops.OffloadFallbackWarning)
    expected = oracle(c0, a)
    assert_trees_close(ours(c0, a), expected, depth=n)
    assert_trees_close(unrolled(c0, a), expected, depth=n)
    loss = lambda f: lambda c, a: sum(jnp.sum(jnp.cos(y)) for y in jax.tree.leaves(f(c, a)))
    assert_trees_close(jax.grad(loss(ours), (0, 1))(c0, a), jax.grad(loss(oracle), (0, 1))(c0, a),
                       depth=2 * n)
    folded = loops.fold(lambda c, x: _body(c, x)[0], axis, remat=remat, reverse=reverse)(
        c0, {'a': a, 's': 0.3})
  assert_trees_close(folded, expected[0], depth=n)
  mapped = loops.map(lambda x: jnp.sum(x['a'] * 2), axis)({'a': a, 's': 0.3})
  assert_trees_close(mapped, jnp.sum(jnp.moveaxis(a, axis, 0).reshape(n, -1) * 2, axis=1), 1)


def test_unscanned_leaves_reach_every_step_unchanged():
  seen = []

  def record(carry, x):
    seen.append((x["name"], x["short"].shape, x["scalar"].shape, x["n"]))
    return carry + x["long"].sum() * x["n"], x["long"]

  xs = {"long": jnp.ones((3, 5)), "short": jnp.ones(3), "scalar": jnp.float32(2.0),
        "n": 2.0, "name": "static"}
  carry, ys = loops.scan(record, axis=1)(jnp.float32(0.0), xs)
  assert seen == [("static", (3,), (), 2.0)]
  assert float(carry) == 30.0 and ys.shape == (3, 5)


def test_is_scanned_rule():
  assert loops.curried.is_scanned(np.zeros((2, 3)), 1)
  assert loops.curried.is_scanned(jnp.zeros((2, 3)), -2)
  assert not loops.curried.is_scanned(jnp.zeros(3), 1)
  assert not loops.curried.is_scanned(jnp.zeros(3), -2)
  assert not loops.curried.is_scanned(3.0, 0)
  assert not loops.curried.is_scanned("static", 0)


@pytest.mark.parametrize("remat", [False, "nested"])
@pytest.mark.parametrize("reverse", [False, True])
def test_xs_none_with_length_is_lax_scan(remat, reverse):
  body = lambda c, _: (c * 2.0 + 1.0, c)
  got = loops.scan(body, length=4, remat=remat, reverse=reverse)(jnp.float32(1.0), None)
  assert_trees_close(got, lax.scan(body, jnp.float32(1.0), None, length=4, reverse=reverse), 4)
  assert float(got[0]) == 31.0 and got[1].tolist() == ([15.0, 7.0, 3.0, 1.0] if reverse
                                                       else [1.0, 3.0, 7.0, 15.0])


def test_fold_returns_the_carry_only():
  xs = jnp.arange(1.0, 7.0).reshape(2, 3)
  got = loops.fold(lambda c, x: c * x, axis=1, remat="nested")(jnp.ones(2), xs)
  assert_trees_close(got, jnp.prod(xs, axis=1), depth=3)


def test_fold_unroll_and_reverse_are_passed_on():
  order = loops.fold(lambda c, x: c * 10.0 + x, reverse=True, unroll=2)
  assert float(order(jnp.float32(0.0), jnp.arange(1.0, 4.0))) == 321.0


def test_map_matches_vmap_and_stacks_at_axis():
  xs = jnp.arange(24.0).reshape(2, 3, 4)
  got = loops.map(lambda x: x * x.sum(), axis=2)(xs)
  np.testing.assert_array_equal(got, jax.vmap(lambda x: x * x.sum(), in_axes=2, out_axes=2)(xs))
  assert loops.map(jnp.sum, axis=1)(jnp.ones((2, 3))).tolist() == [2.0, 2.0, 2.0]  # lower rank
