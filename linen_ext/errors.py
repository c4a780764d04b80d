"""Errors raised by `linen_ext`. Every class derives from `ModuleError` (a `LiftError`),
and, where Flax raises an error for the same misuse, from Flax's class too.

Messages say what failed (the module class, name or argument), why, and the fix.
"""
from __future__ import annotations

from typing import Any

from flax import errors as flax_errors

from lift.errors import LiftError

from linen_ext.describe import one_line, short_str


class ModuleError(LiftError):
  """Base class of every error raised by the `linen_ext` Module system."""


_UNBOUND = (
    '{what} on an unbound module `{cls}`: a module only has variables and rngs inside '
    '`init`, `apply` or a parent module that is itself bound. Fix: run it '
    'through `{cls}(...).init(key, x)` / `.apply(variables, x)`, or `bind` '
    'it: `module.bind(variables)`.')


# Flax's message for each kind of use of an unbound module, by how ours names the use
_FLAX_UNBOUND = (
    ('Calling @compact', "Can't call compact methods on unbound modules"),
    ('Calling setup', "Can't call compact methods on unbound modules"),
    ('Calling unbind', "Can't call `unbind()` on unbound modules"),
    ('Calling `share_scope`', "Can't call `share_scope` on unbound modules"),
    ('make_rng', "Can't use RNGs on unbound modules"),
    ('has_rng', "Can't query for RNGs on unbound modules"),
)


class UnboundModuleError(ModuleError, ValueError, flax_errors.CallCompactUnboundModuleError,
                         flax_errors.CallSetupUnboundModuleError,
                         flax_errors.CallUnbindOnUnboundModuleError,
                         flax_errors.CallShareScopeOnUnboundModuleError):
  """A module was used (called, asked for variables or rngs) outside `init`/`apply`."""

  def __init__(self, cls_name: str, what: str):
    flax_phrase = next((p for start, p in _FLAX_UNBOUND if what.startswith(start)), None)
    ours = _UNBOUND.format(what=what, cls=cls_name)
    super().__init__(f'{flax_phrase}. {ours}' if flax_phrase else ours)


class NameInUseError(ModuleError, ValueError, flax_errors.NameInUseError):
  """Two submodules, or a submodule and a variable, claim one name in one module."""

  def __init__(self, kind: str, name: str, parent_cls: str, path: tuple[str, ...]):
    super().__init__(
        f'Could not create {kind} "{name}" in Module {parent_cls}: Name in use (at '
        f'"/{"/".join(path)}", by another submodule or variable of this module). '
        'Names must be unique per module. Fix: '
        f'pass a different `name=` (or leave it out to get an automatic '
        f'`ClassName_N` name), or reuse the existing instance to share its variables.')
    self.name, self.path = name, tuple(path)


class ReservedNameError(ModuleError, TypeError, flax_errors.ReservedModuleAttributeError):
  """A Module subclass declares `parent` or `name` as its own field."""

  def __init__(self, cls_name: str, field: str):
    super().__init__(
        f'`{cls_name}` declares a field "{field}", but `parent` and `name` are '
        'reserved by Module (every module gets them as keyword-only '
        'arguments). Fix: rename the field, e.g. `layer_name: str`.')


class FrozenModuleError(ModuleError, AttributeError,
                        flax_errors.SetAttributeFrozenModuleError):
  """An attribute of a module was set outside `setup`."""

  def __init__(self, cls_name: str, attr: str, value: Any):
    super().__init__(
        f"Can't set {attr}={short_str(value)} for Module of type {cls_name}: Module instance is "
        'frozen outside of setup method (modules are frozen dataclasses). Fix: assign '
        'submodules and variables in `setup()`, or make a modified copy with '
        f'`module.clone({attr}=...)`.')


class SetupFieldAssignmentError(ModuleError, AttributeError,
                                flax_errors.SetAttributeInModuleSetupError):
  """`setup` assigned to a dataclass field."""

  def __init__(self, cls_name: str, attr: str):
    super().__init__(
        f'`{cls_name}.setup` assigns to "{attr}", which is a dataclass field '
        '(a constructor argument). Fields are fixed when the module is '
        'constructed. Fix: pass the value to the constructor, or store the '
        'derived value under another attribute name in `setup`.')


