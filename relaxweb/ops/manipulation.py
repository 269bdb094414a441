"""Data movement ops: reshape, transpose, concat, split, strided_slice, broadcast_to, tile,
pad, trilu, and the data-dependent squeeze / expand_dims / dynamic_slice.

They move elements without arithmetic and legalize to copy programs whose load indices are
index arithmetic on the output axes (later work may turn a contiguous reshape into a view of
the same storage).  ``concat`` picks its source with a :class:`~relaxweb.ir.tir.Select`
per input; ``split`` is one program per part.

Shape operands (a reshape target, the repeats of a tile, pads...) are shape values
(``ShapeExpr``, possibly symbolic) when they are known at compile time.  They may also be
1-D integer tensors computed at run time (``broadcast_to``, ``tile``, ``pad``, ``split``, and
the separate ``dynamic_reshape`` / ``dynamic_slice``): the result's shape is then
data-dependent (only its rank is deduced) and the numpy reference runs it.  ``dynamic_reshape``,
``dynamic_slice`` and ``squeeze`` / ``expand_dims`` with run-time axes legalize by computing
each result extent on the GPU and reading it back (``relaxweb/ops/readback.py``: a fresh
size variable per dim, one host stage each), then a copy; the others stop with an
``UnknownShapeError``.  Ops after a data-dependent result still see an unknown shape (only
its rank) and need a ``match_cast`` to legalize.

Signatures (args, then attributes):

- ``reshape(x, shape, count_checked=False)``: ``shape`` is a shape value; one entry may be
  ``-1``, inferred from the element count.  0 means a dimension of size 0 here (ONNX's "copy
  the input's dim" 0 is resolved by the frontend).  The element counts must be equal (and a
  count divisible for ``-1``): provably, or, where the analyzer cannot decide, checked at run
  time by a ``match_cast`` of the count bound just before; ``count_checked=True`` says so.
- ``dynamic_reshape(x, shape, copy_zeros=False, source="")``: with a run-time 1-D integer
  tensor ``shape`` (data-dependent; extents read back); ``copy_zeros`` gives ONNX's meaning to
  its zeros (Reshape without ``allowzero``).  The element count of the target is checked at
  run time (on the GPU path and in the reference alike); ``source`` names where the op comes
  from for that error (``Reshape node 'r'``).
- ``transpose(x, axes=[...])``: a permutation of the dims.
- ``concat(x0, x1, ..., axis=0)``: the tensors are the call's arguments (not a tuple).
- ``split(x, sections=k, axis=0)`` or ``split(x, indices=[i, j, ...], axis=0)``: a tuple of
  ``k`` equal parts, or of the parts between the (constant, numpy-style) split points;
  ``split(x, sizes, count=k, axis=0)`` with a run-time 1-D tensor of part sizes.
- ``strided_slice(x, begin, end, axes=[...], strides=[...], assume_inbound=True)``: ``begin``
  and ``end`` are shape values, so they may be symbolic (use :func:`strided_slice`).
- ``dynamic_slice(x, starts, ends, axes, steps)``: ONNX Slice with every operand a run-time
  1-D integer tensor (data-dependent; extents read back, positions computed in the kernel).
- ``broadcast_to(x, shape, source="")``: ONNX Expand: ``x`` and ``shape`` broadcast together
  (a 1 in ``shape`` keeps the input's dim).  With a run-time ``shape``, each entry facing a
  dim of ``x`` that is not 1 must be 1 or that dim, checked at run time (``source`` names
  the node for that error).
- ``tile(x, repeats)``: ONNX Tile.
- ``pad(x, pads, value[, axes], mode="constant")``: ONNX Pad; ``pads`` holds the begin pads
  of each padded axis then the end pads (negative pads crop), ``value`` is a scalar tensor
  (the fill of constant mode), ``axes`` a shape value of constant axes (all axes without it);
  modes ``constant``, ``edge``, ``reflect`` and ``wrap``.
- ``trilu(x, k, upper=True)``: ONNX Trilu on the last two dims; ``k`` is a prim value
  (possibly symbolic) or a one-element integer tensor.
- ``squeeze(x[, axes])`` / ``expand_dims(x, axes)``: with a 1-D tensor of axes (squeeze
  without axes drops every dim of extent 1); only the rank is deduced (none for squeeze).
  The frontend uses them for run-time axes or inputs of unknown shape; with constant axes
  and known dims it writes a ``reshape``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InputShapeError, UnsupportedModelError
from ..ir.expr import Call, Constant, Expr, PrimValue, ShapeExpr, Tuple, tensor_dtype, tensor_shape
from ..ir.op_registry import AssumptionError, DeductionError, call_op, register_op
from ..ir.struct_info import PrimStructInfo, ShapeStructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import (
    IntImm, PrimExpr, as_expr, as_int, expr_max, expr_min, format_expr, product, prove_equal,
    prove_less_equal, prove_not_equal, simplify,
)
from ..ir.tir import Cast, FloatImm, Gather, IndexValue, Load, maximum, minimum, select
from .common import (
    DimOf, UnknownShapeError, broadcast_shapes, expect_args, load_broadcast, make_program, needs_known_shapes,
    normalize_axes, normalize_axis, require_equal, require_tensor, same_dtype,
)
from .readback import both, const, count_true, element, extent_reason, index, int32, read_back_dims, wrap_negative


class ReshapeInferenceError(AssumptionError):
    """The -1 of a reshape target is inferred only if the element count is a multiple of the
    other dims, which the analyzer cannot prove (the model may be fine for the sizes it is made
    for): a builder checks it at run time."""


# reshape ---------------------------------------------------------------------------------------


def _shape_values(expr: Expr, op: str, what: str) -> ShapeStructInfo:
    info = expr.struct_info
    if not isinstance(info, ShapeStructInfo):
        raise DeductionError(f"{op}: {what} must be a known shape value, got {info}")
    return info


def shape_operand(expr: Expr, op: str, what: str) -> ShapeStructInfo:
    """A shape operand: a shape value, or a run-time 1-D integer tensor, seen as a shape
    value whose entries are unknown (its length is known when the tensor's shape is)."""
    info = expr.struct_info
    if isinstance(info, ShapeStructInfo):
        return info
    if isinstance(info, TensorStructInfo):
        if not (info.dtype.startswith("int") or info.dtype.startswith("uint")):
            raise DeductionError(f"{op}: {what} must be an integer tensor, got {info.dtype}")
        if info.ndim not in (-1, 1):
            raise DeductionError(f"{op}: {what} must be a 1-D tensor, got {info.ndim} dims")
        length = as_int(info.shape[0]) if info.shape is not None else None
        return ShapeStructInfo(None, length if length is not None else -1)
    raise DeductionError(f"{op}: {what} must be a shape value or a 1-D integer tensor, got {info}")


def int_list(array) -> list[int]:
    """The entries of a shape operand's value (a shape value or an integer tensor)."""
    return [int(v) for v in np.asarray(array).reshape(-1)]


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
    checked = bool(attrs.get("count_checked", False))
    if inferred_dims:
        position = inferred_dims[0]
        known = product(v for d, v in enumerate(values) if d != position)
        if as_int(known) == 0:
            raise DeductionError(
                f"reshape: cannot infer -1 (target dim {position}): the other target dims multiply to 0"
            )
        inferred = simplify(count // known)
        if not checked and not prove_equal(inferred * known, count):
            where = f"reshape: cannot infer -1 (target dim {position}): {format_expr(count)} elements are"
            if prove_not_equal(inferred * known, count):
                raise DeductionError(f"{where} never a multiple of {format_expr(known)}")
            raise ReshapeInferenceError(
                f"{where} not provably a multiple of {format_expr(known)}", argument=0, dim=None, actual=count,
                expected=simplify(inferred * known), quantity="the element count", checked_attrs={"count_checked": True},
            )
        values[position] = inferred
    elif not checked and not prove_equal(count, product(values)):
        message = f"reshape: element counts differ: {format_expr(count)} vs {format_expr(product(values))}"
        if prove_not_equal(count, product(values)):
            raise DeductionError(message)
        raise AssumptionError(message, argument=0, dim=None, actual=count, expected=product(values),
                              quantity="the element count", checked_attrs={"count_checked": True})
    return TensorStructInfo(tuple(values), data.dtype)


def row_major_strides(shape: tuple[PrimExpr, ...]) -> list[PrimExpr]:
    strides: list[PrimExpr] = []
    stride: PrimExpr = simplify(1)
    for dim in reversed(shape):
        strides.append(stride)
        stride = simplify(stride * dim)
    return strides[::-1]


def reshape_program(data: Expr, shape: tuple[PrimExpr, ...], name: str = "reshape"):
    """The copy program of a reshape of ``data`` (a known shape) to ``shape`` (row-major order)."""
    def body(axes, buffers):
        (source,) = buffers
        if any(as_int(d) == 0 for d in (*shape, *source.shape)) or not source.shape:  # nothing is ever loaded, or a scalar
            return Load(source, tuple(axes[0] if axes else IntImm(0) for _ in source.shape))
        flat = sum((axis * stride for axis, stride in zip(axes, row_major_strides(shape))), simplify(0))
        source_strides = row_major_strides(source.shape)
        indices = tuple(
            simplify((flat // stride) % dim) for stride, dim in zip(source_strides, source.shape)
        )
        return Load(source, indices)

    return make_program(name, [data], tuple(shape), tensor_dtype(data), body)


def legalize_reshape(context, call: Call):
    data = call.args[0]
    return context.call_tir(reshape_program(data, call.struct_info.shape), (data,))


def needs_known_data_shape(legalize):
    """Wrap a legalization whose result shape is data-dependent (read back): the arguments'
    shapes must be known, the result's is not."""
    def wrapper(context, call: Call):
        for position, arg in enumerate(call.args):
            info = arg.struct_info
            if isinstance(info, TensorStructInfo) and info.shape is None:
                raise UnknownShapeError(
                    f"{call.op}: argument {position} has an unknown shape ({info}); legalization needs a "
                    "known shape: add a match_cast that gives its dims names"
                )
        return legalize(context, call)

    return wrapper


def reshape_reference(arrays, attrs):
    data, target = arrays[0], int_list(arrays[1])
    if attrs.get("copy_zeros"):
        target = [data.shape[position] if value == 0 else value for position, value in enumerate(target)]
    return np.asarray(data.reshape(tuple(target)), order="C")  # (ascontiguousarray makes a 0-d result 1-d)


def dynamic_reshape_reference(arrays, attrs):
    """A reshape whose target, from data, is checked as on the GPU path."""
    data, target = arrays[0], int_list(arrays[1])
    if attrs.get("copy_zeros"):
        target = [data.shape[position] if value == 0 else value for position, value in enumerate(target)]
    target = _checked_target(data.size, target, attrs.get("source", ""))
    return np.asarray(data.reshape(tuple(target)), order="C")


def count_reason(source: str) -> str:
    """What the element-count check of a ``dynamic_reshape`` states (see match_cast's reason)."""
    return f"{source or 'dynamic_reshape'}: the element count of the target shape"


def _checked_target(count: int, target: list[int], source: str) -> list[int]:
    """The target with its -1 resolved as the GPU path resolves it (the count over the
    product of the others), refused with the GPU path's error when it does not hold ``count``
    elements or has a negative extent."""
    others = int(np.prod([value for value in target if value != -1], dtype=np.int64))
    resolved = [count // max(others, 1) if value == -1 else value for value in target]
    for position, value in enumerate(resolved):
        if value < 0:
            raise InputShapeError(f"{extent_reason(source or 'dynamic_reshape', position)} is {value}, must be >= 0")
    total = int(np.prod(resolved, dtype=np.int64))
    if total != count:
        raise InputShapeError(f"{count_reason(source)} is {total}, expected {count}")
    return resolved


register_op("reshape", deduce=deduce_reshape, legalize=needs_known_shapes(legalize_reshape), reference=reshape_reference)


def deduce_dynamic_reshape(args, attrs) -> TensorStructInfo:
    expect_args("dynamic_reshape", args, 2)
    data = require_tensor(args[0], "dynamic_reshape", 0)
    target = shape_operand(args[1], "dynamic_reshape", "the target shape")
    return TensorStructInfo(None, data.dtype, target.ndim)


def legalize_dynamic_reshape(context, call: Call):
    """Each target extent (the entry; the input's dim for a 0 with ``copy_zeros``; the element
    count over the others' product for -1) is computed on the GPU and read back (one read per
    dim, ``relaxweb/ops/readback.py``), their product checked against the element count (the
    host stops with the reason before the copy), then a reshape copy."""
    data, target = call.args
    shape = tensor_shape(data)
    length = as_int(tensor_shape(target)[0]) if len(tensor_shape(target)) == 1 else None
    if length is None:
        raise UnsupportedModelError("dynamic_reshape: the target shape needs a 1-D tensor of known length")
    copy_zeros = bool(call.attrs.get("copy_zeros", False))

    def resolved(buffers, position: int):
        value = element(buffers[1], position)
        if copy_zeros and position < len(shape):
            value = select(value.eq(const(0)), index(shape[position]), value)
        return value

    def extent(position: int):
        def build(buffers):
            others = const(1)
            for other in range(length):
                if other != position:
                    others = others * resolved(buffers, other)
            inferred = int32(index(product(shape)) / maximum(others, const(1)))
            value = resolved(buffers, position)
            return select(value.eq(const(-1)), inferred, value)
        return build

    dims = read_back_dims(context, (data, target), [extent(j) for j in range(length)], "reshape",
                          call.attrs.get("source", "dynamic_reshape"))
    context.emit_match_cast(PrimValue(product(dims)), PrimStructInfo("int64", product(shape)), "reshape_count",
                            reason=count_reason(call.attrs.get("source", "")))
    return context.call_tir(reshape_program(data, dims), (data,))


register_op("dynamic_reshape", deduce=deduce_dynamic_reshape, reference=dynamic_reshape_reference,
            legalize=needs_known_data_shape(legalize_dynamic_reshape))


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
    if _operand_length(call, 1) != count:
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


register_op("split", deduce=deduce_split, legalize=_legalize_split_any, reference=split_reference)


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
)


# broadcast_to ----------------------------------------------------------------------------------


def deduce_broadcast_to(args, attrs) -> TensorStructInfo:
    expect_args("broadcast_to", args, 2)
    data = require_tensor(args[0], "broadcast_to", 0)
    target = shape_operand(args[1], "broadcast_to", "the target shape")
    if target.values is None or data.shape is None:
        known = data.ndim != -1 and target.ndim != -1
        return TensorStructInfo(None, data.dtype, max(data.ndim, target.ndim) if known else -1)

    return TensorStructInfo(
        broadcast_shapes("broadcast_to", [data.shape, target.values], origins=[(0, 0), (None, 0)]), data.dtype
    )


def legalize_broadcast_to(context, call: Call):
    info = call.struct_info
    data = call.args[0]
    program = make_program("broadcast_to", [data], info.shape, info.dtype,
                           lambda axes, buffers: load_broadcast(buffers[0], axes))
    return context.call_tir(program, (data,))


def broadcast_to_reference(arrays, attrs):
    x, target = arrays[0], int_list(arrays[1])
    rank = max(x.ndim, len(target))
    for position in range(rank - min(x.ndim, len(target)), rank):  # the positions both sides have
        dim, entry = x.shape[position - (rank - x.ndim)], target[position - (rank - len(target))]
        if dim != 1 and entry not in (1, dim):
            raise InputShapeError(f"{_entry_reason(attrs.get('source', ''), position - (rank - len(target)))} is {entry}, "
                                  f"expected {dim}")
    return np.ascontiguousarray(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(target))))


def _entry_reason(source: str, position: int) -> str:
    """What the run-time check of an Expand target's entry states."""
    return f"{source or 'broadcast_to'}: entry {position} of the target shape (1 or the input's dim)"


def _operand_length(call: Call, position: int) -> int | None:
    """The length of a run-time 1-D integer tensor operand, or None for a shape value."""
    info = call.args[position].struct_info
    if not isinstance(info, TensorStructInfo):
        return None
    length = as_int(info.shape[0]) if info.shape is not None and len(info.shape) == 1 else None
    if length is None:
        raise UnsupportedModelError(f"{call.op}: the run-time operand needs a 1-D tensor of known length")
    return int(length)


def legalize_broadcast_to_run_time(context, call: Call):
    """A run-time target shape: each result extent (the target's entry where the data's dim is
    1, else the data's dim) is computed on the GPU and read back, then the broadcast copy.
    Where the data's dim is not 1, the value read back is the entry when it is neither 1 nor
    that dim, and a check that it equals the dim stops the run with both values."""
    data = call.args[0]
    shape = tensor_shape(data)
    length = _operand_length(call, 1)
    rank = max(len(shape), length)

    def extent(position: int):
        def build(buffers):
            offset = position - (rank - len(shape))
            entry = element(buffers[1], position - (rank - length)) if position >= rank - length else index(1)
            if offset < 0:
                return entry
            if as_int(shape[offset]) == 1:
                return entry
            if position < rank - length:  # no entry: the data's dim
                return index(shape[offset])
            agrees = select(entry.eq(const(1)), FloatImm(1, "bool"), entry.eq(index(shape[offset])))
            return select(agrees, index(shape[offset]), entry)
        return build

    source = call.attrs.get("source", "")
    dims = read_back_dims(context, call.args, [extent(j) for j in range(rank)], "broadcast_to", source or "broadcast_to")
    for position in range(max(rank - length, rank - len(shape)), rank):
        dim = shape[position - (rank - len(shape))]
        if as_int(dim) != 1:
            context.emit_match_cast(PrimValue(dims[position]), PrimStructInfo("int64", dim), "expand_checked",
                                    reason=_entry_reason(source, position - (rank - length)))
    program = make_program("broadcast_to", [data], dims, tensor_dtype(data),
                           lambda axes, buffers: load_broadcast(buffers[0], axes))
    return context.call_tir(program, (data,))


def _static_or_run_time(static, run_time):
    def legalize(context, call: Call):
        if isinstance(call.args[1].struct_info, TensorStructInfo):
            return needs_known_data_shape(run_time)(context, call)
        return needs_known_shapes(static)(context, call)

    return legalize


register_op("broadcast_to", deduce=deduce_broadcast_to,
            legalize=_static_or_run_time(legalize_broadcast_to, legalize_broadcast_to_run_time),
            reference=broadcast_to_reference)


# tile ------------------------------------------------------------------------------------------


def deduce_tile(args, attrs) -> TensorStructInfo:
    expect_args("tile", args, 2)
    data = require_tensor(args[0], "tile", 0)
    repeats = shape_operand(args[1], "tile", "the repeats")
    if data.ndim != -1 and repeats.ndim != -1 and data.ndim != repeats.ndim:
        raise DeductionError(f"tile: {repeats.ndim} repeats for a {data.ndim}-d tensor")
    if data.shape is None or repeats.values is None:
        return TensorStructInfo(None, data.dtype, data.ndim if data.ndim != -1 else repeats.ndim)
    return TensorStructInfo(tuple(simplify(d * r) for d, r in zip(data.shape, repeats.values)), data.dtype)


def legalize_tile(context, call: Call):
    info = call.struct_info
    data = call.args[0]

    def body(axes, buffers):
        (source,) = buffers
        return Load(source, tuple(
            IntImm(0) if as_int(dim) == 1 else simplify(axis % dim) for axis, dim in zip(axes, source.shape)
        ))

    program = make_program("tile", [data], info.shape, info.dtype, body)
    return context.call_tir(program, (data,))


def legalize_tile_run_time(context, call: Call):
    """Run-time repeats: each result extent (dim * repeats) is computed on the GPU and read
    back, then the tiling copy."""
    data = call.args[0]
    shape = tensor_shape(data)
    length = _operand_length(call, 1)
    if length != len(shape):
        raise UnsupportedModelError(f"tile: {length} repeats for a {len(shape)}-d tensor")

    def extent(position: int):
        return lambda buffers: index(shape[position]) * element(buffers[1], position)

    dims = read_back_dims(context, call.args, [extent(j) for j in range(len(shape))], "tile")

    def body(axes, buffers):
        (source,) = buffers
        if any(as_int(d) == 0 for d in source.shape):  # nothing is ever loaded
            return Load(source, tuple(axes[0] for _ in source.shape))
        return Load(source, tuple(
            IntImm(0) if as_int(dim) == 1 else simplify(axis % dim) for axis, dim in zip(axes, source.shape)
        ))

    program = make_program("tile", [data], dims, tensor_dtype(data), body)
    return context.call_tir(program, (data,))


register_op("tile", deduce=deduce_tile, legalize=_static_or_run_time(legalize_tile, legalize_tile_run_time),
            reference=lambda arrays, attrs: np.ascontiguousarray(np.tile(arrays[0], int_list(arrays[1]))))


# pad -------------------------------------------------------------------------------------------

PAD_MODES = ("constant", "edge", "reflect", "wrap")


def _pad_axes(args, ndim: int) -> list[int] | None:
    """The padded axes (normalized when the rank is known), or None when run-time."""
    if len(args) < 4:
        return list(range(ndim)) if ndim != -1 else None
    axes = shape_operand(args[3], "pad", "the axes")
    if axes.values is None or any(as_int(a) is None for a in axes.values):
        return None
    values = [as_int(a) for a in axes.values]
    return normalize_axes("pad", values, ndim) if ndim != -1 else values


def deduce_pad(args, attrs) -> TensorStructInfo:
    if len(args) not in (3, 4):
        raise DeductionError(f"pad: takes 3 or 4 argument(s), got {len(args)}")
    data = require_tensor(args[0], "pad", 0)
    pads = shape_operand(args[1], "pad", "the pads")
    value = require_tensor(args[2], "pad", 2)
    mode = attrs.get("mode", "constant")
    if mode not in PAD_MODES:
        raise DeductionError(f"pad: unknown mode {mode!r}; expected one of {', '.join(PAD_MODES)}")
    if value.dtype != data.dtype:
        raise DeductionError(f"pad: the value is {value.dtype}, the tensor {data.dtype}")
    axes = _pad_axes(args, data.ndim)
    if axes is not None and pads.ndim not in (-1, 2 * len(axes)):
        raise DeductionError(f"pad: {pads.ndim} pads for {len(axes)} padded axes (expected {2 * len(axes)})")
    if data.shape is None or pads.values is None or axes is None:
        return TensorStructInfo(None, data.dtype, data.ndim)
    shape = list(data.shape)
    for position, axis in enumerate(axes):
        shape[axis] = simplify(shape[axis] + pads.values[position] + pads.values[position + len(axes)])
        if as_int(shape[axis]) is not None and as_int(shape[axis]) < 0:
            raise DeductionError(f"pad: dimension {axis} would have {as_int(shape[axis])} elements")
    return TensorStructInfo(tuple(shape), data.dtype)


def legalize_pad(context, call: Call):
    """Negative pads crop first (as onnxruntime does), then the positive pads are filled
    per mode from the cropped range: each padded axis reads ``low + f(q)`` where ``q`` is the
    position in the cropped range and ``f`` maps it inside (edge: clamp; reflect:
    ``(d-1) - |(d-1) - |q||``, for pads shorter than the dim; wrap: ``q % d``, floor modulo,
    for pads of any length)."""
    data, pads_expr, value = call.args[0], call.args[1], call.args[2]
    info = call.struct_info
    mode = call.attrs.get("mode", "constant")
    shape = tensor_shape(data)
    axes = _pad_axes(call.args, len(shape))
    pads = pads_expr.struct_info.values
    plan = {}  # axis -> (first source index, cropped extent, begin pad, end pad)
    for position, axis in enumerate(axes):
        begin, end = pads[position], pads[position + len(axes)]
        low = simplify(expr_max(simplify(0 - begin), 0))
        extent = simplify(shape[axis] - low - expr_max(simplify(0 - end), 0))
        plan[axis] = (low, extent, simplify(expr_max(begin, 0)), simplify(expr_max(end, 0)))
    tensors = [data, value] if mode == "constant" else [data]

    def body(out_axes, buffers):
        source = buffers[0]
        fill = Load(buffers[1], (IntImm(0),) * len(buffers[1].shape)) if mode == "constant" else None
        inner = {axis: simplify(out_axes[axis] - begin) for axis, (_, _, begin, _) in plan.items()}

        def load(mapped):
            return Load(source, tuple(
                simplify(plan[d][0] + mapped[d]) if d in mapped else out_axes[d] for d in range(len(shape))
            ))

        if mode == "edge":
            return load({axis: expr_min(expr_max(q, 0), simplify(plan[axis][1] - 1)) for axis, q in inner.items()})
        if mode == "reflect":
            def reflect(q, extent):
                if as_int(extent) == 1:
                    return IntImm(0)
                magnitude = expr_max(q, simplify(0 - q))
                last = simplify(extent - 1)
                return simplify(last - expr_max(simplify(last - magnitude), simplify(magnitude - last)))
            return load({axis: reflect(q, plan[axis][1]) for axis, q in inner.items()})
        if mode == "wrap":
            def wrap(q, extent, begin, end):
                if prove_less_equal(begin, 0) and prove_less_equal(end, 0):  # every position inside
                    return q
                if as_int(extent) == 0:
                    raise UnsupportedModelError("pad: wrap mode cannot pad an axis cropped to no element")
                return simplify(q % extent)  # floor modulo: positions before the start are negative
            return load({axis: wrap(q, *plan[axis][1:]) for axis, q in inner.items()})
        # constant: the fill where a padded axis's position is before or after the cropped range
        expr = load(inner)
        for axis, q in inner.items():
            _, extent, begin, end = plan[axis]
            if not prove_less_equal(end, 0):  # some positions lie past the end
                expr = select(IndexValue(q).lt(IndexValue(extent)), expr, fill)
            if not prove_less_equal(begin, 0):  # some lie before the start
                expr = select(IndexValue(q).ge(IndexValue(0)), expr, fill)
        return expr

    program = make_program("pad", tensors, info.shape, info.dtype, body)
    return context.call_tir(program, tuple(tensors))


def pad_reference(arrays, attrs):
    x, pads, value = arrays[0], int_list(arrays[1]), np.asarray(arrays[2])
    axes = int_list(arrays[3]) if len(arrays) > 3 else list(range(x.ndim))
    axes = [a + x.ndim if a < 0 else a for a in axes]
    begin, end = [0] * x.ndim, [0] * x.ndim
    for position, axis in enumerate(axes):
        begin[axis], end[axis] = pads[position], pads[position + len(axes)]
    x = x[tuple(slice(max(-b, 0), x.shape[d] - max(-e, 0)) for d, (b, e) in enumerate(zip(begin, end)))]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        fill = value.reshape(-1)[0] if value.size else 0
        return np.pad(x, widths, mode="constant", constant_values=fill)
    return np.pad(x, widths, mode=mode)


def legalize_pad_run_time(context, call: Call):
    """Run-time pads (``constant`` and ``edge`` modes; the axes constant): each padded
    extent ``dim + begin + end`` is read back, and each padded axis reads ``i - begin``
    (computed in the kernel from the pads): the fill outside the input (constant), or the
    position clamped into the cropped range (edge)."""
    data, pads, value = call.args[0], call.args[1], call.args[2]
    mode = call.attrs.get("mode", "constant")
    if mode not in ("constant", "edge"):
        raise UnsupportedModelError(f"pad: run-time pads have no GPU lowering in {mode} mode (constant and edge only)")
    shape = tensor_shape(data)
    axes = _pad_axes(call.args, len(shape))
    if axes is None:
        raise UnsupportedModelError("pad: run-time axes have no GPU lowering (make them constants)")
    count = len(axes)
    if _operand_length(call, 1) != 2 * count:
        raise UnsupportedModelError(f"pad: the pads need a 1-D tensor of {2 * count} entries")
    tensors = (data, pads, value)
    padded = read_back_dims(context, (pads,), [
        (lambda buffers, p=p, axis=axis: index(shape[axis]) + (element(buffers[0], p) + element(buffers[0], p + count)))
        for p, axis in enumerate(axes)
    ], "pad")
    out_shape = list(shape)
    for axis, extent in zip(axes, padded):
        out_shape[axis] = extent

    def body(out_axes, buffers):
        source, pad_buffer, fill_buffer = buffers
        positions: list = list(out_axes)
        inside = None
        for p, axis in enumerate(axes):
            begin, end = element(pad_buffer, p), element(pad_buffer, p + count)
            q = IndexValue(out_axes[axis]) - begin
            if mode == "edge":  # clamp into the cropped range [max(-begin, 0), dim - 1 - max(-end, 0)]
                low = maximum(-begin, const(0))
                high = index(shape[axis] - 1) - maximum(-end, const(0))
                q = minimum(maximum(q, low), high)
            else:
                here = both(q.ge(const(0)), q.lt(index(shape[axis])))
                inside = here if inside is None else both(inside, here)
            positions[axis] = q
        loaded = Gather(source, tuple(positions))
        if inside is None:
            return loaded
        if any(as_int(d) == 0 for d in fill_buffer.shape):
            fill = FloatImm(0, source.dtype)
        else:
            fill = Load(fill_buffer, tuple(IntImm(0) for _ in fill_buffer.shape))
        return select(inside, loaded, fill)

    program = make_program("pad", tensors, tuple(out_shape), tensor_dtype(data), body)
    return context.call_tir(program, tensors)


def _legalize_pad_any(context, call: Call):
    if isinstance(call.args[1].struct_info, TensorStructInfo):
        return needs_known_data_shape(legalize_pad_run_time)(context, call)
    return needs_known_shapes(legalize_pad)(context, call)


register_op("pad", deduce=deduce_pad, legalize=_legalize_pad_any, reference=pad_reference)


# trilu -----------------------------------------------------------------------------------------


def deduce_trilu(args, attrs) -> TensorStructInfo:
    expect_args("trilu", args, 2)
    data = require_tensor(args[0], "trilu", 0)
    if data.ndim != -1 and data.ndim < 2:
        raise DeductionError(f"trilu: needs at least 2 dims, got {data.ndim}")
    k = args[1].struct_info
    if isinstance(k, TensorStructInfo):
        if not k.dtype.startswith("int"):
            raise DeductionError(f"trilu: k must be an integer, got {k.dtype}")
    elif not isinstance(k, PrimStructInfo):
        raise DeductionError(f"trilu: k must be a prim value or a scalar tensor, got {k}")
    return data


def legalize_trilu(context, call: Call):
    data, k = call.args
    info = call.struct_info
    tensors = [data] + ([k] if isinstance(k.struct_info, TensorStructInfo) else [])

    def body(axes, buffers):
        row, column = axes[-2], axes[-1]
        if len(buffers) > 1:
            offset = Cast("int32", Load(buffers[1], (IntImm(0),) * len(buffers[1].shape)))
        else:
            offset = IndexValue(k.struct_info.value)
        above = IndexValue(simplify(column - row))
        keep = above.ge(offset) if call.attrs.get("upper", True) else above.le(offset)
        return select(keep, Load(buffers[0], axes), 0)

    program = make_program("trilu", tensors, info.shape, info.dtype, body)
    return context.call_tir(program, tuple(tensors))


def trilu_reference(arrays, attrs):
    x, k = arrays[0], int(np.asarray(arrays[1]).reshape(-1)[0])
    return np.triu(x, k) if attrs.get("upper", True) else np.tril(x, k)


register_op("trilu", deduce=deduce_trilu, legalize=needs_known_shapes(legalize_trilu), reference=trilu_reference)


# squeeze / expand_dims with run-time axes --------------------------------------------------------


def _deduce_axes_op(name: str, sign: int):
    def deduce(args, attrs) -> TensorStructInfo:
        if name == "squeeze" and len(args) == 1:  # every dim of extent 1
            data = require_tensor(args[0], name, 0)
            return TensorStructInfo(None, data.dtype, -1)
        expect_args(name, args, 2)
        data = require_tensor(args[0], name, 0)
        axes = shape_operand(args[1], name, "the axes")
        ndim = data.ndim + sign * axes.ndim if data.ndim != -1 and axes.ndim != -1 else -1
        return TensorStructInfo(None, data.dtype, ndim)

    return deduce


def _normalized(axes: list[int], ndim: int) -> tuple[int, ...]:
    return tuple(a + ndim if a < 0 else a for a in axes)


def squeeze_reference(arrays, attrs):
    if len(arrays) == 1:
        return np.squeeze(arrays[0])
    return np.squeeze(arrays[0], _normalized(int_list(arrays[1]), arrays[0].ndim))


def expand_dims_reference(arrays, attrs):
    axes = int_list(arrays[1])
    return np.expand_dims(arrays[0], _normalized(axes, arrays[0].ndim + len(axes)))


def _axes_count(call: Call) -> int:
    """The number of run-time axes (the length of the 1-D axes tensor)."""
    info = call.args[1].struct_info
    length = as_int(info.shape[0]) if isinstance(info, TensorStructInfo) and info.shape is not None \
        and len(info.shape) == 1 else None
    if length is None:
        raise UnsupportedModelError(f"{call.op}: the axes need a 1-D tensor of known length")
    return int(length)


def legalize_squeeze(context, call: Call):
    """Constant axes (or none, over constant dims): a reshape.  Run-time axes: each output
    extent (the j-th input dim not named by an axis) is computed on the GPU and read back
    (``relaxweb/ops/readback.py``), then a reshape copy."""
    data = call.args[0]
    shape = tensor_shape(data)
    ndim = len(shape)
    if len(call.args) == 1:
        if any(as_int(d) is None for d in shape):
            raise UnsupportedModelError("squeeze: without axes, every input dim must be a constant")
        target = tuple(d for d in shape if as_int(d) != 1)
        return context.call_tir(reshape_program(data, target, "squeeze"), (data,))
    axes = call.args[1]
    if isinstance(axes, Constant):
        dropped = _normalized(int_list(axes.data), ndim)
        target = tuple(d for position, d in enumerate(shape) if position not in dropped)
        return context.call_tir(reshape_program(data, target, "squeeze"), (data,))
    count = _axes_count(call)

    def kept(buffers, dim: int):
        named = [wrap_negative(element(buffers[1], k), index(ndim)).eq(index(dim)) for k in range(count)]
        return count_true(named).eq(index(0))

    def extent(position: int):
        def build(buffers):
            total = index(0)
            for dim in range(ndim):
                before = count_true([kept(buffers, d) for d in range(dim)])
                chosen = both(kept(buffers, dim), before.eq(index(position)))
                total = select(chosen, index(shape[dim]), total)
            return total
        return build

    dims = read_back_dims(context, (data, axes), [extent(j) for j in range(ndim - count)], "squeeze")
    return context.call_tir(reshape_program(data, dims, "squeeze"), (data,))


def legalize_expand_dims(context, call: Call):
    """Constant axes: a reshape.  Run-time axes: each output extent (1 at an axis, else the
    next input dim) is computed on the GPU and read back, then a reshape copy."""
    data, axes = call.args
    shape = tensor_shape(data)
    count = _axes_count(call)
    rank = len(shape) + count
    if isinstance(axes, Constant):
        added = _normalized(int_list(axes.data), rank)
        rest = iter(shape)
        target = tuple(IntImm(1) if position in added else next(rest) for position in range(rank))
        return context.call_tir(reshape_program(data, target, "expand_dims"), (data,))

    def extent(position: int):
        def build(buffers):
            normalized = [wrap_negative(element(buffers[1], k), index(rank)) for k in range(count)]
            is_axis = count_true([a.eq(index(position)) for a in normalized]).gt(index(0))
            source = index(position) - count_true([a.lt(index(position)) for a in normalized])
            dim: object = index(1)
            for d in range(len(shape)):
                dim = select(source.eq(index(d)), index(shape[d]), dim)
            return select(is_axis, index(1), dim)
        return build

    dims = read_back_dims(context, (data, axes), [extent(p) for p in range(rank)], "expand_dims")
    return context.call_tir(reshape_program(data, dims, "expand_dims"), (data,))


register_op("squeeze", deduce=_deduce_axes_op("squeeze", -1), reference=squeeze_reference,
            legalize=needs_known_data_shape(legalize_squeeze))
register_op("expand_dims", deduce=_deduce_axes_op("expand_dims", 1), reference=expand_dims_reference,
            legalize=needs_known_data_shape(legalize_expand_dims))
