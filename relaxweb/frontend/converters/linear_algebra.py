"""ONNX MatMul and Gemm."""

from __future__ import annotations

import numpy as np

from ...ir.expr import Constant, tensor_shape
from ...ops import call_op
from .registry import NodeConversionError, converter


@converter("MatMul")
def convert_matmul(context, node, inputs):
    a, b = inputs
    if len(tensor_shape(a)) < 2 or len(tensor_shape(b)) < 2:
        raise NodeConversionError(f"MatMul node '{node.name}': 1-D operands are not supported yet")
    return call_op("matmul", a, b)


@converter("Gemm")
def convert_gemm(context, node, inputs):
    """Y = alpha * A' @ B' + beta * C, with A' = A or A^T and B' = B or B^T.

    Transposes of constant operands and the scaling of constant C are folded here, at
    import, so a typical Linear layer becomes matmul + add with no extra work on the GPU.
    """
    attrs = context.attributes(node)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None

    def maybe_transpose(operand, flag: str):
        if not attrs.get(flag, 0):
            return operand
        if isinstance(operand, Constant):
            return context.constant(operand.data.T, operand.name + "_T")
        return context.builder.emit(call_op("transpose", operand, axes=[1, 0]), "transpose")

    a, b = maybe_transpose(a, "transA"), maybe_transpose(b, "transB")
    if alpha != 1.0:
        if isinstance(b, Constant):
            b = context.constant((b.data * np.float32(alpha)).astype(b.data.dtype), b.name + "_scaled")
        else:
            scale = context.constant(np.array(alpha, dtype=np.float32).reshape(()), node.name + "_alpha")
            b = context.builder.emit(call_op("multiply", b, scale), "gemm_alpha")
    result = call_op("matmul", a, b)
    if c is None or beta == 0.0:
        return result
    if beta != 1.0:
        if isinstance(c, Constant):
            c = context.constant((c.data * np.float32(beta)).astype(c.data.dtype), c.name + "_scaled")
        else:
            scale = context.constant(np.array(beta, dtype=np.float32).reshape(()), node.name + "_beta")
            c = context.builder.emit(call_op("multiply", c, scale), "gemm_beta")
    product = context.builder.emit(result, "gemm")
    return call_op("add", product, c)
