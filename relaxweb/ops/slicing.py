"""Slices: strided_slice (begin, end and steps known at compile time, possibly symbolic) and
dynamic_slice (ONNX Slice with every operand a run-time tensor).

- ``strided_slice(x, begin, end, axes=[...], strides=[...], assume_inbound=True)``: ``begin``
  and ``end`` are shape values, so they may be symbolic (use :func:`strided_slice`).
- ``dynamic_slice(x, starts, ends, axes, steps)``: every operand a run-time 1-D integer tensor
  (data-dependent; extents read back, positions computed in the kernel).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import UnsupportedModelError
from ..ir.expr import Call, Expr, ShapeExpr, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError, call_op, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import (
    IntImm, PrimExpr, as_expr, as_int, expr_max, expr_min, prove_less_equal, simplify,
)
from ..ir.tir import Gather, IndexValue, Load, maximum, minimum, select
from .common import (
    expect_args, make_program, needs_known_shapes,
    normalize_axes, require_tensor,
)
from .readback import const, element, index, int32, read_back_dims, wrap_negative
from .shape_operands import int_list, needs_known_data_shape, shape_operand, shape_values


# strided_slice ---------------------------------------------------------------------------------

# A begin or end at or past +-BIG means "from the start" / "to the end" (ONNX writes INT64_MAX).
BIG = 2**31 - 1


def _position(value: PrimExpr, dim: PrimExpr, stride: int, is_end: bool) -> PrimExpr:
    """A begin or end resolved against the dim: constants as ONNX Slice does (negative counts
    from the end, +-BIG are the ends), symbolic values as positions from the start."""
    constant = as_int(value)
    if constant is None:
        return simplify(value)
    if constant >= BIG:
        return dim if stride > 0 else simplify(dim - 1)
    if constant <= -BIG:
        return IntImm(-1) if (stride < 0 and is_end) else IntImm(0)
    if constant < 0:
        return simplify(dim + constant)
    return IntImm(constant)


def _clamp(value: PrimExpr, low: PrimExpr, high: PrimExpr, assume_inbound: bool) -> PrimExpr:
    """``value`` clamped to ``[low, high]``: exactly when decidable; otherwise with min/max,
    or assumed already in range when ``assume_inbound``."""
    value, low, high = simplify(value), simplify(low), simplify(high)
    constants = [as_int(value), as_int(low), as_int(high)]
    if None not in constants:
        v, lo, hi = constants
        return IntImm(min(max(v, lo), hi))  # type: ignore[type-var]
    if prove_less_equal(value, low):
        value = low
    elif not prove_less_equal(low, value) and not assume_inbound:
        value = expr_max(value, low)
    if prove_less_equal(high, value):
        value = high
    elif not prove_less_equal(value, high) and not assume_inbound:
        value = expr_min(value, high)
    return simplify(value)


def slice_range(
    dim: PrimExpr, begin: PrimExpr, end: PrimExpr, stride: int, assume_inbound: bool = True
) -> tuple[PrimExpr, PrimExpr]:
    """(first index, number of elements) of ``begin:end:stride`` on a dim, with ONNX Slice
    clamping: positive strides clamp both ends to ``[0, dim]``; negative strides clamp the
    begin to ``[0, dim - 1]`` and the end to ``[-1, dim - 1]``."""
    dim = simplify(dim)
    start = _position(as_expr(begin), dim, stride, is_end=False)
    stop = _position(as_expr(end), dim, stride, is_end=True)
    if stride > 0:
        start = _clamp(start, IntImm(0), dim, assume_inbound)
        stop = _clamp(stop, IntImm(0), dim, assume_inbound)
        span = simplify(stop - start)
    else:
        start = _clamp(start, IntImm(0), simplify(dim - 1), assume_inbound)
        stop = _clamp(stop, IntImm(-1), simplify(dim - 1), assume_inbound)
        span = simplify(start - stop)
    step = abs(stride)
    extent = simplify((span + (step - 1)) // step)
    if prove_less_equal(span, 0):
        extent = IntImm(0)
    elif not prove_less_equal(0, span) and not assume_inbound:
        extent = simplify(expr_max(extent, 0))
    return start, extent


def _slice_attrs(args, attrs, ndim: int):
    """Axes (normalized when the rank is known), strides, and the begin/end values (or None)."""
    begin = shape_values(args[1], "strided_slice", "begin").values
    end = shape_values(args[2], "strided_slice", "end").values
    axes = [int(a) for a in attrs["axes"]]
    strides = [int(s) for s in attrs.get("strides") or [1] * len(axes)]
    lengths = {"axes": len(axes), "strides": len(strides)}
    if begin is not None:
        lengths["begin"] = len(begin)
    if end is not None:
        lengths["end"] = len(end)
    if len(set(lengths.values())) > 1:
        raise DeductionError(
            "strided_slice: axes, begin, end and strides need one entry per sliced axis, got "
            + ", ".join(f"{len_} in {name}" for name, len_ in lengths.items())
        )
    for axis, stride in zip(axes, strides):
        if stride == 0:
            raise DeductionError(f"strided_slice: the stride of axis {axis} is 0")
    if ndim != -1:
        axes = normalize_axes("strided_slice", axes, ndim)
    return axes, strides, begin, end


def _slice_plan(data_shape, args, attrs) -> dict[int, tuple[PrimExpr, PrimExpr, int]]:
    """For each sliced axis: (first index, extent, stride)."""
    axes, strides, begin, end = _slice_attrs(args, attrs, len(data_shape))
    assume = bool(attrs.get("assume_inbound", True))
    plan = {}
    for axis, b, e, s in zip(axes, begin, end, strides):
        start, extent = slice_range(data_shape[axis], b, e, s, assume)
        plan[axis] = (start, extent, s)
    return plan


def deduce_strided_slice(args, attrs) -> TensorStructInfo:
    expect_args("strided_slice", args, 3)
    data = require_tensor(args[0], "strided_slice", 0)
    _, _, begin, end = _slice_attrs(args, attrs, data.ndim)
    if data.shape is None or begin is None or end is None:
        return TensorStructInfo(None, data.dtype, data.ndim)
    shape = list(data.shape)
    for axis, (_, extent, _) in _slice_plan(data.shape, args, attrs).items():
        shape[axis] = extent
    return TensorStructInfo(tuple(shape), data.dtype)


def legalize_strided_slice(context, call: Call):
    data = call.args[0]
    info = call.struct_info
    plan = _slice_plan(tensor_shape(data), call.args, call.attrs)

    def body(axes, buffers):
        index = list(axes)
        for axis, (start, _, stride) in plan.items():
            index[axis] = simplify(start + axes[axis] * stride)
        return Load(buffers[0], tuple(index))

    program = make_program("strided_slice", [data], info.shape, info.dtype, body)
    return context.call_tir(program, (data,))


def strided_slice_reference(arrays, attrs):
    x, begin, end = arrays[0], arrays[1], arrays[2]
    axes = [int(a) for a in attrs["axes"]]
    strides = [int(s) for s in attrs.get("strides") or [1] * len(axes)]
    for axis, b, e, s in zip(axes, begin, end, strides):
        axis = axis + x.ndim if axis < 0 else axis
        start, extent = slice_range(IntImm(x.shape[axis]), IntImm(int(b)), IntImm(int(e)), s)
        positions = int(as_int(start)) + np.arange(int(as_int(extent))) * s
        x = np.take(x, positions, axis=axis)
    return np.ascontiguousarray(x)


register_op(
    "strided_slice",
    deduce=deduce_strided_slice,
    legalize=needs_known_shapes(legalize_strided_slice),
    reference=strided_slice_reference,
)


def strided_slice(
    data: Expr,
    axes: Sequence[int],
    begin: Sequence[PrimExpr | int],
    end: Sequence[PrimExpr | int],
    strides: Sequence[int] | None = None,
    assume_inbound: bool = True,
) -> Call:
    """Build a ``strided_slice`` call; ``begin`` and ``end`` may hold symbolic expressions.

    Constant begins and ends follow ONNX Slice (negative counts from the end, clamped to the
    dim).  Symbolic ones are positions from the start; where a clamp cannot be decided at
    compile time, ``assume_inbound`` (as in Relax) takes the value to be in range, otherwise
    the shape holds ``min``/``max``.
    """
    return call_op(
        "strided_slice", data, ShapeExpr(tuple(begin)), ShapeExpr(tuple(end)),
        axes=list(axes), strides=list(strides) if strides is not None else [1] * len(axes),
        assume_inbound=assume_inbound,
    )


def onnx_slice_reference(x: np.ndarray, starts, ends, axes, steps) -> np.ndarray:
    """ONNX Slice on an array: negative starts/ends count from the end, both are clamped
    (Python's slice rules are ONNX's), negative axes count from the end."""
    result = x
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise ValueError("slice: a step is 0")
        axis = axis + x.ndim if axis < 0 else axis
        # the positions themselves: slice.indices gives -1 for "before the start", which a
        # slice would read as the last element
        positions = np.arange(*slice(int(start), int(end), int(step)).indices(x.shape[axis]))
        result = np.take(result, positions, axis=axis)
    return np.ascontiguousarray(result)


# dynamic_slice ---------------------------------------------------------------------------------


def deduce_dynamic_slice(args, attrs) -> TensorStructInfo:
    expect_args("dynamic_slice", args, 5)
    data = require_tensor(args[0], "dynamic_slice", 0)
    for position, what in enumerate(("starts", "ends", "axes", "steps"), start=1):
        shape_operand(args[position], "dynamic_slice", what)
    return TensorStructInfo(None, data.dtype, data.ndim)


def _dynamic_slice_plan(buffers, ndim: int, count: int, dim: int, extent_of_dim):
    """(begin, step, extent) of data dim ``dim`` as int32 scalars, from the run-time starts,
    ends, axes and steps (buffers 1 to 4): Python's slice rules (ONNX's) for the entry whose
    axis is ``dim``, the whole dim where none is."""
    _, starts, ends, axes, steps = buffers
    size = index(extent_of_dim)

    def clamp(value, low, high):
        return minimum(maximum(value, low), high)

    def ceil_div(a, b):  # a >= 0, b > 0
        return int32((a + (b - const(1))) / b)

    begin, step, extent = const(0), const(1), size
    for k in reversed(range(count)):
        step_k = element(steps, k)
        forward = step_k.gt(const(0))

        def resolve(value):
            wrapped = wrap_negative(value, size)
            return select(forward, clamp(wrapped, const(0), size), clamp(wrapped, const(-1), size - const(1)))

        start_k, end_k = resolve(element(starts, k)), resolve(element(ends, k))
        zero = const(0)
        extent_k = select(
            forward, ceil_div(maximum(end_k - start_k, zero), step_k), ceil_div(maximum(start_k - end_k, zero), -step_k),
        )
        here = wrap_negative(element(axes, k), index(ndim)).eq(index(dim))
        begin, step, extent = select(here, start_k, begin), select(here, step_k, step), select(here, extent_k, extent)
    return begin, step, extent


def legalize_dynamic_slice(context, call: Call):
    """Each output extent is computed on the GPU from the run-time operands and read back
    (one read per dim), then a copy whose source positions ``begin + i * step`` are computed
    from the operands in the kernel (an indirect load, clamped)."""
    data = call.args[0]
    shape = tensor_shape(data)
    ndim = len(shape)
    lengths = {as_int(tensor_shape(a)[0]) if len(tensor_shape(a)) == 1 else None for a in call.args[1:]}
    if len(lengths) != 1 or None in lengths:
        raise UnsupportedModelError("dynamic_slice: the starts, ends, axes and steps need 1-D tensors of one known length")
    (count,) = lengths

    def extent(dim: int):
        return lambda buffers: _dynamic_slice_plan(buffers, ndim, count, dim, shape[dim])[2]

    dims = read_back_dims(context, call.args, [extent(d) for d in range(ndim)], "slice")

    def body(axes, buffers):
        positions = []
        for d in range(ndim):
            begin, step, _ = _dynamic_slice_plan(buffers, ndim, count, d, shape[d])
            positions.append(begin + IndexValue(axes[d]) * step)
        return Gather(buffers[0], tuple(positions))

    program = make_program("dynamic_slice", call.args, dims, tensor_dtype(data), body)
    return context.call_tir(program, call.args)


register_op(
    "dynamic_slice",
    deduce=deduce_dynamic_slice,
    legalize=needs_known_data_shape(legalize_dynamic_slice),
    reference=lambda arrays, attrs: onnx_slice_reference(arrays[0], *(int_list(a) for a in arrays[1:])),
    reads_back=True,
)
