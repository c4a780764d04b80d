"""Mistakes with a Module's entry points: `init`, `init_with_output`, `apply`, `bind`,
`lazy_init`, `nn.apply`/`nn.init`: their variables, rngs, `mutable=` and `method=`."""
import flax.errors as flax_errors
import jax
import jax.numpy as jnp

import linen_ext as nn
from lift import errors as lift_errors
from linen_ext import errors

from tests.misuse import both, case
from tests.misuse.module_cases import Field, Mlp, compact, module

KEY = jax.random.key(0)
X = jnp.ones((2, 3))
XS = jnp.ones((3, 2, 3))


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.Dense(4)(x)
    x = nn.BatchNorm(use_running_average=not train)(x)
    return nn.Dropout(0.1, deterministic=not train)(x)


VARIABLES = Block().init(KEY, X)
DROPOUT = {'dropout': jax.random.key(1)}


class ScaledByInput(nn.Module):
  @nn.compact
  def __call__(self, x, *, scale):
    return self.param('w', lambda key: scale.sum() * jnp.ones(2))


def _lazy_init_of_a_value_the_params_read():
  shape = jax.ShapeDtypeStruct((2,), jnp.float32)
  return ScaledByInput().lazy_init(KEY, shape, scale=shape)


CASES = [
    # -- the variables ---------------------------------------------------------------------
    case('training without mutable batch_stats', lambda: Block().apply(
        VARIABLES, X, train=True, rngs=DROPOUT), lift_errors.ImmutableCollectionError,
         '"mean" in "/BatchNorm_0"', '"batch_stats" is immutable', 'mutable=["batch_stats"]',
         flax_error=flax_errors.ModifyScopeVariableError),
    case('apply given the params collection alone', lambda: Block().apply(VARIABLES['params'], X),
         lift_errors.MissingCollectionError, '"kernel" from collection "params"', '"/Dense_0"',
         flax_error=flax_errors.ScopeCollectionNotFound),
    case('params wrapped twice in apply', lambda: Block().apply({'params': VARIABLES}, X),
         lift_errors.InvalidVariablesError, 'extra params layer',
         flax_error=flax_errors.ApplyScopeInvalidVariablesStructureError),
    case('apply given a list of variables', lambda: Block().apply([VARIABLES], X),
         lift_errors.InvalidVariablesError, 'got list', 'the dict returned by `init`'),
    case('a parameter missing from the variables of a module', lambda: compact(
        nn, lambda m, nn, x: x * m.param('scale', nn.initializers.ones, ())).apply(
            {'params': {'other': 1.0}}, X), lift_errors.MissingParamError, '"scale"',
         flax_error=flax_errors.ScopeParamNotFoundError),
    both('apply with a param of another shape than its init makes', lambda nn: compact(
        nn, lambda m, nn, x: x @ m.param('w', nn.initializers.ones, (3, 2))).apply(
            {'params': {'w': jnp.ones((3, 5))}}, X), lift_errors.ParamShapeError,
         flax_errors.ScopeParamShapeError, 'parameter "w" in "/"', '(3, 2)', '(3, 5)'),
    both('a ready-made layer fed another input width than at init', lambda nn: compact(
        nn, lambda m, nn, x: nn.Dense(2)(x)).apply(compact(
            nn, lambda m, nn, x: nn.Dense(2)(x)).init(KEY, XS), X[:, :2]),
         lift_errors.ParamShapeError, flax_errors.ScopeParamShapeError,
         'parameter "kernel" in "/Dense_0"', '(2, 2)', '(3, 2)'),
    case('a ready-made layer applied without its kernel', lambda: nn.Dense(2).apply(
        {'params': {'bias': jnp.zeros(2)}}, X), lift_errors.MissingParamError,
         'Could not find parameter named "kernel"', flax_error=flax_errors.ScopeParamNotFoundError),
    both('a module writing a collection apply does not make mutable', lambda nn: compact(
        nn, lambda m, nn, x: m.put_variable('counter', 'n', 1)).apply(
            {'counter': {'n': 0}}, X, mutable=['params']), lift_errors.ImmutableCollectionError,
         flax_errors.ModifyScopeVariableError, '"n" in "/"', '"counter" is immutable'),
    case('bind given a number for its variables', lambda: Block().bind(3),
         lift_errors.InvalidVariablesError, 'got int'),
    # -- rngs ------------------------------------------------------------------------------
    case('dropout without a dropout key', lambda: Block().apply(
        VARIABLES, X, train=True, mutable=['batch_stats']), lift_errors.UnknownRngError,
         'PRNG for "dropout"', 'rngs={"dropout": key}', flax_error=flax_errors.InvalidRngError),
    both('make_rng of a stream apply was not given', lambda nn: compact(
        nn, lambda m, nn, x: jax.random.normal(m.make_rng('dropout'), x.shape)).apply({}, X),
         lift_errors.UnknownRngError, flax_errors.InvalidRngError, 'PRNG for "dropout"'),
    case('init given a string for its rngs', lambda: Field().init('test', X),
         lift_errors.InvalidRngsError, 'RNGs should be of shape (2,) or PRNGKey in Module Field',
         'rngs are: test', flax_error=flax_errors.InvalidRngError),
    case('init given a dict of strings for its rngs', lambda: Field().init({'params': 'test'}, X),
         lift_errors.InvalidRngsError, 'First argument passed to an init function should be a '
         '``jax.PRNGKey``', flax_error=ValueError),
    case('apply given a number for its rngs', lambda: Block().apply(VARIABLES, X, rngs=3),
         lift_errors.InvalidRngsError, 'in Module Block', 'rngs are: 3'),
    case('bind given a string for the rngs of a module', lambda: Block().bind(
        VARIABLES, rngs='key'), lift_errors.InvalidRngsError, "got 'key'"),
    # -- mutable= --------------------------------------------------------------------------
    case('apply given a number for mutable', lambda: Block().apply(VARIABLES, X, mutable=3),
         lift_errors.InvalidFilterError, 'Invalid filter 3', 'DenyList',
         flax_error=flax_errors.InvalidFilterError),
    case('apply given a dict for mutable', lambda: Block().apply(
        VARIABLES, X, mutable={'batch_stats': True}), lift_errors.InvalidFilterError,
         "Invalid filter {'batch_stats': True}"),
    case('init given a number for mutable', lambda: Block().init(KEY, X, mutable=3),
         lift_errors.InvalidFilterError, 'Invalid filter 3'),
    case('bind of a module given a number for mutable', lambda: Block().bind(VARIABLES, mutable=3),
         lift_errors.InvalidFilterError, 'Invalid filter 3'),
    # -- method= ---------------------------------------------------------------------------
    case('apply of a method the module lacks', lambda: Mlp().apply({}, X, method='missing'),
         errors.MissingMethodError, '"Mlp" object has no attribute "missing"', 'method=',
         flax_error=flax_errors.ApplyModuleInvalidMethodError),
    case('apply given a method that takes no module', lambda: Mlp().apply(
        {}, X, method=lambda: True), errors.InvalidMethodError,
         'a function taking the module first'),
    case('apply of a field that is not callable', lambda: Field().apply(
        {}, X, method='not_callable'), errors.MethodNotCallableError,
         "'Field.not_callable' must be a callable, got <class 'int'>"),
    case('apply given a number as its method', lambda: Field().apply({}, X, method=3),
         errors.InvalidMethodError, 'Cannot call apply(): 3 is not'),
    case('apply of a module without __call__', lambda: module('NoCall', {'a': int})(1).apply({}),
         errors.MissingMethodError, '"NoCall" object has no attribute "__call__"'),
    case('init of a module without __call__', lambda: module('NoCall', {'a': int})(1).init(KEY),
         errors.MissingMethodError, '"NoCall" object has no attribute "__call__"'),
    # -- entry points called on the class, or given no module --------------------------------
    case('init called on the class', lambda: Mlp.init(KEY, X), errors.InvalidInstanceModuleError,
         '`init` got', 'called on a Module class', 'MyModule(...).init',
         flax_error=flax_errors.InvalidInstanceModuleError),
    case('init_with_output called on the class', lambda: Mlp.init_with_output(KEY, X),
         errors.InvalidInstanceModuleError, '`init_with_output` got',
         'MyModule(...).init_with_output'),
    case('apply called on the class', lambda: Mlp.apply({}, X), errors.InvalidInstanceModuleError,
         '`apply` got', 'MyModule(...).apply'),
    case('bind called on the class', lambda: Mlp.bind({}, X), errors.InvalidInstanceModuleError,
         '`bind` got', 'MyModule(...).bind'),
    case('nn.apply given a Module class', lambda: nn.apply(lambda m, x: m(x), Mlp)({}, X),
         errors.InvalidInstanceModuleError, '`nn.apply` got type', 'Mlp',
         'nn.apply(fn, MyModule(...))'),
    case('nn.init given a number as its module', lambda: nn.init(lambda m: m, 3)(KEY),
         errors.InvalidInstanceModuleError, '`nn.init` got int 3'),
    # -- lazy_init -------------------------------------------------------------------------
    case('lazy_init given a placeholder for an input the params read',
         _lazy_init_of_a_value_the_params_read, errors.LazyInitError, "kwargs['scale']",
         'concrete value', flax_error=flax_errors.LazyInitError),
]