class SubmoduleOutsideSetupError(ModuleError, ValueError, flax_errors.AssignSubModuleError):
  """A submodule or variable was created in a method that is neither `setup` nor `@compact`."""

  def __init__(self, cls_name: str, kind: str, name: str):
    """``kind``: 'Submodule', 'Variable' or 'Parameter'; the message starts with Flax's."""
    if kind == 'Submodule':
      head = f'Submodule {name} must be defined in `setup()` or in a method wrapped in `@compact`'
    else:
      head = (f'{kind}s must be initialized in `setup()` or in a method wrapped in '
              f'`@compact` ({kind.lower()} "{name}")')
    super().__init__(
        f'{head}, but this one was created on `{cls_name}` elsewhere (in another of its '
        'methods, or in a function it was passed to, e.g. by `nn.vjp`). Submodules and '
        'variables are defined in one of those so their names are stable. Fix: '
        'decorate the method with `@nn.compact`, or define them in `setup()`.')


class FlaxModuleCalledInlineError(ModuleError, flax_errors.CallCompactUnboundModuleError):
  """A `flax.linen` module that no module adopted was called in a method of a Module."""

  def __init__(self, cls_name: str, method: str):
    super().__init__(
        "Can't call compact methods on unbound modules: a flax.linen module called in "
        f'`{cls_name}.{method}` is bound to no module. A flax module made in a method of '
        'ours is adopted by that module, and one held by a field or assigned in `setup` '
        'is wrapped; this one was made elsewhere (at import, in another function, or in '
        '`setup` without being assigned). Fix: wrap it where it is used, '
        '`nn.from_flax(flax_module)(x)`, make it inside the method, or pass it as a field.')


class TimeAxisError(ModuleError, ValueError):
  """`nn.as_scan`'s ``time_axis`` is an axis the module does not carry state along,
  while it does along another (most likely the batch axis was given)."""

  def __init__(self, method: str, time_axis: int, causal_axis: int):
    super().__init__(
        f'nn.as_scan(time_axis={time_axis}): nothing in `{method}` carries information '
        f'along axis {time_axis} of its inputs, so the step would keep no state and take '
        f'each slice along that axis as one time step; the module does carry state along '
        f'axis {causal_axis} (it is causal along it). Axis {time_axis} is most likely the '
        f'batch. Fix: time_axis={causal_axis}.')


class InvalidParentError(ModuleError, TypeError):
  """`parent=` is not None, a Module or a Scope."""

  def __init__(self, cls_name: str, parent):
    kind = type(parent).__name__
    if type(parent).__module__.startswith('flax.core'):  # a child of Flax's scope
      kind = (f'a {type(parent).__module__}.{kind} that is not a root (a root one is taken '
              'as a lift.Scope over its variables); `lift.bind(variables, rngs=..., '
              'mutable=...)` makes a lift.Scope over the same variables')
    super().__init__(
        f'`{cls_name}(parent=...)` got {kind}; parent must be '
        'None (a detached module), a Module or a lift.Scope. Fix: leave '
        '`parent` out, or pass `parent=None` for a module used through '
        '`init`/`apply` only, or `parent=lift.bind(variables)` (as `module.bind(variables)`).')


class InvalidMethodError(ModuleError, TypeError, flax_errors.ApplyModuleInvalidMethodError):
  """`apply(..., method=...)` is neither a method name nor a callable taking the module."""

  def __init__(self, method):
    super().__init__(
        f'Cannot call apply(): {method!r} is not a valid function for apply(): it '
        'is not a method of the module. Fix: pass its name '
        '(`method="encode"`), the unbound function (`method=Model.encode`), '
        'or a function taking the module first (`method=lambda m, x: m.encode(x)`).')


class MissingMethodError(InvalidMethodError, AttributeError):
  """`init`/`apply` was asked for a method (``__call__`` by default) the module lacks."""

  def __init__(self, cls_name: str, name: str):
    ModuleError.__init__(
        self, f'"{cls_name}" object has no attribute "{name}", so `init`/`apply` cannot '
        f'call it. Fix: define `{name}` on `{cls_name}`, or pass the method to run: '
        '`method="encode"`, `method=Model.encode` or `method=lambda m, x: m.encode(x)`.')


class MethodNotCallableError(InvalidMethodError):
  """`init`/`apply` was given ``method=name`` naming an attribute that is not callable."""

  def __init__(self, cls_name: str, name: str, value: Any):
    ModuleError.__init__(
        self, f"'{cls_name}.{name}' must be a callable, got {type(value)}. Fix: pass the "
        'name of a method of the module (`method="encode"`), or a function taking the '
        'module first (`method=lambda m, x: m.encode(x)`).')


