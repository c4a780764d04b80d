"""Errors raised by `lift`, all derived from `LiftError`. Messages say what failed (the
collection, variable path or argument), why, and how to fix it."""
from __future__ import annotations

from typing import Any, NamedTuple

from flax import errors as flax_errors


class LiftError(Exception):
  """Base class of every error raised by `lift`.

  Where Flax raises an error for the same misuse, ours also derives from
  Flax's class (``MissingParamError`` is a ``flax.errors.ScopeParamNotFoundError``),
  so code that catches Flax's errors keeps working; the message is ours.
  Catch it to handle any misuse of `lift`; it is not meant to be raised by
  user code (raise your own exception class instead).

  Examples:
    >>> try:
    ...   lift.apply(lambda scope: scope.param('w', jnp.zeros, (2,)))({})
    ... except LiftError as e:
    ...   print(type(e).__name__)
    MissingCollectionError
    >>> issubclass(MissingParamError, flax_errors.ScopeParamNotFoundError)
    True
  """

  def __init__(self, *args):
    Exception.__init__(self, *args)  # not FlaxError's, which appends a link to its docs


class ScanConversionError(LiftError):
  """`as_scan` could not turn a function into its step form.

  Raised for a primitive without a rule, or for a non-causal use of the scan
  axis (a reduction over time, an anti-causal shift, a reversal); the message
  names the primitive, where it was called and why. It is raised once, when
  the step is derived: do not catch it to fall back at every step, fix the
  function or give its causal part a `lift.custom_causal` rule.

  Examples:
    >>> try:
    ...   lift.as_scan(lambda xs: xs[::-1], jnp.zeros(3))
    ... except ScanConversionError as e:
    ...   print(str(e).splitlines()[0])
    as_scan cannot convert `rev` at ...: it reverses the scan axis 0 ...
  """


class CacheLengthError(LiftError, IndexError):
  """A step derived by `as_scan` was called past the length its caches hold.

  The caches of a derived step (attention's keys and values, tables read by
  position) hold as many elements as `example_xs` (or `max_length`). Under `jit`,
  where the step count is not known on the host, the outputs past that length are
  NaN instead. Derive the step with a larger `max_length`; a model whose only
  attention is a sliding window (ring caches) decodes without limit.

  Examples:
    >>> def attend(xs):  # [T, d]: each position averages itself and the earlier ones
    ...   return (jnp.tril(jnp.ones((len(xs), len(xs)))) * (xs @ xs.T)) @ xs
    >>> f, carry = lift.as_scan(attend, jnp.zeros((2, 3)))  # caches for 2 elements
    >>> for _ in range(2):
    ...   carry, y = f(carry, jnp.ones(3))
    >>> try:
    ...   f(carry, jnp.ones(3))
    ... except CacheLengthError as e:
    ...   print(str(e).splitlines()[0])
    the derived step was called for element 2 (0-based), but its caches hold 2 ...
  """


class DecodeArgumentError(LiftError, ValueError):
  """An argument of `lift.generate` has the wrong type or value (the message names it).

  Examples:
    >>> try:
    ...   lift.generate(lambda t: t, jnp.zeros((1, 2), jnp.int32), max_new_tokens=0)
    ... except DecodeArgumentError as e:
    ...   print(e)
    lift.generate: max_new_tokens must be a positive int; got 0. Fix: pass the number ...
  """


class ModelLengthError(LiftError, ValueError):
  """The function fails at the length a derived step must hold, and runs at a shorter one.

  `as_scan` traces the function at the length of `example_xs` (or `max_length`);
  `lift.generate` at the prompt's length plus `max_new_tokens - 1`. A value in the
  function built for a fixed length (a table of positions sliced to the input's
  length, a fixed-size mask) is shorter there. The message names the failure and the
  source line.

  Examples:
    >>> table = jnp.zeros((4, 2))  # positions for 4 elements
    >>> try:
    ...   lift.as_scan(lambda xs: xs + table[:len(xs)], jnp.zeros((3, 2)), max_length=6)
    ... except ModelLengthError as e:
    ...   print(str(e).splitlines()[0])
    as_scan runs the function at length 6 (max_length), but it fails there: ...
  """




def _path_text(path) -> str:
  """A scope's path as text; a string is already a scope's ``path_text``."""
  return path if isinstance(path, str) else '/' + '/'.join(path)


