"""Runtime overhead of `lift.scan` and `lift.vmap` against the hand-written JAX programs.

Two workloads, each as a jitted forward+backward step (`jax.value_and_grad` of
a squared-output loss with respect to the parameters):

* scan: a stack of `--layers` scope-level dense+relu layers, `lift.scan` with
  `variable_axes={'params': 0}`, against `lax.scan` over the stacked params;
* vmap: an ensemble of `--layers` scope-level 2-layer MLPs, `lift.vmap` with
  `variable_axes={'params': 0}`, against `jax.vmap` over the stacked params.

Both programs of a pair get the same parameters and inputs, are compiled and
warmed up first, and are then timed alternately in one process; the script
prints the median step times, their ratio (lifted / hand-written), and whether
the two compiled programs have the same HLO instructions.

    python examples/benchmarks/lift_overhead.py                # width 512, 200 repeats
    python examples/benchmarks/lift_overhead.py --quick        # small, few repeats
"""
from __future__ import annotations

import argparse
import collections
import re
import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

import lift

STACK = dict(variable_axes={'params': 0}, split_rngs={'params': True})


def dense(scope, x, features):
  kernel = scope.param('kernel', jax.nn.initializers.lecun_normal(), (x.shape[-1], features))
  bias = scope.param('bias', jax.nn.initializers.zeros, (features,))
  return x @ kernel + bias[None]


def layer(scope, h, _):
  return jax.nn.relu(dense(scope, h, h.shape[-1])), None


def mlp(scope, x):
  h = jax.nn.relu(scope.child(dense, 'hidden')(x, x.shape[-1]))
  return scope.child(dense, 'out')(h, x.shape[-1])


def hand_layer(h, params):
  return jax.nn.relu(h @ params['kernel'] + params['bias'][None]), None


def hand_mlp(params, x):
  h = jax.nn.relu(x @ params['hidden']['kernel'] + params['hidden']['bias'][None])
  return h @ params['out']['kernel'] + params['out']['bias'][None]


class Pair(NamedTuple):
  name: str
  lifted: Callable[..., Any]
  hand: Callable[..., Any]
  params: Any
  x: jax.Array


def _train_step(forward: Callable[[Any, jax.Array], jax.Array]) -> Callable[..., Any]:
  return jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(forward(p, x) ** 2)))


def scan_pair(layers: int, width: int, batch: int) -> Pair:
  stack = lift.scan(layer, length=layers, **STACK)
  x = jax.random.normal(jax.random.key(1), (batch, width))
  _, variables = jax.jit(lift.init(stack))(jax.random.key(0), x, None)
  lifted = lambda p, x: lift.apply(stack)({'params': p}, x, None)[0]
  hand = lambda p, x: lax.scan(hand_layer, x, p)[0]
  return Pair('scan', _train_step(lifted), _train_step(hand), variables['params'], x)


def vmap_pair(members: int, width: int, batch: int) -> Pair:
  ensemble = lift.vmap(mlp, **STACK)
  x = jax.random.normal(jax.random.key(1), (members, batch, width))
  _, variables = jax.jit(lift.init(ensemble))(jax.random.key(0), x)
  lifted = lambda p, x: lift.apply(ensemble)({'params': p}, x)
  hand = jax.vmap(hand_mlp)
  return Pair('vmap', _train_step(lifted), _train_step(hand), variables['params'], x)


def same_compiled_ops(pair: Pair) -> bool:
  """Whether both compiled programs have the same multiset of HLO instructions."""
  def ops(step):
    text = step.lower(pair.params, pair.x).compile().as_text()
    return collections.Counter(re.findall(r'= \S+ ([\w-]+)\(', text))
  return ops(pair.lifted) == ops(pair.hand)


def _time_once(step: Callable[..., Any], params: Any, x: jax.Array) -> float:
  start = time.perf_counter()
  jax.block_until_ready(step(params, x))
  return time.perf_counter() - start


def measure(pair: Pair, warmup: int, repeats: int) -> tuple[float, float]:
  """Median seconds per step of (lifted, hand-written), timed alternately."""
  lifted_value, hand_value = pair.lifted(pair.params, pair.x), pair.hand(pair.params, pair.x)
  for a, b in zip(jax.tree.leaves(lifted_value), jax.tree.leaves(hand_value)):
    assert jnp.allclose(a, b, rtol=1e-4, atol=1e-4), f'{pair.name}: programs disagree'
  for _ in range(warmup):
    _time_once(pair.lifted, pair.params, pair.x)
    _time_once(pair.hand, pair.params, pair.x)
  lifted_times, hand_times = [], []
  for i in range(repeats):
    order = [(pair.lifted, lifted_times), (pair.hand, hand_times)]
    for step, times in (order if i % 2 == 0 else order[::-1]):
      times.append(_time_once(step, pair.params, pair.x))
  return statistics.median(lifted_times), statistics.median(hand_times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--layers', type=int, default=16)
  parser.add_argument('--width', type=int, default=512)
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--warmup', type=int, default=20)
  parser.add_argument('--repeats', type=int, default=200)
  parser.add_argument('--quick', action='store_true', help='width 64, 10 repeats')
  args = parser.parse_args()
  if args.quick:
    args.width, args.warmup, args.repeats = 64, 3, 10
  print(f'device: {jax.devices()[0].device_kind}; layers/members {args.layers}, '
        f'width {args.width}, batch {args.batch}, median of {args.repeats}')
  print(f'{"":6} {"lift (ms)":>10} {"hand (ms)":>10} {"ratio":>7}  same HLO ops')
  for build in (scan_pair, vmap_pair):
    pair = build(args.layers, args.width, args.batch)
    lifted, hand = measure(pair, args.warmup, args.repeats)
    print(f'{pair.name:6} {1e3 * lifted:10.3f} {1e3 * hand:10.3f} {lifted / hand:7.3f}'
          f'  {same_compiled_ops(pair)}')


if __name__ == '__main__':
  main()
