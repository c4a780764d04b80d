"""Mistakes with the Module transforms (`nn.vmap`, `nn.scan`, `nn.jit`, `nn.checkpoint`,
`nn.vjp`, `nn.grad`, `nn.cond`, ...): their targets, `methods=`, static arguments, axes,
rng splits and return values, and mistakes both Flax and we refuse inside transformed modules."""
import flax.errors as flax_errors
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import linen_ext as nn
import lift
from lift import errors as lift_errors
from linen_ext import errors

from tests.misuse import both, case
from tests.misuse.module_cases import compact

KEY = jax.random.key(0)
X = jnp.ones((2, 3))
XS = jnp.ones((3, 2, 3))
ENSEMBLE = dict(variable_axes={'params': 0}, split_rngs={'params': True})


def module(fn, *wraps, name='Model'):
  """A Module class whose compact ``__call__(self, x)`` is ``fn(self, x)``, wrapped by ``wraps``."""
  def __call__(self, x):
    return fn(self, x)
  method = nn.compact(__call__)
  for wrap in wraps:
    method = wrap(method)
  return type(name, (nn.Module,), {'__call__': method})


class Twice(nn.Module):
  inner: nn.Module

  def __call__(self, x):
    return self.inner(x)


def called(layer, x):
  layer(x)
  return layer


def init(cls):
  return lambda: cls().init(KEY, X)


def lift_scale(fn, factor, collection='params'):
  """Runs ``fn`` on ``factor`` times the variables of ``collection``."""
  def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
    scaled, rest = variable_groups
    scaled = jax.tree_util.tree_map(lambda v: v * factor, scaled)
    scope = scope_fn((scaled, rest), rng_groups)
    return fn(scope, *args, **kwargs), repack_fn(scope)
  return lift.pack(inner, (collection, True), (nn.DenyList(collection),), (True,))


def _branches(transform):
  def call(m, nn, x):
    dense = [nn.Dense(2, name=f'd{i}') for i in range(2)]
    fns = [lambda mdl, x, i=i: mdl[i](x) for i in range(2)]
    if transform == 'cond':
      return nn.cond(True, fns[0], fns[1], dense, x)
    return nn.switch(1, fns, dense, x)
  return lambda: compact(nn, call).init(KEY, X)


def _unhashable_field():
  class Scaled(nn.Module):
    field: object

    @nn.jit
    @nn.compact
    def __call__(self, x):
      return x * self.param('w', nn.initializers.ones, x.shape[-1:])[None]

  return compact(nn, lambda m, nn, x: Scaled(jnp.ones(4))(x)).init(KEY, X)


def _scanned(nn, body, xs, **options):
  class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, x):
      return body(self, nn, c, x), None
  return compact(nn, lambda m, nn, xs: nn.scan(Cell, **options)()(jnp.zeros((2, 3)), xs)
                 ).init(KEY, xs)


def _broadcast_param_written_per_step(m, nn, c, x):
  p = m.variable('params', 'w', lambda: jnp.zeros(3))
  p.value = p.value + x.sum()
  return c + p.value[None]


def _scan_of_a_passed_module(nn):
  class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, x, head):
      h = nn.Dense(4)(x) + c
      return h + head(x), h

  def call(m, nn, xs):
    head = nn.Dense(4, name='head')
    head(xs[0])
    scanned = nn.scan(Cell, variable_axes={'params': 0}, split_rngs={'params': True},
                      in_axes=(0, nn.broadcast))
    return scanned()(jnp.zeros((2, 4)), xs, head)  # the passed module's params are scanned too
  model = compact(nn, call)
  model.apply(model.init(KEY, XS), XS)


def _vmap_sizes(nn):
  model = compact(nn, lambda m, nn, x: nn.vmap(nn.Dense, **ENSEMBLE)(3)(x))
  model.apply(model.init(KEY, XS), jnp.ones((4, 2, 3)))


SHARED_STATS = dict(variable_axes={'params': None, 'batch_stats': None},
                    split_rngs={'params': False})


