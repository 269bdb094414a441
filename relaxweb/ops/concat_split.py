"""concat and split: one tensor from several along an axis, and back.

``concat`` picks its source with a :class:`~relaxweb.ir.tir.Select` per input; ``split`` is
one copy program per part.

- ``concat(x0, x1, ..., axis=0)``: the tensors are the call's arguments (not a tuple).
- ``split(x, sections=k, axis=0)`` or ``split(x, indices=[i, j, ...], axis=0)``: a tuple of
  ``k`` equal parts, or of the parts between the (constant, numpy-style) split points;
  ``split(x, sizes, count=k, axis=0)`` with a run-time 1-D tensor of part sizes (the parts'
  extents are read back).
"""

from __future__ import annotations


import numpy as np

from ..errors import UnsupportedModelError
from ..ir.expr import Call, Tuple, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo, TupleStructInfo
from ..ir.symbolic import (
    IntImm, PrimExpr, as_int, format_expr, prove_equal,
    simplify,
)
from ..ir.tir import Gather, IndexValue, Load, select
from .common import (
    DimOf, make_program, needs_known_shapes,
    normalize_axis, require_equal, require_tensor, same_dtype,
)
from .readback import element, read_back_dims
from .shape_operands import int_list, needs_known_data_shape, operand_length, shape_operand


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
            require_equal(DimOf(result[dim], 0, dim), DimOf(info.shape[dim], position, dim), (
                f"concat: dimension {dim} differs: {format_expr(result[dim])} (argument 0) vs "
                f"{format_expr(info.shape[dim])} (argument {position}); only axis {axis} may differ"
            ))
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
            expr = select(IndexValue(axes[axis]).lt(IndexValue(end)), load(buffer, start), expr)
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
    for point in indices:
        if as_int(dim) is not None:
            point = min(point, as_int(dim))  # numpy: split points past the end give empty parts
        bounds.append(IntImm(point))
    last = bounds[-1]
    if as_int(dim - last) is not None and as_int(dim - last) < 0:
        raise DeductionError(f"split: split point {format_expr(last)} is past dimension {axis} ({format_expr(dim)})")
    bounds.append(dim)
    return [simplify(b - a) for a, b in zip(bounds, bounds[1:])]


def deduce_split(args, attrs) -> TupleStructInfo:
    if len(args) not in (1, 2):
        raise DeductionError(f"split: takes 1 or 2 argument(s), got {len(args)}")
    data = require_tensor(args[0], "split", 0)
    axis = int(attrs.get("axis", 0))
    if data.ndim == 0:
        raise DeductionError("split: cannot split a 0-d tensor")
    if data.ndim != -1:
        axis = normalize_axis("split", axis, data.ndim)
    if len(args) == 2:  # run-time part sizes: only the number of parts is known
        sizes = shape_operand(args[1], "split", "the part sizes")
        count = int(attrs["count"])
        if sizes.ndim not in (-1, count):
            raise DeductionError(f"split: {sizes.ndim} part sizes for {count} parts")
        return TupleStructInfo(tuple(TensorStructInfo(None, data.dtype, data.ndim) for _ in range(count)))
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
    if len(arrays) == 2:
        sizes = int_list(arrays[1])
        if sum(sizes) != x.shape[axis] or min(sizes, default=0) < 0:
            raise ValueError(f"split: part sizes {sizes} do not add up to dimension {axis} ({x.shape[axis]})")
        how = list(np.cumsum(sizes)[:-1])
    else:
        how = int(attrs["sections"]) if "sections" in attrs else [int(i) for i in attrs["indices"]]
    return tuple(np.ascontiguousarray(part) for part in np.split(x, how, axis=axis))


def legalize_split_run_time(context, call: Call):
    """Run-time part sizes: each part's extent along the axis is read back, and each part
    copies from the sum of the sizes before it (computed in the kernel)."""
    data, sizes = call.args
    shape = tensor_shape(data)
    axis = normalize_axis("split", call.attrs.get("axis", 0), len(shape))
    count = int(call.attrs["count"])
    if operand_length(call, 1) != count:
        raise UnsupportedModelError(f"split: the part sizes need a 1-D tensor of {count} entries")
    extents = read_back_dims(context, call.args, [lambda buffers, j=j: element(buffers[1], j) for j in range(count)],
                             "split")
    parts = []
    for part, extent in enumerate(extents):
        def body(axes, buffers, part=part):
            offset = IndexValue(axes[axis])
            for before in range(part):
                offset = offset + element(buffers[1], before)
            return Gather(buffers[0], tuple(offset if d == axis else axes[d] for d in range(len(shape))))

        out_shape = tuple(extent if d == axis else dim for d, dim in enumerate(shape))
        program = make_program("split", call.args, out_shape, tensor_dtype(data), body)
        parts.append(context.emit(context.call_tir(program, call.args), "split"))
    return Tuple(tuple(parts))


def _legalize_split_any(context, call: Call):
    if len(call.args) == 2:
        return needs_known_data_shape(legalize_split_run_time)(context, call)
    return needs_known_shapes(legalize_split)(context, call)


register_op("split", deduce=deduce_split, legalize=_legalize_split_any, reference=split_reference, reads_back=True)
