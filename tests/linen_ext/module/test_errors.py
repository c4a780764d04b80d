"""Misuse of the Module system raises a `ModuleError` that names the culprit and the fix."""
import re

import flax
import flax.errors as flax_errors
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn
from lift import errors as lift_errors
from lift.errors import InvalidScopeError, LiftError
from linen_ext import errors
from tests.helpers import check_both_raise

KEY = jax.random.key(0)
X = jnp.ones((2, 3))


class Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


def _compact(nn, fn):
  """A module whose compact ``__call__`` returns ``fn(self, nn, x)``."""
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      return fn(self, nn, x)
  return Model()


def _scanned(nn, body, xs, **options):
  class Cell(nn.Module):
    @nn.compact
    def __call__(self, c, x):
      return body(self, nn, c, x), None
  return _compact(nn, lambda m, nn, xs: nn.scan(Cell, **options)()(jnp.zeros((2, 3)), xs)
                  ).init(KEY, xs)


def _broadcast_param_written_per_step(m, nn, c, x):
  p = m.variable('params', 'w', lambda: jnp.zeros(3))
  p.value = p.value + x.sum()
  return c + p.value[None]


def _vmap_sizes(nn):
  model = _compact(nn, lambda m, nn, x: nn.vmap(
      nn.Dense, variable_axes={'params': 0}, split_rngs={'params': True})(3)(x))
  model.apply(model.init(KEY, XS), jnp.ones((4, 2, 3)))


XS = jnp.ones((3, 2, 3))
# Both libraries refuse these programs (Flax's message, last, shows why); ours is a subclass
# of Flax's class (code catching Flax's keeps working) and names the variable or argument.
BOTH_RAISE = {
    'param shape': (lambda nn: _compact(nn, lambda m, nn, x: x @ m.param(
        'w', nn.initializers.ones, (3, 2))).apply({'params': {'w': jnp.ones((3, 5))}}, X),
                    lift_errors.ParamShapeError, r'parameter "w" in "/".*\(3, 2\).*\(3, 5\)',
                    'parameter "w"'),
    'duplicate param': (lambda nn: _compact(nn, lambda m, nn, x: [
        m.param('w', nn.initializers.ones, (2,)) for _ in range(2)]).init(KEY, X),
                        errors.NameInUseError, 'param "w" in Module Model', 'param "w"'),
    'duplicate submodule': (lambda nn: _compact(nn, lambda m, nn, x: [
        nn.Dense(2, name='a')(x) for _ in range(2)]).init(KEY, X), errors.NameInUseError,
                            'submodule "a" in Module Model: Name in use.*Fix', 'submodule "a"'),
    'immutable write': (lambda nn: _compact(nn, lambda m, nn, x: m.put_variable(
        'counter', 'n', 1)).apply({'counter': {'n': 0}}, X, mutable=['params']),
                        lift_errors.ImmutableCollectionError,
                        r'"n" in "/".*"counter" is immutable', '"counter" is immutable'),
    'missing rng': (lambda nn: _compact(nn, lambda m, nn, x: jax.random.normal(
        m.make_rng('dropout'), x.shape)).apply({}, X),
                    lift_errors.UnknownRngError, 'PRNG for "dropout"', 'PRNG for "dropout"'),
    'scan length': (lambda nn: _scanned(
        nn, lambda m, nn, c, x: c + nn.Dense(3)(x), XS, variable_axes={'params': 0},
        split_rngs={'params': True}, length=4), lift_errors.AxisSizeError,
                    r"length=4.*size 3: axis 0 of argument 'x'", 'argument of 4'),
    'broadcast dependency': (lambda nn: _scanned(
        nn, _broadcast_param_written_per_step, XS, variable_broadcast='params',
        split_rngs={'params': False}), lift_errors.LoopInvariantError,
                             'broadcast variable params/w', 'data dependency'),
    'vmap sizes': (_vmap_sizes, lift_errors.AxisSizeError,
                   r'size 4: axis 0 of args\[0\].*size 3: axis 0 of variable params/bias',
                   'Inconsistent batch axis sizes'),
    'ready-made layer fed another input width': (lambda nn: _compact(nn, lambda m, nn, x: nn.Dense(
        2)(x)).apply(_compact(nn, lambda m, nn, x: nn.Dense(2)(x)).init(KEY, XS), X[:, :2]),
        lift_errors.ParamShapeError, r'parameter "kernel" in "/Dense_0".*\(2, 2\).*\(3, 2\)',
        'parameter "kernel"'),
    'ready-made layer without a params stream in vmap': (lambda nn: _compact(
        nn, lambda m, nn, xs: nn.vmap(nn.Dense, variable_axes={'params': 0}, split_rngs={})(3)(
            xs)).init(KEY, XS), lift_errors.UnknownRngError,
        r'VmapDense_0 needs PRNG for "params".*Fix', 'PRNG for "params"'),
    'shared but split': (lambda nn: _compact(nn, lambda m, nn, xs: nn.vmap(
        nn.Dense, variable_axes={'params': None}, split_rngs={'params': True})(3)(xs)).init(
            KEY, XS), lift_errors.InvalidAxisError,
                         r"variable_axes None.*\['params'\]\['kernel'\]", 'got axis spec None'),
}


