"""Recurrences as real code writes them: dead code, zero-length pieces along time and
`lax.associative_scan`, each against a hand-written oracle."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lift import as_scan, errors
from lift.causal.testing import check_scan

from tests.helpers import assert_trees_close

T = 6


def rand(shape, seed=0, low=None):
  x = np.random.default_rng(seed).standard_normal(shape)
  return jnp.asarray(x if low is None else low + (1 - low) / (1 + np.abs(x)), jnp.float32)


XS = rand((T, 3))
DECAY = rand((T, 3), seed=1, low=0.5)  # in (0.5, 1]
MATS = rand((T, 2, 2), seed=2)
MASK = jnp.array([1.0, 0.0, 1.0])


def linear_recurrence(decay, xs):
  """h_t = decay_t * h_(t-1) + x_t, h_(-1) = 0, step by step."""
  h, out = jnp.zeros(xs.shape[1:]), []
  for a, x in zip(decay, xs):
    h = a * h + x
    out.append(h)
  return jnp.stack(out)


def products(mats):
  """P_t = M_0 @ M_1 @ ... @ M_t, step by step."""
  p, out = jnp.eye(mats.shape[-1]), []
  for m in mats:
    p = p @ m
    out.append(p)
  return jnp.stack(out)


def affine(left, right):  # (a, x) then (b, y): h -> b * (a * h + x) + y
  return left[0] * right[0], right[0] * left[1] + right[1]


def with_dead_code(xs):
  h0 = jnp.zeros_like(xs[0])  # read for its shape only: xs[0] is never used
  last = jnp.cumsum(xs, 0)[-1]  # computed, then dropped
  del last
  return jnp.cumsum(xs, 0) + h0[None]


def dead_code_in_jit(xs):
  inner = jax.jit(lambda x: (jnp.cumsum(x, 0), x[-1], jnp.zeros_like(x[0])))
  return inner(xs)[0]


def conv_by_pieces(xs, kernel=rand((3, 3), seed=3)):
  """A causal convolution as Griffin's Conv1D writes it: one zero-padded window per shift,
  the padding of shift 0 a piece of length 0."""
  out = 0.0
  for shift in range(kernel.shape[0]):
    window = xs[:xs.shape[0] - shift]
    padding = jnp.zeros((shift, xs.shape[1]), xs.dtype)
    out = out + jnp.concatenate([padding, window]) * kernel[shift][None]
  return out


def conv_oracle(xs, kernel=rand((3, 3), seed=3)):
  return jnp.stack([sum(kernel[k] * xs[t - k] for k in range(kernel.shape[0]) if t >= k)
                    for t in range(xs.shape[0])])


@pytest.mark.parametrize('g, oracle', [
    (with_dead_code, lambda xs: jnp.cumsum(xs, 0)),
    (dead_code_in_jit, lambda xs: jnp.cumsum(xs, 0)),
    (conv_by_pieces, conv_oracle),
    (lambda xs: xs + jnp.concatenate([xs[:0], DECAY]), lambda xs: xs + DECAY),
], ids=['dead_code', 'dead_code_in_jit', 'zero_length_piece', 'only_empty_streams'])
def test_dead_code_and_zero_length_pieces(g, oracle):
  assert_trees_close(g(XS), oracle(XS))
  check_scan(g, XS, prefill=[2])


def lru(xs):  # [T, 3] -> [T, 3], the decay a stream too
  return lax.associative_scan(affine, (jax.nn.sigmoid(xs), xs))[1]


def lru_batch_major(xs):  # time on axis 1 inside, as [batch, length, features] code has it
  batch_major = jnp.stack([xs, 2 * xs])
  decays = jnp.broadcast_to(DECAY, batch_major.shape)
  return jnp.moveaxis(lax.associative_scan(affine, (decays, batch_major), axis=1)[1], 1, 0)


@pytest.mark.parametrize('length', [T, T - 1, 2])
def test_associative_scan_of_a_linear_recurrence(length):
  xs = XS[:length]
  assert_trees_close(lru(xs), linear_recurrence(jax.nn.sigmoid(xs), xs))
  check_scan(lru, xs, prefill=[1] if length == 2 else [1, 3])


def test_associative_scan_along_axis_1_with_unscanned_decay():
  want = jnp.moveaxis(jnp.stack([linear_recurrence(DECAY, XS), linear_recurrence(DECAY, 2 * XS)]),
                      0, 1)
  assert_trees_close(lru_batch_major(XS), want)
  check_scan(lru_batch_major, XS, prefill=[3])


def test_associative_scan_of_a_non_commutative_op():
  g = lambda mats: lax.associative_scan(jnp.matmul, mats)
  assert_trees_close(g(MATS), products(MATS))
  check_scan(g, MATS, prefill=[2])


def per_head(decay, xs):  # [T, batch] each: a scan per head, vmapped over heads
  return lax.associative_scan(affine, (decay, xs))[1]


@pytest.mark.parametrize('g, oracle, xs', [
    (lambda m: jax.vmap(lambda x: lax.associative_scan(jnp.matmul, x), in_axes=1, out_axes=1)(m),
     lambda m: jnp.stack([products(m[:, b]) for b in range(3)], 1), rand((T, 3, 2, 2), seed=4)),
    (lambda x: jax.vmap(per_head, in_axes=2, out_axes=2)(jax.nn.sigmoid(x), x),
     lambda x: jnp.stack([jnp.stack([linear_recurrence(jax.nn.sigmoid(x[:, b, h]), x[:, b, h])
                                     for h in range(2)], 1) for b in range(3)], 1),
     rand((T, 3, 2), seed=5)),
], ids=['batch_axis_moved', 'axes_reordered'])
def test_associative_scan_under_vmap(g, oracle, xs):
  # S5-style code vmaps a scan per sequence (or head); vmap moves axes inside it
  assert_trees_close(g(xs), oracle(xs))
  check_scan(g, xs, prefill=[3])


def test_associative_scan_closing_over_a_weight_under_jit():
  # x_0 + mask * (x_1 + ... + x_t): associative for a 0/1 mask, which fn closes over.
  def g(xs, mask):
    return lax.associative_scan(lambda a, b: a + b * mask[None], xs)

  @jax.jit
  def stepped(xs, mask):
    f, carry = as_scan(lambda x: g(x, mask), xs)
    return lax.scan(f, carry, xs)[1]

  want = XS[:1] + MASK[None] * jnp.concatenate([jnp.zeros((1, 3)), jnp.cumsum(XS[1:], 0)])
  assert_trees_close(stepped(XS, MASK), want)


def test_associative_scan_over_another_axis_runs_per_element():
  g = lambda xs: lax.associative_scan(jnp.add, xs, axis=1)
  assert_trees_close(g(XS), jnp.cumsum(XS, 1))
  check_scan(g, XS, prefill=[2])


@pytest.mark.parametrize('fn, kwargs, fragment', [
    (jnp.add, {'reverse': True}, '`rev`'),
    (lambda a, b: a + jnp.cumsum(b, 0), {}, 'not applied to each element alone'),
], ids=['reversed', 'fn_along_time'])
def test_associative_scan_that_is_not_causal_raises(fn, kwargs, fragment):
  with pytest.raises(errors.ScanConversionError, match=fragment):
    as_scan(lambda xs: lax.associative_scan(fn, xs, **kwargs), XS)
