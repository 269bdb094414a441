"""Matrix multiplication with numpy semantics (batched, broadcast batch dims).

``matmul(A[..., M, K], B[..., K, N]) -> [..., M, N]``; the batch dims broadcast.  Operands
must have at least 2 dims (the frontend reshapes 1-D operands).  Legalizes to one tensor
program with a sum reduction over K.

Deduction: K must be provably equal on both sides; the batch dims broadcast like elementwise
ops.  With an operand of unknown shape the result's shape is unknown and its rank the larger
of the two (unknown if either rank is).
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import SizeVar, format_expr, prove_equal
from ..ir.tir import Binary, Load, Reduce
from .common import (
    broadcast_indices, broadcast_shapes, expect_args, make_program, needs_known_shapes, require_tensor,
    same_dtype, unknown_rank_join,
)
from .registry import DeductionError, register_op


def deduce_matmul(args, attrs) -> TensorStructInfo:
    expect_args("matmul", args, 2)
    a, b = (require_tensor(arg, "matmul", i) for i, arg in enumerate(args))
    for position, info in enumerate((a, b)):
        if 0 <= info.ndim < 2:
            raise DeductionError(f"matmul: operands need at least 2 dims, argument {position} is {info}")
    dtype = same_dtype("matmul", [a, b])
    if a.shape is None or b.shape is None:
        return TensorStructInfo(None, dtype, unknown_rank_join([a.ndim, b.ndim]))
    if not prove_equal(a.shape[-1], b.shape[-2]):
        raise DeductionError(
            f"matmul: reduction dims differ: {format_expr(a.shape[-1])} (dim {a.ndim - 1} of the first operand) "
            f"vs {format_expr(b.shape[-2])} (dim {b.ndim - 2} of the second)"
        )
    batch = broadcast_shapes("matmul", [a.shape[:-2], b.shape[:-2]], scope="the batch dims")
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
    legalize=needs_known_shapes(legalize_matmul),
    reference=lambda arrays, attrs: np.matmul(arrays[0], arrays[1]).astype(arrays[0].dtype),
)