class InvalidInstanceModuleError(ModuleError, TypeError,
                                 flax_errors.InvalidInstanceModuleError):
  """An entry point (`init`, `apply`, `bind`, ...) was called on a Module class, or
  `nn.apply`, `nn.init` or `nn.as_scan` was given something other than a Module instance."""

  def __init__(self, entry: str, got, usage: str | None = None):
    """``usage``: for a function taking the module as an argument (`nn.apply`), a call."""
    if usage is not None:
      super().__init__(
          f'`{entry}` got {type(got).__name__} {short_str(got)} as its module, not a Module '
          f'instance. Fix: pass an instance, e.g. `{usage}`.')
      return
    super().__init__(
        f'`{entry}` got {type(got).__name__} as `self`: it was called on a Module '
        f'class (`MyModule.{entry}(...)`), not on an instance. Fix: instantiate the '
        f'module first, `MyModule(...).{entry}(...)`.')


class IncorrectPostInitOverrideError(ModuleError, TypeError,
                                     flax_errors.IncorrectPostInitOverrideError):
  """A subclass overrides `__post_init__` without calling `super().__post_init__()`."""

  def __init__(self, cls_name: str):
    super().__init__(
        f'`{cls_name}.__post_init__` does not call `super().__post_init__()`, so the '
        'module was never set up (no scope, name or state). Fix: call '
        '`super().__post_init__()` in it.')


class UnboundAttributeError(ModuleError, AttributeError):
  """An attribute missing from an unbound module was read (one that `setup` defines only
  exists inside `init`/`apply`)."""

  def __init__(self, cls_name: str, name: str):
    super().__init__(
        f'"{cls_name}" object has no attribute "{name}". If "{name}" is defined in `setup`, '
        'it only exists inside `init`/`apply` (or on a module returned by `bind`). Fix: read '
        f'it in a method run by `init`/`apply`, or on the bound module: '
        f'`module.bind(variables).{name}`.')


class DescriptorAttributeError(ModuleError, AttributeError,
                               flax_errors.DescriptorAttributeError):
  """A property (or other descriptor) of a module raised `AttributeError` itself."""

  def __init__(self, cls_name: str, name: str):
    super().__init__(
        'Trying to access a property that is accessing a non-existent attribute: '
        f'reading `{cls_name}.{name}`, a property or descriptor of the class, raised '
        'AttributeError from its own code. Fix: '
        'that code (a misspelled field, or a setup attribute read on a module '
        'that is not bound).')


class MissingPerturbationError(ModuleError, ValueError):
  """`perturb` found its collection in the variables, but not this perturbation."""

  def __init__(self, collection: str, name: str, path: str):
    super().__init__(
        f'Perturbation collection {collection} present, but missing perturbation '
        f'variable {name} (perturb("{name}") at "{path}"), so this value would go '
        f'unperturbed. Fix: pass the "{collection}" that `init` returned for this '
        f'model, or leave the collection out to run without perturbations.')


class TransformTargetError(ModuleError, TypeError, flax_errors.TransformTargetError):
  """A lifted transform was given a Module instance (ours or `flax.linen`'s), a class that
  is not a Module class, or something else that is neither a class nor a function."""

  def __init__(self, transform: str, target):
    is_class = isinstance(target, type)
    kind = type(target) if not is_class else target
    what = (f'the class {kind.__module__}.{kind.__name__}' if is_class
            else f'{type(target).__name__} instance {one_line(target)}')
    flax_fix = ''
    if kind.__module__.startswith('flax.'):  # a flax.linen instance: its class transforms
      flax_fix = (' For a flax.linen module, transform its class, as with Flax '
                  f'(`nn.{transform}(flax.linen.Dense, ...)(3)`), or call it in a module of '
                  'yours (`nn.from_flax(layer)(x)`) and transform that.')
    super().__init__(
        f'`nn.{transform}` was given {what}; it transforms a Module class of this package '
        'or a method. Fix: transform the class '
        f'and instantiate the result, `nn.{transform}(MyModule, ...)(...)`, or '
        f'decorate the method with `@nn.{transform}(...)`.{flax_fix}')


class NotAModuleError(ModuleError, TypeError):
  """A function-style transform (`nn.cond`, `nn.vjp`, ...) was given something not a Module."""

  def __init__(self, transform: str, target: Any):
    what = type(target).__name__
    if isinstance(target, (list, tuple)):
      what += ' of ' + ', '.join(type(item).__name__ for item in target)
    super().__init__(
        f'`nn.{transform}` lifts one module, passed after the functions; got a '
        f'{what}. Fix: pass the parent module '
        f'(`self`) and reach its submodules inside the functions, e.g. '
        f'`nn.{transform}(..., self, x)` with `lambda mdl, x: mdl.dense(x)`.')


