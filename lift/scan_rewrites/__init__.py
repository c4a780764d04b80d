"""Scan rewrites: Aesara's loop rewrites as a JAX function transformation.

Each rewrite lives in its own module and registers itself by name; the
registration order below is the order they run in.
"""
from lift.scan_rewrites import (remove_unused_inputs, merge_inouts, push_out_non_seq,  # noqa: F401
                                push_out_seq, push_out_scan_output, push_out_dot1,
                                save_mem, merge)
from lift.scan_rewrites.api import check_optimize, explain_scans, optimize_scans
from lift.scan_rewrites.names import LoopInfo
from lift.scan_rewrites.registry import REWRITES, Decision
from lift.scan_rewrites.report import ScanReport, count_scans

__all__ = ['REWRITES', 'Decision', 'LoopInfo', 'ScanReport', 'check_optimize', 'count_scans', 'explain_scans',
           'optimize_scans']
