"""ONNX quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, the integer
GEMMs (MatMulInteger, ConvInteger), the requantizing ones (QLinearMatMul, QLinearConv), and
onnxruntime's com.microsoft MatMulIntegerToFloat and DynamicQuantizeMatMul.

QuantizeLinear / DequantizeLinear are the ops of ``relaxweb/ops/quantization.py``, their
scale and zero point reshaped to the input's rank (per tensor: all ones; per axis: the
extent at ``axis``; blocked: as given).  The others are compositions computing what
onnxruntime's CPU kernels compute:

- the integer GEMMs subtract the zero points in int32 (per tensor; per row of A / per
  column of B, per output channel of W) and multiply or convolve in int32, exactly (a
  constant operand has its zero point subtracted here, at import);
- DynamicQuantizeLinear is onnxruntime's ``GetQuantizationParameter``: the range
  ``[min(0, min x), max(0, max x)]``, ``scale = (max - min) / 255`` (1 when the range is
  empty: an all-zero input), ``zero_point = round(clamp(0 - min / scale, 0, 255))``, then
  QuantizeLinear;
- QLinearMatMul / QLinearConv requantize the int32 result (plus the int32 bias):
  ``saturate(round(float(acc) * (a_scale * b_scale / y_scale)) + y_zero_point)``, the
  multiplier computed in float32 as onnxruntime's ``MlasRequantizeOutput`` takes it;
- MatMulIntegerToFloat: ``float(acc) * (a_scale * b_scale) (+ bias)``; DynamicQuantizeMatMul
  quantizes A as DynamicQuantizeLinear does, then the same.
- com.microsoft DynamicQuantizeLSTM: the LSTM with both GEMMs quantized dynamically, a host
  loop over the steps (below).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from onnx import helper

from ...ir.expr import Constant, Expr, ShapeExpr, TupleGetItem, tensor_dtype, tensor_shape
from ...ir.struct_info import TensorStructInfo, is_less_specific
from ...ir.symbolic import IntImm, as_expr, as_int, simplify
from ...ops import call_op, strided_slice
from ...ops.quantization import DEQUANTIZABLE, QUANTIZED_RANGES
from .contrib import MICROSOFT, label
from .convolution import convert_conv
from .linear_algebra import convert_matmul
from .manipulation import fail, fresh_size_var
from .registry import converter


def _input(inputs: list[Expr | None], position: int) -> Expr | None:
    return inputs[position] if position < len(inputs) else None


def _emit(context, call, name: str) -> Expr:
    return context.builder.emit(call, name)


def _rank(expr: Expr) -> int:
    return len(tensor_shape(expr))


def _scalar(context, value, dtype: str, name: str) -> Constant:
    return context.constant(np.array(value, dtype=np.dtype(dtype)).reshape(()), name)


def _to_rank(context, node, parameter: Expr, rank: int, axis: int, what: str) -> Expr:
    """A scale or zero point with ``rank`` dims: a scalar (or one element) as all ones, a 1-D
    per-axis one as ``[1, ..., C, ..., 1]`` (C at ``axis``); one of ``rank`` dims (blocked) as it is."""
    shape = tensor_shape(parameter)
    if len(shape) == rank and rank != 1:
        return parameter
    if len(shape) > 1:
        raise fail(node, f"the {what} must be a scalar, 1-D or of the input's rank, got {parameter.struct_info}")
    per_axis = len(shape) == 1 and not (isinstance(shape[0], IntImm) and shape[0].value == 1)
    target = tuple(shape[0] if per_axis and dim == axis else IntImm(1) for dim in range(rank))
    if isinstance(parameter, Constant):
        return context.constant(parameter.data.reshape(tuple(int(d.value) for d in target)), f"{parameter.name}_{what}")
    if per_axis and rank == 1:
        return parameter
    return _emit(context, call_op("reshape", parameter, ShapeExpr(target)), what.replace(" ", "_"))


def _axis(context, node, x: Expr, parameters: tuple[Expr, ...]) -> int:
    """The ``axis`` attribute, normalized; it matters (and must be in range) only when a
    parameter has more than one element."""
    rank = _rank(x)
    axis = int(context.attributes(node).get("axis", 1))
    if -rank <= axis < rank:
        return axis % rank
    if any(not (isinstance(d, IntImm) and d.value == 1) for p in parameters for d in tensor_shape(p)):
        raise fail(node, f"axis {axis} is out of range for a {rank}-d input")
    return 0


def _quantized_dtype(context, node, zero_point: Expr | None) -> str:
    if zero_point is not None:
        return tensor_dtype(zero_point)
    to = context.attributes(node).get("output_dtype", 0)
    return str(np.dtype(helper.tensor_dtype_to_np_dtype(to))) if to else "uint8"


@converter("QuantizeLinear")
def convert_quantize_linear(context, node, inputs):
    x, scale, zero_point = inputs[0], inputs[1], _input(inputs, 2)
    dtype = _quantized_dtype(context, node, zero_point)
    if dtype not in QUANTIZED_RANGES:
        raise fail(node, f"quantizing to {dtype} is not supported (supported: {', '.join(QUANTIZED_RANGES)})")
    if zero_point is None:
        zero_point = _scalar(context, 0, dtype, "zero_point")
    attrs = context.attributes(node)  # (saturate applies to float8 outputs only: integers always saturate)
    axis, rank = _axis(context, node, x, (scale, zero_point)), _rank(x)
    block_size = int(attrs.get("block_size", 0))
    return call_op("quantize_linear", x, _to_rank(context, node, scale, rank, axis, "scale"),
                   _to_rank(context, node, zero_point, rank, axis, "zero point"),
                   axis=axis, block_size=block_size, dtype=dtype)


@converter("DequantizeLinear")
def convert_dequantize_linear(context, node, inputs):
    x, scale, zero_point = inputs[0], inputs[1], _input(inputs, 2)
    dtype = tensor_dtype(x)
    if dtype not in DEQUANTIZABLE:
        raise fail(node, f"dequantizing {dtype} is not supported (supported: {', '.join(DEQUANTIZABLE)})")
    if zero_point is None:
        zero_point = _scalar(context, 0, dtype, "zero_point")
    axis, rank = _axis(context, node, x, (scale, zero_point)), _rank(x)
    block_size = int(context.attributes(node).get("block_size", 0))
    return call_op("dequantize_linear", x, _to_rank(context, node, scale, rank, axis, "scale"),
                   _to_rank(context, node, zero_point, rank, axis, "zero point"),
                   axis=axis, block_size=block_size)


def dynamic_quantization(context, x: Expr, per_row: bool = False) -> tuple[Expr, Expr, Expr]:
    """``x`` quantized to uint8 over its whole range (or each row's: the last dim), with that
    range's scale and zero point (0-d; per row: ``x``'s rank, the last dim 1), as
    onnxruntime's ``GetQuantizationParameter`` computes them."""
    dtype = tensor_dtype(x)
    zero, one, top = (_scalar(context, value, dtype, name) for value, name in ((0, "zero"), (1, "one"), (255, "qmax")))
    axes = {"axes": [-1], "keepdims": True} if per_row else {"axes": None, "keepdims": False}
    low = _emit(context, call_op("minimum", _emit(context, call_op("min", x, **axes), "x_min"), zero), "low")
    high = _emit(context, call_op("maximum", _emit(context, call_op("max", x, **axes), "x_max"), zero), "high")
    span = _emit(context, call_op("subtract", high, low), "span")
    empty = _emit(context, call_op("equal", high, low), "empty_range")
    scale = _emit(context, call_op("where", empty, one, _emit(context, call_op("divide", span, top), "step")), "scale")
    initial = _emit(context, call_op("subtract", zero, _emit(context, call_op("divide", low, scale), "low_steps")), "initial_zp")
    clamped = _emit(context, call_op("minimum", _emit(context, call_op("maximum", initial, zero), "zp_low"), top), "zp_clamped")
    zero_point = _emit(context, call_op("cast", _emit(context, call_op("round", clamped), "zp_rounded"), dtype="uint8"), "zero_point")
    if not per_row:
        ones = ShapeExpr((IntImm(1),) * _rank(x))
        scale_nd = _emit(context, call_op("reshape", scale, ones), "scale_nd")
        zero_point_nd = _emit(context, call_op("reshape", zero_point, ones), "zero_point_nd")
    else:
        scale_nd, zero_point_nd = scale, zero_point
    quantized = call_op("quantize_linear", x, scale_nd, zero_point_nd, axis=0, block_size=0, dtype="uint8")
    return _emit(context, quantized, "quantized"), scale, zero_point


