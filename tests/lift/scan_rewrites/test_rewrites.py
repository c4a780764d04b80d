"""Each rewrite: where it fires, where it must not, and that values and gradients stay."""
import jax
import jax.numpy as jnp
import pytest
from jax import lax

import lift
from tests.lift.scan_rewrites.programs import (B, H, I, RNN_ARGS, T, XS, W_H, W_X, body_primitives,
                                               check_same, optimized_scans, rnn, scans)


def _dots(eqn):
  return body_primitives(eqn).count('dot_general')


# --- remove_unused_inputs ---------------------------------------------------------

def _unused(xs, ys, w):
  def step(carry, xy):
    (c, dead), (x, _) = carry, xy
    jax.debug.callback(lambda v: None, c)       # an effect reading c: c stays
    return (c + x * w, dead * 2.0), (c, x)      # `dead` feeds only itself
  (c, _), (kept, _) = lax.scan(step, (0.0, 1.0), (xs, ys))
  return c, kept


def test_remove_unused_inputs_drops_dead_carry_output_and_input():
  xs = jnp.arange(5.0)
  (loop,), report = optimized_scans(_unused, xs, xs * 2, 3.0, rewrites=['remove_unused_inputs'])
  assert report.applied == ('remove_unused_inputs',)
  # before: consts w; carries c, dead; xs x, y -> after: c only, x only, 1 stacked output
  assert loop.params['num_carry'] == 1 and len(loop.invars) == 3 and len(loop.outvars) == 2
  assert 'debug_callback' in body_primitives(loop)
  check_same(_unused, (xs, xs * 2, 3.0), rewrites=['remove_unused_inputs'])


def test_remove_unused_inputs_keeps_what_is_read():
  (loop,), report = optimized_scans(rnn, *RNN_ARGS, rewrites=['remove_unused_inputs'])
  assert report.applied == () and len(loop.invars) == 5


# --- push_out_non_seq -------------------------------------------------------------

def _invariant(w, key, xs):
  def step(c, x):
    a = jnp.exp(w) @ w.T                        # invariant: moves
    noise = jax.random.normal(key, c.shape)     # an invariant draw: stays (one per step)
    return jnp.tanh(c @ a + x) + noise, jnp.sin(c)   # carry-dependent: stays
  return lax.scan(step, jnp.ones(3), xs)


def test_push_out_non_seq_moves_invariants_only():
  args = (W_H[:3, :3], jax.random.key(1), jnp.ones((4, 3)))
  (loop,), report = optimized_scans(_invariant, *args, rewrites=['push_out_non_seq'])
  prims = body_primitives(loop)
  assert 'exp' not in prims and 'transpose' not in prims
  assert 'random_bits' in prims and 'tanh' in prims and 'sin' in prims
  assert report.applied == ('push_out_non_seq',)
  check_same(_invariant, args, rewrites=['push_out_non_seq'])


@pytest.mark.parametrize('shift, moved', [(lambda b: b, False), (jnp.exp, True)])
def test_cost_model_leaves_invariant_broadcasts_in_the_loop(shift, moved):
  def f(b, xs):
    return lax.scan(lambda c, x: (jnp.tanh(c + x + shift(b)[None]), None), jnp.zeros((B, 3)), xs)[0]
  (loop,), report = optimized_scans(f, jnp.ones(3), XS, rewrites=None)
  prims = body_primitives(loop)
  assert 'broadcast_in_dim' in prims and 'exp' not in prims and 'only layout equations' in str(report)
  assert report.applied == (('push_out_non_seq',) if moved else ())
  check_same(f, (jnp.ones(3), XS), rewrites=None)


# --- push_out_seq -----------------------------------------------------------------

def test_push_out_seq_batches_the_input_projection():
  (loop,), _ = optimized_scans(rnn, *RNN_ARGS, rewrites=['push_out_seq'])
  assert _dots(loop) == 2              # h @ w_h and h @ w_o stay; x @ w_x left
  check_same(rnn, RNN_ARGS, rewrites=['push_out_seq'])


