import jax

# Strict numerics: catch silent dtype and rank promotion in library code.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