class InvalidScopeError(LiftError, flax_errors.InvalidScopeError):
  """A scope or variable was used after the transform or `apply` that made it returned.

  Scopes are only valid while the function they were passed to runs; do not
  keep them in closures or globals (return values instead). Not a signal to
  retry: the scope will not become valid again.

  Examples:
    >>> kept = []
    >>> lift.apply(lambda scope: kept.append(scope))({})
    >>> try:
    ...   kept[0].get_variable('params', 'w')
    ... except InvalidScopeError as e:
    ...   print(str(e)[:43])
    The scope at "/" is no longer valid: it ...
  """

  def __init__(self, path):
    super().__init__(
        f'The scope at "{_path_text(path)}" is no longer valid: it belongs to '
        'a lifted transform or an `apply` call that has already returned. '
        'Scopes and Variables are only usable while the function they were '
        'passed to runs. Fix: do not keep scopes or Variables in closures or '
        'globals; pass values out of the transform as return values instead.')
    self.path = path


class MissingParamError(LiftError, flax_errors.ScopeParamNotFoundError):
  """A parameter does not exist and 'params' is not mutable, so it cannot be created."""

  def __init__(self, name, path):
    super().__init__(
        f'Could not find parameter named "{name}" in scope "{_path_text(path)}". It cannot be '
        'created because "params" is not mutable here. Fix: initialise the variables first with '
        '`init`, or check that the variables passed to `apply` come from the same model (a '
        'renamed submodule changes the path).')
    self.name, self.path = name, path


class MissingVariableError(LiftError, flax_errors.ScopeVariableNotFoundError):
  """A variable does not exist and cannot be created (no init_fn, or immutable collection)."""

  def __init__(self, col, name, path):
    super().__init__(
        f'No Variable named "{name}" for collection "{col}" exists in "{_path_text(path)}", '
        f'and it cannot be created here: either no init_fn was given or the collection "{col}" '
        f'is not mutable. Fix: pass an init_fn and `mutable=["{col}"]` (or `mutable=True`) to '
        '`apply`/`init`.')
    self.collection, self.name, self.path = col, name, path


class MissingCollectionError(LiftError, flax_errors.ScopeCollectionNotFound):
  """A variable was requested from an absent collection, and cannot be created there
  (no init_fn, or the collection is immutable)."""

  def __init__(self, col, name, path):
    super().__init__(
        f'Tried to access "{name}" from collection "{col}" in "{_path_text(path)}" but the '
        'collection is empty, and the variable cannot be created here (no init_fn, or '
        f'"{col}" is not mutable). Fix: include "{col}" in the variables passed to `apply` '
        f'(e.g. `{{"{col}": ...}}`), or create the variable: give an init_fn and make the '
        f'collection mutable (`mutable=["{col}"]`).')
    self.collection, self.name, self.path = col, name, path


class ParamShapeError(LiftError, flax_errors.ScopeParamShapeError):
  """An existing parameter's shape differs from the shape its init_fn would produce."""

  def __init__(self, name, path, existing_shape, expected_shape):
    super().__init__(
        f'For parameter "{name}" in "{_path_text(path)}", the given initializer is expected to '
        f'generate shape {expected_shape}, but the existing parameter it received has shape '
        f'{existing_shape}. The variables do not match the model configuration or the input '
        'shape. Fix: re-initialise the variables for this configuration, or pass inputs of the '
        'shape used at init.')
    self.name, self.path = name, path
    self.existing_shape, self.expected_shape = existing_shape, expected_shape


class ParamStructureError(ParamShapeError):
  """An existing parameter is another kind of tree than its init_fn makes (a list for an array)."""

  def __init__(self, name, path, existing, expected):
    LiftError.__init__(
        self, f'For parameter "{name}" in "{_path_text(path)}", the existing value is '
        f'{existing} where the initializer makes {expected}. Fix: store arrays, e.g. '
        f"variables['params'][...]['{name}'] = jnp.asarray(value).")
    self.name, self.path = name, path
    self.existing_shape = self.expected_shape = None


