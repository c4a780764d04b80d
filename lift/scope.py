"""`Scope`: variables grouped in named collections, named PRNG streams, a mutability filter.

A root scope owns a dict ``{collection: {name: value | {child: ...}}}``; a child
scope is a cursor into it (its root plus the names on the way down). Every
read and write goes through the root's dict, so a write made through one scope
is seen by every scope that shares the root.
"""
from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import jax
import numpy as np
from flax.core import meta

from lift import errors, param_shapes
from lift.filters import Filter, in_filter, validate_filter
from lift.rng import RngCounters, as_stream

T = TypeVar('T')


def copy_structure(tree: Any) -> Any:
  """A copy of the nested dict structure of ``tree`` as plain dicts; leaves are shared.

  Examples:
    >>> copy_structure({'a': {'b': 1}})
    {'a': {'b': 1}}
  """
  if isinstance(tree, Mapping):
    return {k: copy_structure(v) for k, v in tree.items()}
  return tree


def unboxed(value: Any) -> Any:
  """``value`` without its axis-metadata boxes (an array, the usual case, as it is)."""
  return value if isinstance(value, jax.Array) else meta.unbox(value)


class Variable(Generic[T]):
  """A handle on one variable of a scope: ``.value`` reads and writes it.

  Made by `Scope.variable`, not constructed directly. Like its scope, it is
  only valid while the function it was made in runs: return its value rather
  than keeping the handle.

  Examples:
    >>> def count(scope):
    ...   n = scope.variable('counter', 'n', lambda: 0)
    ...   n.value += 1
    ...   return n.value
    >>> lift.apply(count, mutable='counter')({'counter': {'n': 41}})
    (42, {'counter': {'n': 42}})
  """

  def __init__(self, scope: Scope, collection: str, name: str, unbox: bool = True):
    self.scope, self.collection, self.name, self.unbox = scope, collection, name, unbox

  @property
  def value(self) -> T:
    value = self.scope.get_variable(self.collection, self.name)
    return unboxed(value) if self.unbox else value

  @value.setter
  def value(self, value: T):
    if self.unbox:
      old = self.scope.get_variable(self.collection, self.name)
      value = meta.replace_boxed(old, value)
    self.scope.put_variable(self.collection, self.name, value)

  def is_mutable(self) -> bool:
    return self.scope.is_mutable_collection(self.collection)

  def __repr__(self):
    return f'Variable({self.collection}:{self.scope.path_text}/{self.name})'