def _nested_batch_norm(nn):
  """google/flax#3319: the inner BatchNorm reduces over the inner vmap's axis only."""
  class Inner(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.BatchNorm(use_running_average=False, axis_name='inner')(x)

  inner = nn.vmap(Inner, axis_name='inner', **SHARED_STATS)
  outer = nn.vmap(lambda m, x: m(x), axis_name='outer', **SHARED_STATS)
  model = compact(nn, lambda m, nn, xs: outer(inner(), xs))
  model.apply(model.init(KEY, XS), XS, mutable=['batch_stats'])  # init leaves the stats as they are


def _by_keyword(apply):
  """google/flax#2772: the ensemble's input passed as ``inputs=``, at init or at apply."""
  ensemble = nn.vmap(nn.Dense, **ENSEMBLE)(2)
  if apply:
    ensemble.apply(ensemble.init(KEY, XS), inputs=XS)
  else:
    ensemble.init(KEY, inputs=XS)


def _scan_by_keyword(apply):
  """The scanned inputs passed as ``x=``: broadcast to every step, at init or at apply."""
  class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, x):
      return c + nn.Dense(3)(x), None

  layer = nn.scan(Cell, **ENSEMBLE)()
  if apply:
    layer.apply(layer.init(KEY, X, XS), X, x=XS)
  else:
    layer.init(KEY, X, x=XS)


def _scale_without_split_rngs(nn):
  class Scale(nn.Module):
    @nn.compact
    def __call__(self, x):
      return x * self.param('w', nn.initializers.normal(), x.shape[-1:])

  nn.vmap(Scale, variable_axes={'params': 0})().init(KEY, XS)


class VmappedBatchNorm(nn.Module):
  @nn.compact
  def __call__(self, x):
    norm = nn.vmap(lambda mdl, x: mdl(x), **ENSEMBLE)
    return norm(nn.BatchNorm(use_running_average=False), x)


TARGETS = [
    case('nn.vmap of a module instance', lambda: nn.vmap(nn.Dense(3), variable_axes={'params': 0}),
         errors.TransformTargetError, '`nn.vmap` was given Dense instance', 'Module class',
         flax_error=flax_errors.TransformTargetError),
    case('nn.vmap of a flax.linen module instance', lambda: nn.vmap(flax_nn.Dense(3), **ENSEMBLE),
         errors.TransformTargetError, '`nn.vmap` was given Dense instance',
         'nn.vmap(flax.linen.Dense, ...)(3)'),
    case('nn.lift_transform of a module instance', lambda: nn.lift_transform(
        lift_scale, nn.Dense(2), 2.0), errors.TransformTargetError,
         '`nn.lift_transform(lift_scale)`'),
    case('nn.jit methods given a string', lambda: nn.jit(nn.Dense, methods='__call__'),
         errors.TransformMethodsError, "methods='__call__'", 'methods must be None'),
    case('nn.jit of a method the class lacks', lambda: nn.jit(nn.Dense, methods=['encode']),
         errors.NotAMethodError, '`Dense` has no method "encode"'),
    case('calling a vmapped module outside init/apply', lambda: nn.vmap(nn.Dense, **ENSEMBLE)(2)(X),
         errors.UnboundModuleError, 'nn.vmap',
         flax_error=flax_errors.CallCompactUnboundModuleError),
    case('calling a jitted module outside init/apply', lambda: nn.jit(nn.Dense)(2)(X),
         errors.UnboundModuleError, 'unbound module `Dense`'),
    case('nn.cond given a list of modules', _branches('cond'), errors.NotAModuleError,
         '`nn.cond`', 'list of Dense, Dense', 'self'),
    case('nn.switch given a list of modules', _branches('switch'), errors.NotAModuleError,
         '`nn.switch`', 'list of Dense, Dense'),
    case('nn.while_loop given a number as its module', lambda: nn.while_loop(
        lambda m, c: False, lambda m, c: c, 3, X), errors.NotAModuleError, '`nn.while_loop`',
         'got a int'),
    case('nn.as_scan given a number as its module', lambda: nn.as_scan(3, {}, X),
         errors.InvalidInstanceModuleError, '`nn.as_scan` got int 3',
         'nn.as_scan(MyModule(...), variables, example_xs)'),
]

