"""Mistakes with the ready-made layers, the flax.linen adapter and the partitioning helpers."""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp

import linen_ext as nn
from linen_ext import errors, partitioning

from tests.misuse import case
from tests.misuse.module_cases import compact

KEY = jax.random.key(0)
X = jnp.ones((2, 3))


class Leaf(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + self.param('p', nn.initializers.zeros, x.shape)


class Pair(nn.Module):
  first: nn.Module
  second: nn.Module
  preserve_adopted_names = True

  def __call__(self, x):
    return self.second(self.first(x))


class Scoped(nn.Module):
  @nn.compact_name_scope
  def up(self, x):
    return nn.Dense(2)(x)


class Cache(nn.Module):
  @nn.compact
  def __call__(self, axes):
    return partitioning.variable_with_axes('cache', 'k', jnp.zeros, (2,), axes=axes).value


def _cache_declared_twice():
  return compact(nn, lambda m, nn, x: (lambda c: c(('a',)) + c(('b',)))(Cache())).init(KEY, X)


def _spectral_norm_of_a_conv():
  return compact(nn, lambda m, nn, x: nn.SpectralNorm(nn.Conv(2, (2,)), error_on_non_matrix=True)(
      x, update_stats=False)).init(KEY, X[..., None])



class FlaxScale(flax_nn.Module):
  @flax_nn.compact
  def __call__(self, x):
    return x * self.param('s', flax_nn.initializers.ones, ())


class FlaxTwice(flax_nn.Module):
  @flax_nn.compact
  def __call__(self, x):
    return FlaxScale()(FlaxScale()(x))


def _native_layer_of_an_unported_composite():
  class Twice(nn.NativeLayer):  # noqa: F841 (defining it is the mistake)
    flax_class = FlaxTwice

CASES = [
    case('calling a ready-made layer outside init/apply', lambda: nn.Dense(3)(X),
         errors.UnboundModuleError, 'unbound module `Dense`'),
    case('calling a compact_name_scope method outside init/apply', lambda: Scoped().up(X),
         errors.UnboundModuleError, 'Calling "up"', '`Scoped`'),
    case('two adopted modules keeping one name', lambda: Pair(
        Leaf(name='leaf'), Leaf(name='leaf')).init(KEY, X), errors.NameInUseError, '"leaf"'),
    case('a native layer of flax code building an unported flax layer',
         _native_layer_of_an_unported_composite, errors.NativeLayerError, 'FlaxTwice',
         "['FlaxScale']", 'nn.from_flax'),
    case('from_flax of a flax.linen class', lambda: nn.from_flax(flax_nn.Dense),
         errors.FlaxAdapterError, 'got type', 'not the class'),
    case('from_flax of one of our modules', lambda: nn.from_flax(nn.Dense(3)),
         errors.FlaxAdapterError, 'got Dense', 'from_flax(flax.linen.Dense(4))'),
    case('RNN of a module that is not a cell', lambda: nn.RNN(nn.Dense(3)).init(KEY, jnp.ones((
        1, 4, 3))), errors.LayerArgumentError, 'Dense is not a recurrent cell', 'nn.LSTMCell'),
    case('SpectralNorm of a tensor with error_on_non_matrix', _spectral_norm_of_a_conv,
         errors.LayerArgumentError, 'Input is 3D', '"Conv_0/kernel" is not a matrix'),
    case('param_with_axes outside a module', lambda: partitioning.param_with_axes(
        'w', jnp.zeros, (2,), axes=('embed',)), errors.NoCurrentModuleError, 'param_with_axes',
         'module=self'),
    case('a variable declared twice with other logical axes', _cache_declared_twice,
         errors.AxesMismatchError, '"cache/k" declared again', "('b',)"),
]
