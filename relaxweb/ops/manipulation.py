"""Data movement ops: reshape and transpose.

Both move elements without arithmetic.  They legalize to copy programs whose load indices
are index arithmetic on the output axes (later work may turn a contiguous reshape into a
view of the same storage).
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.struct_info import ShapeStructInfo, TensorStructInfo
from ..ir.symbolic import PrimExpr, format_expr, product, prove_equal, simplify
from ..ir.tir import Load
from .common import make_program, require_tensor
from .registry import DeductionError, register_op


def deduce_reshape(args, attrs) -> TensorStructInfo:
    data = require_tensor(args[0], "reshape", 0)
    shape_info = args[1].struct_info
    if not isinstance(shape_info, ShapeStructInfo) or shape_info.values is None:
        raise DeductionError(f"reshape: the target shape must be a known shape value, got {shape_info}")
    before, after = product(data.shape), product(shape_info.values)
    if not prove_equal(before, after):
        raise DeductionError(
            f"reshape: element counts differ: {format_expr(before)} vs {format_expr(after)}"
        )
    return TensorStructInfo(shape_info.values, data.dtype)


def row_major_strides(shape: tuple[PrimExpr, ...]) -> list[PrimExpr]:
    strides: list[PrimExpr] = []
    stride: PrimExpr = simplify(1)
    for dim in reversed(shape):
        strides.append(stride)
        stride = simplify(stride * dim)
    return strides[::-1]


def legalize_reshape(context, call: Call):
    info = call.struct_info
    data = call.args[0]

    def body(axes, buffers):
        (source,) = buffers
        flat = sum((axis * stride for axis, stride in zip(axes, row_major_strides(info.shape))), simplify(0))
        source_strides = row_major_strides(source.shape)
        indices = tuple(
            simplify((flat // stride) % dim) for stride, dim in zip(source_strides, source.shape)
        )
        return Load(source, indices)

    program = make_program("reshape", [data], info.shape, info.dtype, body)
    return context.call_tir(program, (data,))


def reshape_reference(arrays, attrs):
    return arrays[0].reshape(tuple(int(v) for v in arrays[1]))


register_op("reshape", deduce=deduce_reshape, legalize=legalize_reshape, reference=reshape_reference)


def deduce_transpose(args, attrs) -> TensorStructInfo:
    data = require_tensor(args[0], "transpose", 0)
    permutation = tuple(attrs["axes"])
    if sorted(permutation) != list(range(data.ndim)):
        raise DeductionError(f"transpose: axes {list(permutation)} are not a permutation of {data.ndim} dims")
    return TensorStructInfo(tuple(data.shape[p] for p in permutation), data.dtype)


def legalize_transpose(context, call: Call):
    info = call.struct_info
    permutation = tuple(call.attrs["axes"])

    def body(axes, buffers):
        source_index: list = [None] * len(permutation)
        for output_dim, source_dim in enumerate(permutation):
            source_index[source_dim] = axes[output_dim]
        return Load(buffers[0], tuple(source_index))

    program = make_program("transpose", call.args, info.shape, info.dtype, body)
    return context.call_tir(program, call.args)


register_op(
    "transpose",
    deduce=deduce_transpose,
    legalize=legalize_transpose,
    reference=lambda arrays, attrs: np.ascontiguousarray(np.transpose(arrays[0], attrs["axes"])),
)