@pytest.mark.parametrize('case', list(BOTH_RAISE))
def test_errors_fire_where_flax_errors(case):
  build, error, message, flax_message = BOTH_RAISE[case]
  ours, theirs = check_both_raise(build, error)
  assert isinstance(ours, type(theirs)), (type(ours), type(theirs))
  assert re.search(message, str(ours), re.S), str(ours)
  assert flax_message in str(theirs), str(theirs)


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


def _module(name, fields=None, **methods):
  """A Module class made by ``type``: ``fields`` annotations, then the given methods."""
  return type(name, (nn.Module,), {'__annotations__': fields or {}, **methods})


class _Reading:
  def __get__(self, obj, objtype=None):
    return obj.missing_attribute


class _Field(nn.Module):
  not_callable: int = 1

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


def _set_frozen():
  class Setter(_Field):
    def __call__(self, x):
      self.not_callable = 2
  Setter().apply({}, X)


def _perturb_missing(perturbations):
  return _compact(nn, lambda m, nn, x: m.perturb('h', x)).apply({'perturbations': perturbations}, X)


def _branches(transform):
  def call(m, nn, x):
    dense = [nn.Dense(2, name=f'd{i}') for i in range(2)]
    fns = [lambda mdl, x, i=i: mdl[i](x) for i in range(2)]
    if transform == 'cond':
      return nn.cond(True, fns[0], fns[1], dense, x)
    return nn.switch(1, fns, dense, x)
  return _compact(nn, call).init(KEY, X)


