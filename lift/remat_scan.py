"""Lifted `remat_scan`: nested scans, every level rematerializing its steps.

Each level is a lifted `scan` (so the loop engine and its checkpoint policies
are `lift.loops`'s); `policy` is the `jax.checkpoint` policy of each step. The
innermost level is rematerialized too (Flax's is not): while the backward pass
recomputes one step of level ``k``, it keeps only that level's ``lengths[k+1]``
carries and one body's internals, not every inner body's internals.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from flax.core import meta

from lift import errors, loops
from lift.filters import Filter
from lift.scan import build_scan, ScanConfig
from lift.axes import VariableAxes, check_split_rngs, check_variable_axes

_BAD_LENGTHS = (
    'remat_scan: lengths={lengths!r} is not a non-empty sequence of positive '
    'ints. Each entry is the number of steps of one nesting level; the body runs '
    'prod(lengths) times. Fix: e.g. lengths=(4, 4) for 16 steps.')


def _carry_only_step(body_fn: Callable[..., Any], scope: Any, carry: Any) -> tuple[Any, tuple]:
  return body_fn(scope, carry), ()


def _carry_only(loop: Callable[..., Any], scope: Any, carry: Any) -> Any:
  return loop(scope, carry)[0]


def _inner_metadata(metadata_params: Mapping[Any, Any]) -> dict[Any, Any]:
  # Only the outermost level names its axis: a mesh axis may appear once in a
  # PartitionSpec, so inner levels add an unnamed (None) axis.
  params = dict(metadata_params)
  if meta.PARTITION_NAME in params:
    params[meta.PARTITION_NAME] = None
  return params


class _Rules(NamedTuple):
  """The variable and rng rules that every level of a `remat_scan` shares."""
  variable_axes: VariableAxes
  variable_broadcast: Filter
  variable_carry: Filter
  split_rngs: Mapping[Filter, bool]


def _step_remat(policy: Callable[..., Any] | None) -> loops.ScanCheckpointPolicy | None:
  """`remat_scan`'s `policy` (a `jax.checkpoint` policy, None saving nothing) for each step."""
  return loops.ScanCheckpointPolicy(jax_policy=policy) if policy is not None else loops.resolve_remat('full')


def _remat_level(body_fn, lengths: tuple[int, ...], policy, metadata_params, rules: _Rules):
  if len(lengths) == 1:
    step = functools.partial(_carry_only_step, body_fn)
  else:
    inner = _remat_level(body_fn, lengths[1:], policy, _inner_metadata(metadata_params), rules)
    step = functools.partial(_carry_only_step, inner)
  config = ScanConfig(variable_axes=rules.variable_axes,
                      rng_splits=tuple(rules.split_rngs.values()), in_axes=0, out_axes=0,
                      size=lengths[0], metadata_params=dict(metadata_params),
                      remat=_step_remat(policy))
  loop = build_scan(step, rules.variable_broadcast, rules.variable_carry, rules.split_rngs, config)
  return functools.partial(_carry_only, loop)


def remat_scan(body_fn: Callable[..., Any], lengths: Sequence[int],
               policy: Callable[..., Any] | None = None,
               variable_broadcast: Filter = False, variable_carry: Filter = False,
               variable_axes: Mapping[Filter, int] = {True: 0},  # noqa: B006
               split_rngs: Mapping[Filter, bool] = {True: True},  # noqa: B006
               metadata_params: Mapping[Any, Any] = {}) -> Callable[..., Any]:  # noqa: B006
  """``body_fn(scope, carry) -> carry`` repeated ``prod(lengths)`` times as nested scans.

  Level ``k`` scans ``lengths[k]`` steps of level ``k + 1``; every level
  rematerializes its steps (``jax.checkpoint`` with ``policy``), so the
  backward pass keeps about ``sum(lengths)`` carries and one body's internals
  instead of ``prod(lengths)`` carries (Flax's innermost level keeps every
  body's internals; the values and gradients are the same). Variables with an axis get one axis per level, outermost
  first: a kernel of ``lengths=(2, 3)`` has shape ``(2, 3, in, out)``.
  ``metadata_params`` names the outermost axis; inner axes get None.

  Not when the steps need scanned inputs or outputs: use ``scan(remat=...)``.

  Examples:
    >>> def layer(scope, x):
    ...   return jnp.tanh(x @ scope.param('w', jax.nn.initializers.ones, (4, 4)))
    >>> stack = remat_scan(layer, lengths=(2, 3))
    >>> y, variables = lift.init(stack)(jax.random.key(0), jnp.ones((1, 4)))
    >>> variables['params']['w'].shape
    (2, 3, 4, 4)
  """
  lengths = tuple(lengths) if isinstance(lengths, Sequence) else lengths
  if not (isinstance(lengths, tuple) and lengths and all(
      isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths)):
    raise errors.InvalidAxisError(_BAD_LENGTHS.format(lengths=lengths))
  axes = check_variable_axes('remat_scan', variable_axes, allow_none=False)
  check_split_rngs('remat_scan', split_rngs)
  rules = _Rules(axes, variable_broadcast, variable_carry, split_rngs)
  return _remat_level(body_fn, lengths, policy, metadata_params, rules)


__all__ = ['remat_scan']
