"""The one place where `lift` touches JAX internals.

Keep every import that is not public JAX API here, so that a JAX upgrade is a
change to this file only. Tested against the versions in pyproject.toml.
"""
from __future__ import annotations

import glob as _glob
import importlib.util as _importlib_util
import os as _os
import sysconfig as _sysconfig

import numpy as _np

from jax._src import hardware_utils as _hardware_utils
from jax._src import traceback_util as _traceback_util


# --- libtpu on a machine without TPU chips (run on import, before JAX starts a backend).
# With libtpu installed (the `[tpu]` extra: the compiler `tpu_topology` uses), JAX's first
# operation starts every backend it knows, the TPU one too: libtpu initialises as a runtime,
# and where JAX found no chip it has set TPU_SKIP_MDS_QUERY (no metadata server to ask), so
# libtpu reads the worker hostnames and accelerator type from the environment, finds
# neither, prints an `E0000 ... INVALID_ARGUMENT ... TPU_WORKER_HOSTNAMES` error and
# "could not determine TPU accelerator type" on stderr, then fails quietly (JAX carries on
# with the CPU). libtpu does the same when `jax.experimental.topologies` first loads it.
# Saying what such a machine is (one host, itself) makes it fail quietly, and changes
# neither the topologies it describes nor what it compiles for them.
LIBTPU_SINGLE_HOST = {'TPU_WORKER_HOSTNAMES': 'localhost', 'TPU_HOST_BOUNDS': '1,1,1'}
# Any of these set means someone configured libtpu: leave the environment as it is.
_LIBTPU_SETTINGS = ('TPU_WORKER_HOSTNAMES', 'TPU_HOST_BOUNDS', 'TPU_ACCELERATOR_TYPE',
                    'TPU_CHIPS_PER_HOST_BOUNDS', 'TPU_PROCESS_BOUNDS',
                    'TPU_CHIPS_PER_PROCESS_BOUNDS', 'TPU_PROCESS_ADDRESSES',
                    'TPU_VISIBLE_CHIPS', 'TPU_VISIBLE_DEVICES', 'JAX_FORCE_TPU_INIT')


def tpu_chips_present() -> bool:
  """Whether this machine may have TPU chips: JAX's count of them on the PCI bus, or a
  TPU's device files (``/dev/accel*``, a VFIO group). True where that cannot be told."""
  try:
    chips, _ = _hardware_utils.num_available_tpu_chips_and_device_id()
    vfio_groups = ([name for name in _os.listdir('/dev/vfio') if name != 'vfio']
                   if _os.path.isdir('/dev/vfio') else [])
  except (AttributeError, OSError, ValueError):
    return True
  return chips > 0 or bool(_glob.glob('/dev/accel*')) or bool(vfio_groups)


def quiet_libtpu_without_chips() -> bool:
  """Sets `LIBTPU_SINGLE_HOST` in the environment where libtpu is installed, this machine
  has no TPU chip and nothing configures libtpu already; whether it did. JAX's platform
  choice (``JAX_PLATFORMS``) is never touched, and a machine with TPUs is left alone."""
  installed = bool(_os.environ.get('TPU_LIBRARY_PATH')) or (
      _importlib_util.find_spec('libtpu') is not None)
  if (not installed or any(name in _os.environ for name in _LIBTPU_SETTINGS)
      or tpu_chips_present()):
    return False
  _os.environ.update(LIBTPU_SINGLE_HOST)
  return True


quiet_libtpu_without_chips()


# Folders of the packages whose frames are hidden: source locations skip them too.
_LIBRARY_FOLDERS: list[str] = []


def hide_from_tracebacks(package_file: str) -> None:
  """Hides a package's frames from user tracebacks, as JAX does for its own."""
  folder = _os.path.dirname(package_file)
  _traceback_util.register_exclusion(folder)
  _LIBRARY_FOLDERS.append(folder + _os.sep)


# --- as_scan (lift.causal): jaxpr types, primitives, custom-primitive hooks.
import jax as _jax
from jax import lax as _lax
from jax.extend import linear_util as _lu
import jax.core as _jax_core
import jax.extend.core as _jex_core
from jax.extend.core import primitives as scan_primitives  # noqa: F401
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _batching
from jax.interpreters import mlir as _mlir
from jax._src.interpreters import mlir as _mlir_internal
from jax._src.lib.mlir.dialects import hlo as _hlo
from jax._src import source_info_util as _source_info_util
from jax._src.interpreters import partial_eval as _pe
from jax._src import core as _core_internal
from jax._src.lax.control_flow import loops as _loops
from jax._src.lax import lax as _lax_internal

