"""Lifted transforms for Modules, with Flax's signatures.

Each transform applies to a Module class (a subclass named like Flax's: ``vmap(MLP)``
is ``VmapMLP``) or decorates a method; ``methods=`` picks a class's methods (a list, or
a dict of per-method options). All go through one mechanism (``lifting``): the lift
transform lifts the module's scopes; the method runs on a clone bound to the inner ones.
"""
from __future__ import annotations

import collections
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar, cast

from lift.checkpoint import checkpoint as lift_checkpoint
from lift.filters import Filter
from lift.fold_rngs import fold_rngs as lift_fold_rngs
from lift.jit import jit as lift_jit
from lift.map_variables import map_variables as lift_map_variables
from lift.metadata import add_axis, remove_axis
from lift.remat_scan import remat_scan as lift_remat_scan
from lift.scan import scan as lift_scan
from lift.shard_map import shard_map as lift_shard_map
from lift.vmap import vmap as lift_vmap

from linen_ext import errors
from linen_ext.transforms.lifting import (Build, cached_lifted, call_lifted, forked_rngs,
                               is_module_class, mark_wrapped, positional_parameters)
from linen_ext.module.core import Module, fn_name, wrap_method
from linen_ext.module.foreign import FOREIGN_MODULES, our_class

Target = TypeVar('Target')


class TransformSpec(NamedTuple):
  """A Module transform: its name, the `lift` transform, and how options reach it.

  >>> VMAP = TransformSpec('vmap', lift.vmap)
  """
  name: str
  lift_fn: Callable[..., Any]
  cached: bool = False  # jit: build once per method, pass the module as a static argument
  fork_rngs: bool = False  # streams restart from a key drawn at the module (Flax's fold_rngs)
  adapt: Callable[[str, Callable[..., Any], dict], dict] | None = None
  class_prefix: str | None = None  # of a transformed class's name; default: name.capitalize()


def _apply_lift(lift_fn: Callable[..., Any], options: dict, core: Callable[..., Any]):
  return lift_fn(core, **options)


def _probe(scope, *args, **kwargs):
  del scope, args, kwargs


def _method(spec: TransformSpec, fn: Callable[..., Any], options: dict,
            cls: type | None) -> Callable[..., Any]:
  """The transformed method; the lift transform is built (and validated) here, once."""
  options = spec.adapt(spec.name, fn, options) if spec.adapt else options
  build: Build = functools.partial(_apply_lift, spec.lift_fn, options)
  build(_probe)
  if spec.cached:
    call = cached_lifted(spec.name, build, fn)

    def method(self, *args, **kwargs):
      return call(self, args, kwargs, cls)
  elif spec.fork_rngs:

    def method(self, *args, **kwargs):
      with forked_rngs(self._bound_scope(f'Calling `nn.{spec.name}`-transformed "{fn_name(fn)}"')):
        return call_lifted(spec.name, build, fn, self, args, kwargs, cls)
  else:

    def method(self, *args, **kwargs):
      return call_lifted(spec.name, build, fn, self, args, kwargs, cls)

  return mark_wrapped(method, fn)


def _per_method_options(spec: TransformSpec, methods: Any, options: dict) -> dict[str, dict]:
  if methods is None:
    return {'__call__': options}
  if isinstance(methods, Mapping):
    return {name: {**options, **dict(extra)} for name, extra in methods.items()}
  if isinstance(methods, (list, tuple)) and all(isinstance(m, str) for m in methods):
    return {name: options for name in methods}
  raise errors.TransformMethodsError(spec.name, methods)


def _transform_class(spec: TransformSpec, target: Any, methods: Any, options: dict):
  partial = target if isinstance(target, functools.partial) else None
  module_class = cast(type, partial.func if partial else target)  # a Module class
  namespace: dict[str, Any] = {}
  for name, method_options in _per_method_options(spec, methods, options).items():
    fn = getattr(module_class, name, None)
    if not callable(fn):
      raise errors.NotAMethodError(spec.name, module_class.__name__, name)
    namespace[name] = _method(spec, fn, method_options, module_class)
  namespace['__module__'] = module_class.__module__
  prefix = spec.class_prefix or spec.name.capitalize()
  cls = type(f'{prefix}{module_class.__name__}', (module_class,), namespace)
  return functools.partial(cls, *partial.args, **partial.keywords) if partial else cls


