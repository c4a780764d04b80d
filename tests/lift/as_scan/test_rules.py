"""The `check_scan` oracle on every `as_scan` rule, with and without prefill."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lift import as_scan
from lift.causal.testing import check_scan

from tests.helpers import assert_trees_close

T = 6


def rand(shape, dtype=jnp.float32, seed=0):
  x = np.random.default_rng(seed).standard_normal(shape)
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.asarray(x * 4, dtype)
  return jnp.asarray(x, dtype)


W = rand((3, 5), seed=1)
FRAME = rand((1, 3), seed=2)
PER_STEP = rand((T, 3), seed=3)
BATCHED = rand((T, 3, 4), seed=4)
KERNEL = rand((3, 3, 3), seed=5)
EMBED = rand((10, 4), seed=6)
LAYERS = rand((3, 3), seed=7) * 0.5


def shift(x, k=1, axis=0):
  pad = [(0, 0)] * x.ndim
  pad[axis] = (k, 0)
  return lax.slice_in_dim(jnp.pad(x, pad), 0, x.shape[axis], axis=axis)


def conv(x, padding, dilation=1, groups=1, kernel=KERNEL):
  """1-D convolution of x [batch, time, channels]."""
  return lax.conv_general_dilated(x, kernel, (1,), [padding], rhs_dilation=(dilation,),
                                  dimension_numbers=('NWC', 'WIO', 'NWC'), feature_group_count=groups)


def swap(x):
  return jnp.swapaxes(x, 0, 1)


ELEMENTWISE = {
    'sin': jnp.sin,
    'exp_tanh_logistic': lambda x: jnp.exp(x) * jnp.tanh(x) + jax.nn.sigmoid(x),
    'unscanned_frame': lambda x: x * FRAME - FRAME,
    'unscanned_per_step': lambda x: x + PER_STEP[:x.shape[0]],
    'scalar_literals': lambda x: 2.0 * x + 1.0,
    'iota_position_mask': lambda x: jnp.where(jnp.arange(x.shape[0])[:, None] % 2 == 0, x, -x),
    'select_clamp_pow': lambda x: jnp.where(x > 0, jnp.clip(x, 0, 0.5), x) ** 3,
    'custom_jvp_relu_softplus': lambda x: jax.nn.relu(x) + jax.nn.softplus(x),
    'convert': lambda x: (x * 4).astype(jnp.int32).astype(jnp.float32),
}
SHAPES = {
    'expand_squeeze': lambda x: jnp.expand_dims(x, 1).squeeze(1),
    'broadcast': lambda x: jnp.broadcast_to(x[:, None, :], (x.shape[0], 2, 3)),
    'reshape_trailing': lambda x: x.reshape(x.shape[0], 3, 1).reshape(-1, 3),
    'transpose_internal': lambda x: jnp.transpose(jnp.sin(x.T)),
    'reduce_features': lambda x: jnp.concatenate(
        [x.sum(1, keepdims=True), x.max(1, keepdims=True), jnp.argmax(x, 1)[:, None].astype(x.dtype)],
        axis=1),
    'softmax_features': lambda x: jax.nn.softmax(x, axis=-1),
    'rev_features': lambda x: x[:, ::-1],
    'sort_features': lambda x: jnp.sort(x, axis=1) + jnp.argsort(x, axis=1).astype(x.dtype),
    'static_index': lambda x: x[:, 1:2] * x[:, 0][:, None],
    'stack_unstack': lambda x: (jnp.stack([x, PER_STEP[:x.shape[0]]], axis=1).sum(1)
                                + jnp.stack([x, -x])[1] * sum(jnp.unstack(x, axis=1))[:, None]),
    'top_k_features': lambda x: jnp.concatenate(
        [lax.top_k(x, 2)[0], lax.top_k(x.T, 1, axis=0)[1].T.astype(x.dtype)], axis=1),
}
LINEAR = {
    'dot_free': lambda x: x @ W,
    'dot_rhs_stream': lambda x: (W.T @ x.T).T,
    'dot_batch_unscanned': lambda x: jnp.einsum('th,thk->tk', x, BATCHED[:x.shape[0]]),
    'dot_batch_both': lambda x: jnp.einsum('th,th->t', x, x)[:, None],
    'dot_tril_mask': lambda x: jnp.tril(jnp.ones((x.shape[0],) * 2)) @ x,
    'dot_decay_mask': lambda x: (jnp.tril(0.9 ** (
        jnp.arange(x.shape[0])[:, None] - jnp.arange(x.shape[0])[None, :]).astype(jnp.float32))) @ x,
    'conv_causal': lambda x: conv(x[None], (2, 0))[0],
    'conv_dilated': lambda x: conv(x[None], (4, 0), dilation=2)[0],
    'conv_delayed': lambda x: conv(x[None], (5, -1), dilation=2)[0],
    'conv_depthwise': lambda x: conv(x[None], (2, 0), groups=3, kernel=KERNEL[:, :1])[0],
    'conv_channels_first_depth_multiplier': lambda x: lax.conv_general_dilated(  # [1, 6, T]
        x.T[None], jnp.concatenate([KERNEL[:, :1], KERNEL[:, 1:2]], 2).T, (1,), [(4, 0)],
        rhs_dilation=(2,), dimension_numbers=('NCW', 'OIW', 'NCW'),
        feature_group_count=3)[0].T,
    'conv_time_as_batch': lambda x: conv(x[:, None, :], (1, 1))[:, 0],
    'gather_features': lambda x: x[:, jnp.array([2, 0, 1])],
    'take_along_axis': lambda x: jnp.take_along_axis(x, jnp.arange(x.shape[0])[:, None] % 3, axis=1),
    'dynamic_slice': lambda x: lax.dynamic_slice_in_dim(x, 1, 2, axis=1),
}
TIME = {
    'shift_concat': lambda x: jnp.concatenate([jnp.zeros((1, 3)), x[:-1]]),
    'shift_pad_3': lambda x: shift(x, 3),
    'shift_repeat_first': lambda x: jnp.concatenate([x[:1], x[:-1]]),
    'shifts_mixed': lambda x: x + 0.5 * shift(x, 1) + 0.25 * shift(x, 2),
    'pad_high': lambda x: jnp.pad(x, ((0, 2), (1, 0)))[:x.shape[0], 1:],
    'split_time': lambda x: jnp.concatenate([jnp.ones((1, 3)), jnp.split(x, [x.shape[0] - 1])[0]]),
    'cumsum': lambda x: jnp.cumsum(x, 0),
    'cumprod': lambda x: jnp.cumprod(x, 0),
    'cummax': lambda x: lax.cummax(x, 0),
    'cummin': lambda x: lax.cummin(x, 0),
    'cumlogsumexp': lambda x: lax.cumlogsumexp(x, 0),
    'cumsum_features': lambda x: jnp.cumsum(x, 1),
    'prompt': lambda x: jnp.cumsum(jnp.concatenate([PER_STEP[:2], x]), 0)[2:],
    'cumulative_sum_initial_and_of_bools': lambda x: (
        jnp.cumulative_sum(x, axis=0, include_initial=True)[:-1]
        + jnp.cumsum(x > 0, 0, dtype=jnp.int32).astype(x.dtype)),
    'writes_scatter_and_update_slice': lambda x: lax.dynamic_update_slice(lax.dynamic_update_slice(
        x.at[:, 0].set(0.0).at[2].set(1.0).at[:, 1].add(x[:, 2]).at[3, 2].max(5.0),
        jnp.zeros((2, 1)), (1, 1)), 2 * x[:, :1], (0, 2)),
}
CONTROL = {
    'scan_rnn': lambda x: lax.scan(lambda c, a: (jnp.tanh(c + a), c * a), jnp.zeros(3), x)[1],
    'scan_unscanned_xs': lambda x: lax.scan(
        lambda c, ab: (c + ab[0] * ab[1], c), jnp.zeros(3), (x, PER_STEP[:x.shape[0]]))[1],
    'scan_layers_with_shift': lambda x: lax.scan(
        lambda h, w: (jnp.tanh(h * w[None] + shift(h)), None), x, LAYERS)[0],
    'scan_layers_ys': lambda x: swap(lax.scan(
        lambda h, w: (h * w[None], jnp.cumsum(h, 0)), x, LAYERS)[1])[:, 0],
    'scan_promoted_carry': lambda x: lax.scan(
        lambda c, row: (c * 0.5 + row, None), jnp.zeros(x.shape[0]), x.T)[0][:, None],
    'scan_nested_time': lambda x: lax.scan(
        lambda h, w: (lax.scan(lambda c, a: (c + a * w, c), jnp.zeros(3), h)[1], None), x, LAYERS)[0],
    'cond_traced_index': lambda x: lax.cond(jnp.sum(W) > 0, lambda y: jnp.cumsum(y, 0),
                                            lambda y: shift(y), x),
    'switch_static_index': lambda x: lax.switch(1, [jnp.sin, lambda y: lax.cummax(y, 0)], x),
    'while_per_element': lambda x: lax.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.tanh(c[1] * W[None, :, 0])), (0, x))[1],
    'jit': jax.jit(lambda x: jnp.sin(x) + shift(x)),
    'checkpoint': jax.checkpoint(lambda x: jnp.cumsum(jnp.sin(x), 0)),
    'checkpoint_name': lambda x: jax.ad_checkpoint.checkpoint_name(x, 'a'),
    'sharding_constraint': lambda x: jnp.cumsum(lax.with_sharding_constraint(
        x, jax.sharding.SingleDeviceSharding(jax.devices()[0])), 0),
}


@jax.custom_vjp
def _double(x):
  return 2 * x


_double.defvjp(lambda x: (2 * x, None), lambda _, g: (2 * g,))
CONTROL["custom_vjp"] = lambda x: _double(shift(x))


TABLES = {'elementwise': ELEMENTWISE, 'shapes': SHAPES, 'linear': LINEAR, 'time': TIME,
          'control': CONTROL}
CASES = {f'{kind}-{name}': g for kind, table in TABLES.items() for name, g in table.items()}


@pytest.mark.parametrize('g', list(CASES.values()), ids=list(CASES))
def test_rule(g):
  check_scan(g, rand((T, 3)), prefill=[2])


def _time_at_internal_axes(x):  # xs [T, 2, 3]; inside, time moves to axis 1 for a conv and a shift
  y = conv(swap(x), (2, 0))
  y = y + shift(y, 2, axis=1)
  return swap(jnp.cumsum(y, axis=1)).reshape(x.shape[0], 6)


OTHER_INPUTS = {  # (g, xs, prefill lengths)
    'embedding_lookup_int_tokens': (lambda t: EMBED[t] * jnp.cumsum(EMBED[t], 0),
                                    jnp.asarray(np.arange(T) % 10, jnp.int32), [3]),
    'time_at_internal_axes': (_time_at_internal_axes, rand((T, 2, 3)), [3]),
    'pytree_inputs_and_outputs': (
        lambda xs: {'sum': xs['a'] + xs['b'][:, :1], 'pair': (jnp.cumsum(xs['a'], 0), shift(xs['b']))},
        {'a': rand((T, 3)), 'b': rand((T, 2), seed=9)}, [1, 4]),
    'unscanned_output_is_indexed_per_step': (lambda x: (x, PER_STEP[:x.shape[0]]), rand((T, 3)), [2]),
}


@pytest.mark.parametrize('g, xs, prefill', list(OTHER_INPUTS.values()), ids=list(OTHER_INPUTS))
def test_other_inputs_and_outputs(g, xs, prefill):
  check_scan(g, xs, prefill=prefill)


@pytest.mark.parametrize('dtype,tol', [(jnp.bfloat16, 2e-2), (jnp.int32, 0)])
@pytest.mark.parametrize('name', ['cumsum', 'cummax', 'shift_concat'])
def test_dtypes(dtype, tol, name):
  g = {'cumsum': lambda x: jnp.cumsum(x * x, 0), 'cummax': lambda x: lax.cummax(x + x, 0),
       'shift_concat': lambda x: jnp.concatenate([jnp.zeros((1, 3), x.dtype), x[:-1]]) - x}[name]
  check_scan(g, rand((T, 3), dtype), prefill=[2], rtol=tol, atol=tol)


def test_as_scan_inside_jit_with_traced_weights_and_a_jitted_step():
  @jax.jit
  def run(w, xs):
    f, carry = as_scan(lambda x: jnp.cumsum(x @ w, 0), xs)
    return lax.scan(f, carry, xs)[1]

  xs = rand((T, 3))
  assert_trees_close(run(W, xs), jnp.cumsum(xs @ W, 0), depth=T)
  f, carry = as_scan(functools.partial(jnp.cumsum, axis=0), xs)
  step, outs = jax.jit(f), []
  for x in xs:  # one step at a time, each a call of the compiled step
    carry, y = step(carry, x)
    outs.append(y)
  assert_trees_close(jnp.stack(outs), jnp.cumsum(xs, 0), depth=T)