@converter("DynamicQuantizeLinear")
def convert_dynamic_quantize_linear(context, node, inputs):
    if tensor_dtype(inputs[0]) != "float32":
        raise fail(node, f"the input must be float32, got {inputs[0].struct_info}")
    return list(dynamic_quantization(context, inputs[0]))


def _centered(context, node, operand: Expr, zero_point: Expr | None, per: str, what: str) -> Expr:
    """``operand - zero_point`` in int32.  ``per`` says how a 1-D zero point lines up with
    the operand: ``"row"`` (dim -2 of a matrix), ``"column"`` (the last dim) or ``"channel"``
    (dim 0 of a convolution weight, dim 1 of its input)."""
    rank = _rank(operand)
    if zero_point is not None and len(tensor_shape(zero_point)) == 1:
        axis = {"row": rank - 2, "column": rank - 1, "channel": 0}[per]
        zero_point = _to_rank(context, node, zero_point, rank, max(axis, 0), f"{what} zero point")
    if isinstance(operand, Constant) and (zero_point is None or isinstance(zero_point, Constant)):
        offset = 0 if zero_point is None else zero_point.data.astype(np.int32)
        return context.constant(operand.data.astype(np.int32) - offset, f"{operand.name}_centered")
    wide = _emit(context, call_op("cast", operand, dtype="int32"), f"{what}_int32") if tensor_dtype(operand) != "int32" else operand
    if zero_point is None or (isinstance(zero_point, Constant) and not zero_point.data.any()):
        return wide
    zero_wide = _emit(context, call_op("cast", zero_point, dtype="int32"), f"{what}_zero_point_int32")
    return _emit(context, call_op("subtract", wide, zero_wide), f"{what}_centered")


