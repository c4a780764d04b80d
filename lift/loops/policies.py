"""Checkpoint policies of loops: `ScanCheckpointPolicy`, `resolve_remat`, and their `jax.checkpoint` form.

A loop step is recomputed in the backward pass from its *roots*: the carry that
enters it and its slice of `xs`. The policy says where the roots are kept
(device or host memory), which named values inside the step are kept too, and
whether steps are grouped into recomputed blocks (`nested`). The mapping to
`jax.checkpoint_policies` is the table in notes/0004-checkpoint-policies.md.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

import jax
from jax.ad_checkpoint import Offloadable, Saveable
from jax.ad_checkpoint import checkpoint_name as _jax_checkpoint_name

from lift.errors import RematPolicyError
from lift.loops import _messages

# Names the engine gives to a step's roots when they are offloaded.
CARRY_NAME = "lift.loops.carry"
INPUT_NAME = "lift.loops.input"

Remat = Union[bool, str, "ScanCheckpointPolicy"]


class OffloadFallbackWarning(UserWarning):
  """An offloading policy runs on a backend without separate host memory.

  The loop still runs, keeping on device what it would offload. It is a
  warning, not an error: do not catch it to retry; filter it (e.g. in CPU
  test runs) with `warnings.filterwarnings`.

  Examples:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter('always')
    ...   policy = on_this_backend(resolve_remat('offload'))
    >>> offload_supported() or caught[0].category is OffloadFallbackWarning
    True
  """


def _names(field: str, value: Any, allowed: str) -> tuple[str, ...]:
  if isinstance(value, str) or not isinstance(value, Sequence) or not all(
      isinstance(name, str) for name in value):
    raise RematPolicyError(_messages.NAMES_FIELD.format(
        field=field, value=value, allowed=allowed))
  return tuple(value)


@dataclasses.dataclass(frozen=True)
class ScanCheckpointPolicy:
  """What a loop keeps for the backward pass, and what it recomputes.

  Not needed for the common cases: ``remat=True``, ``'nested'``,
  ``'offload'`` and ``'save_all'`` name ready-made policies.

  Attributes:
    save_carries: where the carry entering each step is kept: True (device)
      or 'offload' (host memory).
    save_inputs: where each step's slice of `xs` is kept: True or 'offload'.
    save_block_internals: False (recompute every value inside a step), True
      (keep all of them: no recomputation) or names given to `checkpoint_name`
      whose values are kept on device.
    offload_block_internals: names whose values are kept in host memory.
    nested: False, True (about sqrt(N) outer blocks) or the number of outer
      blocks; only the carries entering blocks are kept, and a block's steps
      are recomputed in the backward pass (see `lift.loops.nested`). Under
      nested, inputs are read from `xs` and never copied, steps are
      differentiated one at a time, and of the other fields only
      `save_carries='offload'` (block carries in host memory) has an effect.
    prevent_cse: passed to `jax.checkpoint`; a scan already prevents CSE.
    jax_policy: a `jax.checkpoint_policies` policy used for each step as is,
      for code ported from `flax.core.lift.remat_scan(policy=...)`; it
      replaces the policy derived from the fields above, which must then
      keep their defaults.

  Examples:
    >>> ScanCheckpointPolicy(save_block_internals=["attn"]).nested
    False
  """
  save_carries: bool | Literal["offload"] = True
  save_inputs: bool | Literal["offload"] = True
  save_block_internals: bool | Sequence[str] = False
  offload_block_internals: Sequence[str] = ()
  nested: bool | int = False
  prevent_cse: bool = False
  jax_policy: Callable[..., Any] | None = None

  def __post_init__(self):
    for field in ("save_carries", "save_inputs"):
      value = getattr(self, field)
      if value is not True and value != "offload":
        raise RematPolicyError(_messages.ROOT_FIELD.format(field=field, value=value))
    if not isinstance(self.save_block_internals, bool):
      object.__setattr__(self, "save_block_internals", _names(
          "save_block_internals", self.save_block_internals,
          "True, False or a list of names"))
    object.__setattr__(self, "offload_block_internals", _names(
        "offload_block_internals", self.offload_block_internals, "a list of names"))
    self._check_overlap()
    if not (isinstance(self.nested, int) and (isinstance(self.nested, bool) or self.nested > 0)):
      raise RematPolicyError(_messages.NESTED_FIELD.format(value=self.nested))
    if self.nested:
      self._check_nested_fields()
    if self.jax_policy is not None:
      self._check_jax_policy_fields()

  def _check_overlap(self):
    saved = self.save_block_internals if not isinstance(self.save_block_internals, bool) else ()
    both = sorted(set(saved) & set(self.offload_block_internals))
    if both:
      raise RematPolicyError(_messages.NAMES_OVERLAP.format(names=both))

  def _check_nested_fields(self):
    ignored = {"save_inputs": self.save_inputs == "offload",
               "save_block_internals": self.save_block_internals is not False,
               "offload_block_internals": bool(self.offload_block_internals)}
    names = [name for name, bad in ignored.items() if bad]
    if names:
      fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
      raise RematPolicyError(_messages.NESTED_FIELDS.format(
          nested=self.nested, fields=fields, names=", ".join(names)))

  def _check_jax_policy_fields(self):
    defaults = ScanCheckpointPolicy()
    changed = [name for name in ("save_carries", "save_inputs", "save_block_internals",
                                 "offload_block_internals", "nested")
               if getattr(self, name) != getattr(defaults, name)]
    if changed:
      raise RematPolicyError(_messages.JAX_POLICY_FIELDS.format(fields=", ".join(changed)))

  @property
  def offloads(self) -> bool:
    """Whether any value is kept in host memory."""
    return ("offload" in (self.save_carries, self.save_inputs)
            or bool(self.offload_block_internals))


REMAT_ALIASES: dict[str, ScanCheckpointPolicy] = {
    "full": ScanCheckpointPolicy(),
    "nested": ScanCheckpointPolicy(nested=True),
    "offload": ScanCheckpointPolicy(save_carries="offload"),
    "save_all": ScanCheckpointPolicy(save_block_internals=True),
}


def resolve_remat(remat: Remat) -> ScanCheckpointPolicy | None:
  """Turns a `remat=` argument into a policy, or None for no checkpointing.

  Call it when a loop is built, so that a bad value fails before tracing.
  Not needed before passing ``remat=`` to a loop of this project: each calls it.

  Args:
    remat: False, True (same as 'full'), 'full', 'nested', 'offload',
      'save_all', a `ScanCheckpointPolicy`, or a `jax.checkpoint_policies`
      policy (as ``ScanCheckpointPolicy(jax_policy=policy)``).

  Returns:
    None for False, otherwise the policy.

  Raises:
    RematPolicyError: for any other value; the message lists the valid ones.

  Examples:
    >>> resolve_remat("nested").nested
    True
  """
  if remat is False:
    return None
  if remat is True:
    return REMAT_ALIASES["full"]
  if isinstance(remat, ScanCheckpointPolicy):
    return remat
  if isinstance(remat, str) and remat in REMAT_ALIASES:
    return REMAT_ALIASES[remat]
  if callable(remat) and not isinstance(remat, str):  # a jax.checkpoint_policies policy
    return ScanCheckpointPolicy(jax_policy=remat)
  names = ", ".join(repr(name) for name in REMAT_ALIASES)
  raise RematPolicyError(_messages.UNKNOWN_REMAT.format(value=remat, names=names))


def checkpoint_name(tree: Any, name: str) -> Any:
  """Tags every array leaf of `tree` with `name` for checkpoint policies.

  Non-array leaves are returned unchanged. A `ScanCheckpointPolicy` with
  `save_block_internals=[name]` then keeps these values instead of
  recomputing them. Not needed where no policy names it: the tag alone
  changes nothing.

  Examples:
    >>> import jax.numpy as jnp
    >>> checkpoint_name({"h": jnp.ones(2)}, "h")["h"].shape
    (2,)
  """
  return jax.tree.map(
      lambda leaf: _jax_checkpoint_name(leaf, name) if isinstance(leaf, jax.Array) else leaf,
      tree)


def offload_supported() -> bool:
  """Whether the target has host memory distinct from device memory.

  The target is the devices of the mesh in context (`jax.set_mesh`), which may be
  another platform's compiled for ahead of time, else the default backend.

  The CPU backend lists a 'pinned_host' memory, but JAX drops host placement
  when lowering for CPU (the device memory is host memory), so offloading
  there keeps the values where they are.
  """
  mesh = jax.sharding.get_abstract_mesh()
  target = getattr(mesh, "abstract_device", None)
  if not mesh.empty and target is not None:  # compiling for the mesh's devices (maybe AOT)
    return target.platform != "cpu"
  device = jax.devices()[0]
  kinds = {memory.kind for memory in device.addressable_memories()}
  return device.platform != "cpu" and "pinned_host" in kinds


def on_this_backend(policy: ScanCheckpointPolicy) -> ScanCheckpointPolicy:
  """`policy`, with offloaded values kept on device where offload is unsupported.

  Warns with `OffloadFallbackWarning` when it changes the policy.
  """
  if not policy.offloads or offload_supported():
    return policy
  offloaded = [field for field in ("save_carries", "save_inputs")
               if getattr(policy, field) == "offload"]
  offloaded += list(policy.offload_block_internals)
  warnings.warn(_messages.OFFLOAD_FALLBACK.format(
      what=", ".join(offloaded), platform=jax.devices()[0].platform),
      OffloadFallbackWarning, stacklevel=3)
  internals = policy.save_block_internals
  if not isinstance(internals, bool):
    internals = tuple(internals) + tuple(policy.offload_block_internals)
  return dataclasses.replace(policy, save_carries=True, save_inputs=True,
                             save_block_internals=internals,
                             offload_block_internals=())


def _offload_or_save(offload_policy: Callable[..., Any]) -> Callable[..., Any]:
  def policy(prim, *args, **params):
    decision = offload_policy(prim, *args, **params)
    return decision if isinstance(decision, Offloadable) else Saveable
  return policy


def _jax_policy(saved: Sequence[str], offloaded: Sequence[str],
                save_everything: bool = False) -> Callable[..., Any]:
  if not offloaded:
    if save_everything:
      return jax.checkpoint_policies.everything_saveable
    return jax.checkpoint_policies.save_only_these_names(*saved)
  offload = jax.checkpoint_policies.save_and_offload_only_these_names(
      names_which_can_be_saved=list(saved), names_which_can_be_offloaded=list(offloaded),
      offload_src="device", offload_dst="pinned_host")
  return _offload_or_save(offload) if save_everything else offload


def step_policy(policy: ScanCheckpointPolicy) -> Callable[..., Any]:
  """The `jax.checkpoint` policy of one loop step (see the note's table)."""
  if policy.jax_policy is not None:
    return policy.jax_policy
  offloaded = [CARRY_NAME] if policy.save_carries == "offload" else []
  offloaded += [INPUT_NAME] if policy.save_inputs == "offload" else []
  offloaded += list(policy.offload_block_internals)
  internals = policy.save_block_internals
  if isinstance(internals, bool):
    return _jax_policy((), offloaded, save_everything=internals)
  return _jax_policy(internals, offloaded)


def checkpoint_step(body: Callable, policy: ScanCheckpointPolicy) -> Callable:
  """`body(carry, x)` under `jax.checkpoint`, its roots tagged for offloading.

  Roots kept on device are not tagged: a tagged copy of `x` would be stacked
  by the scan, while an untagged `x` is read from `xs` without a copy.
  """
  offload_carry = policy.save_carries == "offload"
  offload_input = policy.save_inputs == "offload"

  def tagged(carry, x):
    if offload_carry:
      carry = checkpoint_name(carry, CARRY_NAME)
    if offload_input:
      x = checkpoint_name(x, INPUT_NAME)
    return body(carry, x)

  return jax.checkpoint(tagged, prevent_cse=policy.prevent_cse, policy=step_policy(policy))
