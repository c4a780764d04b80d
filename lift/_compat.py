"""The one place where `lift` touches JAX internals.

Keep every import that is not public JAX API here, so that a JAX upgrade is a
change to this file only. Tested against the versions in pyproject.toml.
"""
from __future__ import annotations
