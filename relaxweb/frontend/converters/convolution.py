"""ONNX Conv, ConvTranspose and pooling (MaxPool, AveragePool, LpPool, and the global ones).

Padding stays symbolic: ``auto_pad=SAME_*`` on a symbolic spatial dim is resolved by the op
from the input's shape (``relaxweb/ops/convolution.py``), so one program serves every size.
"""

from __future__ import annotations

from ...ir.expr import Call, PrimValue, tensor_shape
from ...ir.struct_info import PrimStructInfo, TensorStructInfo
from ...ir.symbolic import as_int, expr_max, prove_less_equal, simplify
from ...ops import call_op
from .nn import text_attr
from .registry import NodeConversionError, converter


def _spatial_attrs(node, attrs, rank: int) -> dict:
    """strides, dilations, padding and auto_pad of a conv or pool node."""
    strides = [int(v) for v in attrs.get("strides", [1] * rank)]
    dilations = [int(v) for v in attrs.get("dilations", [1] * rank)]
    padding = [int(v) for v in attrs.get("pads", [0] * (2 * rank))]
    auto_pad = text_attr(attrs, "auto_pad", "NOTSET") or "NOTSET"
    for name, values, count in (("strides", strides, rank), ("dilations", dilations, rank), ("pads", padding, 2 * rank)):
        if len(values) != count:
            raise NodeConversionError(f"{node.op_type} node '{node.name}': {name} has {len(values)} entries, expected {count}")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise NodeConversionError(f"{node.op_type} node '{node.name}': unknown auto_pad {auto_pad!r}")
    return {"strides": strides, "dilations": dilations, "padding": padding, "auto_pad": auto_pad}


def _spatial_rank(node, data, least: int = 1) -> int:
    rank = len(tensor_shape(data)) - 2
    if rank < least:
        raise NodeConversionError(
            f"{node.op_type} node '{node.name}': needs an input [N, C, spatial...], got {data.struct_info}"
        )
    return rank


def _window_fits(context, node, call: Call, least: int) -> Call:
    """``call`` after a run-time check of each spatial extent of its result that the analyzer
    cannot prove at least ``least`` (1 for a conv, 0 for a pool, as onnxruntime): an input
    smaller than the window stops the run naming the node, instead of an empty or negative
    shape.  (Constant extents are checked by the op's deduction.)"""
    info = call.struct_info
    if not isinstance(info, TensorStructInfo) or info.shape is None:
        return call
    for dim, extent in enumerate(info.shape[2:]):
        if as_int(extent) is None and not prove_less_equal(least, extent):
            context.builder.emit_match_cast(
                PrimValue(extent), PrimStructInfo("int64", simplify(expr_max(extent, least))), "window_checked",
                reason=f"{node.op_type} node '{node.name}': the result's extent along spatial dim {dim} (the window "
                       "must fit the padded input)")
    return call


@converter("Conv")
def convert_conv(context, node, inputs):
    data, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    attrs = context.attributes(node)
    rank = _spatial_rank(node, data)
    kernel = attrs.get("kernel_shape")
    weight_shape = tensor_shape(weight)
    if kernel is not None and len(kernel) != rank:
        raise NodeConversionError(f"Conv node '{node.name}': kernel_shape {list(kernel)} does not match {rank} spatial dims")
    if len(weight_shape) != rank + 2:
        raise NodeConversionError(f"Conv node '{node.name}': the weight {weight.struct_info} needs {rank + 2} dims")
    args = (data, weight) if bias is None else (data, weight, bias)
    return _window_fits(context, node, call_op("conv", *args, groups=int(attrs.get("group", 1)),
                                               **_spatial_attrs(node, attrs, rank)), least=1)


@converter("ConvTranspose")
def convert_conv_transpose(context, node, inputs):
    data, weight = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    attrs = context.attributes(node)
    rank = _spatial_rank(node, data)
    spatial = _spatial_attrs(node, attrs, rank)
    output_padding = [int(v) for v in attrs.get("output_padding", [0] * rank)]
    if len(output_padding) != rank:
        raise NodeConversionError(f"ConvTranspose node '{node.name}': output_padding needs {rank} entries")
    output_shape = attrs.get("output_shape")
    if output_shape is not None:
        output_shape = [int(v) for v in output_shape]
        if len(output_shape) == rank + 2:  # some exporters write the whole shape
            output_shape = output_shape[2:]
        if len(output_shape) != rank:
            raise NodeConversionError(f"ConvTranspose node '{node.name}': output_shape needs {rank} entries")
    if spatial["auto_pad"] == "VALID":
        spatial["auto_pad"], spatial["padding"] = "NOTSET", [0] * (2 * rank)
    extra = {"output_shape": output_shape} if output_shape is not None else {}
    args = (data, weight) if bias is None else (data, weight, bias)
    return call_op(
        "conv_transpose", *args, groups=int(attrs.get("group", 1)), output_padding=output_padding, **spatial, **extra
    )


POOLS = {"MaxPool": "max_pool", "AveragePool": "avg_pool", "LpPool": "lp_pool"}


@converter(*POOLS)
def convert_pool(context, node, inputs):
    data = inputs[0]
    attrs = context.attributes(node)
    rank = _spatial_rank(node, data)
    kernel = [int(v) for v in attrs.get("kernel_shape", [])]
    if len(kernel) != rank:
        raise NodeConversionError(f"{node.op_type} node '{node.name}': kernel_shape {kernel} needs {rank} entries")
    spatial = _spatial_attrs(node, attrs, rank)
    extra = {"ceil_mode": bool(attrs.get("ceil_mode", 0))}
    if extra["ceil_mode"] and spatial["auto_pad"] != "NOTSET":
        extra["ceil_mode"] = False  # ONNX: ceil_mode does not apply with auto_pad
    if node.op_type == "AveragePool":
        extra["count_include_pad"] = bool(attrs.get("count_include_pad", 0))
    if node.op_type == "LpPool":
        extra["p"] = float(attrs.get("p", 2))
    result = _window_fits(context, node, call_op(POOLS[node.op_type], data, kernel=kernel, **spatial, **extra), least=0)
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        storage_order = int(attrs.get("storage_order", 0))
        return [result, call_op("max_pool_indices", data, kernel=kernel, storage_order=storage_order, **spatial, **extra)]
    return result


@converter("GlobalAveragePool", "GlobalMaxPool")
def convert_global_pool(context, node, inputs):
    data = inputs[0]
    rank = _spatial_rank(node, data, least=0)
    op = "mean" if node.op_type == "GlobalAveragePool" else "max"
    return call_op(op, data, axes=list(range(2, rank + 2)), keepdims=True)
