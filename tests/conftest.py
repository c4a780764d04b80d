import os
import pathlib

import jax

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
