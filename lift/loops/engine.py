"""The loop engine: the one `lax.scan` entry point of the project, owner of the remat policies.

Every loop (curried scan/fold/map, taps, the lifted scan, layer stacks) calls
`run_scan`, so a checkpoint policy means the same thing everywhere.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax import lax

from lift.errors import RematPolicyError, ScanLengthError
from lift.loops import _messages
from lift.loops.nested import nested_scan, plan_blocks
from lift.loops.policies import Remat, checkpoint_step, on_this_backend, resolve_remat


def scan_length(xs: Any, length: int | None = None) -> int:
  """The number of steps of a scan over `xs` (leading axis of every leaf).

  Not needed to validate inputs before a loop: every loop calls it.

  Raises:
    ScanLengthError: leaves disagree, a leaf is a scalar, `length` disagrees
      with them, or there are no leaves and no `length`.

  Examples:
    >>> import jax.numpy as jnp
    >>> scan_length({"a": jnp.zeros((3, 2)), "b": jnp.zeros(3)})
    3
  """
  sizes = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(xs):
    shape = np.shape(leaf)
    if not shape:
      raise ScanLengthError(_messages.XS_SCALAR.format(path=jax.tree_util.keystr(path)))
    sizes[jax.tree_util.keystr(path)] = shape[0]
  if len(set(sizes.values())) > 1:
    detail = ", ".join(f"xs{path}: {size}" for path, size in sizes.items())
    raise ScanLengthError(_messages.XS_LENGTHS.format(sizes=detail))
  if not sizes:
    if length is None:
      raise ScanLengthError(_messages.RUN_NO_LENGTH)
    return int(length)
  label, size = next(iter(sizes.items()))
  if length is not None and length != size:
    raise ScanLengthError(_messages.LENGTH_MISMATCH.format(
        length=length, size=size, path=f"xs{label}"))
  return size


def run_scan(body: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, *,
             length: int | None = None, reverse: bool = False,
             unroll: int | bool = 1, remat: Remat = False,
             split_transpose: bool = False, optimize: Any = False) -> tuple[Any, Any]:
  """`jax.lax.scan(body, init, xs, length, reverse, unroll)` under a checkpoint policy.

  Same semantics as `lax.scan`: every leaf of `xs` is scanned along axis 0,
  `xs=None` needs `length`, and the result is `(final_carry, stacked_ys)`.
  `remat` is anything `resolve_remat` accepts (an already resolved
  `ScanCheckpointPolicy` included); values and gradients do not depend on it,
  only what is kept for the backward pass does. `split_transpose` is
  `lax.scan`'s experimental `_split_transpose` (not with nested remat).
  `optimize` rewrites the loop with `lift.optimize_scans`: True lets its cost
  model decide, a sequence of rewrite names applies those (False: as written).
  Not the friendliest entry point for user code: the curried `scan` takes an
  ``axis`` and checks ``remat`` when it is built.

  Raises:
    RematPolicyError: bad `remat`, or more nested blocks than steps.
    ScanLengthError: `xs` leaves or `length` disagree on the number of steps.

  Examples:
    >>> import jax.numpy as jnp
    >>> body = lambda c, x: (c + x, c)
    >>> carry, ys = run_scan(body, 0.0, jnp.arange(4.0), remat="nested")
    >>> float(carry), ys.tolist()
    (6.0, [0.0, 0.0, 1.0, 3.0])
  """
  if optimize is not False:
    rewrites = None if optimize is True else optimize
    loop = functools.partial(run_scan, body, length=length, reverse=reverse, unroll=unroll,
                             remat=remat, split_transpose=split_transpose)
    rewriting = importlib.import_module('lift.scan_rewrites')  # loaded by the loops that ask
    return rewriting.optimize_scans(loop, rewrites=rewrites)(init, xs)
  policy = resolve_remat(remat)
  steps = scan_length(xs, length)
  options: dict[str, Any] = dict(length=steps, reverse=reverse, unroll=unroll,
                                 _split_transpose=split_transpose)
  if policy is None:
    return lax.scan(body, init, xs, **options)
  policy = on_this_backend(policy)
  if policy.nested and steps:
    if split_transpose:
      raise RematPolicyError(_messages.NESTED_SPLIT_TRANSPOSE)
    plan = plan_blocks(steps, policy.nested)
    return nested_scan(body, init, xs, plan, reverse=reverse, unroll=unroll,
                       offload_carries=policy.save_carries == "offload")
  step = checkpoint_step(body, policy)
  return lax.scan(step, init, xs, **options)
