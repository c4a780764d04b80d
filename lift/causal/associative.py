"""`lax.associative_scan` calls in a jaxpr, folded into one equation each.

`lax.associative_scan(fn, elems, axis=a)` is not a primitive: it traces to
strided slices, `fn` on the halves, interior pads and concatenations. `fold`
finds the equations of each call (by the source location they were traced at:
inside `associative_scan`) and replaces them by one equation of
`associative_scan_call`, whose parameters hold those equations (`jaxpr`, run
when it is evaluated, differentiated or batched) and `fn` applied once
(`combine`, read from the call's first level: `fn(elems[0::2], elems[1::2])`).

The structure read, for a call on leaves `E_k` of length `T >= 2` along `a`:

* the call starts with `slice(E_k, 0, T - 1, 2)` for every leaf, then
  `slice(E_k, 1, T, 2)`: `combine`'s inputs;
* every result is `pad(concat(E_k[0:1], even_k)) + pad(odd_k)` (interleaved
  along `a`), `odd_k` being the scan of the combined pairs: `combine`'s
  result for leaf k, or a scan of it, itself such an interleave.

A call that does not have this structure (reversed, for one) is left as it is.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from lift import _compat
from lift.causal import custom

associative_scan_call_p = _compat.Primitive("associative_scan")
custom.define_jaxpr_primitive(associative_scan_call_p)


class Interleave(NamedTuple):
  """`pad(concat(first[0:1], even)) + pad(odd)` along `axis`."""
  axis: int
  first: Any  # the value whose element 0 leads the result
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
  """One `associative_scan_call` equation for a call's equations, or None."""
  producer = {v: e for e in eqns for v in e.outvars}
  inputs = _inputs(eqns, producer)
  outputs = [v for e in eqns for v in e.outvars
             if not isinstance(v, _compat.DropVar) and last_use.get(v, -1) >= stop]
  tops = [t for e in eqns if (t := interleave(e, producer)) is not None
          and t.first in inputs]
  if not tops or len({(t.axis, t.out.aval.shape[t.axis]) for t in tops}) != 1:
    return None
  outs = [t.out for t in tops]
  if any(v not in outs for v in outputs):
    return None
  halves = _halves(eqns, tops)
  combined = [_combined(t.odd, producer) for t in tops]
  if halves is None or any(v not in producer for v in combined):
    return None
  elems = [t.first for t in tops]
  consts = [v for v in inputs if v not in elems]
  combine = _combine_jaxpr(eqns, producer, halves + consts, combined, set(elems))
  if combine is None:
    return None
  ordered = list(dict.fromkeys(elems)) + consts
  params = dict(
      jaxpr=_closed(ordered, outputs, eqns), combine=_compat.ClosedJaxpr(combine, ()),
      axis=tops[0].axis, elems=tuple(ordered.index(v) for v in elems),
      leaves=tuple(outs.index(v) for v in outputs))
  return _compat.new_equation(
      ordered, outputs, associative_scan_call_p, params, _effects(eqns),
      eqns[0].source_info, eqns[0].ctx)


def _inputs(eqns, producer) -> list:
  """Variables the equations read and do not define, in order of first use."""
  seen = [v for e in eqns for v in e.invars
          if isinstance(v, _compat.Var) and v not in producer]
  return list(dict.fromkeys(seen))


def interleave(eqn, producer: dict) -> Interleave | None:
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
  head = _made_by(concat.invars[0], prims.slice_p, producer)
  if head is None or not _leading(head, axes[0]):
    return None
  return Interleave(axes[0], head.invars[0], odd.invars[0], eqn.outvars[0])


def _made_by(var, primitive, producer: dict):
  """The equation defining `var`, if it is one of `primitive`."""
  eqn = producer.get(var) if isinstance(var, _compat.Var) else None
  return eqn if eqn is not None and eqn.primitive is primitive else None


def _leading(eqn, axis: int) -> bool:
  """Whether a `slice` equation takes element 0 along `axis` and all of other axes."""
  shape = eqn.invars[0].aval.shape
  strides = eqn.params['strides'] or (1,) * len(shape)
  return all(s == 0 and st == 1 and limit == (1 if i == axis else shape[i])
             for i, (s, limit, st) in enumerate(zip(
                 eqn.params['start_indices'], eqn.params['limit_indices'], strides)))


def _halves(eqns, tops: list[Interleave]) -> list | None:
  """`combine`'s inputs: the call's first equations, `E_k[0::2]` then `E_k[1::2]`."""
  count, axis = len(tops), tops[0].axis
  if len(eqns) < 2 * count:
    return None
  halves = []
  for index, eqn in enumerate(eqns[:2 * count]):
    start = index // count
    if (eqn.primitive is not _compat.scan_primitives.slice_p
        or eqn.invars[0] is not tops[index % count].first
        or eqn.params['start_indices'][axis] != start
        or (eqn.params['strides'] or ())[axis:axis + 1] != (2,)):
      return None
    halves.append(eqn.outvars[0])
  return halves


def _combined(odd, producer: dict):
  """`combine`'s result for a leaf, from the odd elements of its scan."""
  nested = interleave(producer[odd], producer) if odd in producer else None
  return odd if nested is None else nested.first


def _combine_jaxpr(eqns, producer: dict, invars: list, outvars: list, elems: set):
  """The equations computing `outvars` from `invars`, as a jaxpr; None if they read
  a whole leaf (then they are not `fn` on the halves)."""
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
