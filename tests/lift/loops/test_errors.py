"""One misuse test per `lift.loops` error message: it names the argument and value and says the fix."""
import jax
import jax.numpy as jnp
import pytest

from lift import loops
from lift.errors import (LiftError, RematPolicyError, ScanAxisError, ScanLengthError,
                         ScanTapsError)
from lift.loops import ScanCheckpointPolicy

add = lambda c, x: (c + x, c)


def test_unknown_remat_string_lists_valid_values():
  with pytest.raises(RematPolicyError, match="remat='nestd'") as info:
    loops.scan(add, remat="nestd")
  for name in ("False", "True", "'full'", "'nested'", "'offload'", "'save_all'",
               "ScanCheckpointPolicy", "Fix:"):
    assert name in str(info.value)
  assert isinstance(info.value, LiftError)


@pytest.mark.parametrize("call", [
    lambda: loops.run_scan(add, 0.0, jnp.ones(3), remat=3),
    lambda: loops.fold(lambda c, x: c + x, remat=3)(0.0, jnp.ones(3))], ids=["run_scan", "fold"])
def test_unknown_remat_fails_in_run_scan_and_fold_too(call):
  with pytest.raises(RematPolicyError, match="remat=3"):
    call()


def test_save_carries_false_is_rejected_with_the_alternatives():
  with pytest.raises(RematPolicyError, match=r"save_carries=False.*'offload'.*nested=True"):
    ScanCheckpointPolicy(save_carries=False)


def test_save_block_internals_must_be_names():
  with pytest.raises(RematPolicyError, match=r"save_block_internals='attn'.*\['attn_out'\]"):
    ScanCheckpointPolicy(save_block_internals="attn")


def test_saved_and_offloaded_names_must_not_overlap():
  with pytest.raises(RematPolicyError, match=r"\['h'\].*both.*Fix: remove"):
    ScanCheckpointPolicy(save_block_internals=["h", "g"], offload_block_internals=["h"])


def test_nested_must_be_bool_or_positive_int():
  with pytest.raises(RematPolicyError, match=r"nested=0.*Fix: nested=True or nested=4"):
    ScanCheckpointPolicy(nested=0)


def test_nested_with_options_it_cannot_honour():
  with pytest.raises(RematPolicyError,
                     match=r"nested=True, save_block_internals=\('h',\)\).*Fix: drop save_block_internals"):
    ScanCheckpointPolicy(nested=True, save_block_internals=["h"])


def test_more_nested_blocks_than_steps():
  scan = loops.scan(add, remat=ScanCheckpointPolicy(nested=9))
  with pytest.raises(RematPolicyError,
                     match=r"nested=9 outer blocks for a loop of 5 steps.*Fix: nested=True"):
    scan(jnp.float32(0.0), jnp.ones(5))


def test_inconsistent_xs_lengths_name_each_leaf():
  with pytest.raises(ScanLengthError, match=r"xs\['a'\]: 3, xs\['b'\]: 4.*Fix"):
    loops.run_scan(add, 0.0, {"a": jnp.ones(3), "b": jnp.ones(4)})


def test_scalar_leaf_in_run_scan_xs():
  with pytest.raises(ScanLengthError, match=r"\['s'\] of xs is a scalar.*Fix: close over"):
    loops.run_scan(add, 0.0, {"s": jnp.float32(1.0)})


def test_length_disagreeing_with_xs():
  with pytest.raises(ScanLengthError, match=r"length=4 but xs has 3.*Fix: drop length= or pass length=3"):
    loops.scan(add, length=4)(jnp.float32(0.0), jnp.ones(3))


@pytest.mark.parametrize("call, error", [
    (lambda: loops.run_scan(add, 0.0, None), ScanLengthError),
    (lambda: loops.scan(add)(0.0, None), ScanAxisError)], ids=["run_scan", "scan"])
def test_no_length_and_nothing_to_scan(call, error):
  with pytest.raises(error, match=r"no scanned leaf.*Fix: pass length=N"):
    call()


def test_axis_must_be_an_int():
  with pytest.raises(ScanAxisError, match=r"axis='time' is not an int.*Fix"):
    loops.fold(lambda c, x: c, axis="time")


def test_axis_absent_from_every_leaf():
  with pytest.raises(ScanAxisError, match=r"axis=2 exists in no leaf.*ranks.*Fix"):
    loops.scan(add, axis=2)(jnp.zeros(3), {"a": jnp.ones((3, 2)), "b": 1.0})


def test_map_with_only_static_leaves_needs_a_length():
  with pytest.raises(ScanAxisError, match=r"Fix: pass length=N"):
    loops.map(lambda x: x)(3.0)


def test_output_taps_must_be_negative():
  with pytest.raises(ScanTapsError, match=r"outputs_info\[0\] has taps \[-1, 0\].*Fix"):
    loops.scan_taps(lambda a, b: a, n_steps=2,
                    outputs_info=[{"initial": jnp.zeros(2), "taps": [-1, 0]}])


def test_output_taps_need_enough_initial_values():
  with pytest.raises(ScanTapsError, match=r"taps \[-3, -1\].*3 previous.*shape \(2,\).*Fix"):
    loops.scan_taps(lambda a, b: a + b, n_steps=2,
                    outputs_info=[{"initial": jnp.zeros(2), "taps": [-3, -1]}])


def test_sequences_giving_different_step_counts():
  with pytest.raises(ScanTapsError, match=r"sequences\[0\].*: 5 steps; sequences\[1\].*: 4 steps.*Fix"):
    loops.scan_taps(lambda a, b: a + b, sequences=[jnp.ones(5), jnp.ones(4)])


def test_n_steps_beyond_a_sequence():
  with pytest.raises(ScanTapsError, match=r"n_steps=6 but sequences\[0\].*only 4 steps.*Fix"):
    loops.scan_taps(lambda a, b: a + b, sequences={"input": jnp.ones(5), "taps": [-1, 0]},
                    n_steps=6)


def test_n_steps_needed_without_sequences():
  with pytest.raises(ScanTapsError, match=r"n_steps=None.*no sequences.*Fix: pass n_steps"):
    loops.scan_taps(lambda h: h, outputs_info=jnp.float32(0.0))


def test_fn_returning_the_wrong_number_of_outputs():
  with pytest.raises(ScanTapsError, match=r"fn returned 2 outputs but outputs_info has 1.*Fix"):
    loops.scan_taps(lambda h: (h, h), n_steps=2, outputs_info=[jnp.float32(0.0)])


def test_malformed_sequence_spec():
  with pytest.raises(ScanTapsError, match=r"sequences\[0\]=.*expected an array or"):
    loops.scan_taps(lambda x: x, sequences=[{"values": jnp.ones(3)}])


def test_jax_policy_cannot_be_combined_with_fields_that_choose_a_policy():
  with pytest.raises(RematPolicyError, match='cannot be combined with save_inputs, save_block_internals'):
    ScanCheckpointPolicy(jax_policy=jax.checkpoint_policies.nothing_saveable,
                         save_inputs='offload', save_block_internals=True)