def _integer_matmul(context, node, a, a_zero_point, b, b_zero_point) -> Expr:
    """int32 ``(a - a_zero_point) @ (b - b_zero_point)`` with MatMul's rank rules."""
    a_centered = _centered(context, node, a, a_zero_point, "row", "a")
    b_centered = _centered(context, node, b, b_zero_point, "column", "b")
    return _emit(context, convert_matmul(context, node, [a_centered, b_centered]), "integer_product")


def _integer_conv(context, node, x, x_zero_point, w, w_zero_point) -> Expr:
    if x_zero_point is not None and len(tensor_shape(x_zero_point)) == 1 and not (
            isinstance(tensor_shape(x_zero_point)[0], IntImm) and tensor_shape(x_zero_point)[0].value == 1):
        raise fail(node, "a per-channel zero point of the input is not supported (onnxruntime takes a scalar)")
    x_centered = _centered(context, node, x, x_zero_point, "channel", "x")
    w_centered = _centered(context, node, w, w_zero_point, "channel", "w")
    return _emit(context, convert_conv(context, node, [x_centered, w_centered]), "integer_conv")


@converter("MatMulInteger")
def convert_matmul_integer(context, node, inputs):
    return _integer_matmul(context, node, inputs[0], _input(inputs, 2), inputs[1], _input(inputs, 3))


@converter("ConvInteger")
def convert_conv_integer(context, node, inputs):
    return _integer_conv(context, node, inputs[0], _input(inputs, 2), inputs[1], _input(inputs, 3))


def _float32(context, x: Expr) -> Expr:
    if tensor_dtype(x) == "float32":
        return x
    if isinstance(x, Constant):
        return context.constant(x.data.astype(np.float32), f"{x.name}_float32")
    return _emit(context, call_op("cast", x, dtype="float32"), "scale_float32")


def _float32_product(context, a: Expr, b: Expr, name: str) -> Expr:
    """``a * b`` in float32 (float16 scales widened first), folded at import when both are constants."""
    a, b = _float32(context, a), _float32(context, b)
    if isinstance(a, Constant) and isinstance(b, Constant):
        return context.constant(a.data * b.data, name)
    return _emit(context, call_op("multiply", a, b), name)


def _requantize(context, node, accumulated: Expr, multiplier: Expr, y_zero_point: Expr | None, axis: int) -> Expr:
    """``saturate(round(float(accumulated) * multiplier) + y_zero_point)``; a 1-D multiplier
    lines up with ``axis`` of the result."""
    rank = _rank(accumulated)
    scaled = _emit(context, call_op("multiply", _emit(context, call_op("cast", accumulated, dtype="float32"), "accumulated"),
                                    _to_rank(context, node, multiplier, rank, axis, "multiplier")), "scaled")
    dtype = tensor_dtype(y_zero_point) if y_zero_point is not None else "uint8"
    if y_zero_point is None:
        y_zero_point = _scalar(context, 0, dtype, "zero_point")
    one = _scalar(context, 1.0, "float32", "unit_scale")
    return call_op("quantize_linear", scaled, _to_rank(context, node, one, rank, 0, "scale"),
                   _to_rank(context, node, y_zero_point, rank, 0, "zero point"), axis=0, block_size=0, dtype=dtype)


