"""A decoder written the way MaxText writes its Linen decoder ports by the import swap: the
same variables, partition specs, logits, gradients and cached decode steps as flax.linen,
bit for bit.

The parts of that style: ``nn.scan`` over ``nn.remat(policy=...)`` layers with static
arguments, parameters scanned on axis 1 at init and read back through ``ScanIn``,
``metadata_params`` naming the ``layers`` axis, logical axis names from
``nn.with_logical_partitioning``, a layer that reads the running module off
``nn.module._context.module_stack`` (a quantization bridge keyed by module path) and a
``cache`` collection for autoregressive decoding. The program is written once, as a
function of the ``nn`` namespace (`check_linen_parity`).
"""
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from tests.helpers import check_linen_parity

B, T, D, H, K, V, L = 2, 4, 8, 2, 4, 11, 2  # batch, max length, embed, heads, head dim, vocab, layers
POLICY = jax.checkpoint_policies.save_only_these_names('query_proj', 'mlpwi')
PATH_SCALE = {'layers': 0.5}  # a per-module setting looked up by the running module's path
TOKENS = jnp.array([[1, 4, 2, 7], [3, 3, 9, 0]])
POSITIONS = jnp.broadcast_to(jnp.arange(T), (B, T))


def decoder(nn):
  """The model class, built with ``nn``, and the module paths its layers saw running."""
  init = nn.initializers.lecun_normal()
  paths = set()

  def dense(features, axes, name, axis=-1):
    return nn.DenseGeneral(features, axis=axis, use_bias=False, name=name,
                           kernel_init=nn.with_logical_partitioning(init, axes))

  def cache_var(module, name, shape, axes, dtype):
    return module.variable('cache', name, nn.with_logical_partitioning(jnp.zeros, axes),
                           shape, dtype)

  class Attention(nn.Module):
    @nn.compact
    def __call__(self, x, positions, mode):
      turn = jnp.cos(positions.astype(jnp.float32) / 4)[:, :, None, None]  # a stand-in for RoPE
      q = checkpoint_name(dense((H, K), ('embed', 'heads', 'kv'), 'query')(x) * turn, 'query_proj')
      k = dense((H, K), ('embed', 'heads', 'kv'), 'key')(x) * turn
      v = dense((H, K), ('embed', 'heads', 'kv'), 'value')(x)
      mask = jnp.tril(jnp.ones((1, 1, x.shape[1], x.shape[1]), bool))
      if mode == 'autoregressive':
        k, v, mask = self.cached(k, v)
      logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / jnp.sqrt(jnp.float32(K))
      weights = jax.nn.softmax(jnp.where(mask, logits, jnp.float32(-1e9)))
      out = jnp.einsum('bhqk,bkhd->bqhd', weights, v)
      return dense(D, ('heads', 'kv', 'embed'), 'out', axis=(-2, -1))(out)

    def cached(self, k, v):
      """One step's key and value written at the cache index (created empty on the first)."""
      ready = self.has_variable('cache', 'cached_key')
      axes = ('cache_batch', 'cache_sequence', 'cache_heads', 'cache_kv')
      keys = cache_var(self, 'cached_key', (B, T, H, K), axes, jnp.float32)
      values = cache_var(self, 'cached_value', (B, T, H, K), axes, jnp.float32)
      index = cache_var(self, 'cache_index', (), (), jnp.int32)
      if not ready:
        return k, v, jnp.ones((1, 1, 1, 1), bool)
      i = index.value
      keys.value = jax.lax.dynamic_update_slice(keys.value, k, (0, i, 0, 0))
      values.value = jax.lax.dynamic_update_slice(values.value, v, (0, i, 0, 0))
      index.value = i + 1
      return keys.value, values.value, (jnp.arange(T) <= i).reshape(1, 1, 1, T)

  class RMSNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
      scale = self.param('scale', nn.with_logical_partitioning(nn.initializers.ones, ('norm',)),
                         (D,)).reshape(1, 1, D)
      return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale

  class DecoderLayer(nn.Module):
    @nn.compact
    def __call__(self, x, positions, deterministic, mode):
      running = nn.module._context.module_stack[-1]
      path = '/'.join(running.path)
      paths.add((path, running is self, deterministic, mode))
      x = x + Attention(name='self_attention')(RMSNorm(name='pre_norm')(x), positions, mode)
      h = checkpoint_name(dense(2 * D, ('embed', 'mlp'), 'wi')(RMSNorm(name='post_norm')(x)),
                          'mlpwi')
      h = dense(D, ('mlp', 'embed'), 'wo')(nn.gelu(h)) * PATH_SCALE.get(path, 1.0)
      return x + h, None

  class Decoder(nn.Module):
    @nn.compact
    def __call__(self, tokens, positions, mode='train'):
      embed = nn.Embed(V, D, name='token_embedder', embedding_init=nn.with_logical_partitioning(
          nn.initializers.normal(1.0), ('vocab', 'embed')))
      params_axis = 1 if self.is_mutable_collection('params') else nn.partitioning.ScanIn(1)
      block = nn.remat(DecoderLayer, prevent_cse=False, policy=POLICY, static_argnums=(3, 4))
      layers = nn.scan(block, variable_axes={'params': params_axis, 'cache': 0},
                       split_rngs={'params': True}, in_axes=(nn.broadcast,) * 3, length=L,
                       metadata_params={nn.PARTITION_NAME: 'layers'})
      x, _ = layers(name='layers')(embed(tokens), positions, True, mode)
      return dense(V, ('embed', 'vocab'), 'logits_dense')(RMSNorm(name='decoder_norm')(x))

  return Decoder, paths


def run_decoder(nn):
  """Init, forward, gradients, the cache's creation and one decode step (one compile), and
  the partition specs of the variables and the cache."""
  Decoder, paths = decoder(nn)
  model = Decoder()

  def loss(params):
    logits = model.apply(params, TOKENS, POSITIONS)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits

  def step(variables, cache, t):
    return model.apply({**variables, **cache}, TOKENS[:, t:t + 1], POSITIONS[:, t:t + 1],
                       'autoregressive', mutable=['cache'])

  @jax.jit
  def run(key):
    variables = model.init(key, TOKENS, POSITIONS)
    (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(variables)
    first, cache = step(variables, {}, 0)
    second, cache_after = step(variables, cache, 1)
    return {'variables': variables, 'logits': logits, 'grads': grads, 'first': first,
            'cache': cache, 'second': second, 'cache_after': cache_after}

  out = run(jax.random.key(0))
  return {**out, 'specs': nn.get_partition_spec(out['variables']),
          'cache_specs': nn.get_partition_spec(out['cache']), 'paths': sorted(paths)}


def test_maxtext_style_decoder_matches_flax():
  ours, _ = check_linen_parity(run_decoder)
  layer_specs = ours['specs']['params']['layers']
  assert tuple(layer_specs['self_attention']['query']['kernel']) == ('embed', 'layers', 'heads',
                                                                     'kv')
  assert tuple(ours['cache_specs']['cache']['layers']['self_attention']['cache_index']) == (
      'layers',)
  assert ours['paths'] == [('layers', True, True, 'autoregressive'),
                           ('layers', True, True, 'train')]
