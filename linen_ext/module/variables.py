"""The variable and rng methods of `Module`: thin checks in front of `lift.Scope`."""
from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, TypeVar

import jax

from lift.scope import Scope, Variable

from linen_ext import errors

T = TypeVar('T')
K = TypeVar('K')


def tuple_reduce(xs: tuple, x: Any) -> tuple:
  """`sow`'s default reduction: append ``x`` to the tuple ``xs``.

  Not for a running value (a sum, a maximum): give `sow` your own ``reduce_fn``.

  Examples:
    >>> tuple_reduce((1,), 2)
    (1, 2)
  """
  return xs + (x,)


def tuple_init() -> tuple:
  """`sow`'s default initial value: an empty tuple.

  Not for a running value: give `sow` your own ``init_fn`` (and ``reduce_fn``).

  Examples:
    >>> class Probe(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     self.sow('intermediates', 'h', x)   # starts from tuple_init(), appends
    ...     return x
    >>> _, state = Probe().apply({}, jnp.ones(2), mutable='intermediates')
    >>> state['intermediates']['h']
    (Array([1., 1.], dtype=float32),)
  """
  return ()


class VariablesMixin:
  """`param`, `variable`, `make_rng`, `sow` and friends; the module must be bound."""

  scope: Scope | None
  if typing.TYPE_CHECKING:  # Module's
    @property
    def _initialization_allowed(self) -> bool: ...

  def _bound_scope(self, what: str) -> Scope:
    if self.scope is None:
      raise errors.UnboundModuleError(type(self).__name__, what)
    return self.scope

  def _reserve_check(self, kind: str, name: str, col: str) -> Scope:
    scope = self._bound_scope(f'Creating {kind} "{name}"')
    if not self._initialization_allowed:
      raise errors.SubmoduleOutsideSetupError(
          type(self).__name__, {'param': 'Parameter'}.get(kind, kind.capitalize()), name)
    if scope.name_reserved(name, col):
      raise errors.NameInUseError(kind, name, type(self).__name__, scope.path)
    return scope

  def param(self, name: str, init_fn: Callable[..., T], *init_args,
            unbox: bool = True, **init_kwargs) -> T:
    """Declares parameter ``name`` in 'params', created by ``init_fn(key, *init_args)``.

    Examples:
      >>> class Bias(nn.Module):
      ...   @nn.compact
      ...   def __call__(self, x):
      ...     return x + self.param('b', nn.initializers.zeros, x.shape[-1:])
      >>> jax.tree.map(jnp.shape, Bias().init(jax.random.key(0), jnp.ones(3)))
      {'params': {'b': (3,)}}
    """
    scope = self._reserve_check('param', name, 'params')
    return scope.param(name, init_fn, *init_args, unbox=unbox, **init_kwargs)

  def variable(self, col: str, name: str, init_fn: Callable[..., T] | None = None,
               *init_args, unbox: bool = True, **init_kwargs) -> Variable[T]:
    """Declares variable ``name`` of collection ``col``; returns a handle with ``.value``.

    Examples:
      >>> class Counter(nn.Module):
      ...   @nn.compact
      ...   def __call__(self):
      ...     count = self.variable('counter', 'count', lambda: 0)
      ...     count.value += 1
      ...     return count.value
      >>> Counter().apply({'counter': {'count': 41}}, mutable='counter')
      (42, {'counter': {'count': 42}})
    """
    scope = self._reserve_check('variable', name, col)
    return scope.variable(col, name, init_fn, *init_args, unbox=unbox, **init_kwargs)

  def make_rng(self, name: str = 'params') -> jax.Array:
    """A fresh key from stream ``name`` (falls back to 'params' when absent, as Flax).

    Examples:
      >>> class Noise(nn.Module):
      ...   def __call__(self, x):
      ...     return x + jax.random.normal(self.make_rng('noise'), x.shape)
      >>> Noise().apply({}, jnp.zeros(2), rngs={'noise': jax.random.key(0)}).shape
      (2,)
    """
    return self._bound_scope(f'make_rng("{name}")').make_rng(name)

  def has_rng(self, name: str) -> bool:
    """Whether stream ``name`` was given to this module (``self.has_rng('dropout')``)."""
    return self._bound_scope(f'has_rng("{name}")').has_rng(name)

  def is_initializing(self) -> bool:
    """True inside ``init`` (and ``init_with_output``).

    Examples:
      >>> class Model(nn.Module):
      ...   def __call__(self, x):
      ...     return x if self.is_initializing() else 2 * x
      >>> y, variables = Model().init_with_output(jax.random.key(0), 1.0)
      >>> y, Model().apply(variables, 1.0)
      (1.0, 2.0)
    """
    return bool(self._bound_scope('is_initializing()').get_flag('initializing', False))

  def is_mutable_collection(self, col: str) -> bool:
    """Whether ``col`` may be written here (``self.is_mutable_collection('batch_stats')``)."""
    return self._bound_scope('is_mutable_collection').is_mutable_collection(col)

  def has_variable(self, col: str, name: str) -> bool:
    """Whether this module has variable ``col/name`` (``self.has_variable('cache', 'k')``)."""
    return self._bound_scope('has_variable').has_variable(col, name)

  def get_variable(self, col: str, name: str, default: T | None = None) -> T | None:
    """The value of variable ``col/name`` of this module, or ``default``.

    Examples:
      >>> class Step(nn.Module):
      ...   def __call__(self):
      ...     step = self.get_variable('state', 'step', 0)
      ...     self.put_variable('state', 'step', step + 1)
      ...     return step
      >>> Step().apply({'state': {'step': 4}}, mutable='state')
      (4, {'state': {'step': 5}})
    """
    return self._bound_scope('get_variable').get_variable(col, name, default)

  def put_variable(self, col: str, name: str, value: Any) -> None:
    """Writes variable ``col/name``; the collection must be mutable.

    Examples:
      >>> class Step(nn.Module):
      ...   def __call__(self):
      ...     self.put_variable('state', 'step', self.get_variable('state', 'step', 0) + 1)
      >>> Step().apply({}, mutable='state')
      (None, {'state': {'step': 1}})
    """
    self._bound_scope('put_variable').put_variable(col, name, value)

  @property
  def variables(self) -> dict[str, Any]:
    """The variables of this module and its children, ``{collection: {name: value}}``.

    Examples:
      >>> variables = nn.Dense(2).init(jax.random.key(0), jnp.ones((1, 3)))
      >>> nn.Dense(2).bind(variables).variables['params']['kernel'].shape
      (3, 2)
    """
    return self._bound_scope('Reading `variables`').variables()

  def sow(self, col: str, name: str, value: Any,
          # mypy cannot check a default against a TypeVar (python/mypy#3737).
          reduce_fn: Callable[[K, Any], K] = tuple_reduce,  # type: ignore[assignment]
          init_fn: Callable[[], K] = tuple_init) -> bool:  # type: ignore[assignment]
    """Stores ``value`` in ``col/name`` when ``col`` is mutable; returns whether it did.

    Examples:
      >>> class Probe(nn.Module):
      ...   def __call__(self, x):
      ...     self.sow('intermediates', 'x', x)
      ...     return x
      >>> Probe().apply({}, 1.0, mutable='intermediates')
      (1.0, {'intermediates': {'x': (1.0,)}})
    """
    scope = self._bound_scope(f'sow("{col}", "{name}")')
    if not scope.is_mutable_collection(col):
      return False
    if scope.has_variable(col, name):
      xs = scope.get_variable(col, name)
    else:
      scope.reserve(name, col)
      xs = init_fn()
    scope.put_variable(col, name, reduce_fn(xs, value))
    return True

  def perturb(self, name: str, value: T, collection: str = 'perturbations') -> T:
    """Adds a zero-initialised 'perturbations' variable to ``value`` (for gradients of intermediates).

    Examples:
      >>> class Probe(nn.Module):
      ...   def __call__(self, x):
      ...     return 2 * self.perturb('x', x)
      >>> x = jnp.ones(2)
      >>> variables = Probe().init(jax.random.key(0), x)
      >>> jax.grad(lambda v: Probe().apply(v, x).sum())(variables)['perturbations']['x']
      Array([2., 2.], dtype=float32)
    """
    scope = self._bound_scope(f'perturb("{name}")')
    if scope.is_mutable_collection(collection) and not scope.has_variable(collection, name):
      scope.put_variable(collection, name, jax.tree.map(jax.numpy.zeros_like, value))
    if scope.has_variable(collection, name):
      return jax.tree.map(jax.numpy.add, value, scope.get_variable(collection, name))
    if collection in scope.root.variables():  # given, but not for this value: a wrong tree
      raise errors.MissingPerturbationError(collection, name, scope.path_text)
    return value
