"""Mistakes in writing Modules: where submodules and variables are made, names, attributes,
fields, `setup`, `__post_init__`, properties, and modules used outside `init`/`apply`."""
import flax.core
import flax.errors as flax_errors
import flax.linen as flax_nn
import jax
import jax.numpy as jnp

import linen_ext as nn
from lift import errors as lift_errors
from linen_ext import errors

from tests.misuse import both, case

KEY = jax.random.key(0)
X = jnp.ones((2, 3))
FLAX_DENSE = flax_nn.Dense(2)  # made at import, outside any module: nothing adopts it


class Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


def compact(nn, fn):
  """A module whose compact ``__call__`` returns ``fn(self, nn, x)``, of library ``nn``."""
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return fn(self, nn, x)
  return Model()


def _plain(fn, setup=lambda m: None):
  """A module whose plain (not compact) ``__call__`` returns ``fn(self, x)``."""
  class Model(nn.Module):
    features: int = 2

    def setup(self):
      setup(self)

    def _helper(self, x):
      return nn.Dense(2)(x)

    def __call__(self, x):
      return fn(self, x)
  return Model()


def module(name, fields=None, **methods):
  """A Module class made by ``type``: ``fields`` annotations, then the given methods."""
  return type(name, (nn.Module,), {'__annotations__': fields or {}, **methods})


class _Reading:
  def __get__(self, obj, objtype=None):
    return obj.missing_attribute


class Field(nn.Module):
  not_callable: int = 1

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


def _set_frozen():
  class Setter(Field):
    def __call__(self, x):
      self.not_callable = 2
  Setter().apply({}, X)


def _used_after_apply(read):
  leaked = []

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      dense = nn.Dense(2)
      leaked.append(dense)
      return dense(x)

  Model().init(KEY, X)
  return read(leaked[0])


