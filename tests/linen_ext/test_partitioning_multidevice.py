"""`linen_ext.partitioning` constraints on 8 simulated CPU devices, against Flax's.

JAX fixes the device count when it starts, so the check runs in a child
interpreter started with ``--xla_force_host_platform_device_count=8``.
"""
import re

import flax.linen as flax_nn
import jax
from flax.linen import partitioning as flax_partitioning

import linen_ext as nn
from linen_ext import partitioning
from tests.helpers import assert_trees_close, run_in_child
from tests.linen_ext.test_partitioning import RULES, X, models

MARK = 'PARTITIONING_OK'


def run_check():
  """In the child: the logical constraints land on the mesh axes the rules name."""
  assert jax.device_count() == 8
  auto = jax.sharding.AxisType.Auto
  mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(auto, auto))
  lowered = {}
  for name, lib, part in (('ours', nn, partitioning), ('flax', flax_nn, flax_partitioning)):
    layers = models(lib, part)[1]
    variables = layers.init(jax.random.key(0), X)
    with jax.set_mesh(mesh), part.axis_rules(RULES):
      step = jax.jit(lambda v, m=layers: m.apply(v, X, mutable=['stats']))
      lowered[name, 'apply'] = step.lower(variables).as_text()
      lowered[name, 'init'] = jax.jit(layers.init).lower(jax.random.key(0), X).as_text()
      out, _ = step(variables)
    assert_trees_close(out, layers.apply(variables, X, mutable=['stats'])[0], depth=1)
  specs = {key: re.findall(r'sharding_constraint %\w+ (<@mesh, [^>]*>)', text)
           for key, text in lowered.items()}
  for stage in ('apply', 'init'):
    assert specs['ours', stage] == specs['flax', stage], (stage, specs)
  assert '<@mesh, [{}, {"model"}]>' in specs['ours', 'apply'], specs  # w1: ('embed', 'mlp')
  print(MARK)


def test_logical_constraints_shard_as_flax_on_8_devices():
  proc = run_in_child('linen_ext.test_partitioning_multidevice.run_check')
  assert MARK in proc.stdout, f'rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}'
