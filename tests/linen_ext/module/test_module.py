"""Module core against flax.linen: naming, setup, compact, sharing, adoption, entry points.

Each model is written once as a function of the ``nn`` namespace and run with both
``flax.linen`` and ``linen_ext``; what comes back must be identical.
"""
import ast
import dataclasses
import functools
import gc
import pathlib
import types

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest
from flax.core import FrozenDict

import linen_ext as nn
from tests.helpers import assert_trees_equal, check_linen_parity

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)
XS = jnp.stack([X, 2.0 * X, 3.0 * X])  # three steps or three items
RNGS = {'params': KEY, 'dropout': jax.random.key(1), 'noise': jax.random.key(2)}


def init_apply(make, *args):
  """``make(nn)()``: init and apply equal Flax's; returns our variables."""
  def build(lib):
    model = make(lib)()
    variables = model.init(KEY, *args)
    return variables, model.apply(variables, *args)
  return check_linen_parity(build)[0][0]


def test_compact_names_explicit_shared_passed_in_and_copied_like_flax():
  def make(nn):
    class Inner(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(4)(x)

    class Child(nn.Module):
      inner: nn.Module

      @nn.compact
      def __call__(self, x, other):
        return self.inner(x) + other(x) + nn.Dense(4)(x)

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        x = nn.Dense(4, name='middle')(nn.Dense(4)(x))  # an explicit name takes no number
        shared, block, inner = nn.Dense(4), nn.Dense(4, name='block'), Inner()
        x = block(shared(shared(x))) + block(x) + inner(inner(x))
        x = Child(nn.Dense(4))(x, nn.Dense(4, name='arg'))  # made here: they live here
        fresh, named = shared.copy(), shared.copy(name='named', features=5)
        return nn.LayerNorm()(nn.Dense(2)(x + fresh(x))), named(x).sum()
    return Model

  variables = init_apply(make, X)['params']
  assert set(variables) == {'Dense_0', 'middle', 'Dense_1', 'block', 'Inner_0', 'Dense_2', 'arg',
                            'Child_0', 'Dense_3', 'named', 'Dense_4', 'LayerNorm_0'}
  assert set(variables['Inner_0']) == set(variables['Child_0']) == {'Dense_0'}  # per call
  assert nn.Dense(3, name='a').copy(name='b').name == 'b'
  assert nn.Dense(3, name='a').copy().name is None


def test_setup_lists_dicts_tuples_nowrap_helpers_and_explicit_names_are_named_like_flax():
  def make(nn):
    class Block(nn.Module):
      features: int = 3

      @nn.compact
      def __call__(self, x):
        return nn.Dense(self.features)(x)

    class Model(nn.Module):
      @nn.nowrap
      def make_layer(self, n):
        return nn.Dense(n)

      def setup(self):
        self.layers = [Block(), Block()]
        self.heads = {'a': nn.Dense(1), 'b': [Block(2), Block(1)]}
        self.pair = (Block(1),)
        self.proj = Block(2, name='custom')
        self.scale = self.param('scale', nn.initializers.ones, (3,))
        self.first = self.make_layer(3)

      def __call__(self, x):
        for layer in self.layers:
          x = layer(x)
        x = self.first(x) * self.scale[None]
        return [self.heads['a'](x), *(m(x) for m in self.heads['b']), self.pair[0](x),
                self.proj(x)]

    class Outer(nn.Module):  # setup modules nest in a compact one
      @nn.compact
      def __call__(self, x):
        x = x + self.param('bias', nn.initializers.normal(0.1), (4,))[None]
        return Model()(x), Model(name='last')(x)
    return Outer

  params = init_apply(make, X)['params']
  assert set(params) == {'bias', 'Model_0', 'last'}
  assert set(params['last']) == {'layers_0', 'layers_1', 'heads_a', 'heads_b_0', 'heads_b_1',
                                 'pair_0', 'custom', 'scale', 'first'}


def test_module_fields_in_tuples_and_dicts_are_adopted_under_the_field_name_and_shared():
  def build(nn):
    class Block(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(2)(x)

    class Holder(nn.Module):
      sub: nn.Module
      subs: tuple = ()
      layers: dict = None

      @nn.compact
      def __call__(self, x):
        return (self.sub(x) + Block()(x) + sum(sub(x) for sub in self.subs)
                + sum(layer(x) for layer in (self.layers or {}).values()))

    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        shared = Block()
        return (Holder(Block(), (Block(), shared))(x) + shared(x)
                + Holder(sub=shared, name='h2')(x))

    y, variables = Holder(Block()).init_with_output(KEY, X)
    shared, a = nn.Dense(2), Block()
    # Flax walks a field's dicts in sorted key order: {'foo': a, 'bar': a} adopts a as layers_bar.
    outside = Holder(shared, (shared,), {'foo': a, 'bar': a, 'zed': Block()}).init(KEY, X)
    assert set(outside['params']) == {'sub', 'Block_0', 'layers_bar', 'layers_zed'}
    return (Model().init_with_output(KEY, X), y, variables, outside,
            Holder(Block()).apply(variables, X, method='sub'))  # `method=` names a field
  check_linen_parity(build)


def test_sow_reduce_and_init_fns_get_and_put_variable_and_mode_queries():
  def build(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        add = lambda a, b: a + b
        for _ in range(2):
          self.sow('stats', 'sum', x.sum(), reduce_fn=add, init_fn=lambda: jnp.zeros(()))
        self.sow('stats', 'lst', x[0])
        sown = self.sow('stats2', 'lst', x[0])
        step = self.get_variable('state', 'step', 0)
        if self.is_mutable_collection('state'):
          self.put_variable('state', 'step', step + 1)
        return (x * step, sown, self.get_variable('state', 'missing', 7),
                self.has_variable('state', 'step'), self.has_rng('dropout'),
                self.has_rng('params'), self.is_initializing(), self.is_mutable_collection('stats'))

    state = {'state': {'step': jnp.array(3)}}
    return (Model().init_with_output(KEY, X, mutable=['stats', 'params']),
            Model().init_with_output(KEY, X),
            Model().apply(state, X, mutable=['stats'], rngs={'dropout': KEY}),
            Model().apply(state, X, mutable=['state']), Model().apply(state, X))
  check_linen_parity(build)


def test_module_api_tour_matches_flax():
  """One model through most of the API: a setup module inside a compact one, sow, put and get,
  rng keys, a single key for apply, methods, nowrap, bind, unbind, clone and fields."""
  def build(nn):
    class Sub(nn.Module):
      feat: int = 2

      @nn.compact
      def __call__(self, x):
        return nn.Dense(self.feat)(x)

    class SetupM(nn.Module):
      def setup(self):
        self.a, self.bs = Sub(3), [Sub(2), Sub(2)]
        self.w = self.param('w', nn.initializers.normal(), (3,))
        self.cnt = self.variable('state', 'cnt', lambda: jnp.zeros(()))

      def __call__(self, x):
        if not self.is_initializing():
          self.cnt.value += 1
        return self.a(x) * self.w[None] + self.bs[1](self.bs[0](x)).sum()

      @nn.nowrap
      def helper(self):
        return 'nowrap'

      def other(self, x):
        return self.a(x)

    class M(nn.Module):
      @nn.compact
      def __call__(self, x):
        info = {'init': self.is_initializing(), 'mut': self.is_mutable_collection('params'),
                'has_rng': self.has_rng('dropout')}
        h = SetupM()(jnp.ones((2, 3))) + nn.Dense(3, name='named')(Sub()(Sub()(x)))
        self.sow('intermediates', 'h', h)
        self.put_variable('cache', 'z', jnp.ones(2))
        info.update(get=self.get_variable('cache', 'z'), rng=jax.random.key_data(
            self.make_rng('dropout')), has=(self.has_variable('cache', 'z'),
                                            self.has_variable('cache', 'q')))
        self.sow('intermediates', 'h', h)
        return h, info

    x, rngs = jnp.ones((2, 3)), {'params': KEY, 'dropout': jax.random.key(1)}
    y, v = M().init_with_output(rngs, x)
    assert_trees_equal(v, M().init(rngs, x))
    stored = {'params': v['params'], 'state': v['state']}
    sv = {c: v[c]['SetupM_0'] for c in ('params', 'state')}
    bound = SetupM().bind(sv, mutable=['state'])
    module, unbound = bound.unbind()
    assert module.scope is None and unbound == sv
    assert bound.a.variables == {'params': sv['params']['a']}
    assert_trees_equal(bound(x), SetupM().apply(sv, x, mutable=['state'])[0])
    assert Sub().clone() == Sub()
    fresh = SetupM().bind({}, rngs={'params': KEY}, mutable=True)  # creates variables
    fresh.sow('intermediates', 'y', fresh(x))
    return (y, v, M().apply(stored, x, rngs={'dropout': KEY},
                            mutable=['intermediates', 'cache', 'state']),
            M().apply(stored, x, rngs=KEY, mutable=True)[0][0],
            SetupM().apply(sv, x, method='other'), SetupM().apply(sv, x, method=SetupM.other),
            SetupM().helper(), bound(x), bound.other(x), bound.w, bound.variables,
            bound.a.variables, type(module).__name__, unbound, module.apply(unbound, x,
                                                                            mutable=True),
            Sub(2).clone(feat=5).feat, Sub(2).clone(feat=5).init(KEY, x), Sub(name='x').clone().name,
            bound.a.clone().name, fresh.variables, [f.name for f in dataclasses.fields(Sub)],
            Sub(name='x').name, Sub().parent is None)
  check_linen_parity(build)


# -- init / apply: mutable filters, methods, capture_intermediates ----------------------------


def stateful_model(nn):
  class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
      if self.is_mutable_collection('counter') or self.has_variable('counter', 'n'):
        count = self.variable('counter', 'n', lambda: jnp.zeros((), jnp.int32))
        if self.is_mutable_collection('counter'):
          count.value += 1
      self.sow('intermediates', 'x', x)
      if self.is_mutable_collection('batch_stats'):
        stats = self.variable('batch_stats', 'm', jnp.zeros, (4,))
        stats.value = stats.value + x.mean(0)
      return nn.Dense(2)(x)

    def other(self, x):
      return 2.0 * x
  return Model()


MUTABLE = {
    'False': lambda nn: False, 'True': lambda nn: True, 'list': lambda nn: ['counter'],
    'str': lambda nn: 'counter', 'two': lambda nn: ['counter', 'intermediates'],
    'deny_one': lambda nn: nn.DenyList('counter'),
    'deny_two': lambda nn: nn.DenyList(['counter', 'batch_stats']), 'empty': lambda nn: [],
    'params': lambda nn: ['params'],
}


@pytest.mark.parametrize('mutable', sorted(MUTABLE))
def test_apply_and_init_with_output_mutable_filters(mutable):
  variables = stateful_model(flax_nn).init(KEY, X)
  check_linen_parity(lambda nn: stateful_model(nn).apply(variables, X,
                                                         mutable=MUTABLE[mutable](nn)))
  if mutable in ('True', 'deny_one', 'params'):
    check_linen_parity(lambda nn: stateful_model(nn).init_with_output(
        KEY, X, mutable=MUTABLE[mutable](nn)))


def test_apply_methods_and_capture_intermediates_filters():
  variables = stateful_model(flax_nn).init(KEY, X)
  assert 'intermediates' not in stateful_model(nn).init(KEY, X)  # kept only when asked
  assert 'intermediates' in stateful_model(nn).init_with_output(KEY, X, mutable=True)[1]

  def build(nn):
    model = stateful_model(nn)
    return (model.apply(variables, X, method='other'),
            model.apply(variables, X, method=type(model).other),
            model.apply(variables, X, method=model.other),
            model.apply(variables, X, method=lambda m, x: m.other(x)[:, :2] + m(x)),
            model.apply(variables, X, capture_intermediates=True),
            model.apply(variables, X, capture_intermediates=True, mutable=['intermediates']),
            model.apply(variables, X, capture_intermediates=lambda m, n: True,
                        mutable=['intermediates']),
            model.init(KEY, X, capture_intermediates=True), model.init(KEY, X, method='other'))
  check_linen_parity(build)


def test_capture_intermediates_of_flax_layer_internals():
  def make(nn):
    class Block(nn.Module):
      @nn.compact
      def __call__(self, x):
        h = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=4,
                                            deterministic=True)(nn.LayerNorm()(x))
        return x + nn.Dense(4)(nn.gelu(h))
    return Block()

  variables = make(flax_nn).init(KEY, XS)
  check_linen_parity(lambda nn: (
      make(nn).apply(variables, XS, capture_intermediates=True, mutable=['intermediates']),
      make(nn).apply(variables, XS, mutable=['intermediates'],
                     capture_intermediates=lambda m, n: type(m).__name__ == 'Dense')))


# -- bind, clone, dataclass fields, inheritance ---------------------------------------------


def test_dataclass_field_defaults_and_post_init():
  class Plain(nn.Module):
    features: int
    use_bias: bool = True

  m = Plain(3, name='m')
  assert (m.features, m.use_bias, m.name, m.parent) == (3, True, 'm', None)

  def build(nn):
    class Model(nn.Module):
      sizes: tuple = dataclasses.field(default_factory=lambda: (2, 3))

      def __post_init__(self):
        super().__post_init__()

      @nn.compact
      def __call__(self, x):
        for size in self.sizes:
          x = nn.Dense(size)(x)
        return x

    class Parent(nn.Module):
      @nn.compact
      def __call__(self, x):
        return Model((3,))(x)

    return (Model().init_with_output(KEY, X), Parent().init_with_output(KEY, X),
            Model() == Model(), hash(Model()) == hash(Model()), Model((1,)) == Model())
  assert check_linen_parity(build)[0][2:] == (True, True, False)


def test_inheritance_with_super_setup_and_super_compact():
  def build(nn):
    class Base(nn.Module):
      features: int = 3

      def setup(self):
        self.d = nn.Dense(self.features)

      def __call__(self, x):
        return self.d(x)

    class Child(Base):
      extra: int = 2

      def setup(self):
        super().setup()
        self.e = nn.Dense(self.extra)

      def __call__(self, x):
        return super().__call__(x), self.e(x)

    class CompactBase(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(2)(x)

    class CompactChild(CompactBase):
      @nn.compact
      def __call__(self, x):
        return super().__call__(x) + nn.Dense(2)(x)

    child = Child(4, 5)
    return (child.init_with_output(KEY, X), child.features, child.extra,
            CompactChild().init_with_output(KEY, X))
  check_linen_parity(build)


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


def test_module_attributes_are_frozen_like_flax():
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


# -- rngs, dtypes, flags and names under transforms ----------------------------------------


def test_rngs_drawn_in_setup_methods_repeated_calls_dropout_and_legacy_keys():
  def build(nn):
    class Sub(nn.Module):
      def setup(self):
        self.k = jax.random.normal(self.make_rng('noise'), (2,))
        self.p = self.param('p', nn.initializers.normal(), (2,))

      def __call__(self, x):
        return self.k + jax.random.normal(self.make_rng('noise'), (2,)) + self.p

      def other(self):
        return jax.random.normal(self.make_rng('noise'), (2,))

    class Model(nn.Module):
      def setup(self):
        self.s = Sub()
        self.t = [Sub(), Sub()]

      def __call__(self, x):
        return (self.s(x), self.s(x), self.s.other(), self.t[1].other(), self.t[0](x),
                jax.random.normal(self.make_rng('noise'), (2,)))

    class Drop(nn.Module):  # the dropout rng collection, legacy uint32 keys and dtypes
      @nn.compact
      def __call__(self, x):
        w = self.param('w', nn.initializers.normal(), (4, 2), jnp.bfloat16)
        dropout = nn.Dropout(0.5, deterministic=False)
        return (nn.Dense(2, param_dtype=jnp.float16, dtype=jnp.float32)(x), w,
                dropout(x), dropout(x),
                nn.Dropout(0.5, deterministic=False, rng_collection='noise')(x))

    y, variables = Model().init_with_output(RNGS, X)
    again = Model().apply(variables, rngs=RNGS,
                          method=lambda m: (m.s.other(), m.s.other(), m.t[0].other()))
    legacy = {name: jax.random.PRNGKey(i) for i, name in enumerate(RNGS)}
    y2, v2 = Drop().init_with_output(legacy, X)
    return (y, variables, Model().apply(variables, X, rngs=RNGS), again, y2, v2,
            Drop().apply(v2, X, rngs=RNGS))
  check_linen_parity(build)


def test_flags_inside_vmap_remat_and_jit():
  def make(nn):
    class Inner(nn.Module):
      @nn.compact
      def __call__(self, x):
        flags = jnp.array([self.is_initializing(), self.has_rng('params'),
                           self.is_mutable_collection('params'), self.has_rng('dropout'),
                           self.is_mutable_collection('stats')])
        return nn.Dense(4)(x), flags

    class Model(nn.Module):
      @nn.compact
      def __call__(self, xs):
        mapped = nn.vmap(Inner, variable_axes={'params': 0, 'stats': 0},
                         split_rngs={'params': True}, out_axes=(0, None))
        return (mapped()(xs)[1], nn.remat(Inner, rngs=['params'])()(xs[0])[1],
                nn.jit(Inner)()(xs[0])[1])
    return Model()

  variables = make(flax_nn).init(KEY, XS)
  check_linen_parity(lambda nn: (
      make(nn).init_with_output(RNGS, XS)[0],
      make(nn).apply(variables, XS, rngs={'dropout': KEY}, mutable=['stats'])))


def test_automatic_names_under_transforms_in_setup_and_decorated_methods():
  def build(nn):
    class Block(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(4)(x) + nn.Dense(4)(x)

    vmapped = functools.partial(nn.vmap, Block, variable_axes={'params': 0},
                                split_rngs={'params': True}, in_axes=None, axis_size=2)

    class Compact(nn.Module):
      @nn.compact
      def __call__(self, x):
        a = vmapped()()(x).sum(0) + vmapped()()(x).sum(0)
        shared = nn.remat(Block)()
        c = shared(a) + shared(a)
        return nn.remat(Block)()(c) + Block()(c) + nn.Dense(4)(c)

    class Setup(nn.Module):
      def setup(self):
        self.layers = [nn.remat(Block)() for _ in range(2)]
        self.vm = vmapped()()
        self.table = {'a': nn.jit(Block)()}

      def __call__(self, x):
        for layer in self.layers:
          x = layer(x)
        return self.vm(x).sum(0) + self.table['a'](x)

    class Mapped(nn.Module):  # compact methods decorated by transforms
      @functools.partial(nn.vmap, variable_axes={'params': 0}, split_rngs={'params': True})
      @nn.compact
      def __call__(self, x):
        return nn.Dense(3)(x)

    class Scanned(nn.Module):
      @functools.partial(nn.scan, variable_broadcast='params', split_rngs={'params': False})
      @nn.compact
      def __call__(self, c, x):
        h = nn.Dense(4)(x) + c
        return h, h

    return (Compact().init_with_output(KEY, X),
            jax.tree.map(lambda a: (a.shape, a.dtype), Setup().init(KEY, X)),
            Mapped().init_with_output(KEY, XS),
            Scanned().init_with_output(KEY, jnp.zeros((3, 4)), XS))
  check_linen_parity(build)


def test_sequential_passes_tuples_as_arguments():
  def build(nn):
    class Two(nn.Module):
      @nn.compact
      def __call__(self, x):
        return nn.Dense(3)(x), x

    class Take(nn.Module):
      @nn.compact
      def __call__(self, a, b):
        return nn.Dense(2)(a) + b.sum()

    class Model(nn.Module):
      def setup(self):
        self.seq = nn.Sequential([Two(), Take()])
        self.mlp = nn.Sequential([nn.Dense(3), nn.relu, nn.Dense(2)])

      @nn.compact
      def __call__(self, x):
        inline = nn.Sequential([nn.Dense(4), nn.relu, nn.Dense(2)])
        return self.seq(x), self.mlp(x), inline(x)

    return Model().init_with_output(KEY, X)
  variables = check_linen_parity(build)[0][1]
  assert {'Dense_0', 'Dense_1'} <= set(variables['params'])  # bound where they were made


def test_top_level_name_paths_and_nested_standalone_init():
  def build(nn):
    class Model(nn.Module):
      def setup(self):
        self.d = nn.Dense(3)

      @nn.compact
      def __call__(self, x):
        standalone = nn.Dense(3, parent=None)
        v = standalone.init(jax.random.key(1), x)
        return (standalone.apply(v, x) + nn.Dense(3)(x), v, self.name, self.d(x), self.path,
                self.d.path, self.d.name)

    return Model(name='foo').init_with_output(KEY, X), Model().init_with_output(KEY, X)
  check_linen_parity(build)


def test_linen_ext_imports_no_flax_scope_or_lifting():
  forbidden = ('flax.core.scope', 'flax.core.lift', 'flax.core.axes_scan', 'flax.linen.transforms')
  imported = []
  for path in sorted(pathlib.Path(nn.__file__).parent.rglob('*.py')):  # subpackages too
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module:
        imported += [node.module] + [f'{node.module}.{a.name}' for a in node.names]
      elif isinstance(node, ast.Import):
        imported += [a.name for a in node.names]
  assert imported and not [m for m in imported if m.startswith(forbidden)]


# -- private methods, several compact methods, share_scope, copy (all as Flax) -------------


def test_private_and_several_compact_methods_name_like_flax():
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
        # Outermost compact calls restart the names (Dense_0 each time: shared); nested ones go on.
        return (self._project(self._embed(x)) + self._embed(x) + self.first(x) + self.second(x)
                + self.nested(x))

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

  variables = init_apply(make, X)
  assert set(variables['params']) == {'Dense_0', 'Dense_1', 'Dense_2', 'proj'}
  # A private method called on a bound module runs setup first, as a public one does.
  check_linen_parity(lambda nn: make(nn)().bind(variables)._project(jnp.ones((2, 3))))


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

  variables = init_apply(make, X)
  assert set(variables['params']['Wrapped_0']) == {'own', 'sub'}
  assert set(variables['params']['Dense_0']) == {'a', 'kernel', 'bias'}


# -- functional entry points and lazy_init ----------------------------------------------------


def test_functional_init_and_apply_like_flax():
  def run(nn):
    class AutoEncoder(nn.Module):
      def setup(self):
        self.encoder, self.decoder = nn.Dense(2), nn.Dense(4)

      def __call__(self, x):
        self.sow('counts', 'calls', 1)
        return self.decoder(self.encoder(x))

    variables = nn.init(lambda m, x: m(x), AutoEncoder(), mutable=['params'])(KEY, X)
    z, encoder_only = nn.init_with_output(lambda m, x: m.encoder(x), AutoEncoder())(KEY, X)
    y, state = nn.apply(lambda m, x: m(x), AutoEncoder(), mutable=['counts'],
                        capture_intermediates=True)(variables, X)
    return variables, z, encoder_only, y, state
  check_linen_parity(run)


@pytest.mark.tracer_leaks_outside  # JAX's partial evaluation keeps the effect's tracers (Flax too)
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
  ours = check_linen_parity(lambda nn: make(nn)().lazy_init(KEY, x, train=True))[0]
  assert_trees_equal(ours, make(nn)().init(KEY, X, train=True))
  assert len(ran) == 1  # only the eager init above ran the forward pass
  assert set(make(nn)().lazy_init(KEY, x, train=False)['params']) == {'Dense_0'}


def test_adopting_an_outside_module_keeps_no_variables_alive_after_the_call():
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


def test_a_root_flax_core_scope_as_parent_holds_what_the_module_creates():
  """Flax's own tests bind modules with `parent=flax.core.Scope(...)`; ours take it too."""
  import flax.core

  def bound_to_flax_scope(lib):
    scope = flax.core.Scope({}, {'params': jax.random.key(0)}, mutable=['params', 'stats'])
    y = lib.Dense(3, parent=scope)(jnp.ones((2, 4)))
    return scope.variables(), y

  (ours, y), (theirs, _) = [bound_to_flax_scope(lib) for lib in (nn, flax_nn)]
  assert jax.tree.map(jnp.shape, ours) == jax.tree.map(jnp.shape, theirs)  # the keys drawn differ
  assert_trees_equal(y, nn.Dense(3).apply(ours, jnp.ones((2, 4))))
  frozen = flax.core.Scope(flax.core.freeze(ours), {})  # immutable: reads only
  assert_trees_equal(nn.Dense(3, parent=frozen)(jnp.ones((2, 4))), y)
