"""ONNX Reshape, Transpose and Constant."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedModelError
from ...ir.expr import ShapeExpr, tensor_shape
from ...ir.symbolic import format_expr, product, prove_equal, simplify
from ...ops import call_op
from .registry import NodeConversionError, converter, tensor_to_array


@converter("Reshape")
def convert_reshape(context, node, inputs):
    """Resolve 0 (copy the input dim) and -1 (infer) symbolically, then reshape."""
    data = inputs[0]
    target = [int(v) for v in context.constant_value(inputs[1], node, "the target shape")]
    attrs = context.attributes(node)
    input_shape = tensor_shape(data)
    dims = []
    for position, value in enumerate(target):
        if value == 0 and not attrs.get("allowzero", 0):
            if position >= len(input_shape):
                raise NodeConversionError(
                    f"Reshape node '{node.name}': target dim {position} is 0 (copy the input's), "
                    f"but the input has only {len(input_shape)} dims"
                )
            dims.append(input_shape[position])
        else:
            dims.append(simplify(value))
    if sum(1 for v in target if v == -1) > 1:
        raise NodeConversionError(f"Reshape node '{node.name}': more than one -1 in the target shape")
    if -1 in target:
        known = product(d for d, v in zip(dims, target) if v != -1)
        inferred = simplify(product(input_shape) // known)
        if not prove_equal(inferred * known, product(input_shape)):
            raise UnsupportedModelError(
                f"Reshape node '{node.name}': cannot infer -1: {format_expr(product(input_shape))} "
                f"elements are not provably a multiple of {format_expr(known)}"
            )
        dims[target.index(-1)] = inferred
    return call_op("reshape", data, ShapeExpr(tuple(dims)))


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