UNBOUND = "Can't {} on unbound modules"  # Flax's phrase leads (ported tests match on it)
OUTSIDE = 'must be initialized in `setup()` or in a method wrapped in `@compact`'
CASES = [
    # -- modules used outside init/apply ----------------------------------------------------
    case('calling a module outside init/apply', lambda: Mlp()(X), errors.UnboundModuleError,
         UNBOUND.format('call compact methods'), 'unbound module `Mlp`', 'init(key, x)',
         flax_error=flax_errors.CallCompactUnboundModuleError),
    case('reading variables of an unbound module', lambda: Mlp().variables,
         errors.UnboundModuleError, 'Reading `variables`', '`Mlp`'),
    case('make_rng on an unbound module', lambda: Mlp().make_rng('dropout'),
         errors.UnboundModuleError, UNBOUND.format('use RNGs'), 'make_rng'),
    case('has_rng on an unbound module', lambda: Mlp().has_rng('dropout'),
         errors.UnboundModuleError, UNBOUND.format('query for RNGs')),
    case('unbind of an unbound module', lambda: Mlp().unbind(), errors.UnboundModuleError,
         'unbind', flax_error=flax_errors.CallUnbindOnUnboundModuleError),
    case('share_scope on unbound modules', lambda: nn.share_scope(Mlp(), Mlp()),
         errors.UnboundModuleError, 'share_scope', '`Mlp`',
         flax_error=flax_errors.CallShareScopeOnUnboundModuleError),
    case('a setup attribute read on an unbound module', lambda: module(
        'Model', setup=lambda self: setattr(self, 'dense', nn.Dense(3)))().dense,
         errors.UnboundAttributeError, '"dense"', 'only exists inside `init`/`apply`', 'bind'),
    case('a submodule kept from init called afterwards', lambda: _used_after_apply(
        lambda dense: dense(X)), lift_errors.InvalidScopeError, 'no longer valid',
         'already returned', flax_error=flax_errors.InvalidScopeError),
    case('variables of a submodule kept from init read afterwards', lambda: _used_after_apply(
        lambda dense: dense.variables), lift_errors.InvalidScopeError, 'no longer valid'),
    # -- where submodules and variables are made -------------------------------------------
    case('a submodule made in a method that is not compact', lambda: _plain(
        lambda m, x: nn.Dense(2)(x)).init(KEY, X), errors.SubmoduleOutsideSetupError,
         'Submodule Dense must be defined in `setup()`', '@nn.compact',
         flax_error=flax_errors.AssignSubModuleError),
    case('a submodule made in a private helper method', lambda: _plain(
        lambda m, x: m._helper(x)).init(KEY, X), errors.SubmoduleOutsideSetupError,
         'Submodule Dense must', '`Model`'),
    case('a param made in a method that is not compact', lambda: _plain(
        lambda m, x: x * m.param('w', nn.initializers.ones, (3,))).init(KEY, X),
         errors.SubmoduleOutsideSetupError, 'Parameters ' + OUTSIDE, 'parameter "w"'),
    case('a variable made in a method that is not compact', lambda: _plain(
        lambda m, x: x * m.variable('state', 'w', jnp.ones, (3,)).value).init(KEY, X),
         errors.SubmoduleOutsideSetupError, 'Variables ' + OUTSIDE, 'variable "w"'),
    case('a value where variable takes an init function', lambda: compact(
        nn, lambda m, nn, x: x + m.variable('stats', 'n', 0).value).init(KEY, X),
         lift_errors.InitFnError, 'variable("n") in collection "stats" at "/"', '0 (int)',
         "variable('stats', 'n', lambda: 0)"),
    case('an array where param takes an init function', lambda: compact(
        nn, lambda m, nn, x: x * m.param('w', jnp.ones(2))).init(KEY, X),
         lift_errors.InitFnError, 'param("w") in collection "params" at "/"', 'not callable'),
    # -- names -----------------------------------------------------------------------------
    both('one param name used twice', lambda nn: compact(nn, lambda m, nn, x: [
        m.param('w', nn.initializers.ones, (2,)) for _ in range(2)]).init(KEY, X),
         errors.NameInUseError, flax_errors.NameInUseError, 'param "w" in Module Model'),
    both('one submodule name used twice', lambda nn: compact(nn, lambda m, nn, x: [
        nn.Dense(2, name='a')(x) for _ in range(2)]).init(KEY, X), errors.NameInUseError,
         flax_errors.NameInUseError, 'submodule "a" in Module Model: Name in use'),
    case('a submodule named as a param', lambda: compact(nn, lambda m, nn, x: (
        m.param('a', nn.initializers.zeros, (3,)), nn.Dense(2, name='a')(x))).init(KEY, X),
         errors.NameInUseError, 'submodule "a"', flax_error=flax_errors.NameInUseError),
    case('a field named name', lambda: module('Model', {'name': str}), errors.ReservedNameError,
         '"name"', flax_error=flax_errors.ReservedModuleAttributeError),
    # -- attributes, fields, setup ---------------------------------------------------------
    case('an attribute set outside setup', lambda: _plain(
        lambda m, x: setattr(m, 'cache', x)).init(KEY, X), errors.FrozenModuleError,
         "Can't set cache=", 'Model', 'frozen', 'clone(cache=',
         flax_error=flax_errors.SetAttributeFrozenModuleError),
    case('a field set outside setup', _set_frozen, errors.FrozenModuleError,
         "Can't set not_callable=2 for Module of type Setter: Module instance is frozen "
         'outside of setup method'),
    case('setup assigning a field', lambda: _plain(
        lambda m, x: x, lambda m: setattr(m, 'features', 3)).init(KEY, X),
         errors.SetupFieldAssignmentError, '"features"',
         flax_error=flax_errors.SetAttributeInModuleSetupError),
    case('__post_init__ without super().__post_init__()', lambda: module(
        'Scaled', {'scale': float}, __post_init__=lambda self: None,
        __call__=nn.compact(lambda self, x: x))(3.0).init(KEY, X),
         errors.IncorrectPostInitOverrideError, '`Scaled.__post_init__`',
         'super().__post_init__()', flax_error=flax_errors.IncorrectPostInitOverrideError),
    case('a property raising AttributeError', lambda: module(
        'Model', derived=property(lambda self: self.missing_attribute),
        __call__=lambda self: self.derived)().apply({}), errors.DescriptorAttributeError,
         '`Model.derived`, a property', flax_error=flax_errors.DescriptorAttributeError),
    case('a descriptor raising AttributeError', lambda: module(
        'Model', derived=_Reading(), __call__=lambda self: self.derived)().apply({}),
         errors.DescriptorAttributeError, '`Model.derived`, a property'),
    case('parent given a number', lambda: Mlp(parent=3), errors.InvalidParentError,
         'parent must be None', 'got int'),
    case('hashing a bound module', lambda: compact(nn, lambda m, nn, x: hash(m)).apply({}, X),
         errors.UnhashableModuleError, "Can't call __hash__ on modules that hold variables: Model",
         'clone(parent=None)'),
    case('an empty Sequential', lambda: compact(nn, lambda m, nn, x: nn.Sequential(
        [], name='body')(x)).init(KEY, X), errors.LayerArgumentError,
         'Empty Sequential module at "/body"'),
    case('perturb without its perturbation', lambda: compact(
        nn, lambda m, nn, x: m.perturb('h', x)).apply({'perturbations': {'other': X}}, X),
         errors.MissingPerturbationError, 'Perturbation collection perturbations present, but '
         'missing perturbation variable h (perturb("h")'),
    case('perturb with an empty perturbations collection', lambda: compact(
        nn, lambda m, nn, x: m.perturb('h', x)).apply({'perturbations': {}}, X),
         errors.MissingPerturbationError, 'missing perturbation variable h (perturb("h")'),
    # -- Flax's objects where ours are expected ----------------------------------------------
    case("a flax.linen module made outside the model, called in a method", lambda: module(
        'Bare', __call__=nn.compact(lambda self, x: FLAX_DENSE(x)))().init(KEY, X),
         errors.FlaxModuleCalledInlineError, "Can't call compact methods on unbound modules",
         '`Bare.', 'nn.from_flax', flax_error=flax_errors.CallCompactUnboundModuleError),
    case("a child of Flax's scope as a parent", lambda: Mlp(parent=flax.core.Scope({}).push('a')),
         errors.InvalidParentError, 'got a flax.core.scope.Scope that is not a root', 'lift.bind('),
]