def _multiplier(context, a_scale: Expr, b_scale: Expr, y_scale: Expr) -> Expr:
    """``a_scale * b_scale / y_scale`` in float32 (as onnxruntime computes the requantization scale)."""
    product, y_scale = _float32_product(context, a_scale, b_scale, "scale_product"), _float32(context, y_scale)
    if isinstance(product, Constant) and isinstance(y_scale, Constant):
        return context.constant(product.data / y_scale.data, "multiplier")
    return _emit(context, call_op("divide", product, y_scale), "multiplier")


@converter("QLinearMatMul")
def convert_qlinear_matmul(context, node, inputs):
    a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point = inputs[:8]
    accumulated = _integer_matmul(context, node, a, a_zero_point, b, b_zero_point)
    return _requantize(context, node, accumulated, _multiplier(context, a_scale, b_scale, y_scale), y_zero_point,
                       _rank(accumulated) - 1)


@converter("QLinearConv")
def convert_qlinear_conv(context, node, inputs):
    x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point = inputs[:8]
    bias = _input(inputs, 8)
    accumulated = _integer_conv(context, node, x, x_zero_point, w, w_zero_point)
    if bias is not None:
        accumulated = _emit(context, call_op("add", accumulated, _to_rank(context, node, bias, _rank(accumulated), 1, "bias")),
                            "biased")
    return _requantize(context, node, accumulated, _multiplier(context, x_scale, w_scale, y_scale), y_zero_point, 1)


def _scaled_product(context, node, accumulated: Expr, a_scale: Expr, b_scale: Expr, bias: Expr | None) -> Expr:
    """``float(accumulated) * (a_scale * b_scale) (+ bias)``: a b_scale per column lines up with the last dim."""
    rank = _rank(accumulated)
    scale = _to_rank(context, node, _float32_product(context, a_scale, b_scale, "scale_product"), rank, rank - 1, "scale")
    result = call_op("multiply", _emit(context, call_op("cast", accumulated, dtype="float32"), "accumulated"), scale)
    if bias is None:
        return result
    return call_op("add", _emit(context, result, "scaled"), bias)


@converter("MatMulIntegerToFloat", domain=MICROSOFT)
def convert_matmul_integer_to_float(context, node, inputs):
    a, b, a_scale, b_scale = inputs[:4]
    accumulated = _integer_matmul(context, node, a, _input(inputs, 4), b, _input(inputs, 5))
    return _scaled_product(context, node, accumulated, a_scale, b_scale, _input(inputs, 6))


@converter("DynamicQuantizeMatMul", domain=MICROSOFT)
def convert_dynamic_quantize_matmul(context, node, inputs):
    a, b, b_scale, b_zero_point, bias = inputs[0], inputs[1], inputs[2], _input(inputs, 3), _input(inputs, 4)
    quantized, a_scale, a_zero_point = dynamic_quantization(context, a)
    accumulated = _integer_matmul(context, node, quantized, a_zero_point, b, b_zero_point)
    return _scaled_product(context, node, accumulated, a_scale, b_scale, bias)


# DynamicQuantizeLSTM ---------------------------------------------------------------------------
#
# onnxruntime's DeepCpuLstmOp with quantized weights (W [D, I, 4H] and R [D, H, 4H]: ONNX's
# LSTM weights transposed, int8 or uint8, a scale and zero point per direction or per column).
# Each GEMM quantizes its float operand dynamically (``ComputeGemm`` of rnn_helpers.cc: the
# range of the whole operand, as DynamicQuantizeLinear) and scales the int32 result by
# ``a_scale * w_scale``: the input projection quantizes the whole sequence X at once, the
# recurrent GEMM the hidden state at each step (per direction), here each batch entry's row on
# its own.  onnxruntime quantizes the rows of the chunk of the batch one of its threads runs
# together (the whole batch below 5 entries with H > 256, else ceil(B / threads) rows), so its
# result depends on its thread count; with one batch entry, or one row per thread, the two
# agree exactly, and a sequence's result here never depends on the others'.  The recurrence
# is a host loop over the steps (both directions in one iteration; the reverse one at step
# T - 1 - t), since each step's quantization needs the range of the whole previous state.
# Gates in W's column order i, o, f, c; c' = f * c + i * tanh(.), h' = o * tanh(c').


