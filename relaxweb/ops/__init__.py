"""Graph-level ops, one file per family; importing this package registers them all."""

from . import elementwise, linear_algebra, manipulation, nn  # noqa: F401  (registration)
from .registry import OPS, DeductionError, OpDefinition, call_op, get_op, register_op

__all__ = ["OPS", "DeductionError", "OpDefinition", "call_op", "get_op", "register_op"]