class InitFnError(LiftError, TypeError):
  """`param` or `variable` was given an initial value where it takes a function."""

  def __init__(self, method, col, name, path, init_fn):
    example = ("scope.param(name, jax.nn.initializers.zeros, shape)" if method == 'param'
               else f"variable('{col}', '{name}', lambda: {init_fn!r})")
    super().__init__(
        f'{method}("{name}") in collection "{col}" at "{_path_text(path)}" was given {init_fn!r} '
        f'({type(init_fn).__name__}) as its init_fn, which is not callable: the initial value is '
        f'made by calling it. Fix: pass a function, e.g. {example}, or jnp.zeros and its shape '
        'as the arguments after it.')
    self.collection, self.name, self.path = col, name, path


class ImmutableCollectionError(LiftError, flax_errors.ModifyScopeVariableError):
  """A write to a variable whose collection is not mutable."""

  def __init__(self, col, name, path):
    super().__init__(
        f'Cannot update variable "{name}" in "{_path_text(path)}" because collection "{col}" '
        f'is immutable. Fix: pass `mutable=["{col}"]` to `apply` (or `mutable=True`); inside a '
        f'lifted transform, also make sure the transform returns "{col}" (for example list it '
        'in `variable_axes`, `variable_carry` or the `variables` filter).')
    self.collection, self.name, self.path = col, name, path


class NearName(NamedTuple):
  """A name in a lifted transform's filters that matches nothing there, near the one meant."""
  transform: str | None  # the lifted transform whose filter it is
  written: str | None  # the name in its filter; None when no written name is near
  present: tuple[str, ...]  # the collections or streams there are


def _near_text(near: NearName, meant: str, kind: str) -> str:
  """A sentence on the near miss, or nothing."""
  if near.written is None:
    return ''
  present = ', '.join(f'"{name}"' for name in near.present) or 'none'
  return (f'The filters of the lifted `{near.transform}` name "{near.written}", which matches '
          f'no {kind} (the {kind}s here: {present}): did you mean "{meant}"? ')


class UnknownRngError(LiftError, flax_errors.InvalidRngError):
  """`make_rng` asked for a stream that this scope does not have.

  With ``left_out`` the stream was given outside the lifted transform it names, whose rng
  filter does not pass it in.
  """

  def __init__(self, rng_name, path, available, scope_name=None,
               left_out: NearName | None = None):
    who = f'{scope_name} needs PRNG for "{rng_name}"'
    if not scope_name:  # Flax's sentence, which names the unnamed root "None"
      who = f'None needs PRNG for "{rng_name}" (None: the unnamed top-level module)'
    if left_out is None:
      message = (
          f'{who}: scope "{_path_text(path)}" has only the streams {sorted(available)} (and no '
          f'"params" stream to fall back on). Fix: pass it, e.g. `rngs={{"{rng_name}": key}}` '
          'to `init`/`apply`; inside a lifted transform, make sure the transform\'s rng filter '
          f'(`split_rngs` / `rngs`) matches "{rng_name}".')
    else:
      message = (
          f'{who}: the stream is given outside the lifted `{left_out.transform}`, but no '
          f'entry of its rng filter matches "{rng_name}", so scope "{_path_text(path)}" inside '
          f'does not have it. {_near_text(left_out, rng_name, "stream")}Fix: pass it in: for '
          f'vmap/scan `split_rngs={{"{rng_name}": True}}` (a key per item or step, as the '
          f'params of an ensemble or a layer stack need) or `{{"{rng_name}": False}}` (the same '
          'key for each); for other transforms include it in `rngs`.')
    super().__init__(message)
    self.rng_name, self.path, self.available, self.scope_name = rng_name, path, available, scope_name
    self.left_out = left_out


class NameInUseError(LiftError, ValueError, flax_errors.NameInUseError):
  """A child scope or variable name is already taken in this scope."""

  def __init__(self, name, path, col=None):
    what = f'variable "{name}" of collection "{col}"' if col else f'child "{name}"'
    super().__init__(
        f'Name "{name}" is already in use at "{_path_text(path)}" (while reserving {what}). '
        'Each child scope, and each variable within a collection, needs a unique name per '
        'scope. Fix: choose another name, or pass `reuse=True` to `push` to get the existing '
        'child back.')
    self.name, self.path = name, path


class InvalidNameError(LiftError, TypeError):
  """A child scope or variable was given a name that is not a string."""

  def __init__(self, name, path):
    super().__init__(
        f'Scope names must be strings, got {name!r} ({type(name).__name__}) at '
        f'"{_path_text(path)}". Fix: name children and variables with strings, e.g. '
        f'`scope.push("layer_{name}")`, or leave the name out to get an automatic one.')
    self.name, self.path = name, path


