"""One misuse case per `lift.loops` error message: it names the argument and value and says the fix."""
import jax
import jax.numpy as jnp
import pytest

from lift import loops
from lift.errors import (LiftError, RematPolicyError, ScanAxisError, ScanLengthError,
                         ScanTapsError)
from lift.loops import ScanCheckpointPolicy as Policy

add = lambda c, x: (c + x, c)
sum2 = lambda a, b: a + b


def test_unknown_remat_string_lists_valid_values():
  with pytest.raises(RematPolicyError, match="remat='nestd'") as info:
    loops.scan(add, remat="nestd")
  for name in ("False", "True", "'full'", "'nested'", "'offload'", "'save_all'",
               "ScanCheckpointPolicy", "Fix:"):
    assert name in str(info.value)
  assert isinstance(info.value, LiftError)


CASES = {
    'remat-run_scan': (lambda: loops.run_scan(add, 0.0, jnp.ones(3), remat=3),
                       RematPolicyError, "remat=3"),
    'remat-fold': (lambda: loops.fold(lambda c, x: c + x, remat=3)(0.0, jnp.ones(3)),
                   RematPolicyError, "remat=3"),
    'save_carries': (lambda: Policy(save_carries=False),
                     RematPolicyError, r"save_carries=False.*'offload'.*nested=True"),
    'internals-names': (lambda: Policy(save_block_internals="attn"),
                        RematPolicyError, r"save_block_internals='attn'.*\['attn_out'\]"),
    'internals-overlap': (lambda: Policy(save_block_internals=["h", "g"],
                                         offload_block_internals=["h"]),
                          RematPolicyError, r"\['h'\].*both.*Fix: remove"),
    'nested-0': (lambda: Policy(nested=0),
                 RematPolicyError, r"nested=0.*Fix: nested=True or nested=4"),
    'nested-internals': (lambda: Policy(nested=True, save_block_internals=["h"]), RematPolicyError,
                         r"nested=True, save_block_internals=\('h',\)\).*Fix: drop save_block_internals"),
    'nested-too-many': (lambda: loops.scan(add, remat=Policy(nested=9))(jnp.float32(0.0), jnp.ones(5)),
                        RematPolicyError, r"nested=9 outer blocks for a loop of 5 steps.*Fix: nested=True"),
    'jax_policy-combined': (lambda: Policy(jax_policy=jax.checkpoint_policies.nothing_saveable,
                                           save_inputs='offload', save_block_internals=True),
                            RematPolicyError, 'cannot be combined with save_inputs, save_block_internals'),
    'xs-lengths': (lambda: loops.run_scan(add, 0.0, {"a": jnp.ones(3), "b": jnp.ones(4)}),
                   ScanLengthError, r"xs\['a'\]: 3, xs\['b'\]: 4.*Fix"),
    'xs-scalar': (lambda: loops.run_scan(add, 0.0, {"s": jnp.float32(1.0)}),
                  ScanLengthError, r"\['s'\] of xs is a scalar.*Fix: close over"),
    'length-vs-xs': (lambda: loops.scan(add, length=4)(jnp.float32(0.0), jnp.ones(3)),
                     ScanLengthError, r"length=4 but xs has 3.*Fix: drop length= or pass length=3"),
    'no-length-run_scan': (lambda: loops.run_scan(add, 0.0, None),
                           ScanLengthError, r"no scanned leaf.*Fix: pass length=N"),
    'no-length-scan': (lambda: loops.scan(add)(0.0, None),
                       ScanAxisError, r"no scanned leaf.*Fix: pass length=N"),
    'axis-not-int': (lambda: loops.fold(lambda c, x: c, axis="time"),
                     ScanAxisError, r"axis='time' is not an int.*Fix"),
    'axis-in-no-leaf': (lambda: loops.scan(add, axis=2)(jnp.zeros(3), {"a": jnp.ones((3, 2)), "b": 1.0}),
                        ScanAxisError, r"axis=2 exists in no leaf.*ranks.*Fix"),
    'map-static-only': (lambda: loops.map(lambda x: x)(3.0), ScanAxisError, r"Fix: pass length=N"),
    'output-tap-0': (lambda: loops.scan_taps(lambda a, b: a, n_steps=2, outputs_info=[
        {"initial": jnp.zeros(2), "taps": [-1, 0]}]),
                     ScanTapsError, r"outputs_info\[0\] has taps \[-1, 0\].*Fix"),
    'output-initial-short': (lambda: loops.scan_taps(sum2, n_steps=2, outputs_info=[
        {"initial": jnp.zeros(2), "taps": [-3, -1]}]),
                             ScanTapsError, r"taps \[-3, -1\].*3 previous.*shape \(2,\).*Fix"),
    'sequence-steps': (lambda: loops.scan_taps(sum2, sequences=[jnp.ones(5), jnp.ones(4)]),
                       ScanTapsError, r"sequences\[0\].*: 5 steps; sequences\[1\].*: 4 steps.*Fix"),
    'n_steps-too-many': (lambda: loops.scan_taps(sum2, n_steps=6, sequences={
        "input": jnp.ones(5), "taps": [-1, 0]}),
                         ScanTapsError, r"n_steps=6 but sequences\[0\].*only 4 steps.*Fix"),
    'n_steps-needed': (lambda: loops.scan_taps(lambda h: h, outputs_info=jnp.float32(0.0)),
                       ScanTapsError, r"n_steps=None.*no sequences.*Fix: pass n_steps"),
    'fn-outputs': (lambda: loops.scan_taps(lambda h: (h, h), n_steps=2,
                                           outputs_info=[jnp.float32(0.0)]),
                   ScanTapsError, r"fn returned 2 outputs but outputs_info has 1.*Fix"),
    'sequence-spec': (lambda: loops.scan_taps(lambda x: x, sequences=[{"values": jnp.ones(3)}]),
                      ScanTapsError, r"sequences\[0\]=.*expected an array or"),
}


@pytest.mark.parametrize("case", CASES)
def test_misuse_names_the_argument_and_the_fix(case):
  call, error, match = CASES[case]
  with pytest.raises(error, match=match):
    call()
