"""ONNX Gather, GatherElements, GatherND, ScatterElements (and the older Scatter), ScatterND,
NonZero, ReverseSequence and OneHot.

A Gather by one index known at compile time (a constant, or a symbolic prim value such as
``Shape(x)[1] - 1``) is a ``strided_slice`` plus a ``reshape`` that drops the axis, which
lower to the GPU; other gathers and scatters are the ``relaxweb/ops/indexing.py`` ops (no
GPU lowering yet: indirect loads).  NonZero's count is data-dependent: its result is matched
against ``[rank, <fresh size var>]`` so later ops have a shape to work with.  OneHot's depth
decides the result's shape: known at compile time (a constant of any numeric type, or a
symbolic value such as ``Shape(x)[1]``) it gives the result a full shape; a depth computed at
run time is read back on the GPU.
"""

from __future__ import annotations

from ...ir.expr import Constant, PrimValue, ShapeExpr
from ...ir.struct_info import TensorStructInfo
from ...ir.symbolic import IntImm, PrimExpr, as_int, prove_less, simplify
from ...ops import call_op, strided_slice
from .manipulation import fail, fresh_size_var, known_dims, node_name
from .registry import converter
from .shape_values import compile_time_ints, materialize

BIG = 2**63 - 1


@converter("Gather")
def convert_gather(context, node, inputs):
    data, indices = inputs
    axis = int(context.attributes(node).get("axis", 0))
    index = compile_time_ints(indices) if indices is not None else None
    scalar = index is not None and (isinstance(indices, PrimValue) or (
        isinstance(indices, Constant) and indices.data.ndim == 0))
    if scalar:
        data, dims = known_dims(context, node, data)
        if not -len(dims) <= axis < len(dims):
            raise fail(node, f"axis {axis} is out of range for rank {len(dims)}")
        axis = axis + len(dims) if axis < 0 else axis
        position = index[0]
        constant = as_int(position)
        if constant is not None:
            if as_int(dims[axis]) is not None and not -as_int(dims[axis]) <= constant < as_int(dims[axis]):
                raise fail(node, f"index {constant} is out of range for dimension {axis} ({as_int(dims[axis])})")
            end = BIG if constant == -1 else constant + 1
            begin = constant
        else:
            if prove_less(position, 0):
                position = simplify(position + dims[axis])
            begin, end = position, simplify(position + 1)
        piece = context.builder.emit(strided_slice(data, [axis], [begin], [end]), node_name(node) + "_slice")
        return call_op("reshape", piece, ShapeExpr(tuple(d for i, d in enumerate(dims) if i != axis)))
    return call_op("take", data, materialize(context, indices), axis=axis)


@converter("GatherElements")
def convert_gather_elements(context, node, inputs):
    return call_op("gather_elements", inputs[0], inputs[1], axis=int(context.attributes(node).get("axis", 0)))


@converter("GatherND")
def convert_gather_nd(context, node, inputs):
    return call_op("gather_nd", inputs[0], inputs[1], batch_dims=int(context.attributes(node).get("batch_dims", 0)))


def _reduction(context, node) -> str:
    value = context.attributes(node).get("reduction", "none")
    return value.decode() if isinstance(value, bytes) else str(value)


@converter("ScatterElements", "Scatter")
def convert_scatter_elements(context, node, inputs):
    attrs = context.attributes(node)
    return call_op("scatter_elements", *inputs, axis=int(attrs.get("axis", 0)), reduction=_reduction(context, node))


@converter("ScatterND")
def convert_scatter_nd(context, node, inputs):
    return call_op("scatter_nd", *inputs, reduction=_reduction(context, node))


@converter("NonZero")
def convert_nonzero(context, node, inputs):
    found = context.builder.emit(call_op("nonzero", inputs[0]), node_name(node) + "_found")
    info = inputs[0].struct_info
    if not isinstance(info, TensorStructInfo) or info.ndim == -1:
        return found
    count = fresh_size_var(context, f"{node.output[0]}_count")
    return context.builder.emit_match_cast(found, TensorStructInfo((IntImm(info.ndim), count), "int64"),
                                           node_name(node) + "_cast")


@converter("ReverseSequence")
def convert_reverse_sequence(context, node, inputs):
    attrs = context.attributes(node)
    return call_op("reverse_sequence", inputs[0], materialize(context, inputs[1]),
                   batch_axis=int(attrs.get("batch_axis", 1)), time_axis=int(attrs.get("time_axis", 0)))


def _one_hot_depth(depth) -> int | PrimExpr | None:
    """OneHot's depth when known at compile time: an int, or a symbolic value (a float
    constant is truncated, as ONNX casts it to int64); None when known only at run time."""
    if isinstance(depth, Constant) and depth.data.size == 1 and depth.data.dtype.kind in "fiu":
        return int(depth.data.reshape(-1)[0])
    values = compile_time_ints(depth)
    if values is None or len(values) != 1:
        return None
    value = simplify(values[0])
    return value if as_int(value) is None else int(as_int(value))


@converter("OneHot")
def convert_one_hot(context, node, inputs):
    indices, depth, values = inputs
    axis = int(context.attributes(node).get("axis", -1))
    known = _one_hot_depth(depth)
    if isinstance(known, int):
        return call_op("one_hot", indices, values, depth=known, axis=axis)
    # a symbolic depth (a prim value), or one computed at run time (read back on the GPU)
    depth = PrimValue(known) if known is not None else materialize(context, depth)
    return call_op("one_hot", indices, values, depth, axis=axis)