class InvalidFilterError(LiftError, TypeError, flax_errors.InvalidFilterError):
  """A filter is not a bool, a string, a collection of strings or a DenyList."""

  def __init__(self, filter_like, where: str | None = None):
    """``where``: the argument that holds it, e.g. "the `mutable` argument of `apply`"."""
    held = f' (in {where})' if where else ''
    super().__init__(
        f'Invalid filter {filter_like!r} of type {type(filter_like).__name__}{held}. '
        'A filter is True (everything), False (nothing), a collection name, '
        'a list/tuple/set of names, or DenyList(filter). Fix: e.g. '
        '`["params", "batch_stats"]` or `DenyList("params")`.')
    self.filter, self.where = filter_like, where


class NotAScopeError(LiftError, TypeError):
  """A lifted transform was called with something other than scopes where its scope goes."""

  def __init__(self, transform_name, value):
    name = transform_name or 'pack'
    super().__init__(
        f'The lifted `{name}` was called with {type(value).__name__} {value!r:.60} where its '
        'first argument is a scope (or a pytree of scopes): a lift transform wraps a '
        'function of a scope, `fn(scope, *args)`. Fix: apply it to such a function; for a '
        'Module class or method use `nn.lift_transform(transform, ModuleClass, ...)`.')


class RepackedScopeError(InvalidScopeError):
  """``repack_fn`` was given scopes it has already repacked (it invalidates them)."""

  def __init__(self, transform_name, path):
    LiftError.__init__(
        self, f'repack_fn of the lifted `{transform_name or "pack"}` was given the scope at '
        f'"{_path_text(path)}" again: repacking collects its variables and ends it, so it '
        'is called once, after the last use of the scopes (or the transform has already '
        'returned). Fix: call repack_fn(scope) once, when the body is done, and return '
        'its groups.')
    self.path = path


class UnmappedCollectionError(LiftError):
  """A mutable collection was written inside a lifted transform but no out filter returns it."""

  def __init__(self, cols, transform_name, path):
    name = transform_name or 'pack'
    super().__init__(
        f'Collections {sorted(cols)} are mutable inside the lifted `{name}` at '
        f'"{_path_text(path)}" but match none of its output variable filters, so their values '
        'would be lost when it returns. Fix: give the transform a rule for them (for vmap/scan '
        'add them to `variable_axes`, `variable_broadcast` or `variable_carry`; for other '
        'transforms include them in `variables`), or make them immutable in `apply`.')
    self.collections, self.path = tuple(sorted(cols)), path


class UnliftedCollectionError(UnmappedCollectionError, ImmutableCollectionError):
  """A write inside a lifted transform to a collection that is mutable outside it but that
  the transform does not return (as in Flax, it is immutable inside: `sow` skips it).

  With ``near``, a name in the filters of the transform it names matches no collection and
  is near this one: a misspelling.
  """

  def __init__(self, col, name, path, transform_name, near: NearName | None = None):
    fix = (f'Fix: make the transform return "{col}": for vmap/scan add it to `variable_axes`, '
           '`variable_broadcast` or `variable_carry`; for map_variables pass `mutable=True` (and '
           '`init=True` to create it); for other transforms include it in `variables`.')
    if near is not None:
      fix = (f'{_near_text(near, col, "collection")}Fix: write "{col}" for "{near.written}" '
             'in them (in `variable_axes`, `variable_broadcast` or `variable_carry` for '
             'vmap/scan, `variables` for other transforms).')
    LiftError.__init__(
        self, f'Cannot update variable "{name}" in "{_path_text(path)}" because collection '
        f'"{col}" is immutable inside the lifted `{transform_name or "pack"}`: it is mutable '
        f'outside, but the transform does not return it, so the write would be lost. {fix}')
    self.collection, self.name, self.path = col, name, path
    self.collections = (col,)
    self.transform_name, self.near = transform_name, near


class InvalidVariablesError(LiftError, TypeError,
                            flax_errors.ApplyScopeInvalidVariablesTypeError,
                            flax_errors.ApplyScopeInvalidVariablesStructureError):
  """The variables passed to `apply`/`bind` are not a `{collection: {name: value}}` dict."""


