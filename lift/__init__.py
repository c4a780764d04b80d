"""lift: lifted JAX transformations over stateful scopes."""
from lift import errors
from lift.errors import LiftError, ScanConversionError
