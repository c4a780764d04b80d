"""Module core: naming, setup, compact, sharing and adoption, against flax.linen as oracle.

Each model is written once as a function of the ``nn`` namespace and built with
both ``flax.linen`` and ``linen_ext``; the variable trees must be identical.
"""
import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)


def assert_same_tree(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def check_parity(make, *args, **kwargs):
  """Same variables and outputs for the model built with flax.linen and with linen_ext."""
  ours, theirs = make(nn)(), make(flax_nn)()
  v_ours, v_theirs = ours.init(KEY, *args, **kwargs), theirs.init(KEY, *args, **kwargs)
  assert_same_tree(v_ours, v_theirs)
  assert_same_tree(ours.apply(v_ours, *args, **kwargs), theirs.apply(v_theirs, *args, **kwargs))
  return v_ours


def test_auto_names_and_explicit_names():
  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        x = nn.Dense(3)(x)
        x = nn.Dense(3, name='middle')(x)
        x = nn.LayerNorm()(nn.Dense(2)(x))
        return x
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'Dense_0', 'middle', 'Dense_1', 'LayerNorm_0'}


def test_setup_lists_dicts_and_nested_attributes_are_named_like_flax():
  def make(nn):
    class Model(nn.Module):
      def setup(self):
        self.layers = [nn.Dense(3), nn.Dense(3)]
        self.heads = {'a': nn.Dense(1), 'b': [nn.Dense(2)]}
        self.proj = nn.Dense(4)

      def __call__(self, x):
        for layer in self.layers:
          x = layer(x)
        return self.heads['a'](x) + self.heads['b'][0](x).sum(-1, keepdims=True) + \
            self.proj(x).sum(-1, keepdims=True)
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'layers_0', 'layers_1', 'heads_a', 'heads_b_0', 'proj'}


def test_shared_submodule_and_repeated_compact_calls_reuse_variables():
  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        shared = nn.Dense(4)
        block = nn.Dense(4, name='block')
        return block(shared(shared(x))) + block(x)
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'Dense_0', 'block'}


def test_module_called_twice_from_parent_keeps_auto_names_per_call():
  def make(nn):
    class Inner(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(4)(x)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        inner = Inner()
        return inner(inner(x))
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']['Inner_0']) == {'Dense_0'}


def test_outside_modules_are_adopted_under_the_field_name_and_stay_shared():
  def make(nn):
    class Pair(nn.Module):
      left: nn.Module
      right: nn.Module

      def __call__(self, x):
        return self.left(x) + self.right(x)

    shared = nn.Dense(4)
    return lambda: Pair(shared, shared)

  variables = check_parity(make, X)
  assert set(variables['params']) == {'left'}


def test_module_shared_in_a_dict_field_is_named_after_the_first_sorted_key():
  """Flax walks a field's dicts in sorted key order: {'foo': a, 'bar': a} adopts a as A_bar."""
  def make(nn):
    class A(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(2)(x)

    class B(nn.Module):
      layers: dict

      def __call__(self, x):
        return sum(layer(x) for layer in self.layers.values())

    a = A()
    return lambda: B({'foo': a, 'bar': a, 'zed': A()})

  variables = check_parity(make, X)
  assert set(variables['params']) == {'layers_bar', 'layers_zed'}


def test_module_created_in_parent_and_passed_to_child_lives_at_the_parent():
  def make(nn):
    class Child(nn.Module):
      inner: nn.Module

      @nn.compact
      def __call__(self, x, other):
        return self.inner(x) + other(x) + nn.Dense(4)(x)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        dense, arg = nn.Dense(4), nn.Dense(4, name='arg')
        return Child(dense)(x, arg)
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'Dense_0', 'arg', 'Child_0'}
  assert set(variables['params']['Child_0']) == {'Dense_0'}


def test_nowrap_helper_creates_submodules_from_setup():
  def make(nn):
    class Model(nn.Module):
      @nn.nowrap
      def make_layer(self, n):
        return nn.Dense(n)

      def setup(self):
        self.first, self.second = self.make_layer(3), self.make_layer(2)

      def __call__(self, x):
        return self.second(self.first(x))
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'first', 'second'}


