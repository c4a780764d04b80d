"""Mistakes with scopes and their entry points: variables, rngs, names, mutability, filters,
the arguments of `lift.init`/`apply`/`bind`, and scopes or Variables used after return."""
import flax.core
import flax.errors as flax_errors
import jax
import jax.numpy as jnp

import lift
from lift import errors
from lift.filters import DenyList, validate_filter

from tests.helpers import dense
from tests.misuse import both, case

KEY = jax.random.key(0)
X = jnp.ones((1, 2))
DENSE_4_2 = {'params': {'kernel': jnp.ones((3, 2)), 'bias': jnp.ones(2)}}


def _kept_scope_used_inside(transform):
  """Keeps the child scope made inside ``transform`` and uses it after the transform returned,
  still inside the same `init`."""
  saved = []
  wrap = {'checkpoint': lift.checkpoint, 'jit': lift.jit, 'vmap': lambda f: lift.vmap(f, {}, {}),
          'map_variables': lambda f: lift.map_variables(f, 'params')}[transform]

  def inner(scope, x):
    saved.append(scope.push('child'))
    return x

  def outer(scope, x):
    wrap(inner)(scope, x)
    saved[0].param('z', lambda key: 1.0)
  return case(f'a scope kept from inside {transform} used after it returned',
              lambda: lift.init(outer)(KEY, jnp.ones((2,))), errors.InvalidScopeError,
              f'"{"remat" if transform == "checkpoint" else transform}(/child)"',
              'no longer valid',
              flax_error=flax_errors.InvalidScopeError)


def _kept_lifted_scope_asked_for(name):
  """Keeps the scope `lift.checkpoint` gives its body, which makes the parameter "w", and asks
  it for the parameter ``name`` after the transform returned, still inside the same `init`."""
  saved = []

  def body(scope, x):
    saved.append(scope)
    return x * scope.param('w', jax.nn.initializers.ones, ())

  def outer(scope, x):
    y = lift.checkpoint(body)(scope, x)
    return y * saved[0].param(name, jax.nn.initializers.ones, ())
  return lift.init(outer)(KEY, jnp.ones(()))


def _kept_after_apply(keep):
  saved = []
  lift.apply(lambda scope: saved.append(keep(scope)))({'state': {'v': 1.0}})
  return saved[0]


