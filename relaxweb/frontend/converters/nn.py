"""ONNX Softmax (both its pre-13 'flatten from axis' form and the per-axis form)."""

from __future__ import annotations

from ...ir.expr import tensor_shape
from ...ops import call_op
from .registry import NodeConversionError, converter


@converter("Softmax")
def convert_softmax(context, node, inputs):
    rank = len(tensor_shape(inputs[0]))
    attrs = context.attributes(node)
    default_axis = -1 if context.opset >= 13 else 1
    axis = int(attrs.get("axis", default_axis))
    if axis < 0:
        axis += rank
    if context.opset >= 13:
        if axis != rank - 1:
            raise NodeConversionError(
                f"Softmax node '{node.name}': axis {axis} of a {rank}-d tensor is not supported yet (only the last axis)"
            )
        axes = [axis]
    else:
        axes = list(range(axis, rank))
    return call_op("softmax", inputs[0], axes=axes)