def test_setup_and_compact_modules_nest_and_params_match_flax():
  def make(nn):
    class Block(nn.Module):
      features: int

      def setup(self):
        self.scale = self.param('scale', nn.initializers.ones, (self.features,))
        self.dense = nn.Dense(self.features)

      def __call__(self, x):
        return self.dense(x) * self.scale[None]

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        x = Block(4)(x)
        bias = self.param('bias', nn.initializers.normal(0.1), (4,))
        return Block(2, name="last")(x + bias[None])
    return Model

  check_parity(make, X)


def test_variables_rngs_and_flags_match_flax():
  def make(nn, seen):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        count = self.variable('counter', 'count', lambda: jnp.zeros((), jnp.int32))
        if self.is_mutable_collection('counter'):
          count.value += 1
        seen.update(init=self.is_initializing(), has_dropout=self.has_rng('dropout'),
                    path=self.path)
        noise = jax.random.normal(self.make_rng('noise'), x.shape)
        self.sow('intermediates', 'noise', noise)
        self.put_variable('state', 'last', x.sum())
        assert self.has_variable('state', 'last')
        return x + self.get_variable('state', 'last') + noise
    return Model()

  seen_ours, seen_theirs = {}, {}
  ours, theirs = make(nn, seen_ours), make(flax_nn, seen_theirs)
  rngs = {'params': KEY, 'noise': jax.random.key(1)}
  variables = ours.init(rngs, X)
  assert_same_tree(variables, theirs.init(rngs, X))
  assert seen_ours == seen_theirs == {'init': True, 'has_dropout': False, 'path': ()}
  mutable = ['counter', 'intermediates', 'state']
  out_ours = ours.apply(variables, X, rngs=rngs, mutable=mutable)
  assert seen_ours['init'] is False
  assert_same_tree(out_ours, theirs.apply(variables, X, rngs=rngs, mutable=mutable))
  assert int(out_ours[1]['counter']['count']) == 2


def test_apply_method_by_name_function_and_lambda():
  def make(nn):
    class AutoEncoder(nn.Module):
      def setup(self):
        self.encoder, self.decoder = nn.Dense(2), nn.Dense(4)

      def encode(self, x):
        return self.encoder(x)

      def __call__(self, x):
        return self.decoder(self.encode(x))
    return AutoEncoder

  ours, theirs = make(nn)(), make(flax_nn)()
  variables = ours.init(KEY, X)
  expected = theirs.apply(variables, X, method='encode')
  for method in ('encode', type(ours).encode, ours.encode, lambda m, x: m.encode(x)):
    np.testing.assert_array_equal(ours.apply(variables, X, method=method), expected)
  z = ours.init(KEY, X, method='encode')
  assert set(z['params']) == {'encoder'}


def test_capture_intermediates_matches_flax():
  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(2)(nn.relu(nn.Dense(3)(x)))
    return Model

  ours, theirs = make(nn)(), make(flax_nn)()
  variables = ours.init(KEY, X)
  _, state_ours = ours.apply(variables, X, capture_intermediates=True)
  _, state_theirs = theirs.apply(variables, X, capture_intermediates=True)
  assert_same_tree(state_ours, state_theirs)


def test_init_does_not_keep_intermediates_by_default():
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      self.sow('intermediates', 'x', x)
      return nn.Dense(2)(x)

  assert set(Model().init(KEY, X)) == {'params'}
  _, variables = Model().init_with_output(KEY, X, mutable=True)
  assert set(variables) == {'params', 'intermediates'}


def test_bind_unbind_and_clone():
  class Model(nn.Module):
    features: int = 3

    def setup(self):
      self.dense = nn.Dense(self.features)

    def __call__(self, x):
      return self.dense(x)

  model = Model()
  variables = model.init(KEY, X)
  bound = model.bind(variables)
  np.testing.assert_array_equal(bound(X), model.apply(variables, X))
  assert bound.dense.variables == {'params': variables['params']['dense']}
  detached, unbound_variables = bound.unbind()
  assert detached.scope is None and unbound_variables == variables
  assert model.clone(features=5).features == 5 and model.clone() == model


def test_setup_attributes_exist_only_when_bound():
  class Model(nn.Module):
    def setup(self):
      self.dense = nn.Dense(3)

    def __call__(self, x):
      return self.dense(x)

  with pytest.raises(AttributeError, match='only exists inside `init`/`apply`'):
    _ = Model().dense


