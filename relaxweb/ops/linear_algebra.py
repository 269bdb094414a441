"""Matrix multiplication with numpy semantics (batched, broadcast batch dims).

``matmul(A[..., M, K], B[..., K, N]) -> [..., M, N]``; the batch dims broadcast.  Operands
must have at least 2 dims (the frontend reshapes 1-D operands).  Legalizes to one tensor
program with a sum reduction over K.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import SizeVar, format_expr, prove_equal
from ..ir.tir import Binary, Load, Reduce
from .common import broadcast_indices, broadcast_shapes, make_program, require_tensor
from .registry import DeductionError, register_op


def deduce_matmul(args, attrs) -> TensorStructInfo:
    a, b = (require_tensor(arg, "matmul", i) for i, arg in enumerate(args))
    if a.ndim < 2 or b.ndim < 2:
        raise DeductionError(f"matmul: operands need at least 2 dims, got {a} and {b}")
    if a.dtype != b.dtype:
        raise DeductionError(f"matmul: dtypes differ ({a.dtype} vs {b.dtype})")
    if not prove_equal(a.shape[-1], b.shape[-2]):
        raise DeductionError(
            f"matmul: reduction dims differ: {format_expr(a.shape[-1])} (dim {a.ndim - 1} of the first operand) "
            f"vs {format_expr(b.shape[-2])} (dim {b.ndim - 2} of the second)"
        )
    batch = broadcast_shapes("matmul", [a.shape[:-2], b.shape[:-2]])
    return TensorStructInfo((*batch, a.shape[-2], b.shape[-1]), a.dtype)


def legalize_matmul(context, call: Call):
    info = call.struct_info
    reduction_axis = SizeVar("k_")

    def body(axes, buffers):
        a, b = buffers
        batch_axes = axes[:-2]
        row, column = axes[-2], axes[-1]
        a_index = (*broadcast_indices(a.shape[:-2], batch_axes), row, reduction_axis)
        b_index = (*broadcast_indices(b.shape[:-2], batch_axes), reduction_axis, column)
        product = Binary("multiply", Load(a, a_index), Load(b, b_index))
        return Reduce("sum", reduction_axis, a.shape[-1], product)

    program = make_program("matmul", call.args, info.shape, info.dtype, body)
    return context.call_tir(program, call.args)


register_op(
    "matmul",
    deduce=deduce_matmul,
    legalize=legalize_matmul,
    reference=lambda arrays, attrs: np.matmul(arrays[0], arrays[1]).astype(arrays[0].dtype),
)
