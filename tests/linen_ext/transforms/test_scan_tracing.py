"""How often `scan` traces its step: once where a second trace would make the same program.

The pre-pass traces one step (to find loop-invariant writes and carried
variables). Flax traces its body twice, or once with
``check_constancy_invariants=False``. Where the step creates no variables and
draws the same keys when traced again (no rng draws, or only draws that every
trace repeats, as ``check_constancy_invariants=False`` asks), the loop runs the
pre-pass's trace; otherwise the step is traced again, with Flax's keys.
"""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

import linen_ext as nn
from tests.helpers import assert_trees_close, assert_trees_equal

KEY = jax.random.key(0)
XS = jnp.linspace(-1.0, 1.0, 24).reshape(3, 2, 4)


def counted(lib, check, dropout=False):
  traces = []

  class Cell(lib.Module):
    @lib.compact
    def __call__(self, c, x):
      traces.append(1)
      h = lib.Dense(4)(c) + x
      if dropout:
        h = lib.Dropout(0.5, deterministic=False)(h)
      return h, h

  scanned = lib.scan(Cell, variable_axes={'params': 0}, length=3,
                     split_rngs={'params': True, 'dropout': True},
                     check_constancy_invariants=check)
  return scanned(), traces


@pytest.mark.parametrize('check, dropout, init_traces, apply_traces', [
    (True, False, 2, 1), (False, False, 1, 1), (True, True, 2, 2)])
def test_init_and_apply_trace_as_needed_for_flax_values(check, dropout, init_traces,
                                                         apply_traces):
  """Init draws split 'params' keys: Flax's keys need the second trace, unless
  check_constancy_invariants=False, where every trace draws the first trace's keys. Apply
  reuses the pre-pass's trace (Flax: 2 traces with the check, 1 without), unless the step
  draws new keys (dropout): then it is traced again, for Flax's keys."""
  model, traces = counted(nn, check, dropout)
  reference, flax_traces = counted(flax_nn, check, dropout)
  variables = model.init(KEY, XS[0], XS)
  assert_trees_equal(variables, reference.init(KEY, XS[0], XS))
  assert len(traces) == len(flax_traces) == init_traces
  traces.clear()
  rngs = {'dropout': jax.random.key(1)}
  y = model.apply(variables, XS[0], XS, rngs=rngs)
  assert len(traces) == apply_traces
  assert_trees_equal(y, reference.apply(variables, XS[0], XS, rngs=rngs))


def test_remat_policies_run_the_reused_trace():
  class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, x):
      return jnp.tanh(nn.Dense(4)(c) + x), None

  def loss(variables, remat):
    scanned = nn.scan(Cell, variable_axes={'params': 0}, split_rngs={'params': True},
                      length=3, remat=remat)()
    return jnp.sum(scanned.apply(variables, XS[0], XS)[0] ** 2)

  variables = nn.scan(Cell, variable_axes={'params': 0}, split_rngs={'params': True},
                      length=3)().init(KEY, XS[0], XS)
  expected = jax.grad(loss)(variables, False)
  for remat in (True, 'nested', 'save_all'):  # 3 steps of Dense and tanh, and their gradients
    assert_trees_close(jax.grad(loss)(variables, remat), expected, depth=6)


def test_broadcast_params_created_in_the_body_are_kept_without_the_check():
  """Flax with check_constancy_invariants=False silently drops broadcast params created in the
  body; ours keeps them (never silently dropped), equal to Flax's default."""
  def init(lib, **flag):
    class Cell(lib.Module):
      @lib.compact
      def __call__(self, c, x):
        return c + lib.Dense(4)(x), None

    layers = lib.scan(Cell, variable_broadcast='params', split_rngs={'params': False}, **flag)
    return layers().init_with_output(KEY, jnp.zeros((2, 4)), XS)
  assert init(flax_nn, check_constancy_invariants=False)[1] == {}
  assert_trees_equal(init(nn, check_constancy_invariants=False), init(flax_nn))