class InvalidRngsError(LiftError, TypeError, ValueError, flax_errors.InvalidRngError):
  """The `rngs` argument is not a PRNG key or a dict of named PRNG keys."""


class RematPolicyError(LiftError, ValueError):
  """A loop's `remat=` value or a `ScanCheckpointPolicy` field is not valid.

  Also raised when a nested policy asks for more outer blocks than the loop has
  steps.
  """


class NestedForwardModeError(RematPolicyError, TypeError):
  """Forward-mode autodiff (`jax.jvp`, `jax.jacfwd`) reached a loop under ``remat='nested'``.

  The nested policy's backward pass is hand-written (a `jax.custom_vjp`), so it
  has reverse mode only.
  """


class ScanAxisError(LiftError, ValueError):
  """The `axis` of a `lift.loops` scan, fold or map cannot be used."""


class ScanLengthError(LiftError, ValueError):
  """The inputs of a loop disagree on the number of steps, or give none."""


class ScanBodyError(LiftError, TypeError):
  """The body of a lifted `scan` returned something other than a pair `(carry, ys)`."""


class ScanTapsError(LiftError, ValueError):
  """A `lift.loops.scan_taps` sequence, output or `fn` result breaks the taps rules."""


class StackRowsError(LiftError, TypeError, ValueError):
  """`lift.loops.stack_rows` got no trees or rows of different shapes or dtypes, or
  `unstack_rows` got leaves without one shared leading axis."""


class AxisSizeError(LiftError, ValueError):
  """A lifted vmap or scan cannot tell the size of its mapped axis.

  The mapped arguments and variables disagree, disagree with `axis_size` /
  `length`, or nothing is mapped and no size was given.
  """


class ParamAxisSizeError(AxisSizeError, flax_errors.ScopeParamShapeError):
  """The sizes disagree, and a parameter is among them: its mapped axis does not have the
  size of the rest (e.g. the params of a module passed into ``scan``, which are not
  stacked). Also a `flax.errors.ScopeParamShapeError`, as Flax raises for this."""


class PartitionNameError(LiftError, flax_errors.PartitioningUnspecifiedError):
  """A transform adds an axis to a `Partitioned` variable, but its ``metadata_params`` give
  no name for the axis."""

  def __init__(self, path: str, names):
    LiftError.__init__(
        self, 'Trying to transform a Partitioned variable but "partition_name" is not '
        f'specified in metadata_params: variable {path} (axes {names}) gains an axis that '
        'its box cannot name. Fix: pass the name to the transform or stack, '
        'metadata_params={nn.PARTITION_NAME: "layers"} (nn.PARTITION_NAME is '
        'flax.core.meta.PARTITION_NAME), or declare the variable without partitioning.')
    self.path = path


class AxisMetadataError(LiftError, ValueError):
  """A metadata box cannot follow an axis a transform adds or removes: its ``add_axis``
  leaves the partition spec without a name for the new axis, or the name to remove is
  not where the transform maps."""

  def __init__(self, path: str, problem: str, fix: str):
    super().__init__(f'variable {path}: {problem} Fix: {fix}')
    self.path = path


class InvalidAxisError(LiftError, ValueError):
  """An axis argument of a lifted transform (`variable_axes`, `in_axes`,
  `out_axes`, `split_rngs`, specs) is malformed or does not fit the values it
  applies to."""


class LoopInvariantError(LiftError, ValueError):
  """A value that a lifted scan treats as loop-invariant (a broadcast variable
  or an output with `out_axes=broadcast`) depends on the carry or on the
  scanned inputs."""


class ArgnumsError(LiftError, ValueError):
  """An entry of `static_argnums`, `static_argnames`, `donate_argnums` or
  `nondiff_argnums` of a lifted transform is not a valid index or name."""


class TransformArgumentError(LiftError, TypeError):
  """An argument of a lifted `checkpoint`, `jit`, `map_variables`, `cond`,
  `switch`, `while_loop`, `vjp`, `jvp`, `value_and_grad` or `custom_vjp` has the
  wrong type or value."""


class PackProtocolError(LiftError, TypeError):
  """A function given to `pack` broke its contract: it passed `scope_fn` or
  returned from `repack_fn` groups that do not match the filters (one group per
  filter, one entry per lifted root scope), or did not return `(y, out_groups)`."""