# Transformed classes by (transform spec, class, options): ``nn.jit(Block)`` written inside a
# compact method gives the same class, hence the same compiled function, on every call.
_CLASSES: collections.OrderedDict = collections.OrderedDict()
_CLASSES_SIZE = 1024


def _freeze(value: Any) -> Any:
  if isinstance(value, Mapping):
    return (Mapping, tuple((k, _freeze(v)) for k, v in value.items()))
  if isinstance(value, (list, tuple)):
    return (type(value), tuple(_freeze(v) for v in value))
  return value


def _cached_class(spec: TransformSpec, target: Any, methods: Any, options: dict):
  key = (spec, target, _freeze(methods), _freeze(options))
  try:
    hash(key)
  except TypeError:
    return _transform_class(spec, target, methods, options)
  if key not in _CLASSES:
    _CLASSES[key] = _transform_class(spec, target, methods, options)
    if len(_CLASSES) > _CLASSES_SIZE:
      _CLASSES.popitem(last=False)
  _CLASSES.move_to_end(key)
  return _CLASSES[key]


def apply_spec(spec: TransformSpec, target: Target, options: dict,
               methods: Any = None) -> Target:
  """Applies ``spec`` to a Module class (a new class) or a method (a decorated method); a
  `flax.linen` class is transformed as the `FlaxLayer` class standing for it."""
  if inspect.isclass(target):
    target = cast(Target, our_class(target))
  foreign = isinstance(target, tuple(FOREIGN_MODULES))  # a flax.linen module instance
  if isinstance(target, Module) or foreign or not callable(target) or (
      inspect.isclass(target) and not is_module_class(target)):
    raise errors.TransformTargetError(spec.name, target)
  if is_module_class(target):
    return _cached_class(spec, target, methods, options)
  return cast(Target, _method(spec, wrap_method(target), options, None))  # called alike


# -- argument adapters ---------------------------------------------------------------


def _as_tuple(value: Any) -> tuple:
  if isinstance(value, Iterable) and not isinstance(value, str):
    return tuple(value)
  return (value,)


def _check_argnums(transform: str, fn: Callable[..., Any], argument: str, nums: tuple):
  names, has_varargs = positional_parameters(fn)
  for i in nums:
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
      raise errors.StaticArgnumsError(transform, fn_name(fn),
                                      f'`{argument}` holds {i!r}, not a non-negative int.')
    if i >= len(names) and not has_varargs:
      raise errors.StaticArgnumsError(
          transform, fn_name(fn),
          f'`{argument}={nums}` names position {i}, but it only has positional '
          f'parameters {names}.')


def _checkpoint_options(transform: str, fn: Callable[..., Any], options: dict) -> dict:
  nums = _as_tuple(options['static_argnums'])
  _check_argnums(transform, fn, 'static_argnums', nums)
  # lift.checkpoint counts the first argument after the scope as 0; here self is 0.
  return {**options, 'static_argnums': tuple(i - 1 for i in nums if i > 0)}


def _jit_options(transform: str, fn: Callable[..., Any], options: dict) -> dict:
  static, donate = _as_tuple(options['static_argnums']), _as_tuple(options['donate_argnums'])
  _check_argnums(transform, fn, 'static_argnums', static)
  _check_argnums(transform, fn, 'donate_argnums', donate)
  # lift.jit counts the scope as 0; the module proxy is argument 1 and static.
  return {**options, 'static_argnums': (1,) + tuple(i + 1 for i in static if i > 0),
          'donate_argnums': tuple(i + 1 for i in donate if i > 0)}


def _map_variables_options(transform: str, fn: Callable[..., Any], options: dict) -> dict:
  del transform, fn
  options = dict(options)
  options['map_in_fn'], options['map_out_fn'] = options.pop('trans_in_fn'), options.pop('trans_out_fn')
  return options