Primitive = _jex_core.Primitive
ClosedJaxpr = _jex_core.ClosedJaxpr
Jaxpr = _jex_core.Jaxpr
JaxprEqn = _jex_core.JaxprEqn
Literal = _jex_core.Literal
Var = _jex_core.Var
DropVar = _jex_core.DropVar
Tracer = _jax_core.Tracer
jaxpr_as_fun = _jex_core.jaxpr_as_fun
convert_constvars_jaxpr = _pe.convert_constvars_jaxpr


def prune_jaxpr(jaxpr: ClosedJaxpr, used_outputs: list[bool]) -> tuple[ClosedJaxpr, list[bool]]:
  """`jaxpr` cut down to the used outputs (through nested jaxprs: pjit, checkpoint,
  ...), and for each of its inputs whether those outputs read it."""
  pruned, used_consts, used_inputs = _pe.dce_jaxpr_consts(jaxpr.jaxpr, used_outputs)
  consts = [c for c, used in zip(jaxpr.consts, used_consts) if used]
  return ClosedJaxpr(pruned, consts), used_inputs


def without_dead_code(jaxpr: Jaxpr) -> Jaxpr:
  """`jaxpr` without the equations its outputs do not need (through nested jaxprs);
  its constvars, invars and outvars are kept, effects too."""
  return _pe.dce_jaxpr_consts(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)[0]


split_p = _lax.split_p
stack_p = _lax_internal.stack_p  # jnp.stack, jnp.unstack: not in jax.extend
unstack_p = _lax_internal.unstack_p
new_equation = _core_internal.new_jaxpr_eqn


def new_jaxpr(invars: list, outvars: list, eqns: list, name: str) -> Jaxpr:
  """A jaxpr without constvars made of existing equations; `name` is what it computes."""
  effects = frozenset().union(*(eqn.effects for eqn in eqns))
  return Jaxpr([], invars, outvars, eqns, effects,
               _core_internal.DebugInfo("as_scan", name, None, None))


def _nested_codes(code) -> set:
  codes = {code}
  for const in code.co_consts:
    if hasattr(const, 'co_code'):
      codes |= _nested_codes(const)
  return codes


# The code of `lax.associative_scan` and of the functions defined in it: an equation
# traced while one of them ran is part of an associative scan.
_ASSOCIATIVE_SCAN_CODES = _nested_codes(
    getattr(_loops.associative_scan, '__wrapped__', _loops.associative_scan).__code__)


def associative_scan_site(eqn: JaxprEqn) -> tuple | None:
  """Where the user called `lax.associative_scan`, if `eqn` was traced inside such a
  call: the frames outside it, as a key equal for the equations of one call site."""
  traceback = eqn.source_info.traceback
  if traceback is None:
    return None
  codes, lasti = traceback.raw_frames()  # innermost frame first
  inside = [i for i, code in enumerate(codes) if code in _ASSOCIATIVE_SCAN_CODES]
  if not inside:
    return None
  return tuple(zip(codes[inside[-1] + 1:], lasti[inside[-1] + 1:]))


def evaluate_known(flat_fn, inputs: list, debug_info) -> list | None:
  """``flat_fn(*inputs)`` where some inputs are ``jax.ShapeDtypeStruct`` placeholders.

  Partial evaluation: operations on values run, those that need a placeholder
  are only traced. Returns the outputs, or None if one needs a placeholder.
  """
  partial = [_pe.PartialVal.unknown(_jax_core.ShapedArray(x.shape, x.dtype))
             if isinstance(x, _jax.ShapeDtypeStruct) else _pe.PartialVal.known(x) for x in inputs]
  _, outs, _ = _pe.trace_to_jaxpr_nounits(_lu.wrap_init(flat_fn, debug_info=debug_info), partial)
  if any(unknown is not None for unknown, _ in outs):  # (aval if unknown, value)
    return None
  return [value for _, value in outs]


def user_frame(eqn: JaxprEqn):
  """The frame of the user code that produced `eqn` (with `file_name`,
  `start_line`, `start_column`, `function_name`): the innermost one outside JAX
  and the packages that hide their frames; None if there is none."""
  folders = tuple(_LIBRARY_FOLDERS)
  frames = _source_info_util.user_frames(eqn.source_info.traceback)
  return next((f for f in frames if not f.file_name.startswith(folders)), None)


def source_summary(eqn: JaxprEqn) -> str:
  """`file.py:line:column (function)` of the user code that produced `eqn`."""
  frame = user_frame(eqn)
  if frame is None:
    return _source_info_util.summarize(eqn.source_info)
  column = f":{frame.start_column}" if frame.start_column else ""
  return f"{frame.file_name}:{frame.start_line}{column} ({frame.function_name})"