def _array_made_static(name):
  """static_argnums=(1,) counts self: it makes x static."""
  def build(nn):
    class Block(nn.Module):
      @nn.compact
      def __call__(self, x, n):
        return jnp.tile(nn.Dense(n)(x), (1, n))

    getattr(nn, name)(Block, static_argnums=(1,))().init(KEY, jnp.ones((1, 3)), 2)
  return build


ARGUMENTS = [
    both('nn.jit static_argnums making an array static', _array_made_static('jit'),
         lift_errors.JitArgumentError, ValueError, "static argument 'x' of ",
         'Block.__call__ is Array'),
    both('nn.checkpoint static_argnums making an array static', _array_made_static('checkpoint'),
         lift_errors.TransformArgumentError, TypeError, "static argument 'x' of", 'Block.__call__',
         'shape (1, 3)', 'counts self as 0'),
    case('nn.jit static_argnums past the arguments', lambda: nn.jit(
        lambda self, x, train: x, static_argnums=(3,)), errors.StaticArgnumsError, 'position 3',
         "['self', 'x', 'train']"),
    case('nn.checkpoint static_argnums negative', lambda: nn.checkpoint(
        nn.Dense, static_argnums=(-1,)), errors.StaticArgnumsError, 'non-negative'),
    case('nn.checkpoint static_argnums given a string', lambda: nn.checkpoint(
        nn.Dense, static_argnums='a'), errors.StaticArgnumsError, "holds 'a'",
         'counts `self` as 0'),
    case('nn.scan variable_axes given a list', lambda: nn.scan(nn.Dense, variable_axes=['params']),
         lift_errors.InvalidAxisError, 'scan: variable_axes must be a dict', "got ['params']"),
    case('nn.scan split_rngs given a number', lambda: nn.scan(
        nn.Dense, variable_axes={'params': 0}, split_rngs={'params': 2}),
         lift_errors.InvalidAxisError, "split_rngs['params'] = 2 is not a bool"),
    case('nn.remat_scan lengths holding a negative number', lambda: nn.remat_scan(
        nn.Dense, lengths=(2, -1)), lift_errors.InvalidAxisError, 'remat_scan: lengths=(2, -1)'),
    case('nn.map_variables given a number as its collections', lambda: nn.map_variables(
        nn.Dense, 3),
         lift_errors.InvalidFilterError, 'Invalid filter 3'),
    case('nn.shard_map given a string as its mesh', lambda: nn.shard_map(
        nn.Dense, mesh='m', in_specs=P('data'), out_specs=P('data')), lift_errors.InvalidAxisError,
         "mesh='m' is not a jax.sharding.Mesh"),
    case('nn.jit of a module with a jax array field', _unhashable_field,
         errors.UnhashableModuleError, 'field `Scaled.field` is not hashable'),
]

