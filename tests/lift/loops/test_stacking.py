"""`lift.loops.stack_rows` / `unstack_rows` against `jnp.stack` and indexing."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lift.loops import stack_rows, unstack_rows

from tests.helpers import assert_trees_close


def _rows(n=4):
  return [{'w': jnp.arange(6.0).reshape(2, 3) * (i + 1) - i, 'b': jnp.full((3,), 0.5 * i)}
          for i in range(n)]


def _reference(rows):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *rows)


def _loss(stack):
  def loss(rows):
    stacked = stack(rows)
    weights = jnp.arange(1.0, len(rows) + 1.0)
    return jnp.sum(jnp.sin(stacked['w']) * weights[:, None, None]) + jnp.sum(stacked['b'] ** 3)
  return loss


@pytest.mark.parametrize('wrap', [lambda f: f, jax.jit], ids=['eager', 'jit'])
def test_values_and_derivatives_match_jnp_stack(wrap):
  rows = _rows()
  assert_trees_close(wrap(stack_rows)(rows), _reference(rows))
  assert_trees_close(wrap(jax.grad(_loss(stack_rows)))(rows), jax.grad(_loss(_reference))(rows))
  tangents = jax.tree.map(lambda x: jnp.cos(x) + 1.0, rows)
  assert_trees_close(wrap(lambda r, t: jax.jvp(_loss(stack_rows), (r,), (t,)))(rows, tangents),
                     jax.jvp(_loss(_reference), (rows,), (tangents,)))
  small = [jnp.array([1.0, 2.0]), jnp.array([-1.0, 0.5])]
  cube = lambda stack: lambda r: jnp.sum(stack(r) ** 3)
  assert_trees_close(wrap(jax.hessian(cube(stack_rows)))(small),
                     jax.hessian(cube(lambda r: jnp.stack(r)))(small))


@pytest.mark.parametrize('wrap', [lambda f: f, jax.jit], ids=['eager', 'jit'])
def test_unstack_is_indexing_and_its_gradient_stacks(wrap):
  stacked = _reference(_rows())
  rows = wrap(unstack_rows)(stacked)
  assert len(rows) == 4
  for i, row in enumerate(rows):
    assert_trees_close(row, jax.tree.map(lambda x, i=i: x[i], stacked))

  def loss(unstack):
    return lambda s: sum(jnp.sum(jnp.cos(r['w']) * i) + jnp.sum(r['b']) for i, r in enumerate(unstack(s)))
  by_index = lambda s: [jax.tree.map(lambda x, i=i: x[i], s) for i in range(4)]
  assert_trees_close(wrap(jax.grad(loss(unstack_rows)))(stacked), jax.grad(loss(by_index))(stacked))


def test_gradient_only_for_the_rows_being_differentiated():
  rows = _rows(3)
  grad = jax.grad(lambda middle: jnp.sum(stack_rows([rows[0], middle, rows[2]])['w'] ** 2))(rows[1])
  assert_trees_close(grad, {'w': 2 * rows[1]['w'], 'b': jnp.zeros(3)})


def test_vmap_of_stack_and_unstack():
  batch = jnp.arange(12.0).reshape(2, 2, 3)
  fixed = jnp.ones((2, 3))
  stacked = jax.vmap(lambda w: stack_rows([w, fixed, w * 2]))(batch)
  np.testing.assert_allclose(stacked, jax.vmap(lambda w: jnp.stack([w, fixed, w * 2]))(batch))
  middle = jax.vmap(lambda s: unstack_rows(s)[1], in_axes=2)(jnp.moveaxis(stacked, 0, 2))
  np.testing.assert_allclose(middle, jnp.broadcast_to(fixed, (2, 2, 3)))
  tree = {'batched': jnp.moveaxis(stacked, 0, 2), 'fixed': jnp.arange(6.0).reshape(3, 2)}
  rows = jax.vmap(unstack_rows, in_axes=({'batched': 2, 'fixed': None},))(tree)
  for i, row in enumerate(rows):
    np.testing.assert_allclose(row['batched'], stacked[:, i])
    np.testing.assert_allclose(row['fixed'], jnp.broadcast_to(tree['fixed'][i], (2, 2)))


def test_gradient_slices_read_runtime_row_indices():
  """The split of the gradient is one `unstack_rows`, lowered to dynamic slices, not 4 slices."""
  rows = [jnp.ones((8, 8)) * i for i in range(4)]
  grad = jax.grad(lambda r: jnp.sum(stack_rows(r) ** 2))
  eqns = jax.make_jaxpr(grad)(rows).jaxpr.eqns
  assert [e.primitive.name for e in eqns].count('unstack_rows') == 1
  assert not any(e.primitive.name in ('slice', 'split') for e in eqns)
  hlo = jax.jit(grad).lower(rows).as_text()
  assert hlo.count('stablehlo.dynamic_slice') == 4
  assert not re.search(r'stablehlo.slice .*tensor<1x8x8xf32>', hlo)


def test_all_leaves_share_one_set_of_row_starts():
  """One `stack_rows` and one `unstack_rows` per tree, and one sort for all its leaves."""
  rows = _rows()
  grad = jax.grad(_loss(stack_rows))
  names = [e.primitive.name for e in jax.make_jaxpr(grad)(rows).jaxpr.eqns]
  assert (names.count('stack_rows'), names.count('unstack_rows')) == (1, 1)
  hlo = jax.jit(grad).lower(rows).as_text()
  assert hlo.count('stablehlo.sort') == 1
  assert hlo.count('stablehlo.dynamic_slice') == 8  # 4 rows of 'w' and 4 of 'b'


def test_mixed_float_and_integer_leaves_differentiate():
  """Integer leaves (float0 tangents) next to float ones: grad, jvp and forward-over-reverse."""
  rows = [{'w': jnp.full((2,), 1.0 + i), 'n': jnp.array(i)} for i in range(3)]
  reference = lambda r: jax.tree.map(lambda *xs: jnp.stack(xs), *r)
  loss = lambda stack: lambda w: jnp.sum(
      stack([{'w': wi, 'n': r['n']} for wi, r in zip(w, rows)])['w'] ** 3
      * (stack(rows)['n'][:, None] + 1))
  w = [r['w'] for r in rows]
  t = [jnp.ones(2) * i for i in range(3)]
  assert_trees_close(jax.grad(loss(stack_rows))(w), jax.grad(loss(reference))(w))
  assert_trees_close(jax.jvp(loss(stack_rows), (w,), (t,)), jax.jvp(loss(reference), (w,), (t,)))
  hvp = lambda stack: jax.jvp(jax.grad(loss(stack)), (w,), (t,))[1]
  assert_trees_close(hvp(stack_rows), hvp(reference))
  integer_tangents = [{'w': ti, 'n': np.zeros((), jax.dtypes.float0)} for ti in t]
  tangent_out = jax.jvp(stack_rows, (rows,), (integer_tangents,))[1]
  np.testing.assert_array_equal(tangent_out['w'], jnp.stack(t))
  assert_trees_close(jax.jit(unstack_rows)(reference(rows))[2], rows[2])


def test_integer_bool_and_key_leaves():
  ints = [jnp.arange(3, dtype=jnp.int32) + i for i in range(2)]
  np.testing.assert_array_equal(jax.jit(stack_rows)(ints), jnp.stack(ints))
  np.testing.assert_array_equal(jax.jit(unstack_rows)(jnp.stack(ints))[1], ints[1])
  flags = [jnp.array([True, False]), jnp.array([False, False])]
  np.testing.assert_array_equal(jax.jit(stack_rows)(flags), jnp.stack(flags))
  keys = [jax.random.key(i) for i in range(3)]
  stacked = jax.jit(stack_rows)(keys)
  np.testing.assert_array_equal(jax.random.key_data(stacked),
                                jax.random.key_data(jnp.stack(keys)))
  np.testing.assert_array_equal(jax.random.key_data(unstack_rows(stacked)[2]),
                                jax.random.key_data(keys[2]))


def test_nan_and_inf_rows_keep_their_places():
  """Row starts come from `x[0] > inf`: NaN and inf must not move them."""
  stacked = jnp.array([[jnp.nan, 1.0], [jnp.inf, 2.0], [-jnp.inf, 3.0]])
  rows = jax.jit(unstack_rows)(stacked)
  np.testing.assert_array_equal(jnp.stack(rows), stacked)
  grad = jax.jit(jax.grad(lambda r: jnp.sum(stack_rows(r) * jnp.arange(6.0).reshape(3, 2))))
  np.testing.assert_array_equal(jnp.stack(grad(list(stacked))), jnp.arange(6.0).reshape(3, 2))


def test_errors_name_the_fault():
  with pytest.raises(TypeError, match=r'row 1 is float32\[3\] but row 0 is float32\[2\]'):
    stack_rows([jnp.zeros(2), jnp.zeros(3)])
  with pytest.raises(ValueError, match='at least one'):
    stack_rows([])
  with pytest.raises(ValueError, match='one shared leading axis'):
    unstack_rows({'a': jnp.zeros((2, 3)), 'b': jnp.zeros((3,))})
