"""Loops: curried scan, fold and map, checkpoint policies, and PyTensor-style taps.

`run_scan` is the one loop engine of the project; every loop, here and in the
lifted transforms and layer stacks, calls it and so shares its `remat=`
policies (notes/0004-checkpoint-policies.md).
"""
from lift.loops.curried import fold, map, scan  # noqa: A004 (Haliax's name)
from lift.loops.engine import run_scan, scan_length
from lift.loops.nested import BlockPlan, plan_blocks
from lift.loops.policies import (OffloadFallbackWarning, ScanCheckpointPolicy,
                                 checkpoint_name, resolve_remat)
from lift.loops.stacking import stack_rows, unstack_rows
from lift.loops.taps import scan_taps

__all__ = [
    "BlockPlan",
    "OffloadFallbackWarning",
    "ScanCheckpointPolicy",
    "checkpoint_name",
    "fold",
    "map",
    "plan_blocks",
    "resolve_remat",
    "run_scan",
    "scan",
    "scan_length",
    "scan_taps",
    "stack_rows",
    "unstack_rows",
]
