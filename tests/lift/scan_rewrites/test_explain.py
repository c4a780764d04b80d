"""`explain_scans`' report: loops by role and line, values by what they hold, a summary."""
import inspect

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import lift
from tests.lift.scan_rewrites.programs import B, H, T, W_H, W_X, XS

VARIABLES = {'params': {'cell': {'w_x': W_X, 'w_h': W_H}}}


def rnn_loss(variables, x):
  w = variables['params']['cell']

  def step(h, x_t):
    h = jnp.tanh(x_t @ w['w_x'] + h @ w['w_h'])
    return h, h
  _, hs = lax.scan(step, jnp.zeros((B, H)), x)
  return jnp.sum(hs ** 2)


SCAN_LINE = inspect.getsource(rnn_loss).splitlines().index(
    '  _, hs = lax.scan(step, jnp.zeros((B, H)), x)') + rnn_loss.__code__.co_firstlineno


@pytest.fixture(scope='module')
def training_step():
  return lift.explain_scans(jax.value_and_grad(rnn_loss), VARIABLES, XS)


def test_report_names_loops_by_role_and_line_and_values_by_path(training_step):
  lines = str(training_step).splitlines()
  assert lines[0].startswith('scans: 2 before, 2 after; ') and 'equation(s) moved out of loops' in lines[0]
  place = f'rnn_loss, line {SCAN_LINE} ('
  assert lines[1].startswith(f'loop 1, forward: {place}') and lines[1].endswith(f', {T} steps')
  backward = lines.index(next(line for line in lines if line.startswith('loop 2')))
  assert lines[backward].startswith(f'loop 2, backward of loop 1: {place}')
  forward_part, backward_part = '\n'.join(lines[2:backward]), '\n'.join(lines[backward:])
  assert 'x @ variables/params/cell/w_x' in forward_part    # the batched input projection
  assert 'sequence 0 f32[6,2,3] (x)' in forward_part          # the input the loop stops reading
  for name in ('w_x', 'w_h'):
    assert f'(gradient of variables/params/cell/{name}) sums a dot_general over {B} rows' in backward_part


def test_report_data_matches_its_text(training_step):
  report = training_step
  assert [(i.number, i.role, i.forward, i.parent, i.function, i.line) for i in report.loop_info] == [
      (1, 'forward', None, None, 'rnn_loss', SCAN_LINE), (2, 'backward', 1, None, 'rnn_loss', SCAN_LINE)]
  by_loop = {n: [d.rewrite for d in report.decisions if d.loop == n] for n in (1, 2)}
  assert by_loop == {1: ['merge_inouts', 'push_out_seq', 'remove_unused_inputs'],
                     2: ['push_out_dot1', 'push_out_dot1', 'remove_unused_inputs']}
  assert len(report.decisions) == 6 and report.equations_moved == sum(d.moved for d in report.decisions)
  assert report.equations_moved > 0 and str(report).startswith(report.summary())


def _inner(w, xs):
  return lax.scan(lambda h, x: (jnp.tanh(x @ w['w_x'] + h @ w['w_h']),) * 2, jnp.zeros((B, H)), xs)[1]


def _outer(variables, xss):
  return lax.scan(lambda c, xs: (c + _inner(variables['params'], xs).sum(), None), 0.0, xss)[0]


def test_nested_loops_under_jit_are_paired_with_their_forward_loops():
  report = lift.explain_scans(jax.grad(jax.jit(_outer)), {'params': VARIABLES['params']['cell']},
                              jnp.stack([XS[:3], XS[3:]]))
  info = {(i.function, i.role): i for i in report.loop_info}
  outer, inner = info['_outer', 'forward'], info['_inner', 'forward']
  outer_back, inner_back = info['_outer', 'backward'], info['_inner', 'backward']
  assert (outer.parent, inner.parent, outer_back.parent, inner_back.parent) == (
      None, outer.number, None, outer_back.number)
  assert (outer_back.forward, inner_back.forward) == (outer.number, inner.number)
  assert f'loop {inner_back.number}, backward of loop {inner.number}, nested in loop {outer_back.number}: ' \
      '_inner, line' in str(report)
  assert 'gradient of variables/params/w_h' in str(report)


def test_summary_counts_the_bytes_a_rewrite_saves():
  def last(xs, w):
    return lax.scan(lambda h, x: (jnp.tanh(x @ w + h),) * 2, jnp.zeros((B, H)), xs)[1][-1]
  report = lift.explain_scans(last, XS, W_X, rewrites=['save_mem'])
  saved = (T - 1) * B * H * 4 - T * 4    # T - 1 of T f32[B, H] steps, less the int32 step index
  assert report.bytes_saved == saved and f'{saved} B saved' in report.summary()
  assert 'output 0 f32[6,2,4] keeps only steps [5, 6) of 6' in str(report)


def test_a_product_left_in_the_loop_is_named_with_its_rows():
  report = lift.explain_scans(rnn_loss, VARIABLES, XS)    # not differentiated: nothing pays
  (decision,) = report.decisions
  assert not decision.applied and decision.loop == 1
  assert decision.detail == (f'x @ variables/params/cell/w_x stays in the loop: a product on {B} rows '
                             'per step, not differentiated (batching pays in the backward pass)')
