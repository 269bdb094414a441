"""Data movement ops: reshape, transpose, concat, split and strided_slice.

They move elements without arithmetic and legalize to copy programs whose load indices are
index arithmetic on the output axes (later work may turn a contiguous reshape into a view of
the same storage).  ``concat`` picks its source with a :class:`~relaxweb.ir.tir.Select`
per input; ``split`` is one program per part.

Signatures (args, then attributes):

- ``reshape(x, shape)``: ``shape`` is a shape value (a ``ShapeExpr``); one entry may be
  ``-1``, inferred from the element count.  0 means a dimension of size 0 here (ONNX's
  "copy the input's dim" 0 is resolved by the frontend).
- ``transpose(x, axes=[...])``: a permutation of the dims.
- ``concat(x0, x1, ..., axis=0)``: the tensors are the call's arguments (not a tuple).
- ``split(x, sections=k, axis=0)`` or ``split(x, indices=[i, j, ...], axis=0)``: a tuple of
  ``k`` equal parts, or of the parts between the (constant, numpy-style) split points.
- ``strided_slice(x, begin, end, axes=[...], strides=[...], assume_inbound=True)``: ``begin``
  and ``end`` are shape values, so they may be symbolic (use :func:`strided_slice`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir.expr import Call, Expr, ShapeExpr, Tuple, tensor_shape
from ..ir.struct_info import ShapeStructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import (
    IntImm, PrimExpr, as_expr, as_int, expr_max, expr_min, format_expr, product, prove_equal,
    prove_less_equal, simplify,
)
from ..ir.tir import Compare, IndexValue, Load, Select
from .common import (
    expect_args, make_program, needs_known_shapes, normalize_axes, normalize_axis, require_tensor,
    same_dtype,
)
from .registry import DeductionError, call_op, register_op


class ReshapeInferenceError(DeductionError):
    """The -1 of a reshape target cannot be inferred: the element count is not provably a
    multiple of the other dims (the model may be fine for some sizes, but not provably)."""


# reshape ---------------------------------------------------------------------------------------


def _shape_values(expr: Expr, op: str, what: str) -> ShapeStructInfo:
    info = expr.struct_info
    if not isinstance(info, ShapeStructInfo):
        raise DeductionError(f"{op}: {what} must be a known shape value, got {info}")
    return info


def deduce_reshape(args, attrs) -> TensorStructInfo:
    expect_args("reshape", args, 2)
    data = require_tensor(args[0], "reshape", 0)
    target = _shape_values(args[1], "reshape", "the target shape")
    if target.values is None:
        return TensorStructInfo(None, data.dtype, target.ndim)
    values = list(target.values)
    inferred_dims = [d for d, v in enumerate(values) if as_int(v) == -1]
    if len(inferred_dims) > 1:
        raise DeductionError(f"reshape: more than one -1 in the target shape (dims {inferred_dims})")
    for position, value in enumerate(values):
        constant = as_int(value)
        if constant is not None and constant < -1:
            raise DeductionError(f"reshape: target dim {position} is {constant}")
    if data.shape is None:
        if inferred_dims:
            return TensorStructInfo(None, data.dtype, len(values))
        return TensorStructInfo(tuple(values), data.dtype)
    count = product(data.shape)
    if inferred_dims:
        position = inferred_dims[0]
        known = product(v for d, v in enumerate(values) if d != position)
        if as_int(known) == 0:
            raise DeductionError(
                f"reshape: cannot infer -1 (target dim {position}): the other target dims multiply to 0"
            )
        inferred = simplify(count // known)
        if not prove_equal(inferred * known, count):
            raise ReshapeInferenceError(
                f"reshape: cannot infer -1 (target dim {position}): {format_expr(count)} elements are not "
                f"provably a multiple of {format_expr(known)}"
            )
        values[position] = inferred
    elif not prove_equal(count, product(values)):
        raise DeductionError(
            f"reshape: element counts differ: {format_expr(count)} vs {format_expr(product(values))}"
        )
    return TensorStructInfo(tuple(values), data.dtype)


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
    return np.ascontiguousarray(arrays[0].reshape(tuple(int(v) for v in arrays[1])))


register_op("reshape", deduce=deduce_reshape, legalize=needs_known_shapes(legalize_reshape), reference=reshape_reference)


# transpose -------------------------------------------------------------------------------------


def _permutation(attrs, ndim: int) -> list[int]:
    axes = attrs.get("axes")
    if axes is None:
        return list(range(ndim - 1, -1, -1))
    permutation = [int(a) for a in axes]
    if sorted(permutation) != list(range(ndim)):
        raise DeductionError(f"transpose: axes {permutation} are not a permutation of {ndim} dims")
    return permutation


def deduce_transpose(args, attrs) -> TensorStructInfo:
    expect_args("transpose", args, 1)
    data = require_tensor(args[0], "transpose", 0)
    if data.ndim == -1:
        if attrs.get("axes") is None:
            return data
        ndim = len(attrs["axes"])
        _permutation(attrs, ndim)
        return TensorStructInfo(None, data.dtype, ndim)
    permutation = _permutation(attrs, data.ndim)
    if data.shape is None:
        return data
    return TensorStructInfo(tuple(data.shape[p] for p in permutation), data.dtype)


def legalize_transpose(context, call: Call):
    info = call.struct_info
    permutation = _permutation(call.attrs, info.ndim)

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
    legalize=needs_known_shapes(legalize_transpose),
    reference=lambda arrays, attrs: np.ascontiguousarray(
        np.transpose(arrays[0], _permutation(attrs, arrays[0].ndim))
    ),
)


# concat ----------------------------------------------------------------------------------------


def deduce_concat(args, attrs) -> TensorStructInfo:
    if not args:
        raise DeductionError("concat: needs at least one tensor")
    infos = [require_tensor(arg, "concat", i) for i, arg in enumerate(args)]
    dtype = same_dtype("concat", infos)
    ranks = {info.ndim for info in infos if info.ndim != -1}
    if len(ranks) > 1:
        described = ", ".join(f"argument {i} has {info.ndim}" for i, info in enumerate(infos) if info.ndim != -1)
        raise DeductionError(f"concat: ranks differ ({described} dims)")
    ndim = ranks.pop() if ranks else -1
    if ndim == 0:
        raise DeductionError("concat: cannot concatenate 0-d tensors")
    axis = int(attrs.get("axis", 0))
    if ndim != -1:
        axis = normalize_axis("concat", axis, ndim)
    if any(info.shape is None for info in infos):
        return TensorStructInfo(None, dtype, ndim)
    result = list(infos[0].shape)
    for dim in range(ndim):
        if dim == axis:
            result[dim] = simplify(sum((info.shape[dim] for info in infos), IntImm(0)))
            continue
        for position, info in enumerate(infos[1:], start=1):
            if not prove_equal(info.shape[dim], result[dim]):
                raise DeductionError(
                    f"concat: dimension {dim} differs: {format_expr(result[dim])} (argument 0) vs "
                    f"{format_expr(info.shape[dim])} (argument {position}); only axis {axis} may differ"
                )
    return TensorStructInfo(tuple(result), dtype)


def legalize_concat(context, call: Call):
    info = call.struct_info
    axis = normalize_axis("concat", call.attrs.get("axis", 0), info.ndim)

    def body(axes, buffers):
        pieces = []
        offset: PrimExpr = IntImm(0)
        for buffer in buffers:
            extent = buffer.shape[axis]
            if as_int(extent) != 0:
                pieces.append((buffer, offset, simplify(offset + extent)))
            offset = simplify(offset + extent)
        if not pieces:  # the result is empty along the axis: nothing is ever loaded
            pieces.append((buffers[0], IntImm(0), IntImm(0)))

        def load(buffer, start):
            index = list(axes)
            index[axis] = simplify(axes[axis] - start)
            return Load(buffer, tuple(index))

        expr = load(pieces[-1][0], pieces[-1][1])
        for buffer, start, end in reversed(pieces[:-1]):
            expr = Select(Compare("lt", IndexValue(axes[axis]), IndexValue(end)), load(buffer, start), expr)
        return expr

    program = make_program("concat", call.args, info.shape, info.dtype, body)
    return context.call_tir(program, call.args)


def concat_reference(arrays, attrs):
    return np.concatenate(arrays, axis=int(attrs.get("axis", 0)))


register_op("concat", deduce=deduce_concat, legalize=needs_known_shapes(legalize_concat), reference=concat_reference)


# split -----------------------------------------------------------------------------------------


def _split_extents(data: TensorStructInfo, attrs, axis: int) -> list[PrimExpr] | None:
    """The extent of each part along the axis (None when the input shape is unknown)."""
    has_sections, has_indices = "sections" in attrs, "indices" in attrs
    if has_sections == has_indices:
        raise DeductionError("split: give exactly one of sections (a count) or indices (split points)")
    if has_sections:
        sections = int(attrs["sections"])
        if sections < 1:
            raise DeductionError(f"split: sections must be at least 1, got {sections}")
        if data.shape is None:
            return None
        dim = data.shape[axis]
        part = simplify(dim // sections)
        if not prove_equal(part * sections, dim):
            raise DeductionError(
                f"split: dimension {axis} (the split axis) has {format_expr(dim)} elements, not provably "
                f"divisible into {sections} equal sections"
            )
        return [part] * sections
    indices = [int(i) for i in attrs["indices"]]
    for position, (a, b) in enumerate(zip(indices, indices[1:]), start=1):
        if b < a:
            raise DeductionError(f"split: indices must not decrease: index {position} is {b}, after {a}")
    if indices and indices[0] < 0:
        raise DeductionError(f"split: indices must be >= 0, got {indices[0]}")
    if data.shape is None:
        return None
    dim = data.shape[axis]
    bounds: list[PrimExpr] = [IntImm(0)]
    for index in indices:
        if as_int(dim) is not None:
            index = min(index, as_int(dim))  # numpy: split points past the end give empty parts
        bounds.append(IntImm(index))
    last = bounds[-1]
    if as_int(dim - last) is not None and as_int(dim - last) < 0:
        raise DeductionError(f"split: split point {format_expr(last)} is past dimension {axis} ({format_expr(dim)})")
    bounds.append(dim)
    return [simplify(b - a) for a, b in zip(bounds, bounds[1:])]


def deduce_split(args, attrs) -> TupleStructInfo:
    expect_args("split", args, 1)
    data = require_tensor(args[0], "split", 0)
    axis = int(attrs.get("axis", 0))
    if data.ndim == 0:
        raise DeductionError("split: cannot split a 0-d tensor")
    if data.ndim != -1:
        axis = normalize_axis("split", axis, data.ndim)
    extents = _split_extents(data, attrs, axis)
    if extents is None:
        count = int(attrs["sections"]) if "sections" in attrs else len(attrs["indices"]) + 1
        return TupleStructInfo(tuple(TensorStructInfo(None, data.dtype, data.ndim) for _ in range(count)))
    fields = []
    for extent in extents:
        shape = list(data.shape)
        shape[axis] = extent
        fields.append(TensorStructInfo(tuple(shape), data.dtype))
    return TupleStructInfo(tuple(fields))


def legalize_split(context, call: Call):
    data = call.args[0]
    info = call.struct_info
    axis = normalize_axis("split", call.attrs.get("axis", 0), len(tensor_shape(data)))
    parts = []
    start: PrimExpr = IntImm(0)
    for field in info.fields:
        begin = start

        def body(axes, buffers, begin=begin):
            index = list(axes)
            index[axis] = simplify(axes[axis] + begin)
            return Load(buffers[0], tuple(index))

        program = make_program("split", [data], field.shape, field.dtype, body)
        parts.append(context.emit(context.call_tir(program, (data,)), "split"))
        start = simplify(start + field.shape[axis])
    return Tuple(tuple(parts))


def split_reference(arrays, attrs):
    x = arrays[0]
    axis = int(attrs.get("axis", 0))
    how = int(attrs["sections"]) if "sections" in attrs else [int(i) for i in attrs["indices"]]
    return tuple(np.ascontiguousarray(part) for part in np.split(x, how, axis=axis))


register_op("split", deduce=deduce_split, legalize=needs_known_shapes(legalize_split), reference=split_reference)


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
    begin = _shape_values(args[1], "strided_slice", "begin").values
    end = _shape_values(args[2], "strided_slice", "end").values
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