ENTRY = r'`{}` got .* called on a Module class.*MyModule\(...\)\.{}'
UNBOUND = "^Can't {} on unbound modules"  # Flax's phrase leads (ported tests match on it)
OUTSIDE = r'^{} must be initialized in `setup\(\)` or in a method wrapped in `@compact` \({}\w* "w"\).*Fix'
# (misuse, our class, what our message says, Flax classes the error also is)
MISUSE = {
    'compact call unbound': (lambda: Mlp()(X), errors.UnboundModuleError,
                             UNBOUND.format('call compact methods') +
                             r'.*unbound module `Mlp`.*init\(key, x\)',
                             flax_errors.CallCompactUnboundModuleError),
    'variables unbound': (lambda: Mlp().variables, errors.UnboundModuleError,
                          'Reading `variables`', ValueError),
    'make_rng unbound': (lambda: Mlp().make_rng('dropout'), errors.UnboundModuleError,
                         UNBOUND.format('use RNGs') + '.*make_rng'),
    'has_rng unbound': (lambda: Mlp().has_rng('dropout'), errors.UnboundModuleError,
                        UNBOUND.format('query for RNGs')),
    'unbind unbound': (lambda: Mlp().unbind(), errors.UnboundModuleError, 'unbind'),
    'share_scope unbound': (lambda: nn.share_scope(Mlp(), Mlp()), errors.UnboundModuleError,
                            'share_scope.*`Mlp`'),
    'submodule named as a param': (lambda: _compact(nn, lambda m, nn, x: (
        m.param('a', nn.initializers.zeros, (3,)), nn.Dense(2, name='a')(x))).init(KEY, X),
                                   errors.NameInUseError, 'submodule "a"'),
    'missing param': (lambda: _compact(nn, lambda m, nn, x: x * m.param(
        'scale', nn.initializers.ones, ())).apply({'params': {'other': 1.0}}, X),
                      lift_errors.MissingParamError, '"scale".*Fix',
                      flax_errors.ScopeParamNotFoundError),
    'attribute set outside setup': (lambda: _plain(lambda m, x: setattr(m, 'cache', x)).init(
        KEY, X), errors.FrozenModuleError, r"Can't set cache=.*Model.*frozen.*clone\(cache="),
    'field set outside setup': (_set_frozen, errors.FrozenModuleError,
                                "^Can't set not_callable=2 for Module of type Setter: Module "
                                'instance is frozen outside of setup method'),
    'setup assigns a field': (lambda: _plain(lambda m, x: x, lambda m: setattr(m, 'features', 3)
                                             ).init(KEY, X),
                              errors.SetupFieldAssignmentError, '"features"'),
    'submodule in a plain method': (lambda: _plain(lambda m, x: nn.Dense(2)(x)).init(KEY, X),
                                    errors.SubmoduleOutsideSetupError,
                                    r'Submodule Dense must be defined in `setup\(\)`.*@nn.compact'),
    'submodule in a private method': (lambda: _plain(lambda m, x: m._helper(x)).init(KEY, X),
                                      errors.SubmoduleOutsideSetupError,
                                      r'Submodule Dense must.*`Model`.*@nn.compact'),
    'param in a plain method': (lambda: _plain(lambda m, x: x * m.param(
        'w', nn.initializers.ones, (3,))).init(KEY, X), errors.SubmoduleOutsideSetupError,
                                OUTSIDE.format('Parameters', 'param')),
    'variable in a plain method': (lambda: _plain(lambda m, x: x * m.variable(
        'state', 'w', jnp.ones, (3,)).value).init(KEY, X), errors.SubmoduleOutsideSetupError,
                                   OUTSIDE.format('Variables', 'variable')),
    'invalid parent': (lambda: Mlp(parent=3), errors.InvalidParentError, 'parent must be None'),
    'bare flax module called in a compact method': (
        lambda: _module('Bare', __call__=nn.compact(lambda self, x: flax_nn.Dense(2)(x)))().init(
            KEY, X), errors.FlaxModuleCalledInlineError,
        r"^Can.t call compact methods on unbound modules: .*`Bare\..*nn.from_flax"),
    'flax child scope as parent': (lambda: Mlp(parent=flax.core.Scope({}).push('a')),
                                   errors.InvalidParentError,
                                   r'got a flax.core.scope.Scope that is not a root.*lift.bind'),
    'missing method': (lambda: Mlp().apply({}, X, method='missing'), errors.InvalidMethodError,
                       '"Mlp" object has no attribute "missing"'),
    'method not taking the module': (lambda: Mlp().apply({}, X, method=lambda: True),
                                     errors.InvalidMethodError, 'a function taking the module first'),
    'method not callable': (lambda: _Field().apply({}, X, method='not_callable'),
                            errors.MethodNotCallableError,
                            "^'_Field.not_callable' must be a callable, got <class 'int'>"),
    'method not a function': (lambda: _Field().apply({}, X, method=3), errors.InvalidMethodError,
                              r'^Cannot call apply\(\): 3 is not'),
    'init on the class': (lambda: Mlp.init(KEY, X), errors.InvalidInstanceModuleError,
                          ENTRY.format('init', 'init'), flax_errors.InvalidInstanceModuleError),
    'init_with_output on the class': (lambda: Mlp.init_with_output(KEY, X),
                                      errors.InvalidInstanceModuleError,
                                      ENTRY.format('init_with_output', 'init_with_output')),
    'apply on the class': (lambda: Mlp.apply({}, X), errors.InvalidInstanceModuleError,
                           ENTRY.format('apply', 'apply')),
    'bind on the class': (lambda: Mlp.bind({}, X), errors.InvalidInstanceModuleError,
                          ENTRY.format('bind', 'bind')),
    'rngs not a key': (lambda: _Field().init('test', X), lift_errors.InvalidRngsError,
                       r'^RNGs should be of shape \(2,\) or PRNGKey in Module _Field, but rngs '
                       'are: test'),
    'rngs dict of non-keys': (lambda: _Field().init({'params': 'test'}, X),
                              lift_errors.InvalidRngsError, '^First argument passed to an init '
                              'function should be a ``jax.PRNGKey``'),
    'perturbation missing': (lambda: _perturb_missing({'other': X}),
                             errors.MissingPerturbationError, '^Perturbation collection '
                             r'perturbations present, but missing perturbation variable h \(perturb'
                             r'\("h"\)'),
    'perturbation collection empty': (lambda: _perturb_missing({}),
                                      errors.MissingPerturbationError,
                                      r'missing perturbation variable h \(perturb\("h"\)'),
    'hash of a bound module': (lambda: _compact(nn, lambda m, nn, x: hash(m)).apply({}, X),
                               TypeError,
                               "^Can't call __hash__ on modules that hold variables: Model"),
    'value for a variable init fn': (lambda: _compact(nn, lambda m, nn, x: x + m.variable(
        'stats', 'n', 0).value).init(KEY, X), lift_errors.InitFnError,
                                     r'variable\("n"\) in collection "stats" at "/".*0 \(int\).*'
                                     r"Fix: pass a function, e\.g\. variable\('stats', 'n', "
                                     r'lambda: 0\)'),
    'value for a param init fn': (lambda: _compact(nn, lambda m, nn, x: x * m.param(
        'w', jnp.ones(2))).init(KEY, X), TypeError,
                                  r'param\("w"\) in collection "params" at "/".*not callable'),
    'reserved field name': (lambda: _module('Model', {'name': str}), errors.ReservedNameError,
                            '"name"'),
    'post_init without super': (lambda: _module(
        'Scaled', {'scale': float}, __post_init__=lambda self: None,
        __call__=nn.compact(lambda self, x: x))(3.0).init(KEY, X),
                                errors.IncorrectPostInitOverrideError,
                                r'`Scaled.__post_init__`.*super\(\).__post_init__\(\)'),
    'property raising AttributeError': (lambda: _module(
        'Model', derived=property(lambda self: self.missing_attribute),
        __call__=lambda self: self.derived)().apply({}), errors.DescriptorAttributeError,
                                        r'`Model.derived`, a property'),
    'descriptor raising AttributeError': (lambda: _module(
        'Model', derived=_Reading(), __call__=lambda self: self.derived)().apply({}),
                                          errors.DescriptorAttributeError,
                                          r'`Model.derived`, a property'),
    'empty Sequential': (lambda: _compact(nn, lambda m, nn, x: nn.Sequential([], name='body')(
        x)).init(KEY, X), ValueError, r'Empty Sequential module at "/body".*Fix'),
    'cond given a list of modules': (lambda: _branches('cond'), errors.NotAModuleError,
                                     r'`nn.cond`.*list of Dense, Dense.*self'),
    'no __call__ in apply': (lambda: _module('NoCall', {'a': int})(1).apply({}),
                             errors.InvalidMethodError, '__call__'),
    'no __call__ in init': (lambda: _module('NoCall', {'a': int})(1).init(KEY),  # as Flax's
                            AttributeError, '"NoCall" object has no attribute "__call__"'),
    'setup attribute of an unbound module': (lambda: _module(
        'Model', setup=lambda self: setattr(self, 'dense', nn.Dense(3)))().dense, AttributeError,
                                             'only exists inside `init`/`apply`'),
    'switch given a list of modules': (lambda: _branches('switch'), errors.NotAModuleError,
                                       r'`nn.switch`.*list of Dense, Dense.*self'),
}


