"""Runs test code in a child interpreter with 8 simulated CPU devices.

JAX fixes the device count when it starts, so multi-device checks run in a
child started with ``--xla_force_host_platform_device_count=8``.
"""
import os
import pathlib
import subprocess
import sys


def run_in_child(call: str, timeout: int = 300) -> subprocess.CompletedProcess:
  """Runs ``import tests.<module> as t; t.<fn>()`` (``call='<module>.<fn>'``) on 8 CPU devices.

  >>> proc = run_in_child('test_partitioning_multidevice.run_check')
  """
  module, fn = call.rsplit('.', 1)
  root = pathlib.Path(__file__).resolve().parents[1]
  env = {**os.environ, 'XLA_FLAGS': '--xla_force_host_platform_device_count=8',
         'JAX_PLATFORMS': 'cpu'}
  code = f'import tests.{module} as t; t.{fn}()'
  return subprocess.run([sys.executable, '-c', code], cwd=root, env=env,
                        capture_output=True, text=True, timeout=timeout)