class Scope:
  """Variables, PRNG streams and mutability of one node in the variable tree.

  A scope function ``fn(scope, *args)`` creates and reads its variables
  through the scope; `lift.init`, `lift.apply` and `lift.bind` make the root
  scope, ``push`` and ``child`` make children. Do not construct one directly
  or keep one after the function it was passed to returns (that raises
  `InvalidScopeError`); in Module code, use `linen_ext.Module` instead.

  Examples:
    >>> def dense(scope, x, features):
    ...   kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(),
    ...                        (x.shape[-1], features))
    ...   return x @ kernel
    >>> y, variables = lift.init(dense)(jax.random.key(0), jnp.ones((1, 3)), 2)
    >>> y.shape, variables['params']['kernel'].shape
    ((1, 2), (3, 2))
  """

  def __init__(self, variables: dict | None, rngs: Mapping[str, Any] | None = None,
               name: str | None = None, mutable: Filter = False,
               parent: Scope | None = None, path: tuple[str, ...] = (),
               flags: Mapping[str, Any] | None = None,
               rng_counters: RngCounters | None = None):
    self.name, self.parent = name, parent
    self.mutable = validate_filter(mutable, 'the `mutable` argument')
    self.path = tuple(path)
    self.rngs = {k: as_stream(v) for k, v in (rngs or {}).items()}
    self.flags = dict(flags or {})
    self.rng_counters = rng_counters or RngCounters()
    self.reservations: dict[str, set[str | None]] = collections.defaultdict(set)
    self._root = parent.root if parent is not None else None  # None: this is the root
    self._rel_path: tuple[str, ...] = ()  # the names from the root down to here
    if parent is not None:
      assert name is not None, 'a child scope has a name'
      self._rel_path = parent._rel_path + (name,)
    self._variables = variables if parent is None else None  # None: read the root's
    # Shared by a root and its rewound copies: invalidating the root ends them all.
    self._root_alive: list[bool] = parent._root_alive if parent is not None else [True]
    self._invalid = False
    self._debug_name: str | None = None  # the lifted transform that made this root
    self._root_debug_path: tuple[str, ...] | None = None  # a lifted root's, see debug_path
    self._unlifted: Filter = False  # collections mutable outside it that it does not return
    # Storage for code built on scopes (linen_ext keeps the modules a root adopted
    # here); it lives and dies with the root, even when its values refer back to it.
    self.client_cache: dict[str, Any] = {}

  # -- identity and validity ------------------------------------------------

  @property
  def root(self) -> Scope:
    return self if self._root is None else self._root

  @property
  def _store(self) -> dict:
    """The root's dict of variables, ``{collection: {name: value | {child: ...}}}``."""
    variables = self.root._variables
    assert variables is not None, 'a root scope holds its variables'
    return variables

  @property
  def path_text(self) -> str:
    """The path for messages: ``/a/b``; Flax's ``scan(/a/b)`` inside a lifted transform,
    or ``/a/b (in nn.Stacked(Block))`` inside a loop its client named."""
    text = '/' + '/'.join(self.path)
    debug = self.root._debug_name
    if not debug:
      return text
    return f'{debug}({text})' if debug.isidentifier() else f'{text} (in {debug})'

  @property
  def debug_path(self) -> tuple[str, ...]:
    """`path` with each lifted transform around the name it lifted, as Flax's.

    >>> seen = []
    >>> _ = lift.apply(lift.vmap(lambda s: seen.append(s.push('dense').debug_path), {}, {},
    ...                          axis_size=2))({})
    >>> seen
    [('vmap()', 'dense')]
    """
    base = self.root._root_debug_path
    return (self.root.path if base is None else base) + self._rel_path

  @property
  def identity(self) -> tuple[int, tuple[str, ...]]:
    """Two scopes with the same identity read and write the same variables."""
    return id(self.root._variables), self._rel_path

  @property
  def invalid(self) -> bool:
    return self._invalid or not self._root_alive[0]

  def invalidate(self):
    """Marks this scope unusable; invalidating a root invalidates its whole tree.

    A root lets go of its variables, rng keys and what it stored for clients
    (modules that refer back to it): values traced inside a transform are
    freed with its trace, not kept alive by a module or cache that holds the
    scope.
    """
    self._invalid = True
    if self.parent is None:
      self._root_alive[0] = False
      self._variables, self.rngs, self.client_cache = {}, {}, {}

  @contextlib.contextmanager
  def temporary(self) -> Iterator[Scope]:
    """This scope, invalidated when the ``with`` block ends (as Flax's).

    Examples:
      >>> scope = lift.bind({}, rngs=jax.random.key(0), mutable=True)
      >>> with scope.temporary() as s:
      ...   w = s.param('w', jax.nn.initializers.zeros, (2,))
      >>> w, s.invalid
      (Array([0., 0.], dtype=float32), True)
    """
    try:
      yield self
    finally:
      self.invalidate()

  def _check_valid(self):
    if self.invalid:
      raise errors.InvalidScopeError(self.path_text)

  def rewound(self, rewind_rngs: bool = False) -> Scope:
    """A copy with no name reservations (and, optionally, rng counters reset)."""
    self._check_valid()
    scope = Scope(self._variables, self.rngs, self.name, self.mutable,
                  self.parent, self.path, self.flags,
                  None if rewind_rngs else self.rng_counters)
    if self.parent is None:
      scope._root_alive, scope._debug_name = self._root_alive, self._debug_name
      scope._root_debug_path = self._root_debug_path
      scope._unlifted = self._unlifted
    return scope

  # -- names and children ---------------------------------------------------

  def name_reserved(self, name: str, col: str | None = None) -> bool:
    taken = self.reservations.get(name, set())
    return bool(taken) and (None in taken or col is None or col in taken)

  def reserve(self, name: str, col: str | None = None):
    """Claims ``name`` for a child (``col=None``) or a variable of ``col``."""
    self._check_valid()  # a scope kept past its transform: not a name clash, whatever the name
    if not isinstance(name, str):
      raise errors.InvalidNameError(name, self.path_text)
    if self.name_reserved(name, col):
      raise errors.NameInUseError(name, self.path_text, col)
    self.reservations[name].add(col)

  def default_name(self, prefix: str) -> str:
    """The first unreserved name ``f'{prefix}{i}'`` for i = 0, 1, ..."""
    i = 0
    while f'{prefix}{i}' in self.reservations:
      i += 1
    return f'{prefix}{i}'

  def push(self, name: str | None = None, prefix: str = '', reuse: bool = False) -> Scope:
    """Creates the child scope ``name`` (``reuse=True`` returns an existing one)."""
    self._check_valid()
    if name is None:
      name = self.default_name(prefix)
    if not reuse or name not in self.reservations:
      self.reserve(name)
    rngs = {k: s.child(name) for k, s in self.rngs.items()}
    return Scope(None, rngs, name, self.mutable, self, self.path + (name,),
                 self.flags, self.rng_counters.child(name))

  def child(self, fn: Callable[..., Any], name: str | None = None,
            prefix: str | None = None, named_call: bool = True,
            **partial_kwargs) -> Callable[..., Any]:
    """Partially applies a new child scope to ``fn``; repeated calls reuse its variables.

    Examples:
      >>> def dense(scope, x, features):
      ...   return x @ scope.param('kernel', jax.nn.initializers.ones, (x.shape[-1], features))
      >>> def mlp(scope, x):
      ...   return scope.child(dense, 'out')(x, 1)
      >>> y, variables = lift.init(mlp)(jax.random.key(0), jnp.ones((1, 3)))
      >>> jax.tree.map(jnp.shape, variables)
      {'params': {'out': {'kernel': (3, 1)}}}
    """
    if name is None:
      if prefix is None:
        prefix = getattr(fn, '__name__', '') + '_'
      name = self.default_name(prefix)
    scope = self.push(name)

    @functools.wraps(fn)
    def call(*args, **kwargs):
      kwargs = {**partial_kwargs, **kwargs}
      if named_call:
        with jax.named_scope(name):
          return fn(scope.rewound(), *args, **kwargs)
      return fn(scope.rewound(), *args, **kwargs)

    return call

  # -- collections ----------------------------------------------------------

  def is_mutable_collection(self, col: str) -> bool:
    return in_filter(self.mutable, col)

  def is_collection_empty(self, col: str) -> bool:
    return not self._store.get(col)

  def _collection(self, col: str) -> Mapping[str, Any]:
    node = self._store.get(col, {})
    for name in self._rel_path:
      node = node.get(name, {}) if isinstance(node, Mapping) else {}
    return node if isinstance(node, Mapping) else {}

  def _mutable_collection(self, col: str) -> dict[str, Any]:
    node = self._store.setdefault(col, {})
    for name in self._rel_path:
      node = node.setdefault(name, {})
    return node

  def has_variable(self, col: str, name: str) -> bool:
    self._check_valid()
    return name in self._collection(col)

  def get_variable(self, col: str, name: str, default: Any = None) -> Any:
    self._check_valid()
    return self._collection(col).get(name, default)

  def put_variable(self, col: str, name: str, value: Any):
    """Writes a variable; the collection must be mutable."""
    self._check_valid()
    if not self.is_mutable_collection(col):
      self.check_lifted(col, name)
      raise errors.ImmutableCollectionError(col, name, self.path_text)
    self._mutable_collection(col)[name] = value

  def check_lifted(self, col: str, name: str):
    """Raises `UnliftedCollectionError` if writing ``col``/``name`` here would be lost.

    That is when ``col`` is mutable outside a lifted transform that made
    this scope but the transform does not return it (inside, as in Flax,
    ``col`` is immutable). A write to a collection immutable everywhere is
    left to the caller.

    Examples:
      >>> def body(scope, x):
      ...   scope.check_lifted('stats', 'mean')   # 'stats' is not lifted into vmap
      ...   return x
      >>> f = lift.vmap(body, variable_axes={'params': 0}, split_rngs={})
      >>> lift.apply(f, mutable='stats')({}, jnp.ones(2))
      Traceback (most recent call last):
      lift.errors.UnliftedCollectionError: Cannot update variable "mean" in "vmap(/)" ...
    """
    if in_filter(self.root._unlifted, col):
      raise errors.UnliftedCollectionError(col, name, self.path_text, self.root._debug_name)

  def variable(self, col: str, name: str, init_fn: Callable[..., T] | None = None,
               *init_args, unbox: bool = True, **init_kwargs) -> Variable[T]:
    """Returns the variable, creating it with ``init_fn(*init_args)`` if absent."""
    if init_fn is not None and not callable(init_fn):
      raise errors.InitFnError('variable', col, name, self.path, init_fn)
    self.reserve(name, col)
    if not self.has_variable(col, name):
      if init_fn is not None:
        self.check_lifted(col, name)
      if init_fn is None or not self.is_mutable_collection(col):
        if self.is_collection_empty(col):
          raise errors.MissingCollectionError(col, name, self.path_text)
        raise errors.MissingVariableError(col, name, self.path_text)
      self.put_variable(col, name, init_fn(*init_args, **init_kwargs))
    return Variable(self, col, name, unbox=unbox)

  def param(self, name: str, init_fn: Callable[..., T], *init_args,
            unbox: bool = True, **init_kwargs) -> T:
    """Returns parameter ``name``, creating it with ``init_fn(make_rng('params'), *init_args)``.

    An existing parameter is checked against the shape ``init_fn`` would give.
    """
    if not callable(init_fn):
      raise errors.InitFnError('param', 'params', name, self.path, init_fn)
    self.reserve(name, 'params')
    if self.has_variable('params', name):
      value = self.get_variable('params', name)
      self._check_param_shape(name, unboxed(value), init_fn, init_args, init_kwargs)
    else:
      if not self.is_mutable_collection('params'):
        self.check_lifted('params', name)
        if self.is_collection_empty('params'):
          raise errors.MissingCollectionError('params', name, self.path_text)
        raise errors.MissingParamError(name, self.path_text)
      value = init_fn(self.make_rng('params'), *init_args, **init_kwargs)
      self.put_variable('params', name, value)
    return unboxed(value) if unbox else value

  def _check_param_shape(self, name, value, init_fn, init_args, init_kwargs):
    """``value`` (unboxed) against the shapes ``init_fn`` makes."""
    expected = param_shapes.expected_shapes(init_fn, init_args, init_kwargs)
    if isinstance(expected, jax.ShapeDtypeStruct) and isinstance(value, jax.Array):
      pairs = [(value, expected)]  # one array, the usual parameter: no tree walk
    elif jax.tree.structure(value) != jax.tree.structure(expected):  # type: ignore[operator]
      raise errors.ParamStructureError(name, self.path_text, _describe(value),
                                       _describe(expected))
    else:
      pairs = list(zip(jax.tree.leaves(value), jax.tree.leaves(expected)))
    for have, want in pairs:
      if np.shape(have) != np.shape(want):
        raise errors.ParamShapeError(name, self.path_text, np.shape(have), np.shape(want))

  def variables(self) -> dict[str, Any]:
    """The variables under this scope, ``{collection: {name: value}}``.

    As Flax's: every collection in which this scope's path exists, even empty.
    """
    self._check_valid()
    found = {}
    for col, node in self._store.items():
      for name in self._rel_path:
        node = node.get(name) if isinstance(node, Mapping) else None
      if isinstance(node, Mapping):
        found[col] = node
    return found

  def mutable_variables(self) -> dict[str, Any]:
    """The mutable collections of :meth:`variables`."""
    return {col: tree for col, tree in self.variables().items()
            if self.is_mutable_collection(col)}

  # -- rngs -------------------------------------------------------------------

  def has_rng(self, name: str) -> bool:
    return name in self.rngs

  def make_rng(self, name: str = 'params') -> jax.Array:
    """A fresh key from stream ``name`` (as Flax: falls back to 'params' if absent)."""
    self._check_valid()
    if not self.has_rng(name):
      if not self.has_rng('params'):
        raise errors.UnknownRngError(name, self.path_text, self.rngs, scope_name=self.name)
      name = 'params'
    return self.rngs[name].draw(self.rng_counters.next(name))

  # -- flags --------------------------------------------------------------------

  def has_flag(self, key: str) -> bool:
    return key in self.flags

  def get_flag(self, key: str, default: Any = None) -> Any:
    return self.flags.get(key, default)

  def __repr__(self):
    return f'Scope({self.path_text}, mutable={self.mutable!r}, rngs={sorted(self.rngs)})'


def _describe(tree: Any) -> str:
  """'an array of shape (4, 2)', 'a list of shape (4, 2)', 'a dict': a value in a message."""
  if hasattr(tree, 'shape'):
    return f'an array of shape {tuple(tree.shape)}'
  if isinstance(tree, (list, tuple)):
    return f'a {type(tree).__name__} of shape {np.shape(tree)}'
  return f'a {type(tree).__name__}'
