"""The loop engine: every checkpoint policy computes lax.scan's values and gradients; what each keeps."""
import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import lift
from lift import loops
from lift.loops import ScanCheckpointPolicy, policies

from tests.helpers import assert_trees_close, cheap_jit

POLICIES = [
    True, "full", "nested", "save_all", "offload",
    ScanCheckpointPolicy(nested=5),
    ScanCheckpointPolicy(nested=1),
    ScanCheckpointPolicy(save_block_internals=["h"]),
    ScanCheckpointPolicy(offload_block_internals=["h"]),
    ScanCheckpointPolicy(save_carries="offload", nested=True),
    ScanCheckpointPolicy(save_inputs="offload"),
    ScanCheckpointPolicy(offload_block_internals=["h"], save_carries="offload"),
    ScanCheckpointPolicy(save_block_internals=True, offload_block_internals=["h"]),
    ScanCheckpointPolicy(prevent_cse=True),
    ScanCheckpointPolicy(jax_policy=jax.checkpoint_policies.dots_saveable),
]

CARRY, FEATURES = 5, 4


def policy_id(remat):
  """A short test id: the fields that differ from the defaults."""
  if not isinstance(remat, ScanCheckpointPolicy):
    return str(remat)
  default = ScanCheckpointPolicy()
  return ",".join(f"{name}={value}" for name, value in vars(remat).items()
                  if value != getattr(default, name))


def body(carry, x):
  h = loops.checkpoint_name(jnp.sin(carry) * jnp.sum(x), "h")
  return jnp.cos(h) + carry, h * 2.0


def python_scan(f, init, xs, reverse=False):
  """The oracle: lax.scan written as a Python loop."""
  carry, ys = init, [None] * xs.shape[0]
  order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
  for t in order:
    carry, ys[t] = f(carry, xs[t])
  return carry, jnp.stack(ys)


def loss(init, xs, remat, reverse=False, unroll=1, scan=loops.run_scan):
  carry, ys = scan(body, init, xs, remat=remat, reverse=reverse, unroll=unroll)
  return jnp.sum(carry ** 2) + jnp.sum(jnp.tanh(ys))


def inputs(steps):
  init = jnp.linspace(-1.0, 1.0, CARRY)
  xs = jnp.linspace(-0.5, 0.5, steps * FEATURES).reshape(steps, FEATURES)
  return init, xs


def residual_shapes(f, *args):
  """Shapes of what `f`'s backward pass keeps: the leaves of its vjp function."""
  _, vjp = jax.vjp(f, *args)
  return [leaf.shape for leaf in jax.tree.leaves(vjp)]


def final(remat):
  return lambda i, x: jnp.sum(loops.run_scan(body, i, x, remat=remat)[0])


@pytest.fixture(autouse=True)
def _quiet_offload_fallback():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", loops.OffloadFallbackWarning)
    yield


@functools.cache
def no_remat_value_and_grad(reverse):
  return jax.value_and_grad(loss, (0, 1))(*inputs(13), False, reverse)


@pytest.mark.parametrize("remat", POLICIES, ids=policy_id)
@pytest.mark.parametrize("reverse", [False, True])
def test_every_policy_matches_no_remat(remat, reverse):
  got = jax.value_and_grad(loss, (0, 1))(*inputs(13), remat, reverse, 2)
  assert_trees_close(got, no_remat_value_and_grad(reverse), depth=13)


@pytest.mark.parametrize("remat", [False, True, "nested"])
def test_run_scan_is_lax_scan_is_python_loop(remat):
  init, xs = inputs(7)
  got = loops.run_scan(body, init, xs, remat=remat, reverse=True)
  assert_trees_close(got, python_scan(body, init, xs, True), depth=7)
  assert_trees_close(got, lax.scan(body, init, xs, reverse=True), depth=7)


@pytest.mark.parametrize("remat", [False, True, ScanCheckpointPolicy(nested=2)])
def test_xs_none_with_length(remat):
  count = lambda c, _: (c + 1.0, c)
  carry, ys = loops.run_scan(count, jnp.float32(0.0), None, length=5, remat=remat)
  assert float(carry) == 5.0 and ys.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_zero_steps():
  init, xs = inputs(0)
  carry, ys = loops.run_scan(body, init, xs, remat="nested")
  np.testing.assert_array_equal(carry, init)
  assert ys.shape == (0, CARRY)


