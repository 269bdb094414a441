"""Graph-level ops, one file per family; importing this package registers them all."""

from ..ir.op_registry import OPS, DeductionError, OpDefinition, call_op, get_op, register_op
from . import attention, convolution, creation, elementwise, image, indexing, kv_cache, linear_algebra, logic, manipulation, nn, normalization, packed_weights, quantization, recurrent, reduction, rotary, sequence  # noqa: F401  (registration)
from .common import UnknownShapeError
from .manipulation import ReshapeInferenceError, strided_slice

__all__ = [
    "OPS", "DeductionError", "OpDefinition", "ReshapeInferenceError", "UnknownShapeError", "call_op",
    "get_op", "register_op", "strided_slice",
]
