"""Error and warning messages of `lift.loops`: what failed, the values seen, why, the fix."""
from __future__ import annotations

UNKNOWN_REMAT = (
    "remat={value!r} is not a checkpoint policy. Valid values: False, True, "
    "{names}, a ScanCheckpointPolicy(...), or a jax.checkpoint_policies "
    "policy. Each string names one fixed "
    "policy (see notes/0004-checkpoint-policies.md). Fix: pass one of them, "
    "e.g. remat='full' or remat=ScanCheckpointPolicy(nested=4).")

ROOT_FIELD = (
    "ScanCheckpointPolicy({field}={value!r}) is not supported: {field} must be "
    "True (keep on device) or 'offload' (keep in host memory). Each step is "
    "recomputed from its carry and its input slice, so they cannot be dropped. "
    "Fix: {field}=True, or nested=True to keep only O(sqrt(N)) carries.")

NAMES_FIELD = (
    "ScanCheckpointPolicy({field}={value!r}) is not valid: {field} must be "
    "{allowed}. Fix: list the names given to checkpoint_name, e.g. "
    "{field}=['attn_out'].")

NAMES_OVERLAP = (
    "ScanCheckpointPolicy: the names {names} are in both save_block_internals "
    "and offload_block_internals. A value is kept either on device or in host "
    "memory, not both. Fix: remove them from one of the two lists.")

NESTED_FIELD = (
    "ScanCheckpointPolicy(nested={value!r}) is not valid: nested must be False, "
    "True (the engine picks the block count) or a positive int (the number of "
    "outer blocks). Fix: nested=True or nested=4.")

NESTED_FIELDS = (
    "ScanCheckpointPolicy(nested={nested!r}, {fields}) asks for what a nested "
    "loop cannot do: it recomputes each step right before differentiating it, "
    "so no step internal is kept between the passes, and it reads inputs from "
    "xs without copying them. Of the other options only save_carries='offload' "
    "applies to nested loops. Fix: drop {names}, or use nested=False to keep "
    "named internals.")

NESTED_TOO_MANY = (
    "remat: nested={blocks} outer blocks for a loop of {length} steps. Every "
    "outer block runs at least one step, so there cannot be more blocks than "
    "steps. Fix: nested=True (about sqrt(2*{length}) blocks) or an int from 1 to "
    "{length}.")

OFFLOAD_FALLBACK = (
    "remat offloads {what} to host memory, but the {platform!r} backend has no "
    "separate host memory to offload to (its device memory is host memory), so "
    "they are kept on device instead: the same values and gradients, no memory "
    "saving. Use remat='nested' to cut memory on this backend.")

XS_LENGTHS = (
    "scan: the leaves of xs have different lengths along the scanned axis: "
    "{sizes}. Every scanned leaf gives one slice per step, so all must agree. "
    "Fix: slice or pad them to one length.")

XS_SCALAR = (
    "scan: the leaf {path} of xs is a scalar (shape ()), which has no axis to "
    "scan. Fix: close over it in the body instead of passing it in xs.")

LENGTH_MISMATCH = (
    "scan: length={length} but xs has {size} slices along the scanned axis "
    "(leaf {path}). Fix: drop length= or pass length={size}.")

NO_LENGTH = (
    "{name}: cannot tell the number of steps: xs has no scanned leaf and length= "
    "was not given. Fix: pass length=N, e.g. {name}(f, length=10)(init, None).")

RUN_NO_LENGTH = (
    "run_scan: cannot tell the number of steps: xs has no scanned leaf and length= "
    "was not given. Fix: pass length=N, e.g. run_scan(f, init, None, length=10).")

MAP_NOTHING = (
    "map: xs has no leaf to map over: no array has an axis {axis} (leaf ranks: {ranks}). "
    "Fix: pass the values stacked along axis {axis}, or call f directly on a single value.")

AXIS_TYPE = (
    "{name}: axis={axis!r} is not an int. Fix: pass the position of the scanned "
    "axis, e.g. axis=0 or axis=-1.")

AXIS_ABSENT = (
    "{name}: axis={axis} exists in no leaf of xs (leaf ranks: {ranks}). A leaf is "
    "scanned only if it is an array with -ndim <= axis < ndim; the others are "
    "passed whole to every step, so nothing is left to scan. Fix: pass an axis "
    "that the arrays have, or length=N to loop over unscanned inputs.")

TAPS_SPEC = (
    "scan_taps: {where}={value!r} is not valid: expected {expected}. Fix: see "
    "lift.loops.scan_taps: a sequence is an array or {{'input': x, 'taps': [-1, 0]}}, an "
    "output None, an initial value or {{'initial': x0, 'taps': [-2, -1]}}.")

TAPS_OUTPUT_NOT_PAST = (
    "scan_taps: outputs_info[{index}] has taps {taps}; an output can only be "
    "read at past steps, so its taps must be a non-empty list of negative ints. "
    "Fix: e.g. 'taps': [-2, -1].")

TAPS_INITIAL_SHORT = (
    "scan_taps: outputs_info[{index}] has taps {taps}, which read the {needed} "
    "previous values, but 'initial' has shape {shape}. 'initial' holds the "
    "values of steps -{needed}..-1 stacked along axis 0 (PyTensor layout). "
    "Fix: pass 'initial' with a leading dimension of at least {needed}, e.g. "
    "jnp.stack([x_minus_{needed}, ..., x_minus_1]).")

SEQUENCE_STEPS = (
    "scan_taps: the sequences give different numbers of steps: {detail}. Each "
    "step reads every sequence at its taps, so all must agree (steps = "
    "len - (max(maxtap, 0) - min(mintap, 0))). Fix: slice the sequences to "
    "matching lengths, or pass n_steps= no larger than the smallest.")

TOO_FEW_STEPS = (
    "scan_taps: n_steps={n_steps} but sequences[{index}] (length {size}, taps "
    "{taps}) gives only {steps} steps. Fix: pass n_steps <= {steps} or a longer "
    "sequence.")

NO_STEPS = (
    "scan_taps: n_steps={n_steps!r} and there are no sequences to count steps "
    "from. Fix: pass n_steps as a non-negative int, e.g. n_steps=10.")

OUTPUT_COUNT = (
    "scan_taps: fn returned {got} outputs but outputs_info has {expected} "
    "entries. Fix: return one value per outputs_info entry, and use None in "
    "outputs_info for outputs that are not fed back.")

JAX_POLICY_FIELDS = (
    "remat: ScanCheckpointPolicy(jax_policy=...) applies that jax.checkpoint "
    "policy to each step as is, so it cannot be combined with {fields}, which "
    "would choose a policy too. Fix: drop those fields, or drop jax_policy and "
    "express the policy with the fields.")
NESTED_SPLIT_TRANSPOSE = (
    "_split_transpose=True cannot be combined with remat='nested' (or a "
    "ScanCheckpointPolicy with nested): the nested loop writes its own backward "
    "pass. Fix: drop one of the two.")

NESTED_FORWARD_MODE = (
    "Forward-mode autodiff (jax.jvp, jax.jacfwd, jax.hessian) reached a loop with "
    "remat='nested' (ScanCheckpointPolicy(nested=...)). That policy's backward pass is "
    "hand-written as a jax.custom_vjp, which has reverse mode only (jax.grad, jax.vjp, "
    "jax.jacrev work). Fix: for forward mode give this loop remat='full' (or another "
    "policy without nested); it computes the same values.")