def test_fold_jit_and_grad_under_nested():
  init, xs = inputs(12)
  fold = loops.fold(lambda c, x: body(c, x)[0], remat="nested")
  f = jax.jit(jax.grad(lambda i: jnp.sum(fold(i, xs))))
  want = jax.grad(lambda i: jnp.sum(python_scan(body, i, xs)[0]))(init)
  assert_trees_close(f(init), want, depth=12)


def test_forward_mode_under_nested_names_the_policy_and_full_gives_the_same_jvp():
  init, xs = inputs(6)
  run = lambda remat: lambda i: loops.fold(lambda c, x: body(c, x)[0], remat=remat)(i, xs)
  with pytest.raises(lift.errors.NestedForwardModeError, match="remat='nested'.*Fix: .*'full'"):
    jax.jvp(run("nested"), (init,), (init,))
  assert isinstance(lift.errors.NestedForwardModeError(), TypeError)
  want = jax.jvp(lambda i: python_scan(body, i, xs)[0], (init,), (init,))
  assert_trees_close(jax.jvp(run("full"), (init,), (init,)), want, depth=6)


NOTHING = jax.checkpoint_policies.nothing_saveable
KEPT = [  # (remat, the residual shapes at 12 steps, sorted)
    (True, [(12, FEATURES), (12, CARRY)]),
    (ScanCheckpointPolicy(save_block_internals=["h"]), [(12, FEATURES), (12, CARRY), (12, CARRY)]),
    (ScanCheckpointPolicy(save_block_internals=["not_a_name"]), [(12, FEATURES), (12, CARRY)]),
    # Entries of blocks 1.. in a buffer sized for the backward pass (4 rows), and init itself.
    ("nested", [(4, CARRY), (CARRY,), (12, FEATURES)]),
    (ScanCheckpointPolicy(jax_policy=NOTHING), [(12, FEATURES), (12, CARRY)]),
    (NOTHING, [(12, FEATURES), (12, CARRY)]),  # taken as ScanCheckpointPolicy(jax_policy=)
]


@pytest.mark.parametrize("remat, kept", KEPT, ids=["full", "save-h", "save-unknown-name", "nested",
                                                 "jax-nothing", "bare-jax-nothing"])
def test_what_each_policy_keeps(remat, kept):
  init, xs = inputs(12)
  assert sorted(residual_shapes(final(remat), init, xs)) == kept


def test_save_all_and_everything_saveable_keep_what_no_remat_keeps():
  init, xs = inputs(12)
  kept = lambda remat: residual_shapes(final(remat), init, xs)
  everything = ScanCheckpointPolicy(jax_policy=jax.checkpoint_policies.everything_saveable)
  assert len(kept(False)) > 2 and len(kept("save_all")) == len(kept(False))
  assert kept(everything) == kept("save_all")
  assert_trees_close(jax.grad(final(everything))(init, xs), jax.grad(final(False))(init, xs), 12)
  assert loops.resolve_remat(jax.checkpoint_policies.dots_saveable) == \
      ScanCheckpointPolicy(jax_policy=jax.checkpoint_policies.dots_saveable)
  assert loops.plan_blocks(12, True).saved_carries == 4


@pytest.mark.parametrize("steps,remat", [(13, "nested"), (13, ScanCheckpointPolicy(nested=5)),
                                          (64, "nested"), (61, "nested")],
                         ids=["13-auto", "13-5blocks", "64-auto", "61-auto"])
def test_nested_saves_fewer_carries_for_any_length(steps, remat):
  init, xs = inputs(steps)
  shapes = residual_shapes(final(remat), init, xs)
  rows = sum(math.prod(shape[:-1]) for shape in shapes if shape[-1:] == (CARRY,))
  assert rows <= math.isqrt(2 * steps) + 2 if remat == "nested" else rows < steps


def check_plan(plan, steps):
  assert sum(plan.lengths) == steps and min(plan.lengths) >= 1
  # Block j's recomputes run while block j+1 is pulled back, one per pull.
  assert all(a <= b + 1 for a, b in zip(plan.lengths, plan.lengths[1:]))
  assert plan.saved_carries == plan.slots - 1


