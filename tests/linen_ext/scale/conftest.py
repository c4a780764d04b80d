"""Fixtures of the at-scale tests: the abstract chips they compile for, and the type
promotion the models need."""
import jax
import pytest

import linen_ext as nn


@pytest.fixture(scope='module')
def standard_promotion():
  """Flax's RMSNorm promotes its bfloat16 input with float32, and optax's AdamW its int32
  step count with Python floats, implicitly."""
  with jax.numpy_dtype_promotion('standard'):
    yield


@pytest.fixture(scope='session')
def chips():
  """Four abstract TPU v5e chips (v5e:2x2)."""
  return nn.tpu_topology('v5e-4')