def call_site(eqn: JaxprEqn) -> tuple:
  """The frames outside JAX that produced `eqn`, as a key: JAX gives the loops
  it derives from a loop (partial evaluation, transposition) the same ones."""
  return tuple((f.file_name, f.start_line, f.start_column, f.function_name)
               for f in _source_info_util.user_frames(eqn.source_info.traceback))


_INSTALLED = tuple(_sysconfig.get_paths()[key] for key in ('purelib', 'platlib'))


def user_site(eqn: JaxprEqn) -> tuple:
  """`call_site` without the frames of the packages that hide theirs: a library's loop
  and the one its hand-written backward pass runs (a custom VJP) differ only in those."""
  folders = tuple(_LIBRARY_FOLDERS)
  return tuple(site for site in call_site(eqn) if not site[0].startswith(folders))


def operation_frame(eqn: JaxprEqn) -> tuple | None:
  """(frame, None) for the user's code that traced `eqn`: the innermost frame outside
  JAX, the packages that hide their frames and the installed ones (Flax's layers), else
  as `user_frame`. Where the traceback stops inside a package that hides its frames (a
  function it traced with `jax.make_jaxpr`): (that package's innermost frame, its module
  name: ``lift.causal.attention``). None where JAX alone made `eqn`."""
  frames = list(_source_info_util.user_frames(eqn.source_info.traceback))
  folders = tuple(_LIBRARY_FOLDERS)
  users = [f for f in frames if not f.file_name.startswith(folders)]
  own = [f for f in users if not f.file_name.startswith(_INSTALLED)]
  if users:
    return (own or users)[0], None
  if not frames:
    return None
  inner = frames[0]
  folder = next(f for f in _LIBRARY_FOLDERS if inner.file_name.startswith(f))
  relative = _os.path.relpath(inner.file_name, _os.path.dirname(folder.rstrip(_os.sep)))
  return inner, _os.path.splitext(relative)[0].replace(_os.sep, '.')


