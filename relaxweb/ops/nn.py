"""Neural-network ops over some axes: softmax, log_softmax, hardmax; and dropout's mask.

``softmax(x, axes)``, ``log_softmax(x, axes)`` and ``hardmax(x, axes)`` normalise over the
given ``axes`` (any non-empty set of distinct axes, negative counting from the end).  ONNX
opset >= 13 uses one axis; older opsets flatten everything from ``axis`` on, which is the
same as normalising over all those axes.  ``hardmax`` is 1 at the first maximum of each
group (first in row-major order over the axes) and 0 elsewhere.

Legalization: softmax in three tensor programs — the group maximum, the sum of
exponentials, and the normalisation — so each reduction is computed once per group;
log_softmax the same with a logarithm (only when the tensor-program IR has ``log``);
hardmax as the maximum, the first index reaching it, and the one-hot output.

``dropout_mask(x)``: the all-true ``bool`` mask of inference-mode Dropout (legalized as a
constant-true program; bool tensors are u32 0/1 on the device).

Deduction: the result has the argument's annotation (float only; ``bool`` for the mask).
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Expr
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, simplify
from ..ir.tir import FloatImm, IndexValue, Load, Reduce, ReduceCombiner, exp, log, select
from .common import (
    expect_args, make_program, needs_known_shapes, normalize_axes, require_float, require_tensor,
)


def _axes(op: str, attrs, ndim: int) -> list[int]:
    axes = [int(a) for a in attrs["axes"]]
    if not axes:
        raise DeductionError(f"{op}: needs at least one axis")
    return sorted(normalize_axes(op, axes, ndim))


def _deduce_normalizer(op: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(op, args, 1)
        data = require_tensor(args[0], op, 0)
        if not list(attrs["axes"]):
            raise DeductionError(f"{op}: needs at least one axis")
        if data.ndim != -1:
            _axes(op, attrs, data.ndim)
        require_float(op, data)
        return data

    return deduce


def reduce_over(combiner: ReduceCombiner, axes: list[int], buffer, outer_axes, make_body, prefix: str = "r"):
    """``combiner`` over the ``axes`` of ``buffer``: ``make_body(index)`` with the reduced
    dims indexed by reduction variables and the others by ``outer_axes`` (same rank)."""
    reduce_vars = {d: SizeVar(f"{prefix}{d}_") for d in axes}
    index = tuple(reduce_vars.get(d, outer_axes[d]) for d in range(len(buffer.shape)))
    body = make_body(index)
    for d in reversed(axes):
        body = Reduce(combiner, reduce_vars[d], buffer.shape[d], body)
    return body


def _kept(axes: list[int], index) -> tuple:
    """The index into a tensor whose reduced dims are 1."""
    return tuple(IntImm(0) if d in axes else index[d] for d in range(len(index)))


def _row_max(context, call: Call, axes: list[int]):
    data = call.args[0]
    info = call.struct_info
    kept_shape = tuple(IntImm(1) if d in axes else dim for d, dim in enumerate(info.shape))
    program = make_program(
        f"{call.op}_max", [data], kept_shape, info.dtype,
        lambda out_axes, buffers: reduce_over(ReduceCombiner.MAX, axes, buffers[0], out_axes, lambda index: Load(buffers[0], index)),
    )
    return kept_shape, context.emit(context.call_tir(program, (data,)), f"{call.op}_max")


def _exp_sum(context, call: Call, axes: list[int], kept_shape, row_max):
    data = call.args[0]

    def body(out_axes, buffers):
        source, row_max = buffers
        return reduce_over(
            ReduceCombiner.SUM, axes, source, out_axes,
            lambda index: exp(Load(source, index) - Load(row_max, _kept(axes, index))),
        )

    program = make_program(f"{call.op}_sum", [data, row_max], kept_shape, call.struct_info.dtype, body)
    return context.emit(context.call_tir(program, (data, row_max)), f"{call.op}_sum")


def _legalize_normalized(context, call: Call, finish) -> Expr:
    """softmax and log_softmax: the row maximum, the sum of exponentials, then
    ``finish(shifted, total)`` per element (shifted = x - max)."""
    data = call.args[0]
    info = call.struct_info
    axes = _axes(call.op, call.attrs, info.ndim)
    kept_shape, row_max = _row_max(context, call, axes)
    exp_sum = _exp_sum(context, call, axes, kept_shape, row_max)

    def normalize_body(out_axes, buffers):
        source, row_max, total = buffers
        shifted = Load(source, out_axes) - Load(row_max, _kept(axes, out_axes))
        return finish(shifted, Load(total, _kept(axes, out_axes)))

    program = make_program(f"{call.op}_normalize", [data, row_max, exp_sum], info.shape, info.dtype, normalize_body)
    return context.call_tir(program, (data, row_max, exp_sum))


def legalize_softmax(context, call: Call):
    return _legalize_normalized(context, call, lambda shifted, total: exp(shifted) / total)


def legalize_log_softmax(context, call: Call):
    return _legalize_normalized(context, call, lambda shifted, total: shifted - log(total))


def _flat_position(axes: list[int], index, shape) -> PrimExpr:
    """The row-major position of ``index`` over the ``axes`` only."""
    position: PrimExpr = IntImm(0)
    for d in axes:
        position = position * shape[d] + index[d]
    return simplify(position)


def legalize_hardmax(context, call: Call):
    data = call.args[0]
    info = call.struct_info
    axes = _axes("hardmax", call.attrs, info.ndim)
    kept_shape, row_max = _row_max(context, call, axes)
    never = IndexValue(IntImm(2**31 - 1))

    def first_body(out_axes, buffers):
        source, row_max = buffers
        return reduce_over(
            ReduceCombiner.MIN, axes, source, out_axes,
            lambda index: select(
                Load(source, index).eq(Load(row_max, _kept(axes, index))),
                IndexValue(_flat_position(axes, index, source.shape)), never,
            ),
        )

    program = make_program("hardmax_first", [data, row_max], kept_shape, "int32", first_body)
    first = context.emit(context.call_tir(program, (data, row_max)), "hardmax_first")

    def one_hot(out_axes, buffers):
        source, first_index = buffers
        hit = IndexValue(_flat_position(axes, out_axes, source.shape)).eq(Load(first_index, _kept(axes, out_axes)))
        return select(hit, FloatImm(1.0, info.dtype), 0.0)

    program = make_program("hardmax_one_hot", [data, first], info.shape, info.dtype, one_hot)
    return context.call_tir(program, (data, first))


def _native(x: np.ndarray) -> np.ndarray:
    """numpy cannot compute in some dtypes (bfloat16): those compute in float32."""
    return x if x.dtype.kind in "fiub" else x.astype(np.float32)


def softmax_reference(arrays, attrs):
    x = _native(arrays[0])
    axes = tuple(_axes("softmax", attrs, x.ndim))
    shifted = np.exp(x - x.max(axis=axes, keepdims=True))
    return (shifted / shifted.sum(axis=axes, keepdims=True)).astype(arrays[0].dtype)


def log_softmax_reference(arrays, attrs):
    x = _native(arrays[0])
    axes = tuple(_axes("log_softmax", attrs, x.ndim))
    shifted = x - x.max(axis=axes, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=axes, keepdims=True))).astype(arrays[0].dtype)


def hardmax_reference(arrays, attrs):
    x = arrays[0]
    axes = _axes("hardmax", attrs, x.ndim)
    kept = [d for d in range(x.ndim) if d not in axes]
    moved = np.transpose(x, kept + axes)
    rows = moved.reshape(moved.shape[: len(kept)] + (-1,))
    result = np.zeros_like(rows)
    if rows.shape[-1]:
        np.put_along_axis(result, np.argmax(rows, axis=-1)[..., None], 1, axis=-1)
    result = result.reshape(moved.shape)
    return np.ascontiguousarray(np.transpose(result, np.argsort(kept + axes)))


register_op("softmax", deduce=_deduce_normalizer("softmax"), legalize=needs_known_shapes(legalize_softmax),
            reference=softmax_reference)
register_op("log_softmax", deduce=_deduce_normalizer("log_softmax"),
            legalize=needs_known_shapes(legalize_log_softmax),
            reference=log_softmax_reference)
register_op("hardmax", deduce=_deduce_normalizer("hardmax"), legalize=needs_known_shapes(legalize_hardmax),
            reference=hardmax_reference)


# dropout_mask ----------------------------------------------------------------------------------


def deduce_dropout_mask(args, attrs) -> TensorStructInfo:
    expect_args("dropout_mask", args, 1)
    data = require_tensor(args[0], "dropout_mask", 0)
    return TensorStructInfo(data.shape, "bool", data.ndim)


def legalize_dropout_mask(context, call: Call):
    """An all-true bool tensor (inference mode keeps every element)."""
    info = call.struct_info
    program = make_program("dropout_mask", [], info.shape, "bool", lambda axes, buffers: FloatImm(1, "bool"))
    return context.call_tir(program, ())


register_op(
    "dropout_mask",
    deduce=deduce_dropout_mask,
    legalize=needs_known_shapes(legalize_dropout_mask),
    reference=lambda arrays, attrs: np.ones(np.shape(arrays[0]), dtype=bool),
)
