"""`flax.linen.experimental`'s modules for this package's modules: `layers_with_named_axes`.

Not imported by ``import linen_ext``, as Flax's is not by ``import flax.linen``.
"""
