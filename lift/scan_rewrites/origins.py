"""Work moved out of a loop, in the user's words: the code that traced it.

An equation is named by the expression of the user's code that traced it
(``jnp.sqrt(d).astype(x.dtype)`` in ``Block.__call__``, line 12), read from the
source at the position its traceback records. Where the traceback stops inside
a library that traced a function of its own (``lift``'s attention, traced with
``jax.make_jaxpr``), the expression is the library's, named with its module. What no
code wrote is named for what it does: the rounding that `jax.checkpoint` (remat)
puts on each value it saves for the backward pass (``reduce_precision`` to the
value's own precision, JAX PR 22244), or the equations JAX added by itself.
"""
from __future__ import annotations

import linecache
import re

import jax.numpy as jnp

from lift import _compat

MAX_EXPRESSION = 60  # characters of an expression shown before it is cut


def describe(eqns, source: dict | None = None) -> str:
  """`eqns` (body equations moved together) by the code that traced them, in order,
  e.g. "`jnp.tril(m)` (Block.__call__, line 12), the rounding of carry 0 of loop 1 to
  bfloat16 that remat inserts". `source` names body variables (`names.Names.source`)."""
  groups: dict = {}  # key -> [text, what was added to it]
  group_of: dict = {}  # variable -> the key of the group computing it
  jax_ops: list = []
  for eqn in eqns:
    key = _place(eqn, groups, group_of, source or {})
    if key is None:
      jax_ops.append(_op_name(eqn))
    group_of.update((v, key) for v in eqn.outvars if key is not None)
  texts = [group[0] + ''.join(dict.fromkeys(group[1:])) for group in groups.values()]
  if jax_ops:
    texts.append(f'{", ".join(dict.fromkeys(jax_ops))} that JAX added')
  return ', '.join(texts)


def _place(eqn, groups: dict, group_of: dict, source: dict) -> tuple | None:
  """Puts `eqn` in a group: that of the value it converts or rounds (if computed by
  another), else that of the code that traced it. Its key; None for JAX's own work."""
  var = eqn.invars[0] if eqn.invars else None
  inner = group_of.get(var) if isinstance(var, _compat.Var) else None
  found = _compat.operation_frame(eqn)
  dtype = jnp.dtype(eqn.outvars[0].aval.dtype).name if eqn.outvars else ''
  if is_remat_rounding(eqn):
    if inner is not None:
      groups[inner].append(f' with the rounding to {dtype} that remat inserts')
      return inner
    what = _operation(eqn, *found) if found else _name(var, source)
    return _new(groups, ('rounding', what), f'the rounding of {what} to {dtype} that remat inserts')
  if eqn.primitive.name == 'convert_element_type' and inner is not None:
    if eqn.invars[0].aval.dtype != eqn.outvars[0].aval.dtype:  # more than a weak type made strong
      groups[inner].append(f' converted to {dtype}')
    return inner
  return _new(groups, _key(found[0]), _operation(eqn, *found)) if found else None


def _new(groups: dict, key: tuple, text: str) -> tuple:
  groups.setdefault(key, [text])
  return key


def is_remat_rounding(eqn) -> bool:
  """Whether `eqn` rounds a value to its own precision: what `jax.checkpoint` puts
  on a value it saves, so that the forward and backward passes see the same bits."""
  if eqn.primitive.name != 'reduce_precision':
    return False
  finfo = jnp.finfo(eqn.invars[0].aval.dtype)
  return (eqn.params['exponent_bits'], eqn.params['mantissa_bits']) == (finfo.nexp, finfo.nmant)


def _name(var, source: dict) -> str:
  return source.get(var, 'a value it saves') if isinstance(var, _compat.Var) else 'a constant'


def _key(frame) -> tuple:
  return (frame.file_name, frame.start_line, frame.start_column, frame.end_line, frame.end_column)


def _operation(eqn, frame, module: str | None) -> str:
  """"`expression` (function, line N)", or "`expression` (module)" for a library's code."""
  text = _expression(frame) or _op_name(eqn)
  return f'`{text}` ({module or f"{frame.function_name}, line {frame.start_line}"})'


def _expression(frame) -> str:
  """The source text between the frame's start and end positions, on one line
  (empty where the source or the positions are unknown)."""
  lines = linecache.getlines(frame.file_name)
  first, last, start, end = frame.start_line, frame.end_line, frame.start_column, frame.end_column
  if any(not isinstance(n, int) or n < 0 for n in (first, last, start, end)) or not (
      1 <= first <= last <= len(lines)):
    return ''
  chunk = [line.encode() for line in lines[first - 1:last]]  # columns count UTF-8 bytes
  chunk[-1] = chunk[-1][:end]
  chunk[0] = chunk[0][start:]
  text = ' '.join(b''.join(chunk).decode(errors='replace').split())
  text = re.sub(r'([([{]) | ([)\]}])', r'\1\2', text)  # the line breaks inside brackets
  return text if len(text) <= MAX_EXPRESSION else text[:MAX_EXPRESSION - 3] + '...'


def _op_name(eqn) -> str:
  """The primitive, or the name of the function a call equation holds (``tril``)."""
  name = eqn.params.get('name')
  return name if isinstance(name, str) and name else eqn.primitive.name
