"""The command lines of the example scripts: a mistake is one line that names the flag.

The libraries' errors say their fix in Python (``nn.tpu_topology('v5e-256')``); a script
checks what its user typed before it calls them and raises `UsageError` in the user's
terms instead (``--compile-for v5e-256``). `Parser` prints that, and argparse's own
mistakes, as one line on stderr, ``error: <message>``, and exits with argparse's status 2:
no usage block, no traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class UsageError(Exception):
  """A flag's value the job cannot run with. The message starts with the flag as typed and
  ends with ``Fix:`` and the flags to pass instead."""


MESH_AXES = ('stage', 'data', 'model')


def mesh_sizes(text: str, devices: int) -> dict[str, int]:
  """``--mesh 'data=64,model=2'`` as ``{'data': 64, 'model': 2}``; ``devices`` is the
  count the fixes suggest putting on ``data``.

  Raises:
    UsageError: an axis other than ``stage``, ``data``, ``model``, or a size that is not
      a count.
  """
  sizes = {}
  for part in text.split(','):
    name, _, size = part.partition('=')
    if name not in MESH_AXES:
      raise UsageError(f'--mesh {text}: unknown axis {name!r}; the axes are '
                       f'{", ".join(MESH_AXES)}. Fix: only those, e.g. --mesh data={devices}.')
    if not size.isdigit() or int(size) < 1:
      raise UsageError(f'--mesh {text}: {part!r} is not {name}=N with N at least 1. Fix: '
                       f'e.g. --mesh data={devices}.')
    sizes[name] = int(size)
  return sizes


def fail(message: str, status: int = 2) -> NoReturn:
  """Ends the script: ``error: <message>`` as one line on stderr, exit ``status`` (2, a
  usage error, by default)."""
  sys.stderr.write(f'error: {message}\n')
  raise SystemExit(status)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
  """Shows each flag's default, except None and a switch's False: there the help says
  what happens without the flag."""

  def _get_help_string(self, action: argparse.Action) -> str | None:
    if action.default is None or action.default is False:
      return action.help
    return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
  """argparse's parser, its defaults shown in ``--help``, its errors reported by `fail`."""

  def __init__(self, **kwargs):
    super().__init__(formatter_class=_Formatter, **kwargs)

  def error(self, message: str) -> NoReturn:
    fail(message)


def divisors(n: int) -> str:
  """``'1, 2 or 4'``: the divisors of ``n``, as the choices a fix offers."""
  *most, last = [str(d) for d in range(1, n + 1) if n % d == 0]
  return f'{", ".join(most)} or {last}' if most else last


def positive(text: str) -> int:
  """argparse's ``type=`` for a count: an int of at least 1."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{text!r} is not a whole number') from None
  if value < 1:
    raise argparse.ArgumentTypeError(f'{value} is not at least 1')
  return value