def test_plan_blocks_covers_every_step_with_sqrt_2n_carries():
  for steps in range(1, 300):
    plan = loops.plan_blocks(steps, True)
    check_plan(plan, steps)
    # The fewest slots one recomputation allows: M(M+1)/2 >= N.
    assert plan.slots * (plan.slots + 1) // 2 >= steps > (plan.slots - 1) * plan.slots // 2
    for blocks in {1, 2, 3, plan.blocks + 1, steps} & set(range(1, steps + 1)):
      check_plan(loops.plan_blocks(steps, blocks), steps)
      assert loops.plan_blocks(steps, blocks).blocks == blocks
  assert loops.plan_blocks(13, True) == loops.BlockPlan((3, 4, 3, 2, 1))
  assert loops.plan_blocks(64, True).saved_carries == 10
  assert loops.plan_blocks(12, 3) == loops.BlockPlan((5, 4, 3))
  assert loops.plan_blocks(13, 1) == loops.BlockPlan((13,))


@pytest.mark.parametrize("steps", [1, 2, 3, 6, 13])
def test_nested_is_lax_scan_of_jax_checkpoint_for_every_block_count(steps):
  init, xs = inputs(steps)
  checkpointed = lambda f, c, x, remat, reverse, unroll: lax.scan(jax.checkpoint(f), c, x,
                                                                    reverse=reverse)
  grad = cheap_jit(jax.value_and_grad(loss, (0, 1)), static_argnums=(2, 3, 4, 5))
  for reverse in (False, True):
    want = grad(init, xs, False, reverse, 1, checkpointed)
    for blocks in [True] + sorted({1, 2, 3, steps // 2 + 1, steps} & set(range(1, steps + 1))):
      policy = ScanCheckpointPolicy(nested=blocks)
      assert_trees_close(loops.run_scan(body, init, xs, remat=policy, reverse=reverse, unroll=2),
                         lax.scan(jax.checkpoint(body), init, xs, reverse=reverse), depth=steps)
      assert_trees_close(grad(init, xs, policy, reverse, 2, loops.run_scan), want, depth=steps)


def test_offload_falls_back_to_device_on_cpu():
  init, xs = inputs(12)
  with pytest.warns(loops.OffloadFallbackWarning, match="kept on device"):
    shapes = residual_shapes(final("offload"), init, xs)
  assert sorted(shapes) == sorted(residual_shapes(final(True), init, xs))


def test_offload_policy_places_roots_in_host_memory(monkeypatch):
  # The path taken on GPU/TPU; JAX traces it on CPU too, with host-labelled residuals.
  monkeypatch.setattr(policies, "offload_supported", lambda: True)
  init, xs = inputs(12)
  f = final(ScanCheckpointPolicy(save_carries="offload", nested=True))
  _, vjp = jax.vjp(f, init, xs)
  kinds = {leaf.shape: leaf.sharding.memory_kind for leaf in jax.tree.leaves(vjp)}
  assert kinds[(loops.plan_blocks(12, True).blocks - 1, CARRY)] == "pinned_host"
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = jax.grad(f)(init, xs)
  want = jax.grad(lambda i: jnp.sum(python_scan(body, i, xs)[0]))(init)
  assert_trees_close(got, want, depth=12)


def test_resolve_remat_aliases_and_policy_fields():
  assert loops.resolve_remat(False) is None
  assert loops.resolve_remat(True) == loops.resolve_remat("full") == ScanCheckpointPolicy()
  assert loops.resolve_remat("nested").nested is True
  assert loops.resolve_remat("offload").save_carries == "offload"
  assert loops.resolve_remat("save_all").save_block_internals is True
  policy = ScanCheckpointPolicy(nested=3)
  assert loops.resolve_remat(policy) is policy
  fields = {f.name: f.default for f in dataclasses.fields(ScanCheckpointPolicy)}
  assert list(fields)[:6] == ['save_carries', 'save_inputs', 'save_block_internals',
                              'offload_block_internals', 'nested', 'prevent_cse']
  assert fields['save_carries'] is True and fields['save_inputs'] is True
  assert fields['save_block_internals'] is False and tuple(fields['offload_block_internals']) == ()
  assert fields['nested'] is False and fields['prevent_cse'] is False


def test_checkpoint_name_tags_array_leaves_only():
  tree = {"a": jnp.ones(2), "n": 3, "s": "static", "t": (jnp.zeros(1),)}
  named = jax.make_jaxpr(lambda a: loops.checkpoint_name(dict(tree, a=a), "z")["a"])(tree["a"])
  assert str(named).count("name=z") == 2  # 'a' and 't', not the int 'n'
  tagged = loops.checkpoint_name(tree, "z")
  assert tagged["s"] == "static" and jax.tree.structure(tagged) == jax.tree.structure(tree)


@pytest.mark.parametrize("remat", [ScanCheckpointPolicy(nested=3), "nested"], ids=policy_id)
def test_nested_with_integer_leaves_and_closed_over_parameters(remat):
  scale = jnp.float32(1.5)

  def counting(carry, x):
    h, count = carry
    h = jnp.tanh(h * scale + x["v"] * x["k"].astype(jnp.float32))
    return (h, count + x["k"]), {"h": h, "count": count}

  def loss(h0, v, scale_, remat):
    nonlocal scale
    scale = scale_
    xs = {"v": v, "k": jnp.arange(1, 11, dtype=jnp.int32)}
    (h, count), ys = loops.run_scan(counting, (h0, jnp.int32(0)), xs, remat=remat)
    return jnp.sum(h) + jnp.sum(ys["h"] ** 2) + count.astype(jnp.float32)

  args = (jnp.ones(3), jnp.linspace(-1.0, 1.0, 30).reshape(10, 3), jnp.float32(0.7))
  assert_trees_close(jax.grad(loss, (0, 1, 2))(*args, remat),
                     jax.grad(loss, (0, 1, 2))(*args, False), depth=10)


def test_nested_second_order_vmap_and_python_float_init():
  xs = jnp.linspace(0.1, 1.0, 7)
  f = lambda c0, remat: jnp.sum(loops.run_scan(
      lambda c, x: (jnp.sin(c * x), c), c0, xs, remat=remat)[1])
  assert_trees_close(jax.grad(jax.grad(f))(0.3, "nested"), jax.grad(jax.grad(f))(0.3, False), 7)
  batched = jax.vmap(jax.grad(f), in_axes=(0, None))
  assert_trees_close(batched(jnp.linspace(0.0, 1.0, 4), "nested"),
                     batched(jnp.linspace(0.0, 1.0, 4), False), depth=7)


def test_nested_remat_body_reading_integer_and_bool_jit_arguments():
  """Integer/bool values the body closes over are hoisted too (under jit they are tracers)."""
  xs = jnp.linspace(-1.0, 1.0, 14).reshape(7, 2)

  def loss(c0, k, mask, remat):
    body = lambda c, x: (jnp.where(mask, jnp.sin(c * x), c) + k.astype(jnp.float32), c)
    carry, ys = loops.run_scan(body, c0, xs, remat=remat)
    return jnp.sum(carry) + jnp.sum(ys ** 2)

  args = (jnp.ones(2), jnp.int32(2), jnp.array([True, False]))
  expected = jax.grad(jax.jit(functools.partial(loss, remat=False)))(*args)
  got = jax.grad(jax.jit(functools.partial(loss, remat='nested')))(*args)
  assert_trees_close(got, expected, depth=7)


@pytest.mark.parametrize('remat', [True, 'nested', 'save_all', ScanCheckpointPolicy(nested=2)],
                         ids=policy_id)
def test_lift_scan_remat_keeps_values_and_grads(remat):
  def step(scope, c, x):
    w = scope.param('w', jax.nn.initializers.normal(), (3, 3))
    return jnp.tanh(c @ w + x), c.sum()

  def model(r):
    return lambda s, c, xs: lift.scan(step, variable_broadcast='params',
                                      split_rngs={'params': False}, remat=r)(s, c, xs)
  c0, xs = jnp.ones(3), jnp.linspace(-1.0, 1.0, 15).reshape(5, 3)
  params = lift.init(model(False))(jax.random.key(0), c0, xs)[1]['params']
  run = lambda r: jax.value_and_grad(lambda p: jnp.sum(jnp.sin(jnp.concatenate(
      [x.ravel() for x in jax.tree.leaves(lift.apply(model(r))({'params': p}, c0, xs)[0])]))))(params)
  assert_trees_close(run(remat), run(False), depth=5)