def _direction_constant(node, expr: Expr | None, direction: int, what: str) -> np.ndarray | None:
    if expr is None:
        return None
    if not isinstance(expr, Constant):
        raise fail(node, f"the {what} must be a constant (an initializer), as onnxruntime's quantizer writes it")
    return expr.data[direction]


def _check_lstm_attributes(node, attrs, inputs) -> str:
    """The direction; what onnxruntime's quantizer never writes is refused, naming it."""
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction not in ("forward", "reverse", "bidirectional"):
        raise fail(node, f"unknown direction {direction!r}")
    activations = [a.decode().lower() if isinstance(a, bytes) else str(a).lower() for a in attrs.get("activations", ())]
    unsupported = {
        "sequence_lens": _input(inputs, 4) is not None, "P (peepholes)": _input(inputs, 7) is not None,
        "clip": "clip" in attrs, "input_forget=1": bool(attrs.get("input_forget", 0)),
        "activations other than sigmoid, tanh, tanh": bool(activations) and
        activations != ["sigmoid", "tanh", "tanh"] * (len(activations) // 3),
    }
    for name, present in unsupported.items():
        if present:
            raise fail(node, f"{name} is not supported (the LSTM onnxruntime's quantizer writes is)")
    return direction


def _take(context, value: Expr, axis: int, begin, name: str) -> Expr:
    """Entry ``begin`` of ``value`` along ``axis``, that axis dropped."""
    piece = _emit(context, strided_slice(value, [axis], [begin], [simplify(as_expr(begin) + 1)]), f"{name}_slice")
    return _emit(context, call_op("reshape", piece, ShapeExpr(tuple(
        extent for a, extent in enumerate(tensor_shape(value)) if a != axis))), name)


def _stack(context, values: list[Expr], name: str) -> Expr:
    """``values`` stacked along a new leading axis."""
    rows = [_emit(context, call_op("reshape", v, ShapeExpr((IntImm(1), *tensor_shape(v)))), f"{name}_row") for v in values]
    return _emit(context, call_op("concat", *rows, axis=0), name)


@dataclasses.dataclass(frozen=True)
class _LstmDirection:
    """One direction's part of a DynamicQuantizeLSTM: the input projection of every step
    (``[T, B, 4H]``, float), R less its zero point (int32 ``[H, 4H]``), R's scale, the two
    biases added (``[4H]``) and whether it runs the steps backwards."""

    projected: Expr
    centered_r: Constant
    r_scale: Constant
    bias: Constant
    reverse: bool


def _lstm_direction(context, node, inputs, d: int, hidden: int, reverse: bool, quantized_x) -> _LstmDirection:
    w, r = _direction_constant(node, inputs[1], d, "W"), _direction_constant(node, inputs[2], d, "R")
    w_zero, r_zero = _direction_constant(node, _input(inputs, 9), d, "W zero point"), _direction_constant(node, _input(inputs, 11), d, "R zero point")
    w_scale, r_scale = _direction_constant(node, inputs[8], d, "W scale"), _direction_constant(node, inputs[10], d, "R scale")
    centered_w = context.constant(w.astype(np.int32) - (0 if w_zero is None else w_zero.astype(np.int32)), f"W{d}_centered")
    centered_r = context.constant(r.astype(np.int32) - (0 if r_zero is None else r_zero.astype(np.int32)), f"R{d}_centered")
    x, x_scale, x_zero_point = quantized_x
    product = _integer_matmul(context, node, x, x_zero_point, centered_w, None)
    projected = _emit(context, _scaled_product(context, node, product, x_scale,
                                               context.constant(np.float32(w_scale), f"W{d}_scale"), None), f"projected{d}")
    bias = _direction_constant(node, _input(inputs, 3), d, "B")
    bias = np.zeros(4 * hidden, np.float32) if bias is None else bias[:4 * hidden] + bias[4 * hidden:]
    return _LstmDirection(projected, centered_r, context.constant(np.float32(r_scale), f"R{d}_scale"),
                          context.constant(bias.astype(np.float32), f"B{d}"), reverse)


def _lstm_cell(context, node, direction: _LstmDirection, d: int, step, h: Expr, c: Expr, hidden: int) -> tuple[Expr, Expr]:
    """One step of one direction: ``h``, ``c`` ``[B, H]`` -> the next ``h``, ``c``."""
    quantized_h, h_scale, h_zero_point = dynamic_quantization(context, h, per_row=True)
    product = _integer_matmul(context, node, quantized_h, h_zero_point, direction.centered_r, None)
    recurrent = _emit(context, _scaled_product(context, node, product, h_scale, direction.r_scale, None), f"recurrent{d}")
    projected = _take(context, direction.projected, 0, step, f"projected{d}_step")
    summed = _emit(context, call_op("add", projected, recurrent), f"gates{d}_sum")
    gates = _emit(context, call_op("add", summed, direction.bias), f"gates{d}")

    def gate(k: int, activation: str, name: str) -> Expr:
        pre = _emit(context, strided_slice(gates, [1], [k * hidden], [(k + 1) * hidden]), f"{name}_pre")
        return _emit(context, call_op(activation, pre), name)

    i, o, f, g = (gate(k, "tanh" if name == "g" else "sigmoid", f"{name}{d}") for k, name in enumerate("iofg"))
    kept = _emit(context, call_op("multiply", c, f), f"kept{d}")
    written = _emit(context, call_op("multiply", i, g), f"written{d}")
    c_next = _emit(context, call_op("add", kept, written), f"c{d}_next")
    h_next = _emit(context, call_op("multiply", o, _emit(context, call_op("tanh", c_next), f"c{d}_tanh")), f"h{d}_next")
    return h_next, c_next


@converter("DynamicQuantizeLSTM", domain=MICROSOFT)
def convert_dynamic_quantize_lstm(context, node, inputs):
    attrs = context.attributes(node)
    direction = _check_lstm_attributes(node, attrs, inputs)
    hidden = int(attrs["hidden_size"])
    x = inputs[0]
    steps, batch, _ = tensor_shape(x)
    reverse = [False, True] if direction == "bidirectional" else [direction == "reverse"]
    quantized_x = dynamic_quantization(context, x)  # the whole sequence at once, shared by both directions
    directions = [_lstm_direction(context, node, inputs, d, hidden, backwards, quantized_x)
                  for d, backwards in enumerate(reverse)]
    state = TensorStructInfo((IntImm(len(directions)), batch, IntImm(hidden)), "float32")
    zeros = context.constant(np.zeros((len(directions), 1, hidden), np.float32), "zero_state")
    initial = []
    for position, name in ((5, "h"), (6, "c")):
        given = _input(inputs, position)
        if given is None:
            given = _emit(context, call_op("broadcast_to", zeros, ShapeExpr(state.shape)), f"initial_{name}")
        elif not is_less_specific(state, given.struct_info):
            # checked here, before the loop: a check deduced inside the body could not be bound there
            given = context.builder.emit_match_cast(given, state, f"initial_{name}", reason=(
                f"DynamicQuantizeLSTM node '{label(node)}': initial_{name} must be [directions, batch, hidden_size]"))
        initial.append((name, given))
    iteration = fresh_size_var(context, f"{label(node)}_step")

    def body(builder, carried):
        inner = dataclasses.replace(context, builder=builder)
        h, c = carried
        next_h, next_c = [], []
        for d, part in enumerate(directions):
            step = IntImm(0) if as_int(steps) == 1 else simplify(steps - 1 - iteration) if part.reverse else iteration
            h_d, c_d = _lstm_cell(inner, node, part, d, step, _take(inner, h, 0, d, f"h{d}"), _take(inner, c, 0, d, f"c{d}"),
                                  hidden)
            next_h.append(h_d)
            next_c.append(c_d)
        h_next = _stack(inner, next_h, "h_next")
        return [h_next, _stack(inner, next_c, "c_next")], [h_next]

    loop = context.builder.emit_loop(steps, iteration, initial, body, label(node))
    h_last, c_last, states = (_emit(context, TupleGetItem(loop, k), name) for k, name in enumerate(("Y_h", "Y_c", "Y_steps")))
    if not any(reverse):
        return [states, h_last, c_last]
    rows = []  # [T, D, B, H]; the reverse direction's row t was computed at iteration T - 1 - t
    for d, backwards in enumerate(reverse):
        row = _emit(context, strided_slice(states, [1], [d], [d + 1]), f"Y{d}")
        if backwards:
            row = _emit(context, strided_slice(row, [0], [simplify(steps - 1)], [-(2**63)], [-1]), f"Y{d}_reversed")
        rows.append(row)
    states = rows[0] if len(rows) == 1 else _emit(context, call_op("concat", *rows, axis=1), "Y")
    return [states, h_last, c_last]
