"""ONNX Reshape, Transpose and Constant."""

from __future__ import annotations

import numpy as np

from ...ir.expr import ShapeExpr, tensor_shape
from ...ir.symbolic import simplify
from ...ops import ReshapeInferenceError, call_op
from .registry import NodeConversionError, converter, tensor_to_array


@converter("Reshape")
def convert_reshape(context, node, inputs):
    """Resolve ONNX's 0 (copy the input dim, unless allowzero); the reshape op infers -1."""
    data = inputs[0]
    target = [int(v) for v in context.constant_value(inputs[1], node, "the target shape")]
    attrs = context.attributes(node)
    dims = []
    for position, value in enumerate(target):
        if value == 0 and not attrs.get("allowzero", 0):
            input_shape = tensor_shape(data)
            if position >= len(input_shape):
                raise NodeConversionError(
                    f"Reshape node '{node.name}': target dim {position} is 0 (copy the input's), "
                    f"but the input has only {len(input_shape)} dims"
                )
            dims.append(input_shape[position])
        else:
            dims.append(simplify(value))
    try:
        return call_op("reshape", data, ShapeExpr(tuple(dims)))
    except ReshapeInferenceError as error:
        # Valid for some sizes but not provably for all: unsupported rather than invalid.
        raise NodeConversionError(f"Reshape node '{node.name}': {error}") from None


@converter("Transpose")
def convert_transpose(context, node, inputs):
    attrs = context.attributes(node)
    rank = len(tensor_shape(inputs[0]))
    permutation = list(attrs.get("perm", range(rank - 1, -1, -1)))
    return call_op("transpose", inputs[0], axes=permutation)


@converter("Constant")
def convert_constant(context, node, inputs):
    """A Constant node is a weight like an initializer (value, or value_float(s)/int(s))."""
    attrs = context.attributes(node)
    if "value" in attrs:
        data = tensor_to_array(attrs["value"])
    elif "value_float" in attrs:
        data = np.array(attrs["value_float"], dtype=np.float32)
    elif "value_floats" in attrs:
        data = np.array(attrs["value_floats"], dtype=np.float32)
    elif "value_int" in attrs:
        data = np.array(attrs["value_int"], dtype=np.int64)
    elif "value_ints" in attrs:
        data = np.array(attrs["value_ints"], dtype=np.int64)
    else:
        raise NodeConversionError(
            f"Constant node '{node.name}': only value, value_float(s) and value_int(s) are supported"
        )
    return context.constant(data, node.output[0])
