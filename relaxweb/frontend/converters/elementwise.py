"""ONNX elementwise ops: arithmetic with broadcasting, math, activations, comparisons, logic,
selection and casts.

Every ONNX op here maps onto the IR ops of ``relaxweb/ops/elementwise.py`` and
``relaxweb/ops/logic.py``, sometimes more than one: ``Clip`` is a ``maximum`` and a
``minimum``, the variadic ``Max`` / ``Min`` / ``Sum`` / ``Mean`` are chains of binary ops,
``Pow`` by a constant 1, 2 or 0.5 is an identity, a product or a ``sqrt``.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import helper

from ...ir.dtype import DTYPES
from ...ir.expr import Constant, Expr
from ...ir.struct_info import TensorStructInfo
from ...ops import call_op
from .registry import NodeConversionError, converter

BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Pow": "power", "PRelu": "prelu",
    "Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
    "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
}

UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Neg": "negative", "Identity": "identity",
    "Abs": "abs", "Sqrt": "sqrt", "Log": "log", "Reciprocal": "reciprocal", "Floor": "floor", "Ceil": "ceil",
    "Round": "round", "Sign": "sign", "Erf": "erf", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin",
    "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh",
    "Atanh": "atanh", "Softplus": "softplus", "Softsign": "softsign", "Mish": "mish", "HardSwish": "hard_swish",
    "Not": "logical_not", "IsNaN": "isnan", "BitwiseNot": "bitwise_not",
}

# ONNX op -> (IR op, {ONNX attribute: default}); the attributes are passed on as floats.
ACTIVATIONS = {
    "LeakyRelu": ("leaky_relu", {"alpha": 0.01}),
    "Elu": ("elu", {"alpha": 1.0}),
    "Celu": ("celu", {"alpha": 1.0}),
    "Selu": ("selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
    "ThresholdedRelu": ("thresholded_relu", {"alpha": 1.0}),
    "HardSigmoid": ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
    "Shrink": ("shrink", {"lambd": 0.5, "bias": 0.0}),
}

VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}


def known_dtypes(function):
    """Refuse (as unsupported) a node whose tensor inputs have an element type relaxweb lacks
    (bfloat16, float8, int4…; strings only in ``Equal``); placed under ``@converter``."""
    @functools.wraps(function)
    def wrapper(context, node, inputs):
        for position, expr in enumerate(inputs):
            info = None if expr is None else expr.struct_info
            if isinstance(info, TensorStructInfo) and info.dtype not in DTYPES and not (
                node.op_type == "Equal" and info.dtype == "object"  # strings compare in the interpreter
            ):
                raise NodeConversionError(
                    f"{node.op_type} node '{node.name}': input {position} has element type {info.dtype}, "
                    "which relaxweb does not support"
                )
        return function(context, node, inputs)

    return wrapper


def scalar(context, value, dtype: str, name: str) -> Constant:
    """A 0-d constant of ``dtype``."""
    return context.constant(np.array(value, dtype=np.dtype(dtype)), name)


def dtype_of(expr: Expr, node, what: str = "input 0") -> str:
    info = expr.struct_info
    if not isinstance(info, TensorStructInfo):
        raise NodeConversionError(f"{node.op_type} node '{node.name}': {what} must be a tensor, got {info}")
    return info.dtype


def _legacy_broadcast(context, node) -> None:
    """Opsets before 7 broadcast only with the broadcast/axis attributes; numpy rules since."""
    attrs = context.attributes(node)
    if "axis" in attrs:
        raise NodeConversionError(
            f"{node.op_type} node '{node.name}': the legacy 'axis' broadcast attribute (opset < 7) is not supported"
        )


@converter(*BINARY)
@known_dtypes
def convert_binary(context, node, inputs):
    _legacy_broadcast(context, node)
    a, b = inputs[0], inputs[1]
    if node.op_type == "Pow":
        special = _power_by_constant(context, a, b)
        if special is not None:
            return special
    return call_op(BINARY[node.op_type], a, b)


def _power_by_constant(context, base, exponent):
    """``x ** 1``, ``x ** 2`` and ``x ** 0.5`` by a constant scalar: no ``power`` needed."""
    if not isinstance(exponent, Constant) or exponent.data.size != 1:
        return None
    info = base.struct_info
    if not isinstance(info, TensorStructInfo) or not info.dtype.startswith("float"):
        return None
    if info.ndim < exponent.data.ndim:  # the exponent's shape would widen the result
        return None
    value = float(exponent.data.reshape(-1)[0])
    if value == 1.0:
        return call_op("identity", base)
    if value == 2.0:
        return call_op("multiply", base, base)
    if value == 0.5:
        return call_op("sqrt", base)
    return None


@converter("Mod")
@known_dtypes
def convert_mod(context, node, inputs):
    fmod = bool(context.attributes(node).get("fmod", 0))
    return call_op("mod", inputs[0], inputs[1], fmod=fmod)


@converter("BitShift")
@known_dtypes
def convert_bitshift(context, node, inputs):
    direction = context.attributes(node).get("direction", b"")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction not in ("LEFT", "RIGHT"):
        raise NodeConversionError(f"BitShift node '{node.name}': direction must be LEFT or RIGHT, got {direction!r}")
    return call_op("left_shift" if direction == "LEFT" else "right_shift", inputs[0], inputs[1])


@converter(*UNARY)
@known_dtypes
def convert_unary(context, node, inputs):
    x = inputs[0]
    if node.op_type == "Identity" and not isinstance(x.struct_info, TensorStructInfo):
        return x  # a sequence or an optional: the same value
    if node.op_type == "Relu" and not dtype_of(x, node).startswith("float"):
        # integer Relu (opset >= 14): a maximum with 0
        return call_op("maximum", x, scalar(context, 0, dtype_of(x, node), f"{node.output[0]}_zero"))
    return call_op(UNARY[node.op_type], x)


@converter(*ACTIVATIONS)
@known_dtypes
def convert_activation(context, node, inputs):
    name, defaults = ACTIVATIONS[node.op_type]
    attrs = context.attributes(node)
    return call_op(name, inputs[0], **{key: float(attrs.get(key, default)) for key, default in defaults.items()})


@converter("Gelu")
@known_dtypes
def convert_gelu(context, node, inputs):
    approximate = context.attributes(node).get("approximate", b"none")
    approximate = approximate.decode() if isinstance(approximate, bytes) else str(approximate)
    if approximate not in ("none", "tanh"):
        raise NodeConversionError(f"Gelu node '{node.name}': approximate must be 'none' or 'tanh', got {approximate!r}")
    return call_op("gelu_tanh" if approximate == "tanh" else "gelu", inputs[0])


@converter("IsInf")
@known_dtypes
def convert_isinf(context, node, inputs):
    attrs = context.attributes(node)
    return call_op(
        "isinf", inputs[0],
        detect_positive=bool(attrs.get("detect_positive", 1)), detect_negative=bool(attrs.get("detect_negative", 1)),
    )


@converter("Clip")
@known_dtypes
def convert_clip(context, node, inputs):
    """``minimum(maximum(x, min), max)``: like numpy's clip, max wins when min > max."""
    x = inputs[0]
    dtype = dtype_of(x, node)
    if context.opset < 11:
        attrs = context.attributes(node)
        low = scalar(context, attrs["min"], dtype, f"{node.output[0]}_min") if "min" in attrs else None
        high = scalar(context, attrs["max"], dtype, f"{node.output[0]}_max") if "max" in attrs else None
    else:
        low = inputs[1] if len(inputs) > 1 else None
        high = inputs[2] if len(inputs) > 2 else None
    if low is None and high is None:
        return call_op("identity", x)
    result = x
    if low is not None:
        result = call_op("maximum", result, low)
    if high is not None:
        if low is not None:
            result = context.builder.emit(result, "clip_low")
        result = call_op("minimum", result, high)
    return result


