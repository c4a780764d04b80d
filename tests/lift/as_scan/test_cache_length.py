"""A derived step past the length its caches hold: an error, NaN, or (rings) right values.

Oracle: the full form on the longer sequence. Never a plausible wrong value.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift
from tests.helpers import tolerance

LENGTH, LONGER = 4, 7
XS = jnp.asarray(np.random.default_rng(0).standard_normal((LONGER, 3)), jnp.float32)
TABLE = np.linspace(0.0, 1.0, 3 * LONGER, dtype=np.float32).reshape(LONGER, 3)
BOUND = tolerance(np.float32, 8)


def attention(xs):  # a cache of every key
  mask = jnp.tril(jnp.ones((xs.shape[0],) * 2, bool))
  return jax.nn.softmax(jnp.where(mask, xs @ xs.T, -jnp.inf)) @ xs


def window(xs):  # jax's sliding window: a ring of 2 keys
  heads = xs[:, None]
  return jax.nn.dot_product_attention(heads, heads, heads, is_causal=True,
                                      local_window_size=(1, 0))[:, 0]


def position_table(xs):  # no cache, but a table of the example's length read by position
  return xs + TABLE[:xs.shape[0]]


def steps(g, count, **options):
  f, carry = lift.as_scan(g, XS[:LENGTH], **options)
  return jax.lax.scan(f, carry, XS[:count])[1]


@pytest.mark.parametrize('g', [attention, position_table])
def test_eager_steps_raise_at_the_first_element_past_the_caches(g):
  f, carry = lift.as_scan(g, XS[:LENGTH])
  for t in range(LENGTH):
    carry, y = f(carry, XS[t])
    np.testing.assert_allclose(y, g(XS[:LENGTH])[t], rtol=BOUND, atol=BOUND)
  with pytest.raises(lift.CacheLengthError, match=f'element {LENGTH} .*hold {LENGTH}'):
    f(carry, XS[LENGTH])


@pytest.mark.parametrize('g', [attention, position_table])
def test_traced_steps_give_nan_past_the_caches_and_max_length_gives_room(g):
  past = np.asarray(jax.jit(steps, static_argnums=(0, 1))(g, LONGER))
  np.testing.assert_allclose(past[:LENGTH], g(XS[:LENGTH]), rtol=BOUND, atol=BOUND)
  assert np.isnan(past[LENGTH:]).all()
  longer = steps(g, LONGER, max_length=LONGER)
  np.testing.assert_allclose(longer, g(XS), rtol=BOUND, atol=BOUND)


@pytest.mark.parametrize('g', [window, jnp.tanh, lambda xs: jnp.cumsum(xs, 0)],
                         ids=['ring', 'stateless', 'running'])
def test_steps_without_full_length_state_run_past_the_example(g):
  f, carry = lift.as_scan(g, XS[:LENGTH])
  ys = []
  for t in range(LONGER):  # eager: no error
    carry, y = f(carry, XS[t])
    ys.append(y)
  np.testing.assert_allclose(np.stack(ys), g(XS), rtol=BOUND, atol=BOUND)