def _scan_options(transform: str, fn: Callable[..., Any], options: dict) -> dict:
  # The loop names the user's method in messages and paths: nn.scan(Cell.__call__).
  return {**options, '_name': f'nn.{transform}({fn.__qualname__})'}


VMAP = TransformSpec('vmap', lift_vmap)
SCAN = TransformSpec('scan', lift_scan, adapt=_scan_options)
CHECKPOINT = TransformSpec('checkpoint', lift_checkpoint, adapt=_checkpoint_options)
JIT = TransformSpec('jit', lift_jit, cached=True, adapt=_jit_options)
MAP_VARIABLES = TransformSpec('map_variables', lift_map_variables, adapt=_map_variables_options)
REMAT_SCAN = TransformSpec('remat_scan', lift_remat_scan)
FOLD_RNGS = TransformSpec('fold_rngs', lift_fold_rngs, fork_rngs=True)
SHARD_MAP = TransformSpec('shard_map', lift_shard_map)


# -- class and method transforms --------------------------------------------------------


def vmap(target: Target, variable_axes: Mapping[Filter, int | None] = {},  # noqa: B006
         split_rngs: Mapping[Filter, bool] = {}, in_axes: Any = 0,  # noqa: B006
         out_axes: Any = 0, axis_size: int | None = None, axis_name: Any = None,
         spmd_axis_name: Any = None, metadata_params: Mapping[Any, Any] = {},  # noqa: B006
         methods: Any = None) -> Target:
  """Vectorises a Module class or method (``lift.vmap`` on its scopes).

  Keyword arguments of the call reach every item unmapped (with no positional argument
  mapped, ``axis_size`` must say so). Not for a batch axis over shared weights: layers
  broadcast over leading axes already.

  Examples:
    >>> Ensemble = nn.vmap(nn.Dense, variable_axes={'params': 0}, split_rngs={'params': True})
    >>> variables = Ensemble(2).init(jax.random.key(0), jnp.ones((3, 4)))
    >>> variables['params']['kernel'].shape   # one (4, 2) kernel per item
    (3, 4, 2)
  """
  return apply_spec(VMAP, target, dict(
      variable_axes=variable_axes, split_rngs=split_rngs, in_axes=in_axes,
      out_axes=out_axes, axis_size=axis_size, axis_name=axis_name,
      spmd_axis_name=spmd_axis_name, metadata_params=metadata_params), methods)


def scan(target: Target, variable_axes: Mapping[Filter, int] = {},  # noqa: B006
         variable_broadcast: Filter = False, variable_carry: Filter = False,
         split_rngs: Mapping[Filter, bool] = {}, in_axes: Any = 0,  # noqa: B006
         out_axes: Any = 0, length: int | None = None, reverse: bool = False,
         unroll: int = 1, data_transform: Callable[..., Any] | None = None,
         metadata_params: Mapping[Any, Any] = {}, methods: Any = None,  # noqa: B006
         _split_transpose: bool = False, check_constancy_invariants: bool = True,
         remat: Any = False, optimize: Any = False) -> Target:
  """Loops a Module class or method ``f(self, carry, *xs) -> (carry, ys)`` (``lift.scan``).
  ``optimize``: `lift.optimize_scans` on the loop (True, or rewrite names).

  Not for a stack of layers with weights of their own: `Stacked` says it shorter.

  Examples:
    >>> class Cell(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, c, x):
    ...     c = nn.Dense(2)(c) + x
    ...     return c, c
    >>> Loop = nn.scan(Cell, variable_broadcast='params', split_rngs={'params': False})
    >>> (c, ys), variables = Loop().init_with_output(
    ...     jax.random.key(0), jnp.zeros(2), jnp.ones((5, 2)))
    >>> ys.shape, variables['params']['Dense_0']['kernel'].shape   # weights shared by steps
    ((5, 2), (2, 2))
  """
  return apply_spec(SCAN, target, dict(
      variable_axes=variable_axes, variable_broadcast=variable_broadcast,
      variable_carry=variable_carry, split_rngs=split_rngs, in_axes=in_axes,
      out_axes=out_axes, length=length, reverse=reverse, unroll=unroll,
      data_transform=data_transform, metadata_params=metadata_params, remat=remat,
      optimize=optimize, _split_transpose=_split_transpose,
      check_constancy_invariants=check_constancy_invariants), methods)