@converter(*VARIADIC)
@known_dtypes
def convert_variadic(context, node, inputs):
    operands = [i for i in inputs if i is not None]
    if not operands:
        raise NodeConversionError(f"{node.op_type} node '{node.name}': needs at least one input")
    if len(operands) == 1:
        return call_op("identity", operands[0])
    op = VARIADIC[node.op_type]
    result = operands[0]
    for position, operand in enumerate(operands[1:], start=1):
        call = call_op(op, result, operand)
        if position == len(operands) - 1 and node.op_type != "Mean":
            return call
        result = context.builder.emit(call, node.op_type.lower())
    count = scalar(context, len(operands), dtype_of(result, node), f"{node.output[0]}_count")
    return call_op("divide", result, count)


@converter("Where")
@known_dtypes
def convert_where(context, node, inputs):
    return call_op("where", inputs[0], inputs[1], inputs[2])


def _cast(context, node, x, dtype: str):
    if dtype not in DTYPES:
        raise NodeConversionError(f"{node.op_type} node '{node.name}': casting to {dtype} is not supported")
    if dtype_of(x, node) == dtype:
        return x  # an alias: nothing to compute
    return call_op("cast", x, dtype=dtype)


@converter("Cast")
def convert_cast(context, node, inputs):
    to = context.attributes(node)["to"]
    try:
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(to)))
    except (KeyError, TypeError, ValueError):
        dtype = f"ONNX type {to}"
    return _cast(context, node, inputs[0], dtype)


@converter("CastLike")
def convert_cast_like(context, node, inputs):
    return _cast(context, node, inputs[0], dtype_of(inputs[1], node, "input 1"))