def name_stack_parts(eqn: JaxprEqn) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(transform names, scope names) of `eqn`'s name stack, outermost first:
  `transpose` marks what a backward pass computes, `rematted_computation` a
  forward computation that `jax.checkpoint` repeats in it."""
  stack = eqn.source_info.name_stack.stack
  transforms = tuple(e.name for e in stack if isinstance(e, _source_info_util.Transform))
  scopes = tuple(e.name for e in stack if isinstance(e, _source_info_util.Scope))
  return transforms, scopes


def user_location(traceback) -> str:
  """`file.py:line (function)` of the innermost frame of an exception's traceback outside
  JAX, the standard library and the packages that hide their frames."""
  folders = tuple(_LIBRARY_FOLDERS)
  found = "an unknown location"
  while traceback is not None:
    code = traceback.tb_frame.f_code
    if (_source_info_util.is_user_filename(code.co_filename)
        and not code.co_filename.startswith(folders)):
      found = f"{code.co_filename}:{traceback.tb_lineno} ({code.co_name})"
    traceback = traceback.tb_next
  return found


def bind_equation(eqn: JaxprEqn, args: list) -> list:
  """Evaluates one jaxpr equation on `args`, as `jax.core.eval_jaxpr` does."""
  params = eqn.primitive.get_bind_params(eqn.params)
  outs = eqn.primitive.bind(*args, **params)
  return list(outs) if eqn.primitive.multiple_results else [outs]


def define_primitive_rules(prim: Primitive, *, impl, abstract_eval, jvp,
                           batch, batch_takes_spmd_axis: bool = False) -> None:
  """Registers evaluation, lowering, JVP and batching rules of `prim`.

  `jvp(primals, tangents, **params)` receives instantiated (dense) tangents;
  `batch(args, dims, **params) -> (outs, out_dims)` receives `None` for
  unbatched arguments; with `batch_takes_spmd_axis`, also `spmd_axis_name=`: the
  mesh axes the batched axis is sharded over (`jax.vmap`'s), for a rule that vmaps
  again to pass on.
  """
  prim.multiple_results = True
  prim.def_impl(impl)
  prim.def_abstract_eval(abstract_eval)
  _mlir.register_lowering(prim, _mlir.lower_fun(impl, multiple_results=True))

  def dense_jvp(primals, tangents, **params):
    tangents = [_ad.instantiate_zeros(t) for t in tangents]
    return jvp(primals, tangents, **params)

  _ad.primitive_jvps[prim] = dense_jvp
  if not batch_takes_spmd_axis:
    _batching.primitive_batchers[prim] = batch
    return

  def batch_on_axis(axis_data, args, dims, **params):
    return batch(args, dims, spmd_axis_name=axis_data.spmd_name, **params)
  _batching.fancy_primitive_batchers[prim] = batch_on_axis


def define_linear_primitive(prim: Primitive, *, impl, lowering, abstract_eval,
                            transpose, batch) -> None:
  """Registers the rules of a primitive that is linear in all its operands.

  The primitive has multiple results. Its JVP applies `prim` to the
  tangents. `transpose(cotangents, *operands, **params)` receives dense
  cotangents and `ad.UndefinedPrimal` operands; it returns one cotangent or
  None per operand. `lowering(ctx, *operands, **params)` is a lowering rule
  emitting StableHLO (see `lower_dynamic_rows`); `impl` runs eagerly.
  """
  prim.multiple_results = True
  prim.def_impl(impl)
  prim.def_abstract_eval(abstract_eval)
  _mlir.register_lowering(prim, lowering)

  def dense_transpose(cotangents, *operands, **params):
    return transpose([_ad.instantiate_zeros(c) for c in cotangents], *operands, **params)

  _ad.deflinear2(prim, dense_transpose)
  _batching.primitive_batchers[prim] = batch


def lower_function(ctx, fn, avals_in, avals_out, *operands) -> list:
  """Inside a lowering rule: the StableHLO values of ``fn(*operands)``, traced with JAX."""
  sub = ctx.replace(avals_in=list(avals_in), avals_out=list(avals_out))
  return list(_mlir.lower_fun(fn, multiple_results=True)(sub, *operands))


def lower_dynamic_rows(ctx, aval, x, starts) -> list:
  """Inside a lowering rule: row ``starts[i]`` of `x` (of abstract value `aval`), for each i.

  A start is a StableHLO scalar value or a Python int (a constant).
  """
  sliced = aval.update(shape=(1,) + aval.shape[1:])
  row = aval.update(shape=aval.shape[1:])
  sub = ctx.replace(avals_in=[aval], avals_out=[sliced])
  zero = _mlir_internal.ir_constant(_np.int32(0))
  indices = lambda start: [_mlir_internal.ir_constant(_np.int32(start)) if isinstance(start, int)
                           else start] + [zero] * len(row.shape)
  return [_mlir_internal.reshape(sub, _mlir_internal.dynamic_slice(sub, sliced, x, start_indices=indices(start)),
                        row)
          for start in starts]


def lower_stack(ctx, avals, rows):
  """Inside a lowering rule: `rows` (of abstract values `avals`) stacked on a new axis 0."""
  first = avals[0]
  sub = ctx.replace(avals_in=list(avals), avals_out=[first.update(shape=(1,) + first.shape)])
  expanded = [_mlir_internal.reshape(sub, r, sub.avals_out[0]) for r in rows]
  return _hlo.concatenate(expanded, _mlir_internal.i64_attr(0))


def is_undefined_primal(x) -> bool:
  """Whether `x` is an operand being transposed (not a known value)."""
  return _ad.is_undefined_primal(x)


# --- scan rewrites (lift.scan_rewrites): equation contexts and sub-jaxpr parameters.
import contextlib as _contextlib


@_contextlib.contextmanager
def equation_context(eqn: JaxprEqn | None):
  """Binds made inside keep `eqn`'s source location, name stack and context."""
  if eqn is None:
    yield
    return
  name_stack = _source_info_util.current_name_stack() + eqn.source_info.name_stack
  with (_source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
        eqn.ctx.manager):
    yield


def traced_jaxpr(flat_fn, avals: list) -> ClosedJaxpr:
  """The closed jaxpr of ``flat_fn`` on abstract values `avals` (weak types kept)."""
  specs = [_jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
  return _jax.make_jaxpr(flat_fn)(*specs)


def subjaxprs(eqn: JaxprEqn) -> list[Jaxpr]:
  """The (open) jaxprs in `eqn`'s parameters: a scan's body, a cond's branches, ..."""
  found = []
  for value in eqn.params.values():
    for sub in value if isinstance(value, tuple) else (value,):
      if isinstance(sub, ClosedJaxpr):
        found.append(sub.jaxpr)
      elif isinstance(sub, Jaxpr):
        found.append(sub)
  return found


def is_differentiated(value) -> bool:
  """Whether `value` is being differentiated (a forward-mode or linearize tracer)."""
  return isinstance(value, (_ad.JVPTracer, _ad_internal.LinearizeTracer))


from jax._src.interpreters import ad as _ad_internal  # noqa: E402
