"""`as_scan` API: semantics, prefill, prompts, registry, and the error messages of non-causal primitives."""
import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive

import lift
from lift import as_scan, as_scan_with_prefill, register_scan_rule
from lift.causal import api, attention, custom, forms, interpreter, stateless, testing
from lift.causal import ScanCarry
from lift.causal.testing import check_scan

from tests.helpers import assert_trees_close

T = 6
XS = jnp.asarray(np.random.default_rng(0).standard_normal((T, 3)), jnp.float32)


def shift(x):
  return jnp.concatenate([jnp.zeros((1, x.shape[1]), x.dtype), x[:-1]])


def g(x):
  return jnp.cumsum(jnp.tanh(x), 0) + shift(x)


@pytest.mark.parametrize('obj,module', [
    (api, api), (custom, custom), (attention, attention), (interpreter, interpreter),
    (testing, testing), (forms, forms), (lift.causal_self_attention, attention)],
    ids=['api', 'custom', 'attention', 'interpreter', 'testing', 'forms', 'causal_self_attention'])
def test_docstring_examples(obj, module):
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  tests = doctest.DocTestFinder().find(obj, globs=dict(vars(module)))
  for test in tests:
    runner.run(test)
  assert tests and runner.failures == 0


def test_semantics_prefix_equation_and_shape_dtype_struct_examples():
  # g(xs)[:t] == g(xs[:t]) == scan(f, carry, xs[:t]) for every t.
  f, carry = as_scan(g, XS)
  scanned = jax.jit(lambda xs: lax.scan(f, carry, xs)[1])
  full = jax.jit(g)
  for t in (1, 4, T):
    want = full(XS[:t])
    assert_trees_close(full(XS)[:t], want)
    assert_trees_close(scanned(XS[:t]), want, depth=T)
  f, carry = as_scan(g, jax.ShapeDtypeStruct((T, 3), jnp.float32))  # example xs as structs
  assert isinstance(carry, ScanCarry)
  assert_trees_close(lax.scan(f, carry, XS)[1], g(XS), depth=T)


@pytest.mark.parametrize('length', [0, 1, T])
def test_prefill_lengths(length):
  f, carry, out = as_scan_with_prefill(g, XS, XS[:length])
  assert_trees_close(out, g(XS)[:length], depth=T)
  if length < T:
    assert_trees_close(lax.scan(f, carry, XS[length:])[1], g(XS)[length:], depth=T)


def test_prompt_concatenated_inside_the_function():
  prompt = jnp.asarray(np.random.default_rng(1).standard_normal((4, 3)), jnp.float32)
  check_scan(lambda xs: g(jnp.concatenate([prompt, xs]))[len(prompt):], XS, prefill=[2])


def test_generation_feeds_outputs_back():
  weights = jnp.asarray(np.random.default_rng(2).standard_normal((5, 5)), jnp.float32)

  def logits(tokens):
    x = jax.nn.one_hot(tokens, 5)
    return jnp.cumsum(x, 0) @ weights + shift(x) @ weights.T

  @jax.jit
  def generate(first):
    f, carry = as_scan(logits, jax.ShapeDtypeStruct((T,), jnp.int32))
    def body(state, _):
      carry, token = state
      carry, out = f(carry, token)
      token = jnp.argmax(out).astype(jnp.int32)
      return (carry, token), token
    return lax.scan(body, (carry, first), None, length=T)[1]

  tokens = generate(jnp.int32(3))
  inputs = jnp.concatenate([jnp.array([3], jnp.int32), tokens[:-1]])
  np.testing.assert_array_equal(jnp.argmax(logits(inputs), -1), tokens)


def test_register_scan_rule_for_a_new_primitive():
  twice_p = Primitive('lift_test_twice')
  twice_p.def_impl(lambda x: 2 * x)
  twice_p.def_abstract_eval(lambda x: x)
  with pytest.raises(lift.ScanConversionError, match='no rule for primitive `lift_test_twice`'):
    as_scan(twice_p.bind, XS)

  def twice_rule(eqn, **params):
    assert not params
    return stateless(eqn, [eqn.operands[0].stream], lambda i, a: [2 * a[0]])

  register_scan_rule(twice_p, twice_rule)
  f, carry = as_scan(lambda x: jnp.cumsum(twice_p.bind(x), 0), XS)
  assert_trees_close(lax.scan(f, carry, XS)[1], jnp.cumsum(2 * XS, 0), depth=T)
  assert issubclass(lift.ScanConversionError, lift.LiftError)


