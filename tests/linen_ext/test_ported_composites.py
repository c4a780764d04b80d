"""Model code ported by swapping the import, as Hugging Face's Flax composites are written.

Oracle: the same source run with `flax.linen`. The source imports from `flax.linen`'s
submodules (``activation``, ``initializers``, ``dtypes``) and holds an encoder and a
decoder from another file that stays `flax.linen` (HF's ``FlaxAutoModel`` classes),
whose ``config`` it reads in ``setup`` and whose ``attend`` it calls; another block
makes flax layers inline. The port replaces ``flax.linen`` with ``linen_ext`` in the
text and nothing else.
"""
import dataclasses
import sys
import types

import flax.linen as flax_nn
import jax
import jax.numpy as jnp
import pytest

from tests.helpers import assert_trees_equal

SOURCE = '''
import jax.numpy as jnp
import flax.linen as nn
from flax.linen.activation import tanh
from flax.linen.dtypes import promote_dtype
from flax.linen.initializers import normal


class Pooler(nn.Module):
  config: object
  dtype: object = jnp.float32

  @nn.compact
  def __call__(self, h):
    w = self.param('kernel', normal(0.02), (h.shape[-1], self.config.hidden_size))
    first, w = promote_dtype(h[:, 0], w, dtype=self.dtype)
    return tanh(first @ w)


class Mixer(nn.Module):  # flax layers made inline, a flax RNN over a flax cell among them
  @nn.compact
  def __call__(self, h):
    cell = flax.linen.GRUCell(h.shape[-1])
    return flax.linen.RNN(cell)(flax.linen.Dense(h.shape[-1])(h))


class EncoderDecoder(nn.Module):
  config: object
  module_class: type  # an unported flax.linen module class, as FlaxAutoModel's
  dtype: object = jnp.float32

  def setup(self):
    self.encoder = self.module_class(self.config, dtype=self.dtype)
    self.decoder = self.module_class(self.config, dtype=self.dtype)
    hidden = self.decoder.config.hidden_size
    self.enc_to_dec_proj = nn.Dense(hidden, dtype=self.dtype, kernel_init=normal(0.02))
    self.pooler = Pooler(self.config, dtype=self.dtype)
    self.mixer = Mixer()

  def __call__(self, ids, decoder_ids):
    h = self.mixer(self.enc_to_dec_proj(self.encoder(ids)))
    d = self.decoder(decoder_ids) + self.pooler(h)[:, None]
    return self.decoder.attend(d)
'''


@dataclasses.dataclass(frozen=True)
class Config:
  vocab_size: int = 11
  hidden_size: int = 8


class FlaxEncoder(flax_nn.Module):
  """From a file that still imports flax.linen: embeddings, a layer, tied output weights."""
  config: Config
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embed = flax_nn.Embed(self.config.vocab_size, self.config.hidden_size,
                               dtype=self.dtype)
    self.layer = flax_nn.Dense(self.config.hidden_size, dtype=self.dtype)

  def __call__(self, ids):
    return flax_nn.gelu(self.layer(self.embed(ids)))

  def attend(self, h):
    return self.embed.attend(h)


def load(source: str, name: str, monkeypatch) -> types.ModuleType:
  """``source`` as the module ``name`` (dataclasses look their module up by name)."""
  module = types.ModuleType(name)
  monkeypatch.setitem(sys.modules, name, module)
  module.flax = __import__('flax.linen')  # `flax.linen.GRUCell` in Mixer: unported layers
  exec(compile(source, name, 'exec'), module.__dict__)
  return module


def ported(source: str) -> str:
  return source.replace('import flax.linen as nn', 'import linen_ext as nn').replace(
      'from flax.linen.', 'from linen_ext.')


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_a_composite_ported_by_the_import_swap_equals_flax(dtype, monkeypatch):
  ids, decoder_ids = jnp.array([[1, 2, 3]]), jnp.array([[4, 5, 6, 7]])
  results = []
  for name, source in (('ported', ported(SOURCE)), ('original', SOURCE)):
    model = load(source, name, monkeypatch).EncoderDecoder(Config(), FlaxEncoder, dtype=dtype)
    loss = lambda v: model.apply(v, ids, decoder_ids).astype(jnp.float32).sum()
    with jax.numpy_dtype_promotion('standard'):  # model code mixes bf16 and f32, as HF's
      variables = model.init(jax.random.key(0), ids, decoder_ids)
      results.append((variables, model.apply(variables, ids, decoder_ids),
                      jax.grad(loss)(variables)))
  assert_trees_equal(*results)
  variables = results[0][0]['params']
  assert sorted(variables) == ['decoder', 'enc_to_dec_proj', 'encoder', 'mixer', 'pooler']
  assert sorted(variables['mixer']) == ['Dense_0', 'GRUCell_0']  # the cell beside its RNN