class TransformedReturnError(ModuleError, TypeError,
                             flax_errors.TransformedMethodReturnValueError):
  """A transformed method returned a Module or a Variable."""

  def __init__(self, transform: str, method: str, what: str):
    super().__init__(
        f'Method "{method}" transformed by `nn.{transform}` returned a {what}. '
        'Modules and Variables are bound to the scopes of the transform and '
        'become invalid when it returns. Fix: return arrays (e.g. '
        '`variable.value` or the submodule\'s output) instead.')


class StaticArgnumsError(ModuleError, ValueError):
  """`static_argnums` / `static_argnames` do not fit the transformed method."""

  def __init__(self, transform: str, method: str, detail: str):
    super().__init__(
        f'`nn.{transform}` on "{method}": {detail} As in Flax, '
        '`static_argnums` counts `self` as 0, so the first argument after '
        '`self` is 1. Fix: e.g. `static_argnums=(1,)` for `def f(self, '
        'config, x)`, or name it: `static_argnames=("config",)`.')


class TransformMethodsError(ModuleError, TypeError):
  """`methods=` is not a list of method names or a dict of per-method options."""

  def __init__(self, transform: str, methods):
    super().__init__(
        f'`nn.{transform}(..., methods={methods!r:.80})`: methods must be None '
        '(transform `__call__`), a list/tuple of method names, or a dict '
        '`{name: {option: value}}` of per-method options. Fix: e.g. '
        '`methods=["__call__", "encode"]`.')


class NotAMethodError(ModuleError, AttributeError):
  """A name in `methods=` is not a method of the class being transformed."""

  def __init__(self, transform: str, cls_name: str, name: str):
    super().__init__(
        f'`nn.{transform}({cls_name}, methods=[..., "{name}"])`: `{cls_name}` '
        f'has no method "{name}". Fix: list only methods defined on the class.')


class NativeLayerError(ModuleError, TypeError):
  """A `NativeLayer` names a flax class whose code builds flax layers that have no native
  counterpart yet."""

  def __init__(self, owner: str, missing: list[str]):
    super().__init__(
        f'{owner}: the flax code builds {missing}, which have no native layer yet, so the '
        'copied code cannot build native submodules. Fix: define a NativeLayer for each '
        'of them first (class X(nn.NativeLayer): flax_class = flax.linen.X), or wrap the '
        'flax module with nn.from_flax instead.')


class FlaxAdapterError(ModuleError, TypeError):
  """`from_flax` was given something that is not a `flax.linen.Module` instance."""

  def __init__(self, obj):
    super().__init__(
        f'`linen_ext.from_flax` expects a flax.linen.Module instance, got '
        f'{type(obj).__name__}. Fix: pass an instance, e.g. '
        '`from_flax(flax.linen.Dense(4))`, not the class.')


class MultipleScopesError(ModuleError, ValueError):
  """vjp/jvp/custom_vjp on a module that brings other modules' scopes along."""

  def __init__(self, transform: str, count: int):
    super().__init__(
        f'`nn.{transform}` needs the variables of exactly one module, but this '
        f'call lifts {count} scopes (modules passed as fields or arguments bring '
        'their own). The cotangents of variables are shaped like one scope. '
        f'Fix: call `nn.{transform}` on a module without module fields or '
        'module arguments, or pass `multi_scope=True` to `nn.vjp` to get one '
        'cotangent dict per scope.')


class NonScalarOutputError(ModuleError, TypeError):
  """`nn.grad`/`nn.value_and_grad` of a function whose output is not a scalar."""

  def __init__(self, transform: str, shape: tuple):
    super().__init__(
        f'`nn.{transform}` differentiates a scalar function, but the output has '
        f'shape {shape}. Fix: reduce it first, e.g. `lambda mdl, x: mdl(x).sum()`, '
        'or use `nn.vjp` for a vector output.')


class UnhashableModuleError(ModuleError, TypeError):
  """A module cannot be hashed: `hash` of a bound module (it holds variables), or `nn.jit`
  on a module with a field that cannot be hashed. The raise site writes the message."""


class LayerArgumentError(ModuleError, ValueError, TypeError):
  """A ready-made layer got a configuration or input it cannot use (an empty `Sequential`,
  an `RNN` of a module that is not a cell, `SpectralNorm` of a tensor with
  ``error_on_non_matrix``); the message says which and the fix."""


