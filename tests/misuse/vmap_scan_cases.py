"""Mistakes with the axis-adding lifted transforms: `lift.vmap`, `lift.scan`,
`lift.remat_scan`: their filters, axes, sizes, loop-invariant values and bodies."""
import jax
import jax.numpy as jnp
from flax.core import meta

import lift
from lift import errors

from tests.helpers import counter, dense
from tests.misuse import case

KEY = jax.random.key(0)
XS = jnp.linspace(-1.0, 1.0, 15).reshape(3, 5)
ENSEMBLE = dict(variable_axes={'params': 0}, split_rngs={'params': True})
C0 = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
STEPS = jnp.linspace(-0.5, 0.5, 30).reshape(5, 2, 3)
LAYERS = dict(variable_axes={'params': 0}, split_rngs={'params': True})
SHARED = dict(variable_broadcast='params', split_rngs={'params': False})


def _init(fn, *args):
  return lambda: lift.init(fn)(KEY, *args)


# -- vmap -------------------------------------------------------------------------------

def _pair(scope, x, y):
  return dense(scope, x, 2) + dense(scope.push('other'), y, 2)


def _dense2(scope, x):
  return dense(scope, x, 2)


def _record(scope, x):
  scope.variable('stats', 'last', jnp.zeros, x.shape).value = x
  return x


def _vmap_built(**kwargs):
  return lambda: lift.vmap(dense, **kwargs)


