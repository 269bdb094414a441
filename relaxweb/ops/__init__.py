"""Graph-level ops, one file per family; importing this package registers them all."""

from ..ir.op_registry import OPS, DeductionError, OpDefinition, call_op, get_op, register_op
from . import (  # noqa: F401  (registration)
    attention, concat_split, convolution, creation, elementwise, image, indexing, kv_cache, linear_algebra, logic, nn,
    normalization, packed_weights, paged_kv, pad, quantization, recurrent, reduction, repeat, reshape, rotary, sequence, slicing,
)
from .common import UnknownShapeError
from .reshape import ReshapeInferenceError
from .slicing import strided_slice

__all__ = [
    "OPS", "DeductionError", "OpDefinition", "ReshapeInferenceError", "UnknownShapeError", "call_op",
    "get_op", "register_op", "strided_slice",
]
