"""`lax.associative_scan` calls in a jaxpr, folded into one equation each.

`lax.associative_scan(fn, elems, axis=a)` is not a primitive: it traces to
strided slices, `fn` on the halves, interior pads and concatenations. `fold`
finds the equations of each call (by the source location they were traced at:
inside `associative_scan`) and replaces them by one equation of
`associative_scan_call`, whose parameters hold those equations (`jaxpr`, run
when it is evaluated, differentiated or batched) and `fn` as the running step
needs it (`combine`).

The structure read, for a call on leaves `E_k` of length `T >= 2` along `a`:
every result is `pad(concat(E_k[0:1], even_k)) + pad(odd_k)` (interleaved
along `a`), where `odd_k` is the scan at the odd positions and
`even_k = fn(odd_k[:len(even_k)], E_k[2::2])` the scan at the even ones after
the first: `combine` is that application of `fn`, from the scan so far and the
next elements to the scan. Under `jax.vmap` the results may hold the leaves'
axes in another order (transposes between `E_k[0:1]` and the concatenation);
`combine` takes the scan in the results' order and the elements in the
leaves', as the traced program does, and the step keeps that order.

A call that does not have this structure (reversed, for one) is left as it is.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from lift import _compat
from lift.causal import custom

associative_scan_call_p = _compat.Primitive("associative_scan")
custom.define_jaxpr_primitive(associative_scan_call_p)


class Interleave(NamedTuple):
  """`pad(concat(transpose(first[0:1], perm), even)) + pad(odd)` along `axis`."""
  axis: int
  first: Any  # the value whose element 0 leads the result
  perm: tuple[int, ...]  # axis i of the result is axis perm[i] of `first`
  even: Any
  odd: Any
  out: Any


def fold(closed: _compat.ClosedJaxpr) -> _compat.ClosedJaxpr:
  """`closed` with every `lax.associative_scan` call folded, nested jaxprs too."""
  return _compat.ClosedJaxpr(_fold_jaxpr(closed.jaxpr), closed.consts)


def _fold_jaxpr(jaxpr: _compat.Jaxpr) -> _compat.Jaxpr:
  eqns = [_fold_params(eqn) for eqn in jaxpr.eqns]
  last_use = _last_uses(eqns, jaxpr.outvars)
  folded, done = [], 0
  for start, stop in _call_sites(eqns):
    call = _fold_call(eqns[start:stop], last_use, stop)
    if call is not None:
      folded += eqns[done:start] + [call]
      done = stop
  folded += eqns[done:]
  if all(a is b for a, b in zip(folded, jaxpr.eqns)) and len(folded) == len(jaxpr.eqns):
    return jaxpr
  return jaxpr.replace(eqns=folded)


def _fold_params(eqn):
  params = {name: _fold_param(value) for name, value in eqn.params.items()}
  if all(params[name] is value for name, value in eqn.params.items()):
    return eqn
  return eqn.replace(params=params)


def _fold_param(value):
  if isinstance(value, tuple) and any(isinstance(v, (_compat.ClosedJaxpr, _compat.Jaxpr))
                                      for v in value):
    return tuple(_fold_param(v) for v in value)
  if isinstance(value, _compat.ClosedJaxpr):
    jaxpr = _fold_jaxpr(value.jaxpr)
    return value if jaxpr is value.jaxpr else _compat.ClosedJaxpr(jaxpr, value.consts)
  if isinstance(value, _compat.Jaxpr):
    return _fold_jaxpr(value)
  return value


def _last_uses(eqns, outvars) -> dict:
  """Per variable, the index of the last equation reading it (outputs: past the end)."""
  last = {}
  for index, eqn in enumerate(eqns):
    for var in eqn.invars:
      if isinstance(var, _compat.Var):
        last[var] = index
  for var in outvars:
    if isinstance(var, _compat.Var):
      last[var] = len(eqns)
  return last


def _call_sites(eqns) -> list[tuple[int, int]]:
  """Runs `[start, stop)` of equations traced inside one `associative_scan` call site."""
  runs: list[tuple[int, int]] = []
  previous = None
  for index, eqn in enumerate(eqns):
    site = (None if eqn.primitive is associative_scan_call_p
            else _compat.associative_scan_site(eqn))
    if site is not None and site == previous:
      runs[-1] = (runs[-1][0], index + 1)
    elif site is not None:
      runs.append((index, index + 1))
    previous = site
  return runs


def _fold_call(eqns, last_use: dict, stop: int):
  """One `associative_scan` equation in place of a call's equations, or None when they
  do not have the structure read here."""
  producer = {v: e for e in eqns for v in e.outvars}
  inputs = _inputs(eqns, producer)
  outputs = [v for e in eqns for v in e.outvars
             if not isinstance(v, _compat.DropVar) and last_use.get(v, -1) >= stop]
  tops = [t for e in eqns if (t := _interleave(e, producer)) is not None
          and t.first in inputs]
  if not tops or len({t.axis for t in tops}) != 1:
    return None
  outs = [t.out for t in tops]
  elems = [t.first for t in tops]
  consts = [v for v in inputs if v not in elems]
  scans, nexts = _scans_so_far(eqns, tops), _next_elements(eqns, tops)
  if any(v not in outs for v in outputs) or scans is None or nexts is None:
    return None
  combine = _combine_jaxpr(eqns, producer, scans + nexts + consts, [t.even for t in tops],
                           set(elems))
  if combine is None:
    return None
  ordered = list(dict.fromkeys(elems)) + consts
  params = dict(
      jaxpr=_closed(ordered, outputs, eqns), combine=_compat.ClosedJaxpr(combine, ()),
      axis=tops[0].axis, perms=tuple(t.perm for t in tops),
      elems=tuple(ordered.index(v) for v in elems),
      leaves=tuple(outs.index(v) for v in outputs))
  return _compat.new_equation(
      ordered, outputs, associative_scan_call_p, params, _effects(eqns),
      eqns[0].source_info, eqns[0].ctx)


def _inputs(eqns, producer) -> list:
  """Variables the equations read and do not define, in order of first use."""
  seen = [v for e in eqns for v in e.invars
          if isinstance(v, _compat.Var) and v not in producer]
  return list(dict.fromkeys(seen))


def _interleave(eqn, producer: dict) -> Interleave | None:
  """The parts of `eqn` if it interleaves `concat(first[0:1], ...)` with another value
  (what `lax.associative_scan` returns at each level), else None."""
  prims = _compat.scan_primitives
  if eqn.primitive not in (prims.add_p, prims.or_p):
    return None
  even, odd = (_made_by(v, prims.pad_p, producer) for v in eqn.invars)
  if even is None or odd is None:
    return None
  axes = [i for i, (low, _, interior) in enumerate(even.params['padding_config'])
          if interior == 1 and low == 0]
  if len(axes) != 1 or odd.params['padding_config'][axes[0]][::2] != (1, 1):
    return None
  concat = _made_by(even.invars[0], prims.concatenate_p, producer)
  if concat is None or len(concat.invars) != 2:
    return None
  head, perm = _through_transposes(concat.invars[0], producer)
  if head is None or not _takes(head, perm[axes[0]], 0, 1, 1):
    return None
  return Interleave(axes[0], head.invars[0], perm, concat.invars[1], odd.invars[0],
                    eqn.outvars[0])


def _through_transposes(var, producer: dict):
  """The `slice` equation `var` is made from by transposes, and where `var`'s axes come
  from in its operand."""
  perm = tuple(range(var.aval.ndim))
  eqn = producer.get(var)
  while eqn is not None and eqn.primitive is _compat.scan_primitives.transpose_p:
    perm = tuple(eqn.params['permutation'][i] for i in perm)
    eqn = producer.get(eqn.invars[0])
  if eqn is None or eqn.primitive is not _compat.scan_primitives.slice_p:
    return None, perm
  return eqn, perm


def _made_by(var, primitive, producer: dict):
  """The equation defining `var`, if it is one of `primitive`."""
  eqn = producer.get(var) if isinstance(var, _compat.Var) else None
  return eqn if eqn is not None and eqn.primitive is primitive else None


def _takes(eqn, axis: int, start: int, limit: int | None, stride: int) -> bool:
  """Whether a `slice` equation takes `start:limit:stride` along `axis` (None: to the
  end) and all of the other axes."""
  shape = eqn.invars[0].aval.shape
  strides = eqn.params['strides'] or (1,) * len(shape)
  want = {axis: (start, shape[axis] if limit is None else limit, stride)}
  return all((s, end, st) == want.get(i, (0, shape[i], 1)) for i, (s, end, st) in enumerate(
      zip(eqn.params['start_indices'], eqn.params['limit_indices'], strides)))


def _scans_so_far(eqns, tops: list[Interleave]) -> list | None:
  """`combine`'s first operands: the scan at the odd positions, cut to the even ones."""
  length = tops[0].first.aval.shape[tops[0].perm[tops[0].axis]]
  if length % 2:
    return [t.odd for t in tops]
  found = []
  for t in tops:
    cut = [e.outvars[0] for e in eqns if e.primitive is _compat.scan_primitives.slice_p
           and e.invars[0] is t.odd and _takes(e, t.axis, 0, length // 2 - 1, 1)]
    if not cut:
      return None
    found.append(cut[0])
  return found


def _next_elements(eqns, tops: list[Interleave]) -> list | None:
  """`combine`'s second operands: `E_k[2::2]` for every leaf, in the leaves' order."""
  firsts = [t.first for t in tops]
  found = [e for e in eqns if e.primitive is _compat.scan_primitives.slice_p
           and e.invars[0] in firsts]
  found = [e for e in found
           if _takes(e, tops[firsts.index(e.invars[0])].perm[tops[0].axis], 2, None, 2)]
  if [e.invars[0] for e in found] != firsts:
    return None
  return [e.outvars[0] for e in found]


def _combine_jaxpr(eqns, producer: dict, invars: list, outvars: list, elems: set):
  """The equations computing `outvars` from `invars`, as a jaxpr; None if they read a
  whole leaf (then they are not `fn` on the scan so far and the next elements)."""
  needed, stack = set(), list(outvars)
  while stack:
    var = stack.pop()
    if var in invars or var in needed or not isinstance(var, _compat.Var):
      continue
    if var in elems or var not in producer:
      return None
    needed.add(var)
    stack.extend(producer[var].invars)
  body = [e for e in eqns if any(v in needed for v in e.outvars)]
  return _compat.new_jaxpr(invars, outvars, body, "fn")


def _closed(invars, outvars, eqns) -> _compat.ClosedJaxpr:
  return _compat.ClosedJaxpr(_compat.new_jaxpr(invars, outvars, eqns, "associative_scan"), ())


def _effects(eqns) -> frozenset:
  return frozenset().union(*(e.effects for e in eqns))