STACKED = {'params': {'kernel': jnp.ones((3, 5, 2)), 'bias': jnp.ones((3, 2))}}
VMAP = [
    case('vmap without a rule for a collection written inside', _init(lift.vmap(
        counter, variable_axes={'params': 0}, split_rngs={}), XS), errors.UnliftedCollectionError,
         '"counter" is immutable inside the lifted `vmap`', '"count"', 'variable_axes'),
    case('vmap arguments of different sizes', _init(lift.vmap(_pair, **ENSEMBLE), jnp.ones((3, 2)),
                                                      jnp.ones((4, 2))), errors.AxisSizeError,
         "size 3: axis 0 of argument 'x' (3, 2)", "size 4: axis 0 of argument 'y' (4, 2)",
         'axis_size=N'),
    case('vmap variables and arguments of different sizes', lambda: lift.apply(lift.vmap(
        _dense2, **ENSEMBLE))(STACKED, jnp.ones((4, 5))), errors.ParamAxisSizeError,
         'size 3: axis 0 of variable params/'),
    case('vmap axis_size disagreeing with the arguments', _init(lift.vmap(
        _dense2, axis_size=4, **ENSEMBLE), XS), errors.AxisSizeError, 'axis_size=4 was given'),
    case('vmap with nothing mapped and no axis_size', _init(lift.vmap(
        dense, in_axes=None, **ENSEMBLE), XS, 2), errors.AxisSizeError, 'pass axis_size=N'),
    case('vmap out_axes=None of an output that differs per item', _init(lift.vmap(
        _dense2, out_axes=None, **ENSEMBLE), XS), errors.InvalidAxisError,
         'out_axes=None marks an output', 'got axis spec None', "axis_name='batch'"),
    case('vmap out_axes=None of a per-item output, with an axis_name', _init(lift.vmap(
        _dense2, out_axes=None, axis_name='items', **ENSEMBLE), XS), errors.InvalidAxisError,
         "depends on the mapped axis 'items'", "jax.lax.pmean(y, 'items')"),
    case('vmap in_axes beyond the rank of an argument', _init(lift.vmap(
        dense, in_axes=(2, None), **ENSEMBLE), XS, 2), errors.InvalidAxisError,
         "argument 'x' has shape (3, 5), which has no axis 2"),
    case('vmap mapping a scalar argument', _init(lift.vmap(dense, **ENSEMBLE), XS, 2),
         errors.InvalidAxisError, "argument 'features' has shape", 'it is a scalar'),
    case('vmap in_axes longer than the arguments', _init(lift.vmap(
        dense, in_axes=(0, None, 0), **ENSEMBLE), XS, 2), errors.InvalidAxisError,
         'does not fit the positional arguments'),
    case('vmap writing per item to a shared collection', _init(lift.vmap(
        _record, variable_axes={'stats': None}, split_rngs={}), XS), errors.InvalidAxisError,
         'shared by every item', "['stats']['last']", 'pmean'),
    case('vmap with an axis_name writing per item to a shared collection', _init(lift.vmap(
        _record, variable_axes={'stats': None}, split_rngs={}, axis_name='b'), XS),
         errors.InvalidAxisError, "collection 'stats' is shared by every item",
         "variables['stats']['last']", "axis_name='b'", "jax.lax.pmean(value, 'b')"),
    case('vmap given its mapped argument by keyword', lambda: lift.init(lift.vmap(
        _dense2, **ENSEMBLE))(KEY, x=XS), errors.AxisSizeError,
         "keyword argument x of shape (3, 5)", 'keyword arguments are never mapped',
         "pass 'x' positionally"),
    case('vmap variable_axes naming a misspelled collection', _init(lift.vmap(
        _dense2, variable_axes={'param': 0}, split_rngs={'params': True}), XS),
         errors.UnliftedCollectionError, 'name "param", which matches no collection',
         'the collections here: "params"', 'did you mean "params"?',
         'write "params" for "param"'),
    case('vmap split_rngs naming a misspelled stream', _init(lift.vmap(
        _dense2, variable_axes={'params': 0}, split_rngs={'param': True}), XS),
         errors.UnknownRngError, 'the stream is given outside the lifted `vmap`',
         'name "param", which matches no stream', 'did you mean "params"?',
         'split_rngs={"params": True}'),
    case('vmap variable_axes given a string axis', _vmap_built(
        variable_axes={'params': '0'}, split_rngs={}), errors.InvalidAxisError,
         "variable_axes['params'] = '0'"),
    case('vmap variable_axes given a list', _vmap_built(variable_axes=['params'], split_rngs={}),
         errors.InvalidAxisError, 'variable_axes must be a dict'),
    case('vmap split_rngs given a number', _vmap_built(variable_axes={}, split_rngs={'params': 2}),
         errors.InvalidAxisError, "split_rngs['params'] = 2 is not a bool"),
    case('vmap split_rngs given a string', _vmap_built(
        variable_axes={}, split_rngs={'params': 'no'}), errors.InvalidAxisError,
         "split_rngs['params'] = 'no' is not"),
    case('vmap variable_axes keyed by a number', _vmap_built(variable_axes={3: 0}, split_rngs={}),
         errors.InvalidFilterError, 'Invalid filter 3', 'the keys of `variable_axes` of vmap'),
    case('vmap split_rngs keyed by a number', _vmap_built(variable_axes={}, split_rngs={3: True}),
         errors.InvalidFilterError, 'the keys of `split_rngs` of vmap'),
    case('vmap in_axes given a name', _vmap_built(variable_axes={}, split_rngs={}, in_axes='x'),
         errors.InvalidAxisError, "in_axes='x' holds 'x'"),
    case('vmap given a negative axis_size', _vmap_built(
        variable_axes={}, split_rngs={}, axis_size=-1), errors.AxisSizeError, 'axis_size=-1'),
]


# -- scan and remat_scan ------------------------------------------------------------------

def layer(scope, c, x):
  h = scope.child(dense, 'dense')(c, 3)
  return jnp.tanh(h) + x, h


def _count_step(scope, c, x):
  return c, counter(scope, x)


def _two_inputs(scope, c, x, y):
  return c, x + y


def _consts_from_carry(scope, c, x):
  return c + scope.variable('consts', 'first', lambda: c).value, x


def _boxed_layer(scope, c):
  def init(key, shape):
    return meta.Partitioned(jax.nn.initializers.lecun_normal()(key, shape), ('in', 'out'))
  return jnp.tanh(c @ scope.param('kernel', init, (3, 3)))


