"""Flax's direct transforms (nn.cond(pred, f, g, self, x) and friends) against flax.linen.

Each model is written once as a function of ``nn``; `check_linen_parity` runs it with
linen_ext and flax.linen and compares variables, outputs, mutated state and gradients.
"""

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linen_ext as nn
from tests.helpers import assert_trees_close, assert_trees_equal, check_linen_parity

KEY = jax.random.key(0)
X = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
RNGS = {'params': KEY, 'noise': jax.random.key(2)}


def models(nn):
  """name -> (Module class, arguments of init; apply runs on them too unless noted)."""
  class LearnScale(nn.Module):
    @nn.compact
    def __call__(self, x, y):
      return self.param('scale', nn.initializers.ones_init(), ()) * x * y

  class Cond(nn.Module):  # a submodule made in the branch, and one shared by both
    @nn.compact
    def __call__(self, x, pred):
      self.variable('state', 'true_count', lambda: 0)
      self.variable('state', 'false_count', lambda: 0)
      shared = nn.Dense(2, name='shared')
      shared(x)

      def true_fn(mdl, x):
        mdl.variable('state', 'true_count').value += 1
        return nn.Dense(2, name='dense')(x) + shared(x)

      def false_fn(mdl, x):
        mdl.variable('state', 'false_count').value += 1
        return -nn.Dense(2, name='dense')(x) + shared(x)

      return nn.cond(pred, true_fn, false_fn, self, x)

  class CondSetup(nn.Module):  # branches calling submodules made in setup
    def setup(self):
      self.d1, self.d2 = nn.Dense(3), nn.Dense(3)

    def __call__(self, x, pred):
      if self.is_initializing():
        self.d1(x), self.d2(x)
      return nn.cond(pred, lambda m, x: m.d1(x), lambda m, x: m.d2(x), self, x)

  class Switch(nn.Module):
    @nn.compact
    def __call__(self, x, index):
      branches = [lambda m, x: nn.Dense(3, name='a')(x),
                  lambda m, x: nn.Dense(3, name='a')(x) + 1.0]
      return nn.switch(index, branches, self, x)

  class SwitchSetup(nn.Module):  # shared setup layers; the index is clamped
    def setup(self):
      self.ds = [nn.Dense(3) for _ in range(3)]

    def __call__(self, x, i):
      if self.is_initializing():
        for d in self.ds:
          d(x)
      return nn.switch(i, [lambda m, x, j=j: m.ds[j](x) for j in range(3)], self, x)

  class While(nn.Module):
    @nn.compact
    def __call__(self, x):
      dense = nn.Dense(4)
      dense(x)
      return nn.while_loop(lambda m, c: jnp.abs(c).sum() < 100.0, lambda m, c: dense(c) * 2.0,
                           self, x)

  class WhileState(nn.Module):  # carried variables, broadcast params, split rngs
    @nn.compact
    def __call__(self, x):
      dense = nn.Dense(4)
      dense(x)
      self.variable('state', 'acc', lambda: jnp.zeros(()))

      def body_fn(m, c):
        i, h = c
        m.variable('state', 'acc').value += h.sum()
        noise = jax.random.normal(m.make_rng('noise'), h.shape)
        return i + 1, nn.tanh(dense(h)) + noise

      return nn.while_loop(lambda m, c: c[0] < 3, body_fn, self, (0, x), carry_variables='state',
                           broadcast_variables='params', split_rngs={'noise': True})

  class Vjp(nn.Module):  # the module is initialised inside vjp
    @nn.compact
    def __call__(self, x):
      z, bwd = nn.vjp(lambda m, x, y: m(x, y), LearnScale(), x, x)
      return z, bwd(jnp.ones_like(z))

  class Autodiff(nn.Module):  # vjp with aux and multi_scope, grad with aux, jvp tangents
    def setup(self):
      self.dense, self.other = nn.Dense(3), nn.Dense(3)

    def __call__(self, x):
      y, bwd, aux = nn.vjp(lambda m, x: (m(x), {'a': x.sum()}), self.dense, x, has_aux=True)
      y2, bwd2 = nn.vjp(lambda m, x: m(x) + self.other(x), self.dense, x, multi_scope=True)
      grads = nn.grad(lambda m, x: (m(x).sum(), 2.0 * x), self.other, x, has_aux=True)
      value = nn.value_and_grad(lambda m, x, w: (m(x) * w).sum(), self.dense, x, jnp.ones((2, 3)))
      tangents = {'params': jax.tree.map(jnp.ones_like, self.dense.variables['params'])}
      jvp = nn.jvp(lambda m, x: m(x), self.dense, (x,), (jnp.ones_like(x),), tangents)
      return y, bwd(jnp.ones_like(y)), aux, y2, bwd2(jnp.ones_like(y2)), grads, value, jvp

  class Jvp(nn.Module):
    @nn.compact
    def __call__(self, x):
      scale = LearnScale()
      scale(x, x)
      return nn.jvp(lambda m, x: m(x, x), scale, (x,), (jnp.ones_like(x),),
                    {'params': {'scale': jnp.array(1.0)}})

  class Grad(nn.Module):  # the Dense is initialised inside grad
    @nn.compact
    def __call__(self, x):
      dense = nn.Dense(2)
      loss = lambda m, x: (m(x) ** 2).sum()
      with_aux = lambda m, x: ((m(x) ** 2).sum(), x.sum())
      return (nn.grad(loss, dense, x), nn.value_and_grad(loss, dense, x),
              nn.grad(with_aux, dense, x, has_aux=True))

  class SignGrad(nn.Module):
    @nn.compact
    def __call__(self, x):
      f = lambda mdl, x: mdl(x)
      fwd = lambda mdl, x: nn.vjp(f, mdl, x)

      def bwd(vjp_fn, y_t):
        params_t, *inputs_t = vjp_fn(y_t)
        return (jax.tree.map(jnp.sign, params_t), *inputs_t)

      return nn.custom_vjp(f, forward_fn=fwd, backward_fn=bwd)(nn.Dense(1), x).sum()

  class WithExtra(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(3)(x) * self.variable('extra', 'e', jnp.ones, (3,)).value[None]

  class CustomVjp(nn.Module):  # nondiff_argnums and a list of grad_vars
    @nn.compact
    def __call__(self, x, scale=3.0):
      def fwd(mdl, scale, x):
        y, vjp_fn = nn.vjp(lambda m, x: m(x), mdl, x, vjp_variables=['params', 'extra'])
        return y * scale, vjp_fn

      def bwd(scale, vjp_fn, y_t):
        params_t, x_t = vjp_fn(y_t * scale)
        return jax.tree.map(lambda a: 2.0 * a, params_t), x_t

      return nn.custom_vjp(lambda mdl, scale, x: mdl(x) * scale, forward_fn=fwd, backward_fn=bwd,
                           nondiff_argnums=(1,), grad_vars=['params', 'extra'])(WithExtra(), scale, x)

  return {'cond': (Cond, (X, True)), 'cond_setup': (CondSetup, (X, True)),
          'switch': (Switch, (X, 0)), 'switch_setup': (SwitchSetup, (X, 0)),
          'while_loop': (While, (X,)), 'while_state': (WhileState, (X,)), 'vjp': (Vjp, (X,)),
          'autodiff': (Autodiff, (X,)), 'jvp': (Jvp, (X,)), 'grad': (Grad, (X,)),
          'custom_vjp': (SignGrad, (X,)), 'custom_vjp_nondiff': (CustomVjp, (X,))}


@pytest.mark.parametrize('name', sorted(models(nn)))
def test_direct_transforms_match_flax(name):
  def build(nn):
    model, args = models(nn)[name]
    variables = model().init(RNGS, *args)
    return (variables, model().apply(variables, *args, rngs=RNGS, mutable=True),
            jax.grad(lambda v, x: jnp.sum(model().apply(v, x, *args[1:], rngs=RNGS)),
                     (0, 1))(variables, X) if 'custom_vjp' in name else None)
  ours, _ = check_linen_parity(build)
  if name == 'custom_vjp':
    assert set(np.unique(np.abs(ours[2][0]['params']['Dense_0']['kernel']))) == {1.0}


@pytest.mark.parametrize('name, index', [('cond', False), ('cond_setup', False)] + [
    (switch, i) for switch in ('switch', 'switch_setup') for i in (1, 2, 5, -1)])
def test_cond_and_switch_take_the_selected_branch_under_jit(name, index):
  def build(nn):
    model, args = models(nn)[name]
    variables = model().init(KEY, *args)
    return jax.jit(lambda v, i: model().apply(v, X, i, mutable=['state']))(variables, index)
  check_linen_parity(build)
  if name == 'switch' and index == 1:
    model, _ = models(nn)['switch']
    variables = model().init(KEY, X, 1)
    kernel, bias = variables['params']['a']['kernel'], variables['params']['a']['bias']
    assert_trees_close(model().apply(variables, X, 1), X @ kernel + bias[None] + 1.0, depth=1)
  if name == 'cond':
    model, _ = models(nn)['cond']
    _, state = model().apply(model().init(KEY, X, True), X, False, mutable=['state'])
    # init took the true branch; this apply the false one.
    assert (int(state['state']['true_count']), int(state['state']['false_count'])) == (1, 1)


def dropout_branches(nn, kind, scales):
  """Branch j: ``scales[j]`` times dropout, and a key drawn at the module; a key after it."""
  class Branching(nn.Module):
    @nn.compact
    def __call__(self, x, index):
      def branch(scale):
        return lambda m, x: (scale * nn.Dropout(0.5, deterministic=False)(x),
                             jax.random.bits(m.make_rng('dropout'), (2,)))
      branches = [branch(scale) for scale in scales]
      y = (nn.cond(index, *branches, self, x) if kind == 'cond'
           else nn.switch(index, branches, self, x))
      return y, jax.random.bits(self.make_rng('dropout'), (2,))
  return Branching()


class Unrolled(flax_nn.Module):
  """The keys of untransformed code: ``n`` calls of one Dropout, ``n`` draws at the module."""
  @flax_nn.compact
  def __call__(self, x, n):
    dropout = flax_nn.Dropout(0.5, deterministic=False)
    return ([dropout(x) for _ in range(n)],
            [jax.random.bits(self.make_rng('dropout'), (2,)) for _ in range(n)])


@pytest.mark.parametrize('kind, index', [('cond', True), ('cond', False)] + [
    ('switch', i) for i in range(3)])
def test_branch_keys_at_apply_are_the_untransformed_ones(kind, index):
  """Ours: the taken branch draws the keys it draws without the transform, and a draw after it
  follows the draws of the branch that drew most (here each draws one key). Flax: JAX traces
  the branches in turn (cond: the true one first), each drawing after those traced before it,
  and a draw after follows every branch's."""
  scales = (1.0, -1.0) if kind == 'cond' else (1.0, -1.0, 2.0)
  rngs = {'dropout': jax.random.key(3)}
  taken = (0 if index else 1) if kind == 'cond' else index  # also its place in tracing order
  masks, keys = Unrolled().apply({}, X, len(scales) + 1, rngs=rngs)
  ours = dropout_branches(nn, kind, scales).apply({}, X, index, rngs=rngs)
  theirs = dropout_branches(flax_nn, kind, scales).apply({}, X, index, rngs=rngs)
  assert_trees_equal(ours, ((scales[taken] * masks[0], keys[0]), keys[1]))
  assert_trees_equal(theirs, ((scales[taken] * masks[taken], keys[taken]), keys[len(scales)]))


@pytest.mark.parametrize('vjp_variables', [False, 'params', True, ['params'], 'batch_stats'])
def test_vjp_variables_filters(vjp_variables):
  def build(nn):
    class Model(nn.Module):
      @nn.compact
      def __call__(self, x):
        dense = nn.Dense(3)
        dense(x)
        z, bwd = nn.vjp(lambda m, x: m(x), dense, x, vjp_variables=vjp_variables)
        return z, bwd(jnp.ones_like(z))

    variables = Model().init(KEY, X)
    return variables, Model().apply(variables, X)
  ours, _ = check_linen_parity(build)
  params_t = ours[1][1][0]
  assert ('params' in params_t) == (vjp_variables not in (False, 'batch_stats'))