def conv_ahead(x):
  return lax.conv_general_dilated(x[None], jnp.ones((3, 3, 3)), (1,), [(0, 2)],
                                  dimension_numbers=('NWC', 'WIO', 'NWC'))[0]


NOT_CAUSAL = {
    'reverse': (lambda x: x[::-1], '`rev`.*reverses the scan axis'),
    'mean_over_time': (lambda x: x - x.mean(0, keepdims=True), '`reduce_sum`.*scan axis'),
    'look_ahead': (lambda x: jnp.concatenate([x[1:], x[:1]]), '`slice`.*anti-causal'),
    'reverse_cumsum': (lambda x: lax.cumsum(x, 0, reverse=True), '`cumsum`.*reverse'),
    'anti_causal_conv': (conv_ahead, '`conv_general_dilated`.*anti-causal'),
    'reverse_scan': (lambda x: lax.scan(lambda c, a: (c + a, c), jnp.zeros(3), x, reverse=True)[1],
                     '`scan`.*reverse'),
    'final_carry': (lambda x: x * lax.scan(lambda c, a: (c + a, c), jnp.zeros(3), x)[0][None],
                    'final carry'),
    'all_pairs': (lambda x: x @ x.T, '`dot_general`.*pairs every position'),
    'dense_over_time': (lambda x: jnp.ones((T, T)) @ x, '`dot_general`.*contracts the scan axis'),
    'outer_sum': (lambda x: (x[:, None, :] + x[None, :, :]).sum(1),
                  '`reduce_sum`.*key time.*not masked'),
    'flatten_time': (lambda x: x.reshape(-1)[::-1].reshape(T, 3), '`reshape`.*merging'),
    'gather_time': (lambda x: x[jnp.array([1, 0, 2, 3, 5, 4])], '`gather`.*gathers along the scan axis'),
    'sort_time': (lambda x: jnp.sort(x, axis=0), '`sort`.*sorts along'),
    'top_k_time': (lambda x: lax.top_k(x, T, axis=0)[0], '`top_k`.*top k along'),
    'while_loop_keeping_state': (lambda x: lax.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.cumsum(c[1], 0)), (0, x))[1],
                                 '`while`.*keeps state along time'),
    'cond_branches_differ': (lambda x: lax.cond(  # time on axis 0, or 1
        jnp.sum(XS) > 0, lambda y: jnp.broadcast_to(y[:, :1], (T, T)),
        lambda y: jnp.broadcast_to(y[:, 0], (T, T)), x),
                             '`cond`.*branches give results that vary along time differently'),
    'scatter_at_positions_from_data': (lambda x: x.at[jnp.argmax(x, 1)].set(0.0),
                                       '`scatter`.*positions vary along time'),
    'strided': (lambda x: jnp.repeat(x[::2], 2, axis=0), '`slice`.*stride'),
    'first_element': (lambda x: x * x[0][None], '`squeeze`.*removes the scan axis'),
}


@pytest.mark.parametrize('fn,match', list(NOT_CAUSAL.values()), ids=list(NOT_CAUSAL))
def test_not_causal_raises_naming_the_primitive(fn, match):
  with pytest.raises(lift.ScanConversionError, match=match) as info:
    as_scan(fn, XS)
  assert 'test_as_scan.py' in str(info.value)


def test_an_error_at_a_loop_the_library_emits_names_the_users_line():
  backwards = lift.loops.scan(lambda c, x: (c + x, c), reverse=True)
  with pytest.raises(lift.ScanConversionError, match='runs in reverse') as info:
    lift.as_scan(lambda xs: backwards(0.0, xs)[1], jnp.ones(4))
  first_line = str(info.value).splitlines()[0]
  assert 'test_as_scan.py' in first_line and 'lift/loops' not in first_line, first_line