def test_dataclass_fields_and_defaults():
  class Model(nn.Module):
    features: int
    use_bias: bool = True

  m = Model(3, name='m')
  assert (m.features, m.use_bias, m.name, m.parent) == (3, True, 'm', None)
  assert Model(3) == Model(3) and hash(Model(3)) == hash(Model(3))


def test_sequential_matches_flax():
  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)])(x)
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'Dense_0', 'Dense_1'}  # bound where they were made


def test_linen_ext_imports_no_flax_scope_or_lifting():
  import ast
  import pathlib
  forbidden = ('flax.core.scope', 'flax.core.lift', 'flax.core.axes_scan', 'flax.linen.transforms')
  root = pathlib.Path(nn.__file__).parent
  imported = []
  for path in sorted(root.glob('*.py')):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module:
        imported += [node.module] + [f'{node.module}.{a.name}' for a in node.names]
      elif isinstance(node, ast.Import):
        imported += [a.name for a in node.names]
  assert imported and not [m for m in imported if m.startswith(forbidden)]


# -- private methods, several compact methods, share_scope, copy (all as Flax) -------------


def test_private_methods_are_wrapped_like_flax():
  def make(nn):
    class Model(nn.Module):
      def setup(self):
        self.proj = nn.Dense(3)

      @nn.compact
      def _embed(self, x):
        return nn.Dense(3)(x)

      def _project(self, x):
        return self.proj(x)

      def __call__(self, x):
        return self._project(self._embed(x)) + self._embed(x)
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'Dense_0', 'proj'}
  # A private method called on a bound module runs setup first, as a public one does.
  h = jnp.ones((2, 3))
  np.testing.assert_array_equal(make(nn)().bind(variables)._project(h),
                                make(flax_nn)().bind(variables)._project(h))


def test_several_compact_methods_name_like_flax():
  def make(nn):
    class Model(nn.Module):
      def __call__(self, x):
        # Outermost calls restart the names (Dense_0 twice: shared); nested ones continue.
        return self.first(x) + self.second(x) + self.nested(x)

      @nn.compact
      def first(self, x):
        return nn.Dense(3)(x)

      @nn.compact
      def second(self, x):
        return nn.Dense(3)(x)

      @nn.compact
      def nested(self, x):
        return nn.Dense(3)(x) + self.first(x) + self.second(x)
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'Dense_0', 'Dense_1', 'Dense_2'}


def test_share_scope_like_flax():
  def make(nn):
    class Inner(nn.Module):
      sub: nn.Module

      @nn.compact
      def __call__(self, x):
        return self.sub(x) + nn.Dense(3, name='own')(x)

    class Wrapped(nn.Module):  # the child (and its field submodule) move up to the parent
      def setup(self):
        self.inner = Inner(nn.Dense(3, parent=None))
        nn.share_scope(self, self.inner)

      def __call__(self, x):
        return self.inner(x)

    class LoRA(nn.Module):  # the wrapper moves into the scope of the layer passed in
      base: nn.Module

      def setup(self):
        nn.share_scope(self, self.base)

      @nn.compact
      def __call__(self, x):
        a = self.param('a', nn.initializers.normal(1.0), (x.shape[-1], 2))
        return self.base(x) + (x @ a).sum(-1, keepdims=True)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        return Wrapped()(x) + LoRA(nn.Dense(3))(x)
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']['Wrapped_0']) == {'own', 'sub'}
  assert set(variables['params']['Dense_0']) == {'a', 'kernel', 'bias'}


def test_copy_like_flax():
  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        dense = nn.Dense(3)
        y = dense(x)
        fresh, named = dense.copy(), dense.copy(name='named', features=5)
        return y + fresh(x), named(x).sum()
    return Model

  variables = check_parity(make, X)
  assert set(variables['params']) == {'Dense_0', 'Dense_1', 'named'}
  assert nn.Dense(3, name='a').copy(name='b').name == 'b'
  assert nn.Dense(3, name='a').copy().name is None


# -- functional entry points and lazy_init ----------------------------------------------------