@pytest.mark.parametrize('case', list(MISUSE))
def test_misuse_raises_a_module_error_naming_the_culprit(case):
  """Our class (a Flax class too where listed: code catching Flax's keeps working)."""
  misuse, error, message, *flax_classes = MISUSE[case]
  with pytest.raises(error, match=message) as info:
    misuse()
  assert all(isinstance(info.value, cls) for cls in flax_classes), type(info.value).__mro__


def test_module_errors_are_lift_errors():
  assert issubclass(errors.ModuleError, LiftError)


def test_lazy_init_names_the_input_the_variables_read():
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x, *, scale):
      return self.param('w', lambda key: scale.sum() * jnp.ones(2))

  shape = jax.ShapeDtypeStruct((2,), jnp.float32)
  with pytest.raises(errors.LazyInitError, match=r"kwargs\['scale'\].*concrete value"):
    Model().lazy_init(KEY, shape, scale=shape)
  variables = Model().lazy_init(KEY, shape, scale=jnp.ones(2))
  np.testing.assert_array_equal(variables['params']['w'], 2.0 * np.ones(2))


def test_using_a_submodule_after_apply_returned():
  leaked = []

  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      dense = nn.Dense(2)
      leaked.append(dense)
      return dense(x)

  variables = Model().init(KEY, X)
  with pytest.raises(InvalidScopeError, match='no longer valid.*already returned'):
    leaked[0](X)
  with pytest.raises(InvalidScopeError):
    _ = leaked[0].variables
  assert variables['params']['Dense_0']['kernel'].shape == (3, 2)