def _keyed(key, xs):
  def step(key, x):
    key, sub = jax.random.split(key)                       # a key split per step
    return key, x * jax.random.uniform(sub) + jnp.sin(x)   # sin(x): moves
  return lax.scan(step, key, xs)[1]


def test_push_out_seq_leaves_draws_and_carries():
  (loop,), _ = optimized_scans(_keyed, jax.random.key(0), XS, rewrites=['push_out_seq'])
  prims = body_primitives(loop)
  assert 'sin' not in prims and 'random_split' in prims and 'random_bits' in prims
  check_same(_keyed, (jax.random.key(0), XS), rewrites=['push_out_seq'])


@pytest.mark.parametrize('batch, moved', [(2, True), (32, False)])
def test_cost_model_batches_products_on_few_rows_under_grad(batch, moved):
  args = (W_X, W_H, W_X.T, jnp.ones((3, batch, 3)))
  train = jax.grad(lambda *a: lift.optimize_scans(rnn)(*a)[0].sum(), argnums=(0, 1, 2))
  forward, _ = scans(jax.make_jaxpr(train)(*args).jaxpr)
  assert _dots(forward) == (1 if moved else 3)
  (loop,), report = optimized_scans(rnn, *args, rewrites=None)   # not differentiated
  assert _dots(loop) == 3 and 'not differentiated' in str(report)


# --- push_out_scan_output ---------------------------------------------------------

def test_push_out_scan_output_batches_the_output_projection():
  (loop,), report = optimized_scans(rnn, *RNN_ARGS, rewrites=['push_out_scan_output'])
  assert _dots(loop) == 2 and report.applied == ('push_out_scan_output',)
  check_same(rnn, RNN_ARGS, rewrites=['push_out_scan_output'])


def _fed_back(w, xs):
  def step(c, x):
    y = jnp.tanh(c @ w)
    jax.debug.callback(lambda v: None, y)     # an effect at the end of the step
    return y + x, jnp.cos(y)                  # y feeds the carry: stays; cos: moves
  return lax.scan(step, jnp.ones(4), xs)


def test_push_out_scan_output_leaves_carry_work_and_effects():
  (loop,), _ = optimized_scans(_fed_back, W_H, jnp.ones((5, 4)), rewrites=['push_out_scan_output'])
  prims = body_primitives(loop)
  assert 'cos' not in prims and 'tanh' in prims and 'debug_callback' in prims
  check_same(_fed_back, (W_H, jnp.ones((5, 4))), rewrites=['push_out_scan_output'])


# --- push_out_dot1 ----------------------------------------------------------------

_GRAD = jax.grad(lambda *a: jnp.sin(rnn(*a)[0]).sum(), argnums=(0, 1, 2))


def test_push_out_dot1_sums_weight_gradients_after_the_backward_loop():
  _, backward = scans(jax.make_jaxpr(_GRAD)(*RNN_ARGS).jaxpr)
  (_, loop), report = optimized_scans(_GRAD, *RNN_ARGS, rewrites=['push_out_dot1'])
  # dW_x, dW_h, dW_o leave the loop; dh @ W_h^T and dy @ W_o^T stay
  assert (_dots(backward), _dots(loop)) == (5, 2)
  assert loop.params['num_carry'] == backward.params['num_carry'] - 3
  assert 'carry 0 f32[3,4] (gradient of a[0]) sums a dot_general over 2 rows' in str(report)
  check_same(_GRAD, RNN_ARGS, rewrites=['push_out_dot1'])


def _outer_products(xs, ys, w):
  def step(c, xy):
    (acc, n), (x, y) = c, xy
    t = jnp.tanh(y @ w)
    return (acc + (x.T @ t).T, n - jnp.sum(x, 0)), (x * 2.0, t)
  return lax.scan(step, (jnp.ones((3, 3)), jnp.zeros(3)), (xs, ys))