def test_functional_init_and_apply_like_flax():
  def run(nn):
    class AutoEncoder(nn.Module):
      def setup(self):
        self.encoder, self.decoder = nn.Dense(2), nn.Dense(4)

      def __call__(self, x):
        self.sow('counts', 'calls', 1)
        return self.decoder(self.encoder(x))

    def encode(m, x):
      return m.encoder(x)

    variables = nn.init(lambda m, x: m(x), AutoEncoder(), mutable=['params'])(KEY, X)
    z, encoder_only = nn.init_with_output(encode, AutoEncoder())(KEY, X)
    y, state = nn.apply(lambda m, x: m(x), AutoEncoder(), mutable=['counts'],
                        capture_intermediates=True)(variables, X)
    return variables, z, encoder_only, y, state

  assert_same_tree(run(nn), run(flax_nn))


def test_lazy_init_like_flax_without_running_the_forward_pass():
  ran = []

  def make(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x, train=True):
        y = nn.Dense(3)(x)
        if train:
          y = nn.BatchNorm(use_running_average=False)(y)
        jax.debug.callback(lambda v: ran.append(v), y)
        return y
    return Model

  x = jax.ShapeDtypeStruct(X.shape, X.dtype)
  ours = make(nn)().lazy_init(KEY, x, train=True)
  assert_same_tree(ours, make(flax_nn)().lazy_init(KEY, x, train=True))
  assert_same_tree(ours, make(nn)().init(KEY, X, train=True))
  assert len(ran) == 1  # only the eager init above ran the forward pass
  assert set(make(nn)().lazy_init(KEY, x, train=False)['params']) == {'Dense_0'}


def test_module_attributes_are_frozen_like_flax():
  import types

  from flax.core import FrozenDict

  class Model(nn.Module):
    config: dict

    def setup(self):
      self.table = {'a': [1, {'b': 2}]}
      self.proxy = types.MappingProxyType({'a': [1]})

    def __call__(self):
      return self.config, self.table, self.proxy

  config, table, proxy = Model({'z': [1]}).apply({})
  assert config == FrozenDict({'z': (1,)}) and isinstance(config, FrozenDict)
  assert table == FrozenDict({'a': (1, FrozenDict({'b': 2}))})
  assert type(proxy) is types.MappingProxyType  # not a dict: kept as is, as in Flax
  assert type(Model({'z': [1]}).config) is dict  # unbound: untouched, as in Flax


def test_adopting_an_outside_module_keeps_no_variables_alive_after_the_call():
  import gc
  class Outer(nn.Module):
    sub: nn.Module

    def __call__(self, x):
      return self.sub(x)

  model = Outer(nn.Dense(37))
  for _ in range(3):
    model.init(KEY, jnp.ones((1, 41)))
  gc.collect()
  assert not [o for o in gc.get_objects() if isinstance(o, jax.Array) and o.shape == (41, 37)]
  with jax.checking_leaks():  # no tracer outlives a jitted init either
    jax.jit(lambda x: model.init(KEY, x))(jnp.ones((1, 41)))


def test_apply_method_names_a_submodule_field_as_flax():
  def make(nn):
    class Foo(nn.Module):
      bar: nn.Module

      @nn.compact
      def __call__(self, x):
        return self.bar(x) * 2
    return Foo(nn.Dense(3))

  variables = make(nn).init(KEY, X)
  assert_same_tree(variables, make(flax_nn).init(KEY, X))
  assert_same_tree(make(nn).apply(variables, X, method='bar'),
                   make(flax_nn).apply(variables, X, method='bar'))


def test_module_without_call_is_an_error_in_apply_and_init():
  from linen_ext import errors

  class NoCall(nn.Module):
    a: int = 0

  with pytest.raises(errors.InvalidMethodError, match='__call__'):
    NoCall(1).apply({})
  with pytest.raises(AttributeError, match='"NoCall" object has no attribute "__call__"'):
    NoCall(1).init(KEY)  # an AttributeError, as Flax's


@pytest.mark.parametrize('lib', [nn, flax_nn], ids=['linen_ext', 'flax'])
def test_unbound_modules_hash_by_configuration_and_bound_ones_refuse(lib):
  class Scaled(lib.Module):
    scale: float

    @lib.compact
    def __call__(self, x):
      return x * self.scale

  assert hash(Scaled(2.0)) == hash(Scaled(2.0))
  assert len({Scaled(2.0), Scaled(2.0), Scaled(3.0)}) == 2
  bound = Scaled(2.0).bind({})
  with pytest.raises(TypeError, match='hash'):
    hash(bound)
  assert hash(bound.clone(parent=None)) == hash(Scaled(2.0))
