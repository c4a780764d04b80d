import os
import pathlib

import jax
import pytest

# libtpu is installed as the compiler of the at-scale tests (they compile for abstract
# TPU chips), not as a backend: without JAX_PLATFORMS every process the suite starts would
# first try, and fail, to start a TPU. It takes a machine-wide lock unless told that
# several processes (the suite's workers) may load it.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# Strict numerics: catch silent dtype and rank promotion in library code.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

# Many tests compile the same small programs (one model under several transforms, the
# same layer in several files). JAX's persistent compilation cache, keyed by the
# program, lets every worker (and the 8-device child processes, through the
# environment) compile each of them once: the suite runs about a third faster.
# Entries are identical executables, so no result depends on it.
CACHE = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
CACHE_SETTINGS = {
    "jax_compilation_cache_dir": str(CACHE),
    "jax_persistent_cache_min_compile_time_secs": 0,
    "jax_persistent_cache_min_entry_size_bytes": -1,
}
for name, value in CACHE_SETTINGS.items():
  jax.config.update(name, value)
  os.environ[name.upper()] = str(value)

# Not done: compiling the tests without LLVM's optimisation (`--xla_backend_optimization_level
# =0`) saves a third of a cold run, but changes the last bit of some initial values between
# two programs (ours and Flax's), which the parity tests compare bitwise. -O1 keeps them
# equal but saved under a tenth of a fresh-clone run and moved one docs example's
# gradients (remat against none) past its 1e-6.


TESTS = pathlib.Path(__file__).resolve().parent
# Leak checking turns off some of JAX's tracing caches: about 1.8x the time of the tests it
# covers, 2.8x that of the Module tests. The suite checks the tests of lift's scopes and
# transforms (tests/lift, not its loops/ and as_scan/ folders, which hold no scopes; every
# Module transform is one of lift's); LIFT_CHECK_LEAKS=all checks every test of lift and
# linen_ext.
CHECK_ALL_LEAKS = os.environ.get("LIFT_CHECK_LEAKS") == "all"


def _leak_checked(path: pathlib.Path) -> bool:
  if CHECK_ALL_LEAKS:
    return any(folder in path.parents for folder in (TESTS / "lift", TESTS / "linen_ext"))
  return path.parent == TESTS / "lift"


@pytest.fixture(autouse=True)
def no_leaked_tracers(request):
  """The tests `_leak_checked` names run under `jax.checking_leaks()`: a tracer that outlives
  its trace (held by a scope, a module or a cache) fails the test."""
  exempt = request.node.get_closest_marker("tracer_leaks_outside")
  if exempt or not _leak_checked(pathlib.Path(str(request.fspath))):
    yield
    return
  with jax.checking_leaks():
    yield


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "tracer_leaks_outside: JAX or Flax itself keeps this test's tracers (JAX's "
      "partial evaluation with effects, Flax's checkpoint); not leak-checked")


# Files of long tests (child processes, the main job, the docs site, mypy), run first: with
# pytest-xdist a long test collected last keeps one worker busy after the other is done.
LONG_FIRST = ("test_python_versions.py", "test_scale_out.py", "test_pipeline_multidevice.py",
              "test_train_lm.py",
              "test_docs.py", "test_type_check.py", "test_threads.py",
              "test_shard_map_multidevice.py", "test_benchmark_scripts.py")


def pytest_collection_modifyitems(config, items):
  items.sort(key=lambda item: pathlib.Path(str(item.fspath)).name not in LONG_FIRST)