def checkpoint(target: Target, variables: Filter = True, rngs: Filter = True,
               concrete: bool = False, prevent_cse: bool = True,
               static_argnums: int | tuple[int, ...] = (),
               policy: Callable[..., bool] | None = None, methods: Any = None,
               static_argnames: str | Iterable[str] = ()) -> Target:
  """Rematerialises a Module class or method (``lift.checkpoint``); ``self`` is argument 0.

  Not needed with memory to spare: recomputation costs time.

  Examples:
    >>> RematDense = nn.remat(nn.Dense)   # the same variables and values as Dense
    >>> jax.tree.map(jnp.shape, RematDense(2).init(jax.random.key(0), jnp.ones((1, 3))))
    {'params': {'bias': (2,), 'kernel': (3, 2)}}
  """
  return apply_spec(CHECKPOINT, target, dict(
      variables=variables, rngs=rngs, concrete=concrete, prevent_cse=prevent_cse,
      static_argnums=static_argnums, policy=policy, static_argnames=static_argnames), methods)


remat = checkpoint


def jit(target: Target, variables: Filter = True, rngs: Filter = True,
        static_argnums: int | Iterable[int] = (), static_argnames: str | Iterable[str] = (),
        donate_argnums: int | Iterable[int] = (), device: Any = None,
        backend: str | None = None, methods: Any = None) -> Target:
  """Compiles a Module class or method (``lift.jit``); ``self`` is argument 0.

  Repeated calls, and fresh instances with the same configuration, reuse the
  compiled function. Not worth it inside a function that is already jitted:
  there it is inlined.

  Examples:
    >>> JitDense = nn.jit(nn.Dense)
    >>> y, variables = JitDense(2).init_with_output(jax.random.key(0), jnp.ones((1, 3)))
    >>> y.shape
    (1, 2)
  """
  return apply_spec(JIT, target, dict(
      variables=variables, rngs=rngs, static_argnums=static_argnums,
      static_argnames=static_argnames, donate_argnums=donate_argnums, device=device,
      backend=backend), methods)


def _identity(x: Any) -> Any:
  return x


def map_variables(target: Target, mapped_collections: Filter = True,
                  trans_in_fn: Callable[..., Any] = _identity,
                  trans_out_fn: Callable[..., Any] = _identity, init: bool = False,
                  mutable: bool = False, rngs: Filter = True, variables: Filter = True,
                  methods: Any = None) -> Target:
  """Shows a Module class or method a mapped view of some collections (``lift.map_variables``).

  Not for a one-off change of loaded variables: transform the dict before `apply`.

  Examples:
    >>> transpose = lambda tree: jax.tree.map(lambda a: a.T, tree)
    >>> Transposed = nn.map_variables(nn.Dense, 'params', transpose, transpose, init=True)
    >>> variables = Transposed(2, use_bias=False).init(jax.random.key(0), jnp.ones((1, 3)))
    >>> variables['params']['kernel'].shape   # stored transposed
    (2, 3)
  """
  return apply_spec(MAP_VARIABLES, target, dict(
      mapped_collections=mapped_collections, trans_in_fn=trans_in_fn,
      trans_out_fn=trans_out_fn, init=init, mutable=mutable, rngs=rngs,
      variables=variables), methods)


def remat_scan(target: Target, lengths: Sequence[int] = (), policy: Callable[..., bool] | None = None,
               variable_broadcast: Filter = False, variable_carry: Filter = False,
               variable_axes: Mapping[Filter, int] = {True: 0},  # noqa: B006
               split_rngs: Mapping[Filter, bool] = {True: True},  # noqa: B006
               metadata_params: Mapping[Any, Any] = {},  # noqa: B006
               methods: Any = None) -> Target:
  """Repeats ``f(self, carry) -> carry`` ``prod(lengths)`` times as nested rematerialised scans.

  Not for new code: ``Stacked(..., remat='nested')`` saves memory similarly
  with one layer axis.

  Examples:
    >>> class Layer(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return jnp.tanh(nn.Dense(3)(x))
    >>> variables = nn.remat_scan(Layer, lengths=(2, 3))().init(jax.random.key(0), jnp.ones((1, 3)))
    >>> variables['params']['Dense_0']['kernel'].shape   # 2 x 3 layers
    (2, 3, 3, 3)
  """
  return apply_spec(REMAT_SCAN, target, dict(
      lengths=lengths, policy=policy, variable_broadcast=variable_broadcast,
      variable_carry=variable_carry, variable_axes=variable_axes, split_rngs=split_rngs,
      metadata_params=metadata_params), methods)


