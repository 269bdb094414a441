"""Neural-network ops: softmax.

``softmax(x, axes)`` normalises over the contiguous trailing ``axes`` (ONNX opset >= 13 uses
one axis; older opsets flatten everything from ``axis`` on, which is the same as normalising
over all those axes).  Legalized in three tensor programs — the row maximum, the sum of
exponentials, and the normalisation — so each reduction is computed once per row.

Deduction: the result has the argument's annotation; the axes must be the trailing ones
(checked when the rank is known).
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, SizeVar
from ..ir.tir import Binary, Load, Reduce, Unary
from .common import expect_args, make_program, needs_known_shapes, require_float, require_tensor
from .registry import DeductionError, register_op


def deduce_softmax(args, attrs) -> TensorStructInfo:
    expect_args("softmax", args, 1)
    data = require_tensor(args[0], "softmax", 0)
    axes = tuple(attrs["axes"])
    if not axes or (data.ndim != -1 and list(axes) != list(range(axes[0], data.ndim))):
        rank = f"a {data.ndim}-d tensor" if data.ndim != -1 else "the tensor"
        raise DeductionError(f"softmax: axes {list(axes)} must be the trailing axes of {rank}")
    require_float("softmax", data)
    return data


def _reduce_over(combiner, axes_reduced, buffer, outer_axes, make_body):
    """combiner over the reduced axes of ``buffer``; outer axes index the kept dims."""
    reduce_vars = [SizeVar(f"r{d}_") for d in axes_reduced]
    index = list(outer_axes[: axes_reduced[0]]) + reduce_vars
    body = make_body(tuple(index))
    for var, dim in reversed(list(zip(reduce_vars, axes_reduced))):
        body = Reduce(combiner, var, buffer.shape[dim], body)
    return body


def legalize_softmax(context, call: Call):
    data = call.args[0]
    info = call.struct_info
    axes = tuple(call.attrs["axes"])
    kept_shape = tuple(IntImm(1) if d in axes else dim for d, dim in enumerate(info.shape))

    def kept_index(axes_vars):
        return tuple(IntImm(0) if d in axes else axes_vars[d] for d in range(len(axes_vars)))

    row_max_program = make_program(
        "softmax_max", [data], kept_shape, info.dtype,
        lambda out_axes, buffers: _reduce_over(
            "max", axes, buffers[0], out_axes, lambda index: Load(buffers[0], index)
        ),
    )
    row_max = context.emit(context.call_tir(row_max_program, (data,)), "softmax_max")

    def exp_sum_body(out_axes, buffers):
        source, maximum = buffers
        return _reduce_over(
            "sum", axes, source, out_axes,
            lambda index: Unary("exp", Binary("subtract", Load(source, index), Load(maximum, kept_index(index)))),
        )

    exp_sum_program = make_program("softmax_sum", [data, row_max], kept_shape, info.dtype, exp_sum_body)
    exp_sum = context.emit(context.call_tir(exp_sum_program, (data, row_max)), "softmax_sum")

    def normalize_body(out_axes, buffers):
        source, maximum, total = buffers
        shifted = Binary("subtract", Load(source, out_axes), Load(maximum, kept_index(out_axes)))
        return Binary("divide", Unary("exp", shifted), Load(total, kept_index(out_axes)))

    program = make_program("softmax_normalize", [data, row_max, exp_sum], info.shape, info.dtype, normalize_body)
    return context.call_tir(program, (data, row_max, exp_sum))


def softmax_reference(arrays, attrs):
    x = arrays[0]
    axes = tuple(attrs["axes"])
    shifted = np.exp(x - x.max(axis=axes, keepdims=True))
    return (shifted / shifted.sum(axis=axes, keepdims=True)).astype(x.dtype)


register_op("softmax", deduce=deduce_softmax, legalize=needs_known_shapes(legalize_softmax), reference=softmax_reference)