@pytest.mark.parametrize('update, moved', [
    (lambda acc, x, y: acc + x.T @ y, True),
    (lambda acc, x, y: acc + x.T @ (y + jnp.sum(acc)), False),    # the term reads acc
    (lambda acc, x, y: acc + jnp.tanh(x.T @ y), False),           # not linear in the product
    (lambda acc, x, y: 0.9 * acc + x.T @ y, False),               # acc is scaled, not summed
    (lambda acc, x, y: acc + (x.T @ y).astype(int).astype(acc.dtype), False),   # rounded
])
def test_push_out_dot1_only_for_sums_of_products(update, moved):
  def f(xs, ys):
    return lax.scan(lambda acc, xy: (update(acc, *xy), xy[0].sum()), jnp.zeros((3, 4)), (xs, ys))
  args = (XS, jnp.ones((T, B, H)))
  (loop,), _ = optimized_scans(f, *args, rewrites=['push_out_dot1'])
  assert _dots(loop) == (0 if moved else 1)
  check_same(f, args, rewrites=['push_out_dot1'])


def test_push_out_dot1_sums_a_reduce_sum_after_the_loop():
  def f(xs):
    return lax.scan(lambda acc, x: (acc + jnp.sum(jnp.tanh(x), 0), x * 2.0), jnp.ones(I), xs)
  (loop,), report = optimized_scans(f, XS, rewrites=['push_out_dot1'])
  assert loop.params['num_carry'] == 0 and 'carry 0 f32[3] (output[0]) sums a reduce_sum' in str(report)
  check_same(f, (XS,), rewrites=['push_out_dot1'])
  (loop,), report = optimized_scans(f, XS, rewrites=None)   # tanh(x) is not stacked anyway
  assert loop.params['num_carry'] == 1 and 'of values the loop does not stack' in str(report)


def test_push_out_dot1_chain_sequences_and_cost_model():
  args = (XS, XS @ W_X, W_H[:, :3])
  (loop,), _ = optimized_scans(_outer_products, *args, rewrites=['push_out_dot1'])
  assert _dots(loop) == 1 and loop.params['num_carry'] == 1
  assert len(loop.outvars) == 4    # n, x * 2, t, x.T: t is stacked already, not twice
  check_same(_outer_products, args, rewrites=['push_out_dot1'])
  wide = (jnp.ones((T, 32, I)), jnp.ones((T, 32, H)), W_H[:, :3])    # 32 rows per step
  (loop,), report = optimized_scans(_outer_products, *wide, rewrites=None)
  assert _dots(loop) == 2 and 'over 32 rows per step (> 16' in str(report)


# --- save_mem ---------------------------------------------------------------------

def _read(ys):
  return ys[-1], ys[3:5].sum()


@pytest.mark.parametrize('read, steps', [(lambda ys: ys[-1], 1), (_read, 5),
                                         (lambda ys: ys[::2], None), (lambda ys: ys, None),
                                         (lambda ys: ys[jnp.argmax(ys[:, 0])], None)])
def test_save_mem_keeps_only_the_steps_read(read, steps):
  def f(w, xs):
    ys = lax.scan(lambda c, x: (jnp.tanh(c @ w + x), jnp.tanh(c @ w + x)), jnp.ones(4), xs)[1]
    return read(ys)
  xs = jnp.ones((8, 4))
  (loop,), _ = optimized_scans(f, W_H, xs, rewrites=['save_mem'])
  stacked = [v.aval.shape for v in loop.outvars if v.aval.shape[:1] == (8,)]
  assert stacked == ([] if steps else [(8, 4)])
  if steps:
    assert (steps, 4) in [v.aval.shape for v in loop.outvars]
  check_same(f, (W_H, xs), rewrites=['save_mem'])


# --- merge, merge_inouts ----------------------------------------------------------

def _two(xs, w):
  a = lax.scan(lambda c, x: (c + jnp.sin(x * w), jnp.cos(x)), 0.0, xs)
  b = lax.scan(lambda c, x: (jnp.maximum(c, jnp.sin(x * w)), jnp.cos(x)), -1.0, xs)
  return a, b


def test_merge_makes_one_loop_and_merge_inouts_one_input_and_output():
  xs = jnp.arange(6.0)
  (loop,), report = optimized_scans(_two, xs, 2.0, rewrites=['merge', 'merge_inouts'])
  assert report.loops('before') == 2 and report.applied == ('merge', 'merge_inouts')
  assert len(loop.invars) == 4 and len(loop.outvars) == 3    # w, 2 inits, xs; 2 carries, 1 cos
  check_same(_two, (xs, 2.0), rewrites=['merge', 'merge_inouts'])


