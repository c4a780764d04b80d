"""Hypothesis: random scan bodies, and their backward loops, keep their values and gradients
under every rewrite."""
import jax
import jax.numpy as jnp
from hypothesis import given, strategies as st
from jax import lax

from tests.helpers import property_settings
from tests.lift.scan_rewrites.programs import check_same, loss

N, T = 3, 5
OPS = ('add', 'mul', 'tanh', 'sin', 'matmul')
READS = ('all', 'last', 'window')


@st.composite
def bodies(draw):
  """A body as a list of (op, operand, operand) over a pool of values: the loop
  constant, the carry, the step's input, then each op's result in turn."""
  n_ops = draw(st.integers(1, 6))
  ops = []
  for i in range(n_ops):
    pool = 3 + i
    ops.append((draw(st.sampled_from(OPS)), draw(st.integers(0, pool - 1)),
                draw(st.integers(0, pool - 1))))
  size = 3 + n_ops
  outputs = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=3))
  return (ops, draw(st.integers(0, size - 1)), outputs, draw(st.sampled_from(READS)),
          draw(st.booleans()), draw(st.booleans()))


def _build(ops, carry_out, outputs, read, twice, backward):
  def body(w, c, h, x):
    pool = [c, h, x]
    for op, a, b in ops:
      u, v = pool[a], pool[b]
      pool.append({'add': u + v, 'mul': u * v, 'tanh': jnp.tanh(u), 'sin': jnp.sin(u + v),
                   'matmul': u @ w}[op])
    return jnp.tanh(pool[carry_out]), [pool[i] for i in outputs]

  def f(w, c, xs):
    loop = lambda c0: lax.scan(lambda h, x: body(w, c, h, x), c0, xs)
    h, ys = loop(jnp.ones(N))
    if twice:   # a second loop over the same sequence: merge
      h2, ys2 = loop(jnp.zeros(N))
      h, ys = h + h2, ys + ys2
    pick = {'all': lambda y: y, 'last': lambda y: y[-1], 'window': lambda y: y[1:3]}[read]
    return h, [pick(y) for y in ys]
  # the gradient's backward loop sums `w`'s gradient step by step: push_out_dot1
  return jax.grad(loss(f), argnums=(0, 1)) if backward else f


@property_settings(max_examples=12)
@given(bodies())
def test_random_bodies_keep_values_and_gradients(program):
  w = jax.random.normal(jax.random.key(0), (N, N)) * 0.5
  xs = jax.random.normal(jax.random.key(1), (T, N))
  check_same(_build(*program), (w, jnp.linspace(-1.0, 1.0, N), xs), depth=16, grad=not program[-1])