BODIES = [
    case('a jitted method returning a module', init(module(lambda m, x: nn.Dense(2), nn.jit)),
         errors.TransformedReturnError,
         'Method "__call__" transformed by `nn.jit` returned a Dense',
         flax_error=flax_errors.TransformedMethodReturnValueError),
    case('a checkpointed method returning a Variable', init(module(
        lambda m, x: (x, m.variable('state', 'v', jnp.zeros, ())), nn.checkpoint)),
         errors.TransformedReturnError, 'returned a Variable'),
    case('nn.vjp of a module holding another module', init(module(lambda m, x: nn.vjp(
        lambda t, x: t(x), called(Twice(nn.Dense(2)), x), x)[0])), errors.MultipleScopesError,
         '2 scopes', 'multi_scope=True'),
    case('nn.grad of a vector output', init(module(lambda m, x: nn.grad(
        lambda d, x: d(x), called(nn.Dense(2), x), x))), errors.NonScalarOutputError,
         'shape (2, 2)', '.sum()'),
    case('nn.vmap without a rule for batch_stats', lambda: VmappedBatchNorm().init(KEY, X),
         lift_errors.UnliftedCollectionError, '"mean"',
         '"batch_stats" is immutable inside the lifted `vmap`', 'variable_axes',
         flax_error=flax_errors.ModifyScopeVariableError),
    both('nested nn.vmap of BatchNorm reducing over the inner axis only', _nested_batch_norm,
         lift_errors.InvalidAxisError, ValueError, "collection 'batch_stats'",
         "variables['batch_stats']['VmapInner_0']['BatchNorm_0']['mean']", "axis_name='outer'",
         "BatchNorm(axis_name=(..., 'outer'))"),
    case('nn.vmap given its input by keyword at init', lambda: _by_keyword(apply=False),
         lift_errors.AxisSizeError, "keyword argument inputs of shape (3, 2, 3)",
         "pass 'inputs' positionally", flax_error=ValueError),
    case('nn.vmap given its input by keyword at apply', lambda: _by_keyword(apply=True),
         lift_errors.AxisSizeError, "keyword argument inputs of shape (3, 2, 3)",
         'every item would compute on the whole', 'axis_size=N'),
    case('nn.scan given its scanned input by keyword at init', lambda: _scan_by_keyword(False),
         lift_errors.AxisSizeError, "keyword argument x of shape (3, 2, 3)",
         "pass 'x' positionally after the carry"),
    case('nn.scan given its scanned input by keyword at apply', lambda: _scan_by_keyword(True),
         lift_errors.AxisSizeError, "keyword argument x of shape (3, 2, 3)",
         'every step would compute on the whole', 'length=N'),
    both('nn.vmap without split_rngs, the params key given', _scale_without_split_rngs,
         lift_errors.UnknownRngError, flax_errors.InvalidRngError,
         'the stream is given outside the lifted `vmap`', 'Fix: pass it in',
         'split_rngs={"params": True}'),
    case('nn.scan variable_broadcast naming a misspelled collection', lambda: _scanned(
        nn, lambda m, nn, c, x: c + nn.Dense(3)(x), XS, variable_broadcast='param',
        split_rngs={'params': False}), lift_errors.UnliftedCollectionError,
         'name "param", which matches no collection', 'did you mean "params"?'),
    both('nn.scan length disagreeing with the inputs', lambda nn: _scanned(
        nn, lambda m, nn, c, x: c + nn.Dense(3)(x), XS, length=4, **ENSEMBLE),
         lift_errors.AxisSizeError, ValueError, 'length=4', "size 3: axis 0 of argument 'x'"),
    both('nn.scan broadcast param written in the body', lambda nn: _scanned(
        nn, _broadcast_param_written_per_step, XS, variable_broadcast='params',
        split_rngs={'params': False}), lift_errors.LoopInvariantError, ValueError,
         'broadcast variable params/w'),
    both('nn.scan scanning the params of a module passed as an argument',
         _scan_of_a_passed_module, lift_errors.ParamAxisSizeError,
         flax_errors.ScopeParamShapeError, 'axis 0 of variable params/bias (4,)'),
    both('nn.vmap input and params of different sizes', _vmap_sizes,
         lift_errors.ParamAxisSizeError, ValueError, "size 4: axis 0 of argument 'inputs'",
         'size 3: axis 0 of variable params/bias'),
    both('nn.vmap of a ready-made layer without a params stream', lambda nn: compact(
        nn, lambda m, nn, xs: nn.vmap(nn.Dense, variable_axes={'params': 0}, split_rngs={})(3)(
            xs)).init(KEY, XS), lift_errors.UnknownRngError, flax_errors.InvalidRngError,
         'VmapDense_0', 'PRNG for "params"'),
    both('nn.vmap of a top-level ready-made layer without a params stream', lambda nn: nn.vmap(
        nn.Dense, variable_axes={'params': 0}, split_rngs={})(3).init(KEY, XS),
         lift_errors.UnknownRngError, flax_errors.InvalidRngError,
         'None needs PRNG for "params" (None: the unnamed top-level module)', 'split_rngs'),
    both('nn.vmap of shared params with split rngs', lambda nn: compact(
        nn, lambda m, nn, xs: nn.vmap(nn.Dense, variable_axes={'params': None},
                                      split_rngs={'params': True})(3)(xs)).init(KEY, XS),
         lift_errors.InvalidAxisError, ValueError, 'variable_axes None',
         "['params']['VmapDense_0']['kernel']", "split_rngs={'params': False}"),
]

CASES = TARGETS + ARGUMENTS + BODIES
