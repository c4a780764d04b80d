"""Causal functions as scans: `as_scan`, its rules, and causal composites.

`as_scan(g, example_xs)` interprets `g`'s jaxpr with one rule per primitive
(see `notes/0005-as-scan.md`); `custom_causal` marks a composite as causal
and lets its author give the step form.
"""
from lift.causal import rules_associative as _rules_associative
from lift.causal import rules_control as _rules_control
from lift.causal import rules_elementwise as _rules_elementwise
from lift.causal import rules_linear as _rules_linear
from lift.causal import rules_pair_shapes as _rules_pair_shapes
from lift.causal import rules_shape as _rules_shape
from lift.causal import rules_time as _rules_time
from lift.causal import rules_update as _rules_update
from lift.causal.api import Prefilled, ScanCarry, as_scan, as_scan_with_prefill
from lift.causal.attention import KVCache, causal_self_attention
from lift.causal.attention_choice import AttentionChoice, choose_attention
from lift.causal.custom import CustomCausal, custom_causal
from lift.causal.generate import Generated, Sampling, generate
from lift.causal.forms import stateful, stateless
from lift.causal.interpreter import (
    Eqn, NotCausal, Operand, ScanRule, StepForm, Stream, register_scan_rule)

del _rules_associative, _rules_control, _rules_elementwise, _rules_linear, _rules_pair_shapes, _rules_shape
del _rules_time, _rules_update