class LayerStackError(ModuleError, ValueError):
  """A layer stack (`Stacked`, `BlockSeq`, `scan_layers`, layout conversion) got
  arguments or variables it cannot use; the message says which and the fix."""


class LayerMismatchError(LayerStackError):
  """Layers run as one loop (`scan_layers`) or stacked (`layers_to_stacked`)
  differ in their variables (names, shapes, dtypes) or in their code (class, fields)."""


class LazyInitError(ModuleError, ValueError, flax_errors.LazyInitError):
  """`lazy_init` got a `jax.ShapeDtypeStruct` for an input the variables depend on."""

  def __init__(self, placeholders: str):
    super().__init__(
        '`lazy_init(rngs, *args, **kwargs)` cannot create the variables: they depend on '
        f'the value of an input passed as a jax.ShapeDtypeStruct ({placeholders}), which '
        'gives only its shape and dtype. Fix: pass a concrete value for that input, or '
        'call `init` instead.')


class NoCurrentModuleError(ModuleError, ValueError):
  """A function that declares variables in "the current module" ran outside any module method."""

  def __init__(self, fn_name: str):
    super().__init__(
        f'`{fn_name}` ran outside the methods of a module, so there is no module to '
        f'declare the variable in. Fix: call it from a `@compact` method or `setup`, '
        f'or pass the module: `{fn_name}(..., module=self)`.')


class AxesMismatchError(ModuleError, ValueError):
  """Logical axis names disagree: a variable declared twice, or a transform's axis missing."""

  def __init__(self, where: str, expected: Any, found: Any, fix: str):
    super().__init__(f'{where}: expected logical axes {expected}, found {found}. Fix: {fix}')


class PipelineError(LayerStackError):
  """`Stacked.pipeline` got a configuration or an input it cannot run; each subclass
  names the argument at fault and the message gives the fix."""


class MicrobatchError(PipelineError):
  """``microbatches`` is not a positive int that divides the batch (the leading axis of
  every input leaf), or is fewer than ``stages`` under the circular schedule, or an array
  argument (per example, like ``x``) has another leading axis than the batch."""


class StageCountError(PipelineError):
  """``stages`` (times ``repeats``) does not divide the stack's layers, or ``stages``,
  ``repeats`` or ``schedule`` is not a value the pipeline takes."""


class PipelineCarryError(PipelineError):
  """The block returned a carry of another structure, shape or dtype than it received:
  a pipeline passes one activation buffer from stage to stage."""


class PipelineVariablesError(PipelineError):
  """A block changed the structure, shape or dtype of a variable `Stacked.pipeline`
  carries from one microbatch to the next (e.g. ``sow`` into a collection passed back in,
  which grows its tuple)."""


class PipelineMeshError(PipelineError):
  """``mesh_axis`` names no axis of the current mesh, or an axis of another size than
  ``stages``."""


class ScaleError(ModuleError, ValueError):
  """A request to compile for a topology or to plan a configuration cannot be met; each
  subclass names the argument at fault, and the message gives the fix. Raised before
  anything compiles."""


class TopologyError(ScaleError):
  """An unknown TPU topology name (the message lists the known ones), or libtpu, the
  compiler for TPU targets, is not installed (the message says how to install it)."""


class MeshShapeError(ScaleError):
  """A mesh's axis sizes do not multiply to the number of chips, or name an axis other
  than ``stage``, ``data`` and ``model``."""


class BatchShardingError(ScaleError):
  """The batch does not divide over the mesh axes its leading (batch) dimension is
  sharded over."""


class PlanError(ScaleError):
  """`nn.plan` found no candidate that fits the memory limit (the message names the
  smallest need and the candidate that has it), or got a model it cannot vary."""


class ModelStateError(ScaleError):
  """An NNX model given to `nn.compile_train_step` or `nn.plan` holds variables other than
  `nnx.Param` ones (RNG streams, batch statistics), which the step would not update."""


class OptimizerStreamError(ScaleError):
  """The optimizer couples parameters of different layers (``optax.clip_by_global_norm``
  does), so the layer-by-layer update of an optimizer state in host memory would not be
  its update."""

  def __init__(self, argument: str):
    super().__init__(
        f'`{argument}`: updating one layer at a time (offload_optimizer=True streams the '
        'optimizer state of a layer stack through the chip layer by layer) gives a '
        'different update from the whole one: the optimizer couples parameters across '
        'layers, as `optax.clip_by_global_norm` does. Fix: pass the clipping as '
        '`clip_norm=` (applied to all gradients before the update) and an optimizer '
        'without it, or keep the optimizer state on the chip (offload_optimizer=False).')
