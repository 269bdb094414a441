"""ONNX MatMul, Gemm, Einsum and EyeLike (the identity matrix, or a shifted diagonal, of an
input's shape)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from ...errors import UnsupportedModelError
from ...ir.dtype import DTYPES
from ...ir.expr import Constant, tensor_shape
from ...ops import call_op
from .registry import NodeConversionError, converter


@converter("MatMul")
def convert_matmul(context, node, inputs):
    """numpy matmul.  With a 1-D operand ([K] on the left is a row, on the right a column,
    and that dim is dropped from the result) it is the equivalent einsum, one program."""
    a, b = inputs
    a_rank, b_rank = a.struct_info.ndim, b.struct_info.ndim
    if a_rank < 0 or b_rank < 0:
        raise UnsupportedModelError(f"MatMul node '{node.name}': an operand of unknown rank is not supported")
    if a_rank == 0 or b_rank == 0:
        raise NodeConversionError(f"MatMul node '{node.name}': operands must have at least 1 dim")
    if a_rank >= 2 and b_rank >= 2:
        return call_op("matmul", a, b)
    left = "k" if a_rank == 1 else "...mk"
    right = "k" if b_rank == 1 else "...kn"
    output = ("..." if max(a_rank, b_rank) > 1 else "") + ("m" if a_rank > 1 else "") + ("n" if b_rank > 1 else "")
    return call_op("einsum", a, b, equation=f"{left},{right}->{output}")


@converter("Gemm")
def convert_gemm(context, node, inputs):
    """Y = alpha * A' @ B' + beta * C, with A' = A or A^T and B' = B or B^T; C broadcasts
    (a scalar, a row [N], a column [M, 1] or a matrix).

    Transposes of constant operands and the scaling of constant C are folded here, at
    import, so a typical Linear layer becomes matmul + add with no extra work on the GPU.
    """
    attrs = context.attributes(node)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    for name, operand in (("A", a), ("B", b)):
        if len(tensor_shape(operand)) != 2:
            raise NodeConversionError(f"Gemm node '{node.name}': {name} must be a matrix, got {operand.struct_info}")

    def maybe_transpose(operand, flag: str):
        if not attrs.get(flag, 0):
            return operand
        if isinstance(operand, Constant):
            return context.constant(operand.data.T, operand.name + "_T")
        return context.builder.emit(call_op("transpose", operand, axes=[1, 0]), "transpose")

    def scaled(operand, factor: float, what: str):
        dtype = operand.struct_info.dtype
        if isinstance(operand, Constant):
            return context.constant((operand.data * np.asarray(factor, dtype=operand.data.dtype)).astype(operand.data.dtype),
                                    operand.name + "_scaled")
        scale = context.constant(np.array(factor, dtype=dtype).reshape(()), f"{node.name or 'gemm'}_{what}")
        return context.builder.emit(call_op("multiply", operand, scale), f"gemm_{what}")

    a, b = maybe_transpose(a, "transA"), maybe_transpose(b, "transB")
    if alpha != 1.0:
        b = scaled(b, alpha, "alpha")
    result = call_op("matmul", a, b)
    if c is None or beta == 0.0:
        return result
    if beta != 1.0:
        c = scaled(c, beta, "beta")
    product = context.builder.emit(result, "gemm")
    return call_op("add", product, c)


@converter("Einsum")
def convert_einsum(context, node, inputs):
    attrs = context.attributes(node)
    equation = attrs["equation"]
    if isinstance(equation, bytes):
        equation = equation.decode()
    return call_op("einsum", *inputs, equation=equation)


@converter("EyeLike")
def convert_eye_like(context, node, inputs):
    attrs = context.attributes(node)
    dtype = None
    if "dtype" in attrs:
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(attrs["dtype"])))
        if dtype not in DTYPES:
            raise NodeConversionError(f"EyeLike node '{node.name}': dtype {dtype} is not supported")
    return call_op("eye_like", inputs[0], k=int(attrs.get("k", 0)), dtype=dtype)
