"""as_scan at module level: the step derived from a linen_ext model's training-mode apply."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lift
import linen_ext as nn
from examples.causal_lm import TinyLM


@pytest.fixture(scope='module')
def model_and_variables():
  model = TinyLM(vocab=11, d_model=16, heads=2, depth=2)
  tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, 11)
  return model, model.init(jax.random.key(1), tokens), tokens


def run_steps(step, carry, frames):
  return jax.lax.scan(step, carry, frames)[1]


def test_plain_as_scan_of_apply_equals_apply(model_and_variables):
  model, variables, tokens = model_and_variables
  time_first = tokens.T  # [length, batch]
  g = lambda xs: jnp.moveaxis(model.apply(variables, xs.T), 1, 0)
  step, carry = lift.as_scan(g, time_first)
  np.testing.assert_allclose(run_steps(step, carry, time_first), g(time_first), atol=1e-5)


def test_module_as_scan_with_time_axis_equals_apply(model_and_variables):
  model, variables, tokens = model_and_variables
  step, carry = nn.as_scan(model, variables, tokens, time_axis=1)
  logits = run_steps(step, carry, tokens.T)  # [length, batch, vocab]
  np.testing.assert_allclose(jnp.moveaxis(logits, 0, 1), model.apply(variables, tokens), atol=1e-5)


def test_module_as_scan_with_prefill_continues_after_the_prompt(model_and_variables):
  model, variables, tokens = model_and_variables
  step, carry, out_prefill = nn.as_scan(model, variables, tokens, time_axis=1, prefill=tokens[:, :4])
  full = model.apply(variables, tokens)
  np.testing.assert_allclose(out_prefill, full[:, :4], atol=1e-5)
  rest = run_steps(step, carry, tokens[:, 4:].T)
  np.testing.assert_allclose(jnp.moveaxis(rest, 0, 1), full[:, 4:], atol=1e-5)


class LooksAhead(nn.Module):
  @nn.compact
  def __call__(self, x):  # [batch, length, features]
    return nn.Conv(4, kernel_size=(3,), padding='SAME')(x)


def test_non_causal_module_raises_naming_the_primitive():
  x = jnp.ones((1, 6, 2))
  variables = LooksAhead().init(jax.random.key(0), x)
  with pytest.raises(lift.ScanConversionError, match='conv_general_dilated'):
    nn.as_scan(LooksAhead(), variables, x, time_axis=1)


def test_causal_lm_example_generates_what_full_recomputation_generates():
  from examples import causal_lm
  with jax.numpy_dtype_promotion('standard'):  # optax's adam relies on implicit promotion
    _, same = causal_lm.main(steps=5)
  assert same
