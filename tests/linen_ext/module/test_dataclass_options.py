"""Module class options and helpers a Flax user relies on, against flax.linen as oracle:
``kw_only``, ``preserve_adopted_names``, the unspecified-parent sentinel, ``perturb`` of pytrees."""
import copy
import dataclasses
import inspect
import pickle

import flax
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn
from linen_ext.module.core import UNSPECIFIED
from tests.helpers import assert_trees_equal as assert_same_tree

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


@pytest.mark.parametrize('lib', [nn, flax_nn], ids=['linen_ext', 'flax'])
def test_kw_only_class_argument_as_python_dataclasses(lib):
  class Base(lib.Module, kw_only=True):
    scale: int = -1

  class Child(Base):  # kw_only is not inherited: a required positional field after defaults
    factor: int

    def __call__(self, x):
      return x * self.factor * self.scale

  with pytest.raises(TypeError, match='positional argument'):
    Base(2)
  np.testing.assert_array_equal(Child(8).apply({}, jnp.ones(2)), -8 * jnp.ones(2))


def test_fields_of_subclasses_list_parent_and_name_last_as_flax():
  def hierarchy(lib):
    class Base(lib.Module):
      width: int

    class Child(Base):
      depth: int = 2

    class Grandchild(Child):
      heads: int = 1
    return Base, Child, Grandchild

  for ours, theirs in zip(hierarchy(nn), hierarchy(flax_nn)):
    assert list(ours.__dataclass_fields__) == list(theirs.__dataclass_fields__)
    assert [f.name for f in dataclasses.fields(ours)][-2:] == ['parent', 'name']
  child = hierarchy(nn)[1](4, 3)
  assert (child.width, child.depth) == (4, 3)


def test_the_unspecified_parent_sentinel_survives_copies():
  default = inspect.signature(nn.Dense).parameters['parent'].default
  assert default is UNSPECIFIED
  for copied in (copy.copy(default), copy.deepcopy(default), pickle.loads(pickle.dumps(default))):
    assert copied is UNSPECIFIED
  assert copy.deepcopy(nn.Dense(2)).parent is None  # built outside any module


def _leaf(lib):
  class Leaf(lib.Module):
    @lib.compact
    def __call__(self, x):
      return x + self.param('p', lib.initializers.zeros, x.shape)
  return Leaf


def _adopting(lib, preserve):
  class Holder(lib.Module):
    sub: lib.Module
    if preserve is not None:
      preserve_adopted_names = preserve

    def __call__(self, x):
      return self.sub(x)

  return Holder(Holder(_leaf(lib)(name='leaf'), name='holder'))


@pytest.mark.parametrize('preserve, flag', [(True, False), (False, True), (None, True),
                                            (None, False)])
def test_preserve_adopted_names_as_flax(preserve, flag):
  """The class attribute wins over Flax's config flag; adopted modules keep their own names."""
  with flax.config.temp_flip_flag('preserve_adopted_names', flag):
    ours = _adopting(nn, preserve).init(KEY, X)
    theirs = _adopting(flax_nn, preserve).init(KEY, X)
  assert_same_tree(ours, theirs)
  kept = preserve if preserve is not None else flag
  assert list(ours['params']) == (['holder'] if kept else ['sub'])


def _perturbed(lib):
  class Probe(lib.Module):
    @lib.compact
    def __call__(self, x):
      pair = self.perturb('pair', (lib.Dense(2)(x), x))
      return pair[0].sum() + pair[1].sum()
  return Probe()


def test_perturb_of_a_pytree_and_its_gradient_as_flax():
  ours, theirs = _perturbed(nn).init(KEY, X), _perturbed(flax_nn).init(KEY, X)
  assert_same_tree(ours, theirs)

  def grads(lib, variables):
    loss = lambda p: _perturbed(lib).apply({'params': variables['params'], 'perturbations': p}, X)
    return jax.grad(loss)(variables['perturbations'])

  assert_same_tree(grads(nn, ours), grads(flax_nn, theirs))
  np.testing.assert_array_equal(_perturbed(nn).apply({'params': ours['params']}, X),
                                _perturbed(flax_nn).apply({'params': ours['params']}, X))


def test_repr_as_flax_without_running_setup():
  def make(lib):
    class Mlp(lib.Module):
      act: object = lib.relu
      sizes: tuple = (3, 2)

      @lib.compact
      def __call__(self, x):
        for size in self.sizes:
          x = self.act(lib.Dense(size)(x))
        return repr(self)
    return Mlp()

  assert repr(make(nn)) == repr(make(flax_nn))
  text = make(nn).init_with_output(KEY, X)[0]
  assert text == make(flax_nn).init_with_output(KEY, X)[0]
  assert '# children' in text and 'kernel_init = init' in text

  class Lazy(nn.Module):
    def setup(self):
      raise AssertionError('repr must not run setup')

  assert repr(Lazy().bind({})) == 'Lazy()'


def test_flax_return_frozendict_flag_freezes_what_init_and_apply_return():
  model = nn.BatchNorm(use_running_average=False)
  flax.config.update('flax_return_frozendict', True)
  try:
    variables = model.init(KEY, X)
    _, mutated = model.apply(variables, X, mutable=['batch_stats'])
    assert isinstance(variables, flax.core.FrozenDict) and isinstance(mutated, flax.core.FrozenDict)
  finally:
    flax.config.update('flax_return_frozendict', False)
  assert type(model.init(KEY, X)) is dict
