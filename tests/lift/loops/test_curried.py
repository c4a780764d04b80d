"""Curried scan, fold and map: any axis, unscanned leaves, same results as lax.scan."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lift import loops


def step(carry, x):
  new = jnp.tanh(carry * 0.5 + x["a"] * x["scale"]) + x["bias"]
  return new, new * 2.0


def data():
  return {"a": jnp.linspace(-1.0, 1.0, 24).reshape(2, 4, 3),
          "scale": 0.5,
          "bias": jnp.float32(0.1)}


@pytest.mark.parametrize("remat", [False, True, "nested"])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_over_axis_1_is_lax_scan_over_moved_axis(remat, reverse):
  xs = data()
  init = jnp.zeros((2, 3))
  carry, ys = loops.scan(step, axis=1, remat=remat, reverse=reverse)(init, xs)
  moved = lambda c, a: step(c, dict(xs, a=a))
  want_carry, want_ys = lax.scan(moved, init, jnp.moveaxis(xs["a"], 1, 0), reverse=reverse)
  np.testing.assert_allclose(carry, want_carry, rtol=1e-6)
  np.testing.assert_allclose(ys, jnp.moveaxis(want_ys, 0, 1), rtol=1e-6)


def test_negative_axis_and_gradients():
  xs = {"a": jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), "scale": 2.0, "bias": jnp.float32(0.0)}
  loss = lambda a, remat: jnp.sum(loops.scan(step, axis=-1, remat=remat)(
      jnp.zeros(4), dict(xs, a=a))[1] ** 2)
  np.testing.assert_allclose(jax.grad(loss)(xs["a"], "nested"),
                             jax.grad(loss)(xs["a"], False), rtol=1e-5)


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


def test_xs_none_with_length():
  carry, ys = loops.scan(lambda c, _: (c * 2.0, c), length=4)(jnp.float32(1.0), None)
  assert float(carry) == 16.0 and ys.tolist() == [1.0, 2.0, 4.0, 8.0]


def test_fold_returns_the_carry_only():
  xs = jnp.arange(1.0, 7.0).reshape(2, 3)
  got = loops.fold(lambda c, x: c * x, axis=1, remat="nested")(jnp.ones(2), xs)
  np.testing.assert_allclose(got, jnp.prod(xs, axis=1))


def test_fold_unroll_and_reverse_are_passed_on():
  order = loops.fold(lambda c, x: c * 10.0 + x, reverse=True, unroll=2)
  assert float(order(jnp.float32(0.0), jnp.arange(1.0, 4.0))) == 321.0


def test_map_matches_vmap_and_stacks_at_axis():
  xs = jnp.arange(24.0).reshape(2, 3, 4)
  got = loops.map(lambda x: x * x.sum(), axis=2)(xs)
  want = jax.vmap(lambda x: x * x.sum(), in_axes=2, out_axes=2)(xs)
  np.testing.assert_allclose(got, want)


def test_map_with_lower_rank_outputs_stacks_first():
  got = loops.map(jnp.sum, axis=1)(jnp.ones((2, 3)))
  assert got.tolist() == [2.0, 2.0, 2.0]
