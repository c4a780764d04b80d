"""Random compositions of causal building blocks pass the `as_scan` oracle.

Causality composes (`g1(g2(xs))[:t] == g1(g2(xs[:t]))`), so any chain of
causal blocks is causal, and its derived step must reproduce it.
"""
import functools

import hypothesis
from hypothesis import strategies as st
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from lift import causal_self_attention
from lift.causal.testing import check_scan
from tests.helpers import tolerance

T, D = 6, 4
_RNG = np.random.default_rng(0)
DENSE = jnp.asarray(_RNG.standard_normal((D, D)) / 2, jnp.float32)
KERNEL = jnp.asarray(_RNG.standard_normal((3, D, D)) / 4, jnp.float32)
PER_STEP = jnp.asarray(_RNG.standard_normal((T, D)), jnp.float32)


def shift(x, k):
  return jnp.concatenate([jnp.zeros((k, D)), x[:-k]])


def conv(x, dilation):
  return lax.conv_general_dilated(x[None], KERNEL, (1,), [(2 * dilation, 0)], rhs_dilation=(dilation,),
                                  dimension_numbers=('NWC', 'WIO', 'NWC'))[0]


def attend(x):
  heads = x.reshape(x.shape[0], 2, D // 2)
  return causal_self_attention(heads, heads, heads).reshape(x.shape)


BLOCKS = {
    "tanh": jnp.tanh,
    "dense": lambda x: x @ DENSE,
    "shift1": lambda x: shift(x, 1),
    "shift2": lambda x: shift(x, 2),
    "cumsum": lambda x: 0.3 * jnp.cumsum(x, 0),
    "cummax": lambda x: lax.cummax(x, 0),
    "conv": lambda x: conv(x, 1),
    "dilated_conv": lambda x: conv(x, 2),
    "attention": attend,
    "rnn": lambda x: lax.scan(lambda c, a: (jnp.tanh(0.5 * c + a), c), jnp.zeros(D), x)[1],
    "position": lambda x: x * PER_STEP[:x.shape[0]],
    "layer_norm": lambda x: (x - x.mean(1, keepdims=True)) / (x.std(1, keepdims=True) + 1.0),
    "jit_residual": jax.jit(lambda x: x + jnp.sin(x)),
    "transposed_shift": lambda x: shift(x.T.T, 1) + x,
}


@hypothesis.settings(max_examples=8, deadline=None, derandomize=True)
@hypothesis.given(
    names=st.lists(st.sampled_from(sorted(BLOCKS)), min_size=1, max_size=4),
    prefill=st.integers(min_value=1, max_value=T - 1))
def test_random_causal_chains(names, prefill):
  xs = jnp.asarray(np.random.default_rng(len(names)).standard_normal((T, D)), jnp.float32)
  check_scan(lambda x: functools.reduce(lambda x, name: BLOCKS[name](x), names, x), xs, prefill=[prefill],
             rtol=tolerance(np.float32, 32), atol=tolerance(np.float32, 32))