def _metadata_fn(fn, axis: int, metadata_params: Mapping[Any, Any]):
  return functools.partial(fn, axis=axis, metadata_params=metadata_params)


def add_metadata_axis(target: Target, variable_axes: Mapping[Filter, int] = {},  # noqa: B006
                      metadata_params: dict[Any, Any] = {},  # noqa: B006
                      methods: Any = None) -> Target:
  """Adds an axis to the ``AxisMetadata`` boxes of collections created inside (outside view).

  For code that adds the array axis itself (``jax.vmap`` of an ``init``). Not
  needed with `vmap`, `scan` or `Stacked`: their ``metadata_params`` do it.

  Examples:
    >>> class Scale(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     init = nn.with_partitioning(nn.initializers.ones, ('embed',))
    ...     return x * self.param('scale', init, (x.shape[-1],))
    >>> Boxed = nn.add_metadata_axis(Scale, variable_axes={'params': 0},
    ...                              metadata_params={nn.PARTITION_NAME: 'layers'})
    >>> keys = jax.random.split(jax.random.key(0), 4)
    >>> variables = jax.vmap(Boxed().init, in_axes=(0, None))(keys, jnp.ones(3))
    >>> variables['params']['scale'].names, variables['params']['scale'].value.shape
    (('layers', 'embed'), (4, 3))
  """
  for col, axis in variable_axes.items():
    target = map_variables(target, col,
                           trans_in_fn=_metadata_fn(remove_axis, axis, metadata_params),
                           trans_out_fn=_metadata_fn(add_axis, axis, metadata_params),
                           mutable=True, methods=methods)
  return target


def fold_rngs(target: Target, variables: Filter = True, rngs: Filter = True,
              methods: Any = None) -> Target:
  """Runs a Module class or method with rng streams that forget the module's path.

  Only needed to reproduce the keys of Flax's ``fold_rngs``.

  Examples:
    >>> class Noise(nn.Module):
    ...   @nn.compact
    ...   def __call__(self):
    ...     return jax.random.uniform(self.make_rng('noise'))
    >>> nn.fold_rngs(Noise)().apply({}, rngs={'noise': jax.random.key(0)}).shape
    ()
  """
  return apply_spec(FOLD_RNGS, target, dict(variables=variables, rngs=rngs), methods)


def shard_map(target: Target, mesh: Any, in_specs: Any, out_specs: Any,
              variable_specs: Mapping[Filter, Any] = {},  # noqa: B006
              split_rngs: Mapping[Filter, Any] = {},  # noqa: B006
              axis_names: frozenset = frozenset(), check_vma: bool = True,
              methods: Any = None) -> Target:
  """Runs a Module class or method per shard of ``mesh`` (``lift.shard_map``).

  ``variable_specs`` gives each collection's ``PartitionSpec``, inside and out.
  Not needed for data parallelism: `jax.jit` with sharded inputs does that.

  Examples:
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
    >>> Sharded = nn.shard_map(nn.Dense, mesh, in_specs=P('data'), out_specs=P('data'),
    ...                        variable_specs={'params': P()}, split_rngs={'params': False})
    >>> y, variables = Sharded(2).init_with_output(jax.random.key(0), jnp.ones((4, 3)))
    >>> y.shape
    (4, 2)
  """
  return apply_spec(SHARD_MAP, target, dict(
      mesh=mesh, in_specs=in_specs, out_specs=out_specs, variable_specs=variable_specs,
      split_rngs=split_rngs, axis_names=axis_names, check_vma=check_vma), methods)
