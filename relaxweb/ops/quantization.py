"""Linear quantization: a float tensor to 8/16-bit integers and back.

Signatures (args, then attributes):

- ``quantize_linear(x, scale, zero_point, axis, block_size, dtype)``:
  ``saturate(round_half_even(x / scale) + zero_point)`` as ``dtype`` (int8, uint8, int16,
  uint16), saturating to the dtype's range;
- ``dequantize_linear(x, scale, zero_point, axis, block_size)``: ``(x - zero_point) * scale``,
  the difference taken exactly in int32 (``x`` may be int32), the result in ``scale``'s dtype.

``scale`` and ``zero_point`` have ``x``'s rank (the frontend reshapes ONNX's 1-D per-axis
parameters to ``[1, ..., C, ..., 1]``): a dim of extent 1 broadcasts; with ``block_size`` > 0,
dim ``axis`` of the parameters holds one entry per block of ``block_size`` elements of ``x``
(ONNX's blocked quantization), so element ``i`` reads entry ``i // block_size``.  The zero
point has the quantized dtype.

Deduction: the result has ``x``'s shape; parameters of another rank, or whose dims are neither
1 nor ``x``'s (nor the block count along ``axis``), are a deduction error.

Legalization: one elementwise program each (quantization is ``x / scale`` in float32, then
WGSL's ``round``, which halves to even, as ONNX and onnxruntime do; WGSL allows its division
2.5 ulps, so on a GPU that uses that freedom a quotient within an ulp of a rounding boundary
may land one step from onnxruntime's; lavapipe divides exactly).  int8/uint8/int16/uint16 tensors live on the GPU as 32-bit words
(``ir/dtype.py``), so no packing is needed.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, as_int, format_expr, prove_equal, simplify
from ..ir.tir import Load, cast, maximum, minimum, round_half_even
from .common import expect_args, make_program, needs_known_shapes, normalize_axis, require_tensor

#: The dtypes a tensor may be quantized to, with their ranges.
QUANTIZED_RANGES = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
}
#: The dtypes a tensor may be dequantized from (int32: a bias, or an integer GEMM's result).
DEQUANTIZABLE = (*QUANTIZED_RANGES, "int32")


def _check_parameters(op: str, x: TensorStructInfo, params: list[TensorStructInfo], attrs) -> None:
    if x.shape is None:
        return
    axis = normalize_axis(op, int(attrs.get("axis", 1)), x.ndim) if x.ndim > 0 else 0
    block_size = int(attrs.get("block_size", 0))
    for position, info in enumerate(params, start=1):
        if info.shape is None:
            continue
        if info.ndim != x.ndim:
            raise DeductionError(f"{op}: argument {position} needs {x.ndim} dims like the input, got {info}")
        for dim, (extent, param) in enumerate(zip(x.shape, info.shape)):
            if as_int(param) == 1:
                continue
            expected = simplify((extent + block_size - 1) // block_size) if block_size and dim == axis else extent
            if not prove_equal(param, expected):
                raise DeductionError(
                    f"{op}: dim {dim} of argument {position} is {format_expr(param)}, expected 1 or {format_expr(expected)}"
                )


def _deduce(op: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(op, args, 3)
        x, scale, zero_point = (require_tensor(arg, op, i) for i, arg in enumerate(args))
        if not scale.dtype.startswith("float"):
            raise DeductionError(f"{op}: the scale must be a float tensor, got {scale.dtype}")
        if op == "quantize_linear":
            dtype = attrs["dtype"]
            if dtype not in QUANTIZED_RANGES:
                raise DeductionError(f"{op}: cannot quantize to {dtype} (supported: {', '.join(QUANTIZED_RANGES)})")
            if not x.dtype.startswith("float"):
                raise DeductionError(f"{op}: the input must be a float tensor, got {x.dtype}")
        else:
            dtype = scale.dtype
            if x.dtype not in DEQUANTIZABLE:
                raise DeductionError(f"{op}: cannot dequantize {x.dtype} (supported: {', '.join(DEQUANTIZABLE)})")
        if zero_point.dtype != (attrs["dtype"] if op == "quantize_linear" else x.dtype):
            raise DeductionError(f"{op}: the zero point's dtype {zero_point.dtype} is not the quantized dtype")
        _check_parameters(op, x, [scale, zero_point], attrs)
        return TensorStructInfo(x.shape, dtype, x.ndim)

    return deduce


def _parameter_indices(parameter, axes, attrs) -> tuple:
    """The element of ``parameter`` (scale or zero point) that output element ``axes`` uses."""
    block_size = int(attrs.get("block_size", 0))
    axis = int(attrs.get("axis", 1)) % max(len(axes), 1)
    indices = []
    for dim, (extent, index) in enumerate(zip(parameter.shape, axes)):
        if as_int(extent) == 1:
            indices.append(IntImm(0))
        elif block_size and dim == axis:
            indices.append(index // block_size)
        else:
            indices.append(index)
    return tuple(indices)


def legalize_quantize_linear(context, call: Call):
    info = call.struct_info
    low, high = QUANTIZED_RANGES[info.dtype]

    def body(axes, buffers):
        x, scale, zero_point = buffers
        value = cast("float32", Load(x, axes)) / cast("float32", Load(scale, _parameter_indices(scale, axes, call.attrs)))
        shifted = round_half_even(value) + cast("float32", Load(zero_point, _parameter_indices(zero_point, axes, call.attrs)))
        return cast(info.dtype, minimum(maximum(shifted, float(low)), float(high)))

    return context.call_tir(make_program("quantize_linear", call.args, info.shape, info.dtype, body), call.args)


def legalize_dequantize_linear(context, call: Call):
    info = call.struct_info

    def body(axes, buffers):
        x, scale, zero_point = buffers
        offset = cast("int32", Load(x, axes)) - cast("int32", Load(zero_point, _parameter_indices(zero_point, axes, call.attrs)))
        return cast("float32", offset) * cast("float32", Load(scale, _parameter_indices(scale, axes, call.attrs)))

    return context.call_tir(make_program("dequantize_linear", call.args, info.shape, info.dtype, body), call.args)


def expand_parameter(parameter: np.ndarray, shape: tuple[int, ...], attrs) -> np.ndarray:
    """``parameter`` repeated over its blocks and broadcast to ``shape`` (numpy)."""
    block_size = int(attrs.get("block_size", 0))
    if block_size and len(shape):
        axis = int(attrs.get("axis", 1)) % len(shape)
        if parameter.shape[axis] != 1:
            parameter = np.repeat(parameter, block_size, axis=axis).take(range(shape[axis]), axis=axis)
    return np.broadcast_to(parameter, shape)


def quantize_linear_reference(arrays, attrs):
    x, scale, zero_point = arrays
    low, high = QUANTIZED_RANGES[attrs["dtype"]]
    value = x.astype(np.float32) / expand_parameter(scale, x.shape, attrs).astype(np.float32)
    shifted = np.rint(value) + expand_parameter(zero_point, x.shape, attrs).astype(np.float32)
    return np.clip(shifted, low, high).astype(attrs["dtype"])


def dequantize_linear_reference(arrays, attrs):
    x, scale, zero_point = arrays
    offset = x.astype(np.int32) - expand_parameter(zero_point, x.shape, attrs).astype(np.int32)
    return (offset.astype(np.float32) * expand_parameter(scale, x.shape, attrs).astype(np.float32)).astype(scale.dtype)


register_op("quantize_linear", deduce=_deduce("quantize_linear"),
            legalize=needs_known_shapes(legalize_quantize_linear), reference=quantize_linear_reference)
register_op("dequantize_linear", deduce=_deduce("dequantize_linear"),
            legalize=needs_known_shapes(legalize_dequantize_linear), reference=dequantize_linear_reference)