PARAMS5 = {'params': {'dense': {'kernel': jnp.ones((5, 3, 3)), 'bias': jnp.ones((5, 3))}}}
SCAN = [
    case('scan without a rule for a collection written inside', _init(lift.scan(
        _count_step, **LAYERS), (), STEPS), errors.UnliftedCollectionError,
         '"counter" is immutable inside the lifted `scan`', 'variable_carry'),
    case('remat_scan without a rule for a collection written inside', _init(lift.remat_scan(
        counter, (2, 3), variable_axes={'params': 0}), C0), errors.UnliftedCollectionError,
         '"counter" is immutable inside the lifted `scan`'),
    case('scan inputs of different lengths', _init(lift.scan(_two_inputs), (), jnp.ones((5, 2)),
                                                    jnp.ones((4, 2))), errors.AxisSizeError,
         "size 5: axis 0 of argument 'x' (5, 2)", "size 4: axis 0 of argument 'y' (4, 2)",
         'length=N'),
    case('scan variables and inputs of different lengths', lambda: lift.apply(lift.scan(
        layer, **LAYERS))(PARAMS5, C0, STEPS[:4]), errors.ParamAxisSizeError,
         'size 5: axis 0 of variable params/dense/'),
    case('scan length disagreeing with the inputs', _init(lift.scan(
        layer, length=4, **LAYERS), C0, STEPS), errors.AxisSizeError, 'length=4 was given'),
    case('scan with nothing scanned and no length', _init(lift.scan(
        lambda s, c: (c, None), **LAYERS), C0), errors.AxisSizeError, 'pass length=N'),
    case('scan broadcast variable computed from the carry', _init(lift.scan(
        _consts_from_carry, variable_broadcast='consts'), C0, STEPS), errors.LoopInvariantError,
         'broadcast variable consts/first'),
    case('scan broadcast params drawn from a split rng stream', _init(lift.scan(
        layer, variable_broadcast='params', split_rngs={'params': True}), C0, STEPS),
         errors.LoopInvariantError, 'broadcast variable params/dense/',
         "split_rngs={'params': False}"),
    case('scan broadcast output computed from the inputs', _init(lift.scan(
        layer, out_axes=lift.broadcast, **SHARED), C0, STEPS), errors.LoopInvariantError,
         'output ys'),
    case('scan in_axes beyond the rank of an input', _init(lift.scan(
        layer, in_axes=3, **LAYERS), C0, STEPS), errors.InvalidAxisError,
         "argument 'x' has shape (5, 2, 3), which has no axis 3"),
    case('scan out_axes beyond the rank of an output', _init(lift.scan(
        layer, out_axes=-4, **LAYERS), C0, STEPS), errors.InvalidAxisError,
         'output ys (stacked) has shape (5, 2, 3), which has no axis -4'),
    case('scan body not returning (carry, ys)', _init(lift.scan(
        lambda scope, c, x: dense(scope, c + x, 3), **SHARED), C0, STEPS), errors.ScanBodyError,
         'scan(/)": the body returned float32[2,3]'),
    case('scan body changing the shape of its carry', _init(lift.scan(
        lambda scope, c, x: (jnp.concatenate([c, dense(scope, x, 3)]), None), **SHARED), C0,
        STEPS), errors.ScanBodyError, 'float32[2, 3] and returns the carry float32[4, 3]'),
    case('scan body changing the dtype of its carry', _init(lift.scan(
        lambda scope, c, x: (c.astype(jnp.bfloat16), None), **SHARED), C0, STEPS),
         errors.ScanBodyError, 'float32[2, 3]', 'bfloat16[2, 3]'),
    case('scan variable_axes None for a shared collection', lambda: lift.scan(
        layer, variable_axes={'params': None}), errors.InvalidAxisError,
         'variable_broadcast for collections shared'),
    case('scan in_axes holding a name', lambda: lift.scan(layer, in_axes=[0, 'x']),
         errors.InvalidAxisError, "'x'", 'lift.broadcast'),
    case('scan variable_broadcast given a number', lambda: lift.scan(layer, variable_broadcast=3),
         errors.InvalidFilterError, 'in the variable filters of the lifted `scan`'),
    case('remat_scan variable_axes given a string axis', lambda: lift.remat_scan(
        _boxed_layer, (2, 2), variable_axes={'params': 'x'}), errors.InvalidAxisError,
         "remat_scan: variable_axes['params'] = 'x'"),
    case('scan remat given an unknown policy', lambda: lift.scan(layer, remat='sometimes'),
         errors.RematPolicyError, "remat='sometimes'"),
    case('scan given a negative length', lambda: lift.scan(layer, length=-2),
         errors.AxisSizeError, 'length=-2'),
    case('remat_scan without lengths', lambda: lift.remat_scan(_boxed_layer, ()),
         errors.InvalidAxisError, 'lengths=()'),
]

CASES = VMAP + SCAN
