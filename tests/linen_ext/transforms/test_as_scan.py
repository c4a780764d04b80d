"""as_scan at module level: the step derived from a linen_ext model's training-mode apply.

Oracle: the model's apply on the whole sequence. The step runs other programs than
the full apply, so results agree within the tolerance of the model's depth.
"""
import jax
import jax.numpy as jnp
import pytest

import lift
import linen_ext as nn
from examples.causal_lm import TinyLM
from tests.helpers import assert_trees_close

DEPTH = 16  # two blocks of a causal LM: conv, attention, MLP and norms


class CumsumNet(nn.Module):
  @nn.compact
  def __call__(self, x):  # [batch, length, features] or [length, features]
    h = nn.Conv(4, kernel_size=(2,), padding='CAUSAL')(x)
    return nn.Dense(2)(jnp.cumsum(h, axis=-2))


@pytest.fixture(scope='module', params=['lm', 'cumsum'])
def model_and_variables(request):
  if request.param == 'lm':
    model = TinyLM(vocab=11, d_model=16, heads=2, depth=2)
    inputs = jax.random.randint(jax.random.key(0), (2, 9), 0, 11)
  else:
    model, inputs = CumsumNet(), jax.random.normal(jax.random.key(6), (2, 9, 3))
  return model, model.init(jax.random.key(1), inputs), inputs


def run_steps(step, carry, frames):
  return jax.lax.scan(step, carry, frames)[1]


def test_plain_as_scan_of_apply_equals_apply(model_and_variables):
  model, variables, inputs = model_and_variables
  time_first = jnp.moveaxis(inputs, 1, 0)  # [length, batch, ...]
  g = lambda xs: jnp.moveaxis(model.apply(variables, jnp.moveaxis(xs, 0, 1)), 1, 0)
  step, carry = lift.as_scan(g, time_first)
  assert_trees_close(run_steps(step, carry, time_first), g(time_first), DEPTH)


def test_module_as_scan_with_time_axis_equals_apply(model_and_variables):
  model, variables, inputs = model_and_variables
  step, carry = nn.as_scan(model, variables, inputs, time_axis=1)
  outputs = run_steps(step, carry, jnp.moveaxis(inputs, 1, 0))  # [length, batch, ...]
  assert_trees_close(jnp.moveaxis(outputs, 0, 1), model.apply(variables, inputs), DEPTH)


def test_module_as_scan_with_prefill_continues_after_the_prompt(model_and_variables):
  model, variables, inputs = model_and_variables
  step, carry, out_prefill = nn.as_scan(model, variables, inputs, time_axis=1,
                                        prefill=inputs[:, :4])
  full = model.apply(variables, inputs)
  assert_trees_close(out_prefill, full[:, :4], DEPTH)
  rest = run_steps(step, carry, jnp.moveaxis(inputs[:, 4:], 1, 0))
  assert_trees_close(jnp.moveaxis(rest, 0, 1), full[:, 4:], DEPTH)


def test_module_as_scan_defaults_to_time_first():
  xs = jax.random.normal(jax.random.key(5), (6, 3))  # [length, features]
  variables = CumsumNet().init(jax.random.key(0), xs)
  step, carry = nn.as_scan(CumsumNet(), variables, xs)
  assert_trees_close(run_steps(step, carry, xs), CumsumNet().apply(variables, xs), DEPTH)


@pytest.mark.parametrize('prefill', [False, True])
def test_a_time_axis_the_module_keeps_no_state_along_is_refused_naming_the_causal_one(
    model_and_variables, prefill):
  model, variables, inputs = model_and_variables  # [batch, length, ...]
  prompt = {'prefill': inputs[:1]} if prefill else {}
  with pytest.raises(nn.errors.TimeAxisError, match=r'time_axis=0\): nothing in `'
                     rf'{type(model).__name__}.__call__`.*Fix: time_axis=1\.$'):
    nn.as_scan(model, variables, inputs, **prompt)  # time_axis=0: the batch


def test_a_module_without_state_along_any_axis_is_stepped_frame_by_frame():
  model, xs = nn.Dense(2), jax.random.normal(jax.random.key(2), (3, 4, 5))
  variables = model.init(jax.random.key(0), xs)
  step, carry = nn.as_scan(model, variables, xs)
  assert_trees_close(run_steps(step, carry, xs), model.apply(variables, xs), 1)


def test_causal_lm_example_generates_what_full_recomputation_generates():
  from examples import causal_lm
  with jax.numpy_dtype_promotion('standard'):  # optax's adam relies on implicit promotion
    _, same = causal_lm.main(steps=5)
  assert same
