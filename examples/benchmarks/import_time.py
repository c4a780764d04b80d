"""Import time of `lift` and `linen_ext` against `from flax import linen`.

Each statement runs in a fresh interpreter, once per round; the statements take
turns within a round and the table shows medians over the rounds. Bytecode is
compiled once first (into a private cache, as `pip install` does for an installed
package), so every round measures a warm import, not Python compiling sources.

`import flax.errors` is the floor of anything built on Flax: importing any `flax.*`
module runs Flax's package `__init__`, which imports all of `flax.linen`. The last
column is the import's own modules' time (`python -X importtime`, self times of
`lift.*` and `linen_ext.*`).

    python examples/benchmarks/import_time.py                # 9 rounds, about two minutes
    python examples/benchmarks/import_time.py --rounds 1
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

STATEMENTS = {
    'from flax import linen': 'from flax import linen',
    'import flax.errors (floor)': 'import flax.errors',
    'import lift': 'import lift',
    'import linen_ext': 'import linen_ext',
}
TIMED = 'import time; start = time.perf_counter(); {}; print(time.perf_counter() - start)'
OWN_MODULE = re.compile(r'import time:\s+(\d+) \|\s+\d+ \|\s+(lift|linen_ext)(\.|$)')


def child_env(cache: str) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONDONTWRITEBYTECODE'}
  return {**env, 'PYTHONPYCACHEPREFIX': cache}


def seconds(statement: str, env: dict[str, str]) -> float:
  run = subprocess.run([sys.executable, '-c', TIMED.format(statement)], env=env,
                       capture_output=True, text=True, check=True)
  return float(run.stdout)


def own_seconds(statement: str, env: dict[str, str]) -> float:
  """Self time of this project's modules during the import."""
  run = subprocess.run([sys.executable, '-X', 'importtime', '-c', statement], env=env,
                       capture_output=True, text=True, check=True)
  return sum(int(m.group(1)) for m in map(OWN_MODULE.match, run.stderr.splitlines()) if m) / 1e6


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=9)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as cache:
    env = child_env(cache)
    for statement in STATEMENTS.values():  # compile bytecode once, untimed
      seconds(statement, env)
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    own: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    for _ in range(args.rounds):
      for name, statement in STATEMENTS.items():
        times[name].append(seconds(statement, env))
        own[name].append(own_seconds(statement, env))
  flax = statistics.median(times['from flax import linen'])
  print(f'Python {sys.version.split()[0]}, medians of {args.rounds} alternating rounds\n')
  print('| import | seconds | / flax.linen | own modules (s) |')
  print('|---|---|---|---|')
  for name in STATEMENTS:
    median = statistics.median(times[name])
    print(f'| `{name}` | {median:.3f} | {median / flax:.2f}x | {statistics.median(own[name]):.3f} |')


if __name__ == '__main__':
  main()