class JitArgumentError(LiftError, TypeError, ValueError):
  """A call of a lifted `jit` passes a value it cannot trace or cache: a
  non-array argument not marked static (`jax.jit` raises a TypeError), or an unhashable
  static value (a ValueError for `jax.jit` and Flax)."""


class RngReplayError(LiftError):
  """A `lift.jit` function drew different rng keys in two traces of the same
  structure (its Python code decides draws on something outside the cache key)."""


class BranchVariablesError(LiftError, ValueError):
  """The branches of a lifted `cond` or `switch` create or update different
  variables (names, shapes or dtypes)."""


class LoopVariablesError(LiftError, ValueError):
  """The body of a lifted `while_loop` creates carry variables or changes their
  shapes or dtypes."""


class ShardingError(LiftError, ValueError):
  """A variable's partitioning cannot be laid out on a mesh: the base class of
  `LogicalAxisRuleError`, `MeshAxisError` and `ShardingShapeError`."""


class LogicalAxisRuleError(ShardingError):
  """A variable is partitioned along a logical axis name that no axis rule maps to a mesh axis.

  Flax leaves such an axis unsharded without a word; a missing rule is more often a typo
  (``'mpl'`` for ``'mlp'``) or a stack's layer axis (``metadata_params``) forgotten.
  """

  def __init__(self, path: str, name: str, rules) -> None:
    known = sorted({str(rule[0]) for rule in rules}) or ['(none)']
    LiftError.__init__(
        self, f'variable {path}: logical axis "{name}" has no rule mapping it to a mesh axis '
        f'(rules name {", ".join(known)}). Fix: add a rule ("{name}", "<mesh axis>") to shard '
        f'along it or ("{name}", None) to keep it whole, e.g. in nn.logical_axis_rules([...]) '
        'or the rules= argument.')
    self.path, self.axis = path, name


class MeshAxisError(ShardingError):
  """A partition spec names a mesh axis that the mesh does not have."""

  def __init__(self, where: str, axis: Any, mesh_axes) -> None:
    LiftError.__init__(
        self, f'{where}: mesh axis "{axis}" is not an axis of the mesh, which has axes '
        f'{tuple(mesh_axes)}. Fix: name one of {tuple(mesh_axes)} (or None to replicate), or '
        f'build the mesh with an axis "{axis}", e.g. jax.make_mesh((4, 2), (\'data\', '
        f'\'{axis}\')).')
    self.axis = axis


class ShardingShapeError(ShardingError):
  """A dimension of a variable does not divide evenly over the mesh axes that shard it, or
  its spec has more entries than the variable has dimensions."""

  def __init__(self, where: str, shape, spec, problem: str) -> None:
    LiftError.__init__(
        self, f'{where}: shape {tuple(shape)} cannot be sharded as {spec}: {problem}. Fix: '
        'make that dimension a multiple of the mesh axes\' size, shard it over other (or '
        'fewer) mesh axes, or map its logical name to None in the axis rules.')
    self.shape, self.spec = tuple(shape), spec


class AttentionArgumentError(LiftError, ValueError):
  """An argument of `causal_self_attention` has the wrong value or shape (the message
  names it, what it got and what it takes).

  Examples:
    >>> x = jnp.ones((2, 4, 8))
    >>> try:
    ...   lift.causal_self_attention(x, x, x, implementation='cudnn')
    ... except AttentionArgumentError as e:
    ...   print(e)
    causal_self_attention: implementation is 'cudnn'; it takes one of (None, 'xla', 'flash'). Fix: ...
  """

  def __init__(self, argument: str, got: str, takes: str) -> None:
    super().__init__(f'causal_self_attention: {argument} is {got}; it takes {takes}. Fix: '
                     f'pass {argument} as that says (None or \'xla\' compute anywhere, '
                     '\'flash\' for TPU).')


class ScanRewriteError(LiftError, ValueError):
  """`optimize_scans` was asked for a rewrite it does not know, or given a bad
  `rewrites` argument; the message lists the rewrites there are.

  Examples:
    >>> try:
    ...   lift.optimize_scans(lambda x: x, rewrites=['push_out'])
    ... except ScanRewriteError as e:
    ...   print(e)
    optimize_scans: unknown rewrite(s) 'push_out' in `rewrites`. Known rewrites: ...
  """
