"""Mistakes with `lift.pack` and the lifted transforms other than vmap and scan: checkpoint,
jit, map_variables, cond, switch, while_loop, vjp, jvp, value_and_grad, custom_vjp,
shard_map: their filters, arguments, static arguments and bodies."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import linen_ext
import lift
from lift import errors

from tests.helpers import counter, dense
from tests.misuse import case

KEY = jax.random.key(0)
RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


def _init(fn, *args):
  return lambda: lift.init(fn)(RNGS, *args)


# -- pack --------------------------------------------------------------------------------

def passthrough(fn, in_filters=(True,), out_filters=(True,), rng_filters=(True,), name='identity'):
  def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    scope = scope_fn(variable_groups, rng_groups)
    return fn(scope, *args), repack_fn(scope)
  return lift.pack(inner, in_filters, out_filters, rng_filters, name=name)


def _stats(scope):
  scope.variable('batch_stats', 'mean', jnp.zeros, ())


def _unmapped(in_filters):
  lifted = passthrough(_stats, in_filters=in_filters, out_filters=('params',), name='my_transform')
  return lambda: lift.init(lambda s: lifted(s.push('layer')))(KEY)


def _drop_second(scope_fn, repack_fn, variable_groups, rng_groups, x):
  scope = scope_fn(variable_groups[:1], rng_groups)  # 'rest' would be lost
  return dense(scope, x, 2), repack_fn(scope)


def _only_y(scope_fn, repack_fn, variable_groups, rng_groups, x):
  return dense(scope_fn(variable_groups, rng_groups), x, 2)


def _extra_group(scope_fn, repack_fn, variable_groups, rng_groups, x):
  scope = scope_fn(variable_groups, rng_groups)
  return dense(scope, x, 2), repack_fn(scope) + (({},),)


def _repack_twice(scope_fn, repack_fn, variable_groups, rng_groups, x):
  scope = scope_fn(variable_groups, rng_groups)
  y = dense(scope, x, 2)
  repack_fn(scope)
  return y, repack_fn(scope)


def _custom(body):
  packed = lift.pack(body, ('params', True), (True,), (True,), name='custom')
  return lambda: lift.init(lambda s, x: packed(s, x))(KEY, jnp.ones((2, 3)))


def _keywords_refused():
  body = lambda scope_fn, repack_fn, vg, rg, *a, **k: (None, repack_fn(scope_fn(vg, rg)))
  packed = lift.pack(body, (True,), (True,), (True,), name='identity', enable_kwargs=False)
  return lift.apply(packed)({}, x=1.0)


def _kept_in_pack(what):
  kept = {}

  def keep(scope):
    kept['scope'] = scope.push('inner')
    kept['variable'] = scope.variable('state', 'x', lambda: 1)
  lift.apply(lambda s: passthrough(keep)(s.push('outer')), mutable=True)({})
  return kept[what]


UNMAPPED = '"batch_stats" is immutable inside the lifted `my_transform`'
PACK = [
    case('a pack transform returning params only, given params', _unmapped(('params',)),
         errors.UnliftedCollectionError, UNMAPPED, '"mean"', '"my_transform(/layer)"'),
    case('a pack transform returning params only, given everything', _unmapped((True,)),
         errors.UnliftedCollectionError, UNMAPPED),
    case('a pack transform not lifting an rng stream', lambda: lift.apply(passthrough(
        lambda s: s.make_rng('noise'), rng_filters=('params',)))({}, rngs={'noise': KEY}),
         errors.UnknownRngError, 'needs PRNG for "noise"', 'scope "identity(/)"'),
    case('a pack transform writing a collection it only reads', lambda: lift.apply(passthrough(
        counter, out_filters=('params',)), mutable=['counter'])({'counter': {'count': 0}}, 0),
         errors.UnliftedCollectionError, '"count" in "identity(/)"', '"counter"'),
    case('keyword arguments to a pack transform without enable_kwargs', _keywords_refused,
         errors.TransformArgumentError, "identity: keyword arguments ['x']"),
    case('pack given a number as a filter', lambda: lift.pack(
        lambda *a: None, (3,), (True,), (True,)),
         errors.InvalidFilterError, 'Invalid filter 3 of type int',
         'in the variable filters of the lifted `pack`'),
    case('checkpoint variables given a number', lambda: lift.checkpoint(dense, variables=3),
         errors.InvalidFilterError, 'in the variable filters of the lifted `remat`'),
    case('jit rngs given a number', lambda: lift.jit(dense, rngs=3), errors.InvalidFilterError,
         'in the `rngs` of jit'),
    case('custom_vjp grad_vars given a number', lambda: lift.custom_vjp(
        layer, forward, sign_backward, grad_vars=3), errors.InvalidFilterError,
         'in the variable filters of the lifted `custom_vjp`'),
    case('scope_fn given fewer groups than the in filters', _custom(_drop_second),
         errors.PackProtocolError, '`custom`', 'variable_groups given to scope_fn',
         'in_variable_filters` (2)'),
    case('a pack function returning y only', _custom(_only_y), errors.PackProtocolError,
         '`custom` returned', '(y, out_groups)'),
    case('a pack function returning more groups than out filters', _custom(_extra_group),
         errors.PackProtocolError, 'out_groups it returns', 'out_variable_filters` (1)'),
    case('a pack transform applied to a Module class', lambda: passthrough(linen_ext.Dense)(3),
         errors.NotAScopeError, 'lifted `identity` was called with int 3', 'nn.lift_transform'),
    case('a scope kept from inside a pack transform used after apply', lambda: _kept_in_pack(
        'scope').get_variable('state', 'x'), errors.InvalidScopeError,
         '"identity(/outer/inner)" is no longer valid'),
    case('a Variable kept from inside a pack transform read after apply', lambda: _kept_in_pack(
        'variable').value, errors.InvalidScopeError, '"identity(/outer)" is no longer valid'),
    case('repack_fn called twice', _custom(_repack_twice), errors.RepackedScopeError,
         'repack_fn of the lifted `custom` was given the scope at "custom(/)" again',
         'call repack_fn(scope) once'),
]


# -- autodiff ----------------------------------------------------------------------------

def layer(scope, x):
  return jnp.tanh(dense(scope, x, 2))


def loss(scope, x, target):
  return jnp.sum((layer(scope, x) - target) ** 2)


def forward(scope, x):
  return lift.vjp(layer, scope, x)


def sign_backward(bwd, y_cotangent):
  params_t, x_t = bwd(y_cotangent)
  return jax.tree.map(jnp.sign, params_t), x_t


def _custom_vjp(**kwargs):
  return lambda: lift.custom_vjp(layer, forward, sign_backward, **kwargs)


AUTODIFF = [
    case('jvp tangent for a collection without variables', _init(lambda s, x: lift.jvp(
        layer, s.push('layer'), (x,), (x,), {'stats': {'m': x}}), X), errors.TransformArgumentError,
         "collection 'stats'", 'no variables'),
    case('jvp variable tangents not a dict', _init(lambda s, x: lift.jvp(
        layer, s, (x,), (x,), [{}]), X), errors.TransformArgumentError, 'must be a dict'),
    case('vjp given reduce_axes', _init(lambda s, x: lift.vjp(
        loss, s, x, x, reduce_axes=('batch',)), X), errors.TransformArgumentError, 'reduce_axes'),
    case('value_and_grad given reduce_axes', _init(lambda s, x: lift.value_and_grad(
        loss, s, x, x, reduce_axes=('batch',)), X), errors.TransformArgumentError, 'reduce_axes'),
    case('custom_vjp nondiff_argnums beyond the arguments', _init(lambda s, x: lift.custom_vjp(
        layer, forward, sign_backward, nondiff_argnums=(3,))(s, x), X), errors.ArgnumsError,
         'names argument 3'),
    case('custom_vjp nondiff_argnums naming the scope', _custom_vjp(nondiff_argnums=0),
         errors.ArgnumsError, 'nondiff_argnums'),
    case('custom_vjp nondiff_argnums negative', _custom_vjp(nondiff_argnums=(1, -2)),
         errors.ArgnumsError, 'nondiff_argnums', '-2'),
    case('custom_vjp nondiff_argnums given a name', _custom_vjp(nondiff_argnums='x'),
         errors.ArgnumsError, 'nondiff_argnums', "'x'"),
]


# -- checkpoint, jit -------------------------------------------------------------------------

def _jit_called(fn, *args, **kwargs):
  return lambda: lift.init(fn)(RNGS, X, *args, **kwargs)


def _draws_that_change_between_traces():
  calls = []

  def moody(scope, x):
    calls.append(1)
    for _ in range(len(calls)):  # draws once in the first trace, twice in the second
      x = x + jax.random.normal(scope.make_rng('dropout'))
    return x
  jitted = lift.jit(moody)
  lift.init(jitted)(RNGS, X)
  with jax.default_matmul_precision('highest'):  # JAX traces the same structure again
    lift.init(jitted)(RNGS, X)  # (another context), and now it draws twice


CHECKPOINT_JIT = [
    case('checkpoint static_argnums given a string', lambda: lift.checkpoint(
        dense, static_argnums='1'), errors.ArgnumsError, 'static_argnums', "'1'"),
    case('checkpoint static_argnums negative', lambda: lift.checkpoint(dense, static_argnums=-1),
         errors.ArgnumsError, 'static_argnums', '-1'),
    case('checkpoint static_argnums holding a float', lambda: lift.checkpoint(
        dense, static_argnums=(0, 1.5)), errors.ArgnumsError, 'static_argnums', '1.5'),
    case('checkpoint static_argnums given True', lambda: lift.checkpoint(
        dense, static_argnums=True), errors.ArgnumsError, 'static_argnums', 'True'),
    case('checkpoint static_argnums beyond the arguments', _jit_called(lift.checkpoint(
        dense, static_argnums=(2,)), 2), errors.ArgnumsError, 'names argument 2',
         'only 2 positional'),
    case('checkpoint static_argnums making an array static', _jit_called(lift.checkpoint(
        dense, static_argnums=0), 2), errors.TransformArgumentError,
         "static argument 'x' of dense is an array of shape (2, 3)"),
    case('checkpoint with concrete=True', lambda: lift.checkpoint(dense, concrete=True),
         errors.TransformArgumentError, 'concrete', 'static_argnums'),
    case('jit static_argnums given a string', lambda: lift.jit(dense, static_argnums='x'),
         errors.ArgnumsError, 'static_argnums'),
    case('jit static_argnums negative', lambda: lift.jit(dense, static_argnums=-1),
         errors.ArgnumsError, 'static_argnums'),
    case('jit donate_argnums given a float', lambda: lift.jit(dense, donate_argnums=1.0),
         errors.ArgnumsError, 'donate_argnums'),
    case('jit static_argnames given a number', lambda: lift.jit(dense, static_argnames=3),
         errors.ArgnumsError, 'static_argnames'),
    case('jit argument both static and donated', lambda: lift.jit(
        dense, static_argnums=2, donate_argnums=2), errors.ArgnumsError, 'argument 2 is in both'),
    case('jit argument named static and donated', lambda: lift.jit(
        dense, static_argnames='features', donate_argnums=2), errors.ArgnumsError,
         'argument 2 is in both'),
    case('jit donating a missing argument', _jit_called(lift.jit(dense, donate_argnums=3), 2),
         errors.ArgnumsError, 'donate_argnums names argument 3'),
    case('jit given a string argument not marked static', _jit_called(lift.jit(
        lambda scope, x, name: x), 'relu'), errors.JitArgumentError, 'positional arguments[1]',
         'static_argnums'),
    case('jit given a string keyword not marked static', _jit_called(lift.jit(
        lambda scope, x, *, name: x), name='relu'), errors.JitArgumentError,
         "keyword arguments['name']", 'static_argnames'),
    case('jit static argument that is a list', _jit_called(lift.jit(
        lambda scope, x, sizes: x, static_argnums=2), [1, 2]), errors.JitArgumentError,
         "static argument 'sizes'", 'not hashable'),
    case('jit of a function whose draws change between traces', _draws_that_change_between_traces,
         errors.RngReplayError, 'draw 1 was no draw'),
    case('jit marking an array static', _jit_called(lift.jit(dense, static_argnums=1), 2),
         errors.JitArgumentError, "static argument 'x' of dense is Array"),
]


# -- control flow, map_variables, shard_map ----------------------------------------------------

def positive(scope, x):
  return scope.child(dense, 'dense')(x, 2)


def _other(scope, x):
  return scope.child(dense, 'other')(x, 2)


def _wide(scope, x):
  return scope.child(dense, 'dense')(x, 5)[:, :2]


def _carry_created(scope, carry):
  scope.variable('state', 'steps', lambda: jnp.zeros((), jnp.int32))
  return carry + 1


def _carry_retyped(scope, carry):
  scope.put_variable('state', 'steps', jnp.float32(1))
  return carry + 1


def _writes_params(scope, carry):
  scope.put_variable('params', 'w', carry)
  return carry


def _loop(body, **kwargs):
  return lambda s, x: lift.while_loop(lambda s, c: c < 3, body, s, 0, **kwargs)


def _apply(fn, mutable):
  variables = {'params': {'w': X}, 'state': {'steps': jnp.int32(0)}}
  return lambda: lift.apply(fn, mutable=mutable)(variables, X)


def linear(scope, x, features):
  return x @ scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))


def _bump(scope):
  scope.put_variable('params', 'w', scope.get_variable('params', 'w') + 1)


def _shard_map(**kwargs):
  mesh = jax.make_mesh((1,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
  options = {'mesh': mesh, 'in_specs': P('data'), 'out_specs': P('data'), **kwargs}
  return lambda: lift.init(lift.shard_map(counter, **options))(KEY, X)


CONTROL = [
    case('cond branches creating different variables', _init(lambda s, x: lift.cond(
        True, positive, _other, s, x), X), errors.BranchVariablesError, 'branch 1 creates',
         'only in branch 0: params/dense/kernel', 'only in branch 1: params/other/kernel'),
    case('switch branches creating variables of different shapes', _init(
        lambda s, x: lift.switch(1, [positive, _wide], s, x), X), errors.BranchVariablesError,
         'params/dense/kernel: float32[3, 2] in branch 0, float32[3, 5]'),
    case('cond given None as a branch', _init(
        lambda s, x: lift.cond(True, positive, None, s, x), X),
         errors.TransformArgumentError, 'false_fun'),
    case('switch without branches', _init(lambda s, x: lift.switch(0, [], s, x), X),
         errors.TransformArgumentError, 'non-empty sequence'),
    case('switch given a number as a branch', _init(lambda s, x: lift.switch(
        0, [positive, 3], s, x), X), errors.TransformArgumentError, 'branches[1]'),
    case('while_loop body creating carry variables', _init(_loop(
        _carry_created, carry_variables='state'), X), errors.LoopVariablesError,
         'created: state/steps int32'),
    case('while_loop body changing the dtype of a carry variable', _apply(_loop(
        _carry_retyped, carry_variables='state'), 'state'), errors.LoopVariablesError,
         'state/steps: int32[] before, float32[]'),
    case('while_loop body writing a broadcast variable', _apply(lambda s, x: lift.while_loop(
        lambda s, c: False, _writes_params, s, x), True), errors.UnliftedCollectionError,
         '"w"', '"params" is immutable inside the lifted `while_loop`'),
    case('while_loop split_rngs given True', _init(_loop(lambda s, c: c, split_rngs=True), X),
         errors.InvalidAxisError, 'split_rngs'),
    case('while_loop given a string as its body', _init(_loop('body'), X),
         errors.TransformArgumentError, 'body_fn'),
    case('map_variables at init without init=True', lambda: lift.init(lift.map_variables(
        linear, 'params', lambda c: c))(RNGS, X, 3), errors.UnliftedCollectionError, '"params"',
         'init=True'),
    case('map_variables body writing a mapped collection', lambda: lift.apply(lift.map_variables(
        _bump, 'params'), mutable=True)({'params': {'w': jnp.ones(2)}}),
         errors.UnliftedCollectionError, '"w"', '"params"', 'mutable=True'),
    case('map_variables given a number as its collections', lambda: lift.map_variables(linear, 3),
         errors.InvalidFilterError, 'Invalid filter 3',
         'the `mapped_collections` of map_variables'),
    case('while_loop carry_variables given a number', _init(_loop(
        lambda s, c: c, carry_variables=3), X), errors.InvalidFilterError,
         'in the variable filters of the lifted `while_loop`'),
    case('shard_map given a string as its mesh', _shard_map(mesh='mesh'), errors.InvalidAxisError,
         "mesh='mesh' is not a jax.sharding.Mesh"),
    case('shard_map variable_specs holding a tuple', _shard_map(
        variable_specs={'params': ('model',)}), errors.InvalidAxisError,
         "variable_specs['params'] = ('model',) is not a PartitionSpec"),
    case('shard_map variable_specs given a list', _shard_map(variable_specs=[P()]),
         errors.InvalidAxisError, 'variable_specs must be a dict'),
    case('shard_map splitting an rng over an unknown mesh axis', _shard_map(
        split_rngs={'params': 'rows'}), errors.InvalidAxisError, "split_rngs['params'] = 'rows'",
         "('data',)"),
    case('shard_map split_rngs given True', _shard_map(split_rngs=True), errors.InvalidAxisError,
         'split_rngs must be a dict'),
    case('shard_map without a spec for a collection written inside', _shard_map(
        variable_specs={'params': P()}), errors.UnliftedCollectionError,
         '"counter" is immutable inside the lifted `shard_map`'),
]

CASES = PACK + AUTODIFF + CHECKPOINT_JIT + CONTROL