@pytest.mark.parametrize('second', [
    lambda a, xs: lax.scan(lambda c, x: (c + x, c), 0.0, a[1]),               # reads the first
    lambda a, xs: lax.scan(lambda c, x: (c + x, c), 0.0, xs[:4]),             # another length
    lambda a, xs: lax.scan(lambda c, x: (c + x, c), 0.0, xs, reverse=True),   # other direction
])
def test_merge_must_not(second):
  def f(xs):
    a = lax.scan(lambda c, x: (c * x, c + 1.0), 1.0, xs)
    return a, second(a, xs)
  assert len(optimized_scans(f, jnp.arange(5.0), rewrites=['merge'])[0]) == 2
  check_same(f, (jnp.arange(5.0),), rewrites=['merge'])


def test_merge_inouts_keeps_carries_that_differ():
  def f(xs):
    step = lambda c, x: ((c[0] + x, c[1] * x, c[2] + x), (jnp.sin(x), jnp.sin(x)))
    return lax.scan(step, (1.0, 1.0, 1.0), xs)
  (loop,), _ = optimized_scans(f, jnp.arange(1.0, 5.0), rewrites=['merge_inouts'])
  assert loop.params['num_carry'] == 2 and len(loop.outvars) == 3
  check_same(f, (jnp.arange(1.0, 5.0),), rewrites=['merge_inouts'])


# --- together ---------------------------------------------------------------------

def test_every_rewrite_on_an_rnn_with_jit_vmap_and_grad():
  check_same(rnn, RNN_ARGS)
  fast = lift.optimize_scans(rnn)
  batched = jax.vmap(fast, in_axes=(None, None, None, 0))(*RNN_ARGS[:3], jnp.stack([XS, -XS]))
  check = jax.jit(jax.vmap(rnn, in_axes=(None, None, None, 0)))(*RNN_ARGS[:3], jnp.stack([XS, -XS]))
  for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(check)):
    assert jnp.allclose(a, b, atol=1e-5)


def test_rewriting_before_grad_moves_the_backward_products_too():
  grad = jax.grad(lambda *a: rnn(*a)[0].sum(), argnums=(0, 1, 2))
  fwd_bwd = scans(jax.make_jaxpr(jax.grad(lambda *a: lift.optimize_scans(rnn)(*a)[0].sum(),
                                          argnums=(0, 1, 2)))(*RNN_ARGS).jaxpr)
  plain = scans(jax.make_jaxpr(grad)(*RNN_ARGS).jaxpr)
  assert [_dots(e) for e in plain] == [3, 5]
  assert [_dots(e) for e in fwd_bwd] == [1, 2]    # only the recurrence and its transpose
  check_same(lambda *a: grad(*a), RNN_ARGS, grad=False)   # and the transposed program itself


def test_loops_inside_jit_remat_cond_and_scan():
  def f(w, xs):
    inner = lambda h, x: (jnp.tanh(x @ w + h), None)
    @jax.jit
    @jax.checkpoint
    def g(xs):
      run = lambda xs: lax.scan(inner, jnp.zeros((2, 3)), xs)[0]
      return lax.cond(xs.sum() > 0, run, lambda xs: xs[0], xs)
    outer = lax.scan(lambda c, chunk: (c + g(chunk), None), jnp.zeros((2, 3)), xs)[0]
    return outer
  args = (W_H[:3, :3], jnp.ones((2, 4, 2, 3)))
  loops, report = optimized_scans(f, *args)
  assert report.loops('before') == 2 and 'push_out_seq' in report.applied
  check_same(f, args)


def test_bfloat16_values_and_unknown_names():
  args = tuple(a.astype(jnp.bfloat16) for a in RNN_ARGS)
  check_same(rnn, args, depth=16, grad=False)
  assert str(lift.explain_scans(rnn, *RNN_ARGS, rewrites=[])).startswith('scans: 1 before, 1 after')
