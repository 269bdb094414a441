"""ONNX reductions (Reduce*), ArgMax / ArgMin, CumSum, CumProd and TopK.

Axes, ``k`` and the CumSum / CumProd axis decide the result's shape (or the program), so they should
be known at compile time: an attribute, or (in the opsets that made them inputs: ReduceSum
13, the other reductions 18, TopK 10, CumSum always) a constant input — an initializer, a
Constant node or a value the importer folded.  An input computed at run time is passed on
as a tensor argument: the result's shape is then unknown (its rank usually is), the model
runs in the reference interpreter, and building it for the GPU says that those inputs must
be constants.

``noop_with_empty_axes``: with no axes (input absent or empty) every axis is reduced, unless
the flag is set, in which case none is (ReduceSumSquare still squares, as ONNX specifies).
"""

from __future__ import annotations

import numpy as np

from ...ir.expr import Constant, TupleGetItem
from ...ir.struct_info import TensorStructInfo
from ...ir.symbolic import as_int
from ...ops import call_op, get_op
from .elementwise import known_dtypes
from .registry import NodeConversionError, converter

# ONNX op -> (IR op, opset from which the axes are an input)
REDUCTIONS = {
    "ReduceSum": ("sum", 13),
    "ReduceMean": ("mean", 18),
    "ReduceMax": ("max", 18),
    "ReduceMin": ("min", 18),
    "ReduceProd": ("prod", 18),
    "ReduceL1": ("l1_norm", 18),
    "ReduceL2": ("l2_norm", 18),
    "ReduceSumSquare": ("sum_square", 18),
    "ReduceLogSum": ("log_sum", 18),
    "ReduceLogSumExp": ("log_sum_exp", 18),
}


def _integers(context, node, expr, what: str) -> list[int]:
    return [int(v) for v in np.asarray(context.constant_value(expr, node, what)).reshape(-1)]


def _data_info(node, data) -> TensorStructInfo:
    info = data.struct_info
    if not isinstance(info, TensorStructInfo):
        raise NodeConversionError(f"{node.op_type} node '{node.name}': input 0 must be a tensor, got {info}")
    return info


@converter(*REDUCTIONS)
@known_dtypes
def convert_reduce(context, node, inputs):
    op, axes_input_since = REDUCTIONS[node.op_type]
    attrs = context.attributes(node)
    data = inputs[0]
    keepdims = bool(attrs.get("keepdims", 1))
    if context.opset >= axes_input_since:
        axes_expr = inputs[1] if len(inputs) > 1 else None
        if axes_expr is not None and not isinstance(axes_expr, Constant):
            return call_op(op, data, axes_expr, keepdims=keepdims,
                           noop_with_empty_axes=bool(attrs.get("noop_with_empty_axes", 0)))
        axes = _integers(context, node, axes_expr, "the axes") if axes_expr is not None else None
    else:
        axes = [int(a) for a in attrs["axes"]] if "axes" in attrs else None
    if not axes:
        axes = [] if attrs.get("noop_with_empty_axes", 0) else None
    op_attrs = {"axes": axes, "keepdims": keepdims}
    info = _data_info(node, data)
    if info.shape is not None and any(as_int(d) == 0 for d in info.shape):
        dims = [as_int(d) for d in info.shape]
        if all(d is not None for d in dims):
            # an empty input: the result (the reduction's identity) is known now
            empty = np.zeros(dims, dtype=np.dtype(info.dtype))
            return context.constant(get_op(op).reference([empty], op_attrs), node.output[0])
    if op == "mean" and not info.dtype.startswith("float"):
        # an integer mean, computed in float64 and truncated back
        wide = context.builder.emit(call_op("cast", data, dtype="float64"), "mean_wide")
        mean = context.builder.emit(call_op("mean", wide, **op_attrs), "mean")
        return call_op("cast", mean, dtype=info.dtype)
    return call_op(op, data, **op_attrs)


@converter("ArgMax", "ArgMin")
@known_dtypes
def convert_arg(context, node, inputs):
    attrs = context.attributes(node)
    return call_op(
        node.op_type.lower(), inputs[0], axis=int(attrs.get("axis", 0)), keepdims=bool(attrs.get("keepdims", 1)),
        select_last_index=bool(attrs.get("select_last_index", 0)),
    )


@converter("CumSum", "CumProd")
@known_dtypes
def convert_cumulative(context, node, inputs):
    op = {"CumSum": "cumsum", "CumProd": "cumprod"}[node.op_type]
    attrs = context.attributes(node)
    flags = {"exclusive": bool(attrs.get("exclusive", 0)), "reverse": bool(attrs.get("reverse", 0))}
    if not isinstance(inputs[1], Constant):
        return call_op(op, inputs[0], inputs[1], **flags)
    axis = _integers(context, node, inputs[1], "the axis")
    if len(axis) != 1:
        raise NodeConversionError(f"{node.op_type} node '{node.name}': the axis must be one value, got {axis}")
    return call_op(op, inputs[0], axis=axis[0], **flags)


@converter("TopK")
@known_dtypes
def convert_topk(context, node, inputs):
    attrs = context.attributes(node)
    options = {"axis": int(attrs.get("axis", -1)), "largest": bool(attrs.get("largest", 1))}
    if context.opset >= 10 and not isinstance(inputs[1], Constant):
        topk = context.builder.emit(call_op("topk", inputs[0], inputs[1], **options), "topk")
        return [TupleGetItem(topk, 0), TupleGetItem(topk, 1)]
    if context.opset >= 10:
        k = _integers(context, node, inputs[1], "k")
        if len(k) != 1:
            raise NodeConversionError(f"TopK node '{node.name}': k must be one value, got {k}")
        k = k[0]
    else:
        k = int(attrs["k"])
    topk = context.builder.emit(call_op("topk", inputs[0], k=k, **options), "topk")
    return [TupleGetItem(topk, 0), TupleGetItem(topk, 1)]
