"""`lift_transform`: a user's own `lift`-level transform (written with `lift.pack`) applied to
a Module class or a method, through the same mechanism as the built-in Module transforms."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from linen_ext.module.core import fn_name
from linen_ext.transforms.module_transforms import Target, TransformSpec, apply_spec


class _BoundTransform(NamedTuple):
  """A user's transform with its positional arguments; equal ones share a class."""
  transform: Callable[..., Any]
  args: tuple

  def __call__(self, fn: Callable[..., Any], **kwargs) -> Callable[..., Any]:
    return self.transform(fn, *self.args, **kwargs)


def _class_prefix(name: str) -> str:
  return ''.join(part[:1].upper() + part[1:] for part in name.split('_'))


def lift_transform(transform: Callable[..., Any], target: Target, *trafo_args: Any,
                   methods: Any = None, **trafo_kwargs: Any) -> Target:
  """Applies a `lift`-level transform to a Module class or a method, as Flax's.

  ``transform(fn, *trafo_args, **trafo_kwargs)`` is the transform as written
  for scope functions (usually with `lift.pack`): it takes
  ``fn(scope_tree, *args, **kwargs)`` and returns a function of the same
  arguments. The module's scopes (its own, and those of modules it holds or is
  given) arrive as one scope tree, which `lift.pack` handles.

  Args:
    transform: the scope-level transform; its ``__name__`` names the
      transformed class (``lift_transpose`` on ``Dense`` is
      ``LiftTransposeDense``); errors name it ``nn.lift_transform(lift_transpose)``.
    target: a Module class (returns a subclass) or a method (returns the
      decorated method; put it above ``@nn.compact``).
    *trafo_args: positional arguments of ``transform`` after ``fn``.
    methods: the methods of a class to transform (default ``__call__``), a
      list of names or a dict of per-method keyword arguments.
    **trafo_kwargs: keyword arguments of ``transform``.

  Returns:
    The transformed class or method. The same transform, class and arguments
    give the same class, so writing it inside a compact method is cheap.

  Examples:
    >>> def lift_scale(fn, factor):
    ...   def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args):
    ...     params, rest = variable_groups
    ...     params = jax.tree_util.tree_map(lambda p: p * factor, params)
    ...     scope = scope_fn((params, rest), rng_groups)
    ...     return fn(scope, *args), repack_fn(scope)
    ...   return lift.pack(inner, ('params', True), (lift.DenyList('params'),), (True,))
    >>> Doubled = lift_transform(lift_scale, nn.Dense, 2.0)
    >>> Doubled.__name__
    'LiftScaleDense'
    >>> x = jnp.ones((1, 3))
    >>> variables = nn.Dense(2).init(jax.random.key(0), x)
    >>> bool(jnp.allclose(Doubled(2).apply(variables, x), 2 * nn.Dense(2).apply(variables, x)))
    True

  Not for transforms `linen_ext` already has (``nn.vmap``, ``nn.scan``, ...):
  those take Flax's options and validate them when the class is built.
  """
  name = fn_name(transform)
  # mypy does not take a NamedTuple with __call__ for a callable.
  spec = TransformSpec(f'lift_transform({name})',
                       _BoundTransform(transform, trafo_args),  # type: ignore[arg-type]
                       class_prefix=_class_prefix(name))
  return apply_spec(spec, target, trafo_kwargs, methods)