CASES = [
    # -- variables -------------------------------------------------------------------------
    both('a parameter missing from the variables given to apply', lambda M: M.apply(
        lambda s: s.child(dense, 'out')(X, 3))({'params': {'out': {'kernel': jnp.ones((2, 3))}}}),
         errors.MissingParamError, flax_errors.ScopeParamNotFoundError, '"bias"', '"/out"',
         core=True),
    both('apply without the params collection', lambda M: M.apply(
        lambda s: s.child(dense, 'layer')(X, 3))({}), errors.MissingCollectionError,
         flax_errors.ScopeCollectionNotFound, 'collection "params"', '"/layer"', core=True),
    both('a variable missing from its collection', lambda M: M.apply(
        lambda s: s.push('bn').variable('batch_stats', 'mean'))(
            {'batch_stats': {'bn': {'var': 1.0}}}),
         errors.MissingVariableError, flax_errors.ScopeVariableNotFoundError, '"mean"',
         'collection "batch_stats"', '"/bn"', core=True),
    both('a variable without an init function at init', lambda M: M.init(
        lambda s: s.variable('state', 'x').value)(KEY), errors.MissingCollectionError,
         flax_errors.ScopeCollectionNotFound, '"x"', 'collection "state"', core=True),
    both('a variable without an init function in a mutable apply', lambda M: M.apply(
        lambda s: s.variable('state', 'y').value, mutable=True)({'state': {'x': 1}}),
         errors.MissingVariableError, flax_errors.ScopeVariableNotFoundError, '"y"', '"state"',
         core=True),
    both('apply with an input of another width than at init', lambda M: M.apply(dense)(
        DENSE_4_2, jnp.ones((1, 4)), 2), errors.ParamShapeError, flax_errors.ScopeParamShapeError,
         '"kernel" in "/"', 'shape (4, 2)', 'shape (3, 2)', core=True),
    both('a Python list where a parameter array belongs', lambda M: M.apply(dense)(
        {'params': {'kernel': [[1.0, 2.0]] * 4, 'bias': jnp.ones(2)}}, jnp.ones((1, 4)), 2),
         errors.ParamStructureError, flax_errors.ScopeParamShapeError, '"kernel" in "/"',
         'a list of shape (4, 2)', 'jnp.asarray', core=True),
    case('a value where param takes an init function', lambda: lift.init(
        lambda s: s.param('w', 3.0))(KEY), errors.InitFnError, 'param("w")', 'collection "params"',
         '3.0 (float)'),
    # -- mutability ------------------------------------------------------------------------
    both('a parameter written in apply', lambda M: M.apply(
        lambda s: s.push('layer').put_variable('params', 'w', 1.0))({'params': {}}),
         errors.ImmutableCollectionError, flax_errors.ModifyScopeVariableError, '"w"',
         '"/layer"', '"params" is immutable', core=True),
    both('an existing variable written without mutable', lambda M: M.apply(
        lambda s: s.put_variable('state', 'x', 2))({'state': {'x': 1}}),
         errors.ImmutableCollectionError, flax_errors.ModifyScopeVariableError, '"x"',
         '"state" is immutable', 'mutable=["state"]', core=True),
    both('a new collection written without mutable', lambda M: M.apply(
        lambda s: s.put_variable('new', 'x', 2))({'state': {'x': 1}}),
         errors.ImmutableCollectionError, flax_errors.ModifyScopeVariableError,
         '"new" is immutable', core=True),
    case('mutable given as a number', lambda: lift.apply(lambda s: 0, mutable=3)({}),
         errors.InvalidFilterError, 'Invalid filter 3', 'the `mutable` argument', 'DenyList',
         flax_error=flax_errors.InvalidFilterError),
    # -- rngs ------------------------------------------------------------------------------
    both('make_rng of a stream that was not passed', lambda M: M.apply(
        lambda s: s.push('drop').make_rng('dropout'))({}, rngs={'noise': KEY}),
         errors.UnknownRngError, flax_errors.InvalidRngError, 'PRNG for "dropout"',
         'scope "/drop"', 'rngs={"dropout": key}', core=True),
    both('init given a number for its rngs', lambda M: M.init(dense)(3, X, 2),
         errors.InvalidRngsError, ValueError, 'jax.PRNGKey', 'got 3', core=True),
    both('rngs of apply not keys', lambda M: M.apply(lambda s: 0)({}, rngs={'dropout': 3}),
         errors.InvalidRngsError, ValueError, "{'dropout': 3}", core=True),
    case('bind given a string for its rngs', lambda: lift.bind({}, rngs='key'),
         errors.InvalidRngsError, "got 'key'", '{"params": key, "dropout": key2}'),
    # -- names -----------------------------------------------------------------------------
    both('one child name used twice', lambda M: M.init(
        lambda s: (s.push('a').param('w', lambda k: 1.0), s.push('a')))(KEY),
         errors.NameInUseError, ValueError, '"a" is already in use at "/"',
         'reuse=True', core=True),
    case('a number as a scope name', lambda: lift.init(lambda s: s.push(3))(KEY),
         errors.InvalidNameError, 'got 3', 'at "/"'),
    # -- the variables given to apply and bind -----------------------------------------------
    both('params wrapped twice', lambda M: M.apply(dense)({'params': {'params': {}}}, X, 2),
         errors.InvalidVariablesError, flax_errors.ApplyScopeInvalidVariablesStructureError,
         'extra params layer', core=True),
    both('a collection that is not a dict', lambda M: M.apply(dense)({'params': 3}, X, 2),
         errors.InvalidVariablesError, flax_errors.ApplyScopeInvalidVariablesTypeError,
         "collection 'params'", core=True),
    case('bind given a list for its variables', lambda: lift.bind([1]),
         errors.InvalidVariablesError, 'got list', 'the dict returned by `init`'),
    case('bind given a number for mutable', lambda: lift.bind({}, mutable=3),
         errors.InvalidFilterError, 'Invalid filter 3', flax_error=flax_errors.InvalidFilterError),
    # -- filters ---------------------------------------------------------------------------
    case('a number as a filter', lambda: validate_filter(3), errors.InvalidFilterError,
         'Invalid filter 3 of type int', flax_error=flax_errors.InvalidFilterError),
    case('None as a filter', lambda: lift.in_filter(None, 'params'), errors.InvalidFilterError,
         'Invalid filter None'),
    case('a filter list holding a number', lambda: validate_filter(['a', 1]),
         errors.InvalidFilterError, "Invalid filter ['a', 1]"),
    case('a dict as a filter', lambda: validate_filter({'a': 1}), errors.InvalidFilterError,
         "Invalid filter {'a': 1}"),
    case('a DenyList of a number', lambda: DenyList(3), errors.InvalidFilterError,
         'Invalid filter 3'),
    case("Flax's DenyList of a number", lambda: validate_filter(flax.core.DenyList(3)),
         errors.InvalidFilterError, 'Invalid filter 3'),
    # -- scopes and Variables used after return ----------------------------------------------
    case('a scope kept from apply used afterwards', lambda: _kept_after_apply(
        lambda s: s.push('child')).get_variable('params', 'w'), errors.InvalidScopeError,
         '"/child"', 'no longer valid', flax_error=flax_errors.InvalidScopeError),
    case('a Variable kept from apply read afterwards', lambda: _kept_after_apply(
        lambda s: s.variable('state', 'v')).value, errors.InvalidScopeError,
         'scope at "/"', 'no longer valid', flax_error=flax_errors.InvalidScopeError),
    case('a temporary scope used after its block', lambda: _temporary_scope().get_variable(
        'params', 'w'), errors.InvalidScopeError, 'no longer valid'),
    *(_kept_scope_used_inside(t) for t in ('checkpoint', 'jit', 'vmap', 'map_variables')),
    case('a lifted scope kept after its transform returned, asked for a parameter it made',
         lambda: _kept_lifted_scope_asked_for('w'), errors.InvalidScopeError, '"remat(/)"',
         'no longer valid', flax_error=flax_errors.InvalidScopeError),
    case('a lifted scope kept after its transform returned, asked for a new parameter',
         lambda: _kept_lifted_scope_asked_for('v'), errors.InvalidScopeError, '"remat(/)"',
         'no longer valid', flax_error=flax_errors.InvalidScopeError),
    # -- Flax's objects where ours are expected ----------------------------------------------
    case("Flax's scope passed to a lifted transform", lambda: lift.vmap(
        lambda s: 0, {}, {})(flax.core.bind({})), errors.NotAScopeError, 'lifted `vmap`',
         'Scope', 'fn(scope, *args)'),
]


def _temporary_scope():
  with lift.bind({'params': {'w': 1.0}}).temporary() as scope:
    pass
  return scope
