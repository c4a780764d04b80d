"""Errors raised by `lift`. Every class derives from `LiftError`.

Messages say what failed (the collection, variable path or argument), why, and
how to fix it.
"""
from __future__ import annotations


class LiftError(Exception):
  """Base class of every error raised by `lift`."""


class ScanConversionError(LiftError):
  """`as_scan` could not turn a function into its step form.

  Raised for a primitive without a rule, or for a non-causal use of the scan
  axis (a reduction over time, an anti-causal shift, a reversal).
  """
