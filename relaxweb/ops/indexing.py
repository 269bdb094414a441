"""Indexing ops: gathers and scatters by index tensors, and ``nonzero``.

Their loads go through index values read from a tensor: an indirect load
(:class:`~relaxweb.ir.tir.Gather`).  ``take``, ``gather_elements`` and ``gather_nd`` legalize
to one tensor program each, the scatters to one program in which each output element scans
the indices: the index is loaded, cast to ``int32`` (int64 index tensors live as i32 on the
device) and, when the indices come from data, checked at run time
(:class:`~relaxweb.ir.tir.CheckedIndex`: wrapped when negative, and one outside its axis is
the run's error naming the node, the index and the extent, as onnxruntime and the references
here refuse it).  Constant indices out of range are refused by deduction, naming the node,
and are only wrapped.  (The frontend turns a Gather by a constant or symbolic scalar index
into a ``strided_slice``.)  Negative indices count from the end, as in ONNX.

- ``take(data, indices, axis=0)``: ONNX Gather; the result's shape is
  ``data.shape[:axis] + indices.shape + data.shape[axis + 1:]``.
- ``gather_elements(data, indices, axis=0)``: ONNX GatherElements; the shape of ``indices``.
- ``gather_nd(data, indices, batch_dims=0)``: ONNX GatherND; ``indices.shape[-1]`` must be a
  constant.
- ``scatter_elements(data, indices, updates, axis=0, reduction="none")`` and
  ``scatter_nd(data, indices, updates, reduction="none")``: ONNX ScatterElements / ScatterND
  (``reduction`` one of none, add, mul, max, min); the shape of ``data``.
- ``nonzero(x)``: ONNX NonZero, an int64 ``[x.ndim, count]`` tensor whose count is
  data-dependent: ``Tensor(ndim=2)``.
- ``reverse_sequence(data, sequence_lens, batch_axis=1, time_axis=0)``: ONNX ReverseSequence
  (what tf2onnx writes for a bidirectional RNN it cannot fuse): along the time axis, the first
  ``sequence_lens[b]`` steps of each batch entry reversed, the rest copied; batch and time are
  axes 0 and 1.  The shape of ``data``; one gather on the GPU.  A length outside ``[0, time
  extent]`` is an error, as onnxruntime makes it: constant lengths at build, lengths from data
  in the kernel (checked, naming the node).
- ``one_hot(indices, values, depth=, axis=-1)``: ONNX OneHot, ``values`` being
  ``[off_value, on_value]``; the shape of ``indices`` with the depth inserted at ``axis``,
  the dtype of ``values``.  The depth is the int attribute ``depth``, or a third argument: a
  prim value (symbolic, e.g. ``classes``), or a one-element tensor known only at run time
  (the result's shape is then unknown, its rank known, and legalization reads the depth back,
  as ``topk`` its ``k``).  Negative indices count from the depth; one outside
  ``[-depth, depth)`` gives an all-off row.  Float indices (and a float depth) are truncated,
  as onnxruntime does.
"""

from __future__ import annotations

import numpy as np

from typing import Callable

from ..errors import UnsupportedModelError
from ..errors import RunCheckError, run_error_message
from ..ir.expr import Call, Constant, TensorToPrim, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError, LegalizeContext, node_named, register_op
from ..ir.struct_info import PrimStructInfo, TensorStructInfo
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, format_expr, product, prove_equal, simplify
from ..ir.tir import (
    Buffer, Cast, CheckedIndex, FloatImm, Gather, IndexValue, Load, Reduce, ReduceCombiner, ScalarExpr, maximum, minimum,
    select,
)
from .common import UnknownShapeError, expect_args, make_program, needs_known_shapes, normalize_axis, require_tensor
from .reshape import reshape_program
from .readback import both, const, int32, read_back_dims, read_reason

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _require_indices(op: str, expr, position: int) -> TensorStructInfo:
    info = require_tensor(expr, op, position)
    if not info.dtype.startswith("int"):
        raise DeductionError(f"{op}: the indices must be integers, got {info.dtype}")
    return info


def _wrapped_index(indices: Buffer, positions: tuple[PrimExpr, ...], extent: PrimExpr) -> ScalarExpr:
    """``indices[positions]`` as an int32, plus ``extent`` when negative (ONNX semantics)."""
    value: ScalarExpr = Load(indices, positions)
    if indices.dtype != "int32":
        value = Cast("int32", value)
    return select(value.lt(0), value + IndexValue(extent), value)


def _index_message(axis: int) -> str:
    """The error sites' message of an index out of range of data axis ``axis`` (the index as
    given, the extent): ``index 7 is out of range for axis 0 of extent 4``."""
    return f"index {{0}} is out of range for axis {axis} of extent {{1}}"


class _IndexReader:
    """How one call's legalization reads its index tensor: from data, each index is a
    :class:`CheckedIndex` with an error site per data axis it indexes (made on first use);
    from a constant (checked at deduction) it is only wrapped."""

    def __init__(self, context: LegalizeContext, call: Call, indices_arg: int) -> None:
        self.context, self.call = context, call
        self.constant = isinstance(call.args[indices_arg], Constant)
        self.sites: dict[int, int] = {}

    def index(self, indices: Buffer, positions: tuple[PrimExpr, ...], extent: PrimExpr, axis: int) -> ScalarExpr:
        """``indices[positions]`` as an index into data axis ``axis`` of ``extent``."""
        if self.constant:
            return _wrapped_index(indices, positions, extent)
        if axis not in self.sites:
            self.sites[axis] = self.context.error_site(self.call, _index_message(axis))
        value: ScalarExpr = Load(indices, positions)
        if indices.dtype not in ("int32", "int64"):  # an int64 is checked as it is (exact in kernels.wasm)
            value = Cast("int32", value)
        return CheckedIndex(self.sites[axis], value, extent)


def _check_constant_indices(op: str, indices, extent: PrimExpr | None, dim: int) -> None:
    """Refuse constant indices outside ``[-extent, extent)`` of data dimension ``dim`` (a known
    extent): ONNX calls them an error, and the GPU would clamp them (``indices`` is the whole
    constant, or the part of it that indexes ``dim``)."""
    size = as_int(extent) if extent is not None else None
    if size is None or indices is None:
        return
    values = np.asarray(indices, dtype=np.int64).reshape(-1)
    bad = values[(values < -size) | (values >= size)]
    if bad.size:
        raise DeductionError(f"{op}: index {int(bad[0])} is out of range for dimension {dim} of the data (extent "
                             f"{size}: indices lie in [{-size}, {size - 1}])")


def _check_constant_tuples(op: str, indices: np.ndarray | None, shape: tuple[PrimExpr, ...], first: int) -> None:
    """``_check_constant_indices`` for index tuples (the last axis of ``indices``) into the
    data dims from ``first`` on (GatherND, ScatterND)."""
    if indices is None or indices.ndim == 0:
        return
    for j in range(min(indices.shape[-1], len(shape) - first)):
        _check_constant_indices(op, indices[..., j], shape[first + j], first + j)


def _constant_data(expr) -> np.ndarray | None:
    return expr.data if isinstance(expr, Constant) else None


def _normalize(indices: np.ndarray, extent, attrs, op: str, axes) -> np.ndarray:
    """``indices`` counted from the end where negative; one outside its axis is the run's
    error, worded as the kernels report it (``extent`` and ``axes``: one extent and data axis,
    or one per entry of the last axis of ``indices``)."""
    indices = np.asarray(indices, dtype=np.int64)
    extent = np.asarray(extent, dtype=np.int64)
    result = np.where(indices < 0, indices + extent, indices)
    bad = (result < 0) | (result >= extent)
    if np.any(bad):
        position = tuple(int(p[0]) for p in np.nonzero(bad))
        axis = np.broadcast_to(np.asarray(axes), bad.shape)[position]
        size = np.broadcast_to(extent, bad.shape)[position]
        node, op = node_named(attrs, op)
        raise RunCheckError(run_error_message(node, op, _index_message(int(axis)),
                                              (int(indices[position]), int(size))))
    return result


# take ------------------------------------------------------------------------------------------


def deduce_take(args, attrs) -> TensorStructInfo:
    expect_args("take", args, 2)
    data = require_tensor(args[0], "take", 0)
    indices = _require_indices("take", args[1], 1)
    if data.ndim == 0:
        raise DeductionError("take: cannot index a 0-d tensor")
    if data.ndim == -1:
        return TensorStructInfo(None, data.dtype, -1)
    axis = normalize_axis("take", attrs.get("axis", 0), data.ndim)
    if indices.ndim == -1:
        return TensorStructInfo(None, data.dtype, -1)
    if data.shape is None or indices.shape is None:
        return TensorStructInfo(None, data.dtype, data.ndim - 1 + indices.ndim)
    _check_constant_indices("take", _constant_data(args[1]), data.shape[axis], axis)
    return TensorStructInfo(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)


def take_reference(arrays, attrs):
    data, indices = arrays
    axis = int(attrs.get("axis", 0))
    axis = axis + data.ndim if axis < 0 else axis
    return np.ascontiguousarray(np.take(data, _normalize(indices, data.shape[axis], attrs, "take", axis), axis=axis))


def legalize_take(context, call: Call):
    info = call.struct_info
    data_rank = len(call.args[0].struct_info.shape)
    index_rank = len(call.args[1].struct_info.shape)
    axis = normalize_axis("take", call.attrs.get("axis", 0), data_rank)

    reader = _IndexReader(context, call, 1)

    def body(axes, buffers):
        data, indices = buffers
        index = reader.index(indices, tuple(axes[axis:axis + index_rank]), data.shape[axis], axis)
        return Gather(data, (*axes[:axis], index, *axes[axis + index_rank:]))

    return context.call_tir(make_program("take", call.args, info.shape, info.dtype, body), call.args)


register_op("take", deduce=deduce_take, reference=take_reference, legalize=needs_known_shapes(legalize_take),
            checks_data=True)


# gather_elements -------------------------------------------------------------------------------


def deduce_gather_elements(args, attrs) -> TensorStructInfo:
    expect_args("gather_elements", args, 2)
    data = require_tensor(args[0], "gather_elements", 0)
    indices = _require_indices("gather_elements", args[1], 1)
    if data.ndim != -1 and indices.ndim != -1 and data.ndim != indices.ndim:
        raise DeductionError(f"gather_elements: data has {data.ndim} dims, indices {indices.ndim}")
    if data.ndim != -1:
        axis = normalize_axis("gather_elements", attrs.get("axis", 0), data.ndim)
        if data.shape is not None:
            _check_constant_indices("gather_elements", _constant_data(args[1]), data.shape[axis], axis)
    return TensorStructInfo(indices.shape, data.dtype, indices.ndim)


def gather_elements_reference(arrays, attrs):
    data, indices = arrays
    axis = int(attrs.get("axis", 0))
    axis = axis + data.ndim if axis < 0 else axis
    positions = _normalize(indices, data.shape[axis], attrs, "gather_elements", axis)
    return np.ascontiguousarray(np.take_along_axis(data, positions, axis=axis))


def legalize_gather_elements(context, call: Call):
    info = call.struct_info
    axis = normalize_axis("gather_elements", call.attrs.get("axis", 0), len(info.shape))

    reader = _IndexReader(context, call, 1)

    def body(axes, buffers):
        data, indices = buffers
        index = reader.index(indices, tuple(axes), data.shape[axis], axis)
        return Gather(data, (*axes[:axis], index, *axes[axis + 1:]))

    return context.call_tir(make_program("gather_elements", call.args, info.shape, info.dtype, body), call.args)


register_op("gather_elements", deduce=deduce_gather_elements, reference=gather_elements_reference,
            legalize=needs_known_shapes(legalize_gather_elements), checks_data=True)


# gather_nd -------------------------------------------------------------------------------------


def deduce_gather_nd(args, attrs) -> TensorStructInfo:
    expect_args("gather_nd", args, 2)
    data = require_tensor(args[0], "gather_nd", 0)
    indices = _require_indices("gather_nd", args[1], 1)
    batch_dims = int(attrs.get("batch_dims", 0))
    if data.shape is None or indices.shape is None:
        return TensorStructInfo(None, data.dtype, -1)
    if not indices.shape:
        raise DeductionError("gather_nd: the indices need at least 1 dim")
    depth = as_int(indices.shape[-1])
    if depth is None:
        raise DeductionError(
            f"gather_nd: the last dim of the indices ({format_expr(indices.shape[-1])}) must be a constant"
        )
    if batch_dims + depth > data.ndim:
        raise DeductionError(f"gather_nd: {depth} indices per entry after {batch_dims} batch dims, "
                             f"but the data has {data.ndim} dims")
    for dim in range(batch_dims):
        if not prove_equal(data.shape[dim], indices.shape[dim]):
            raise DeductionError(f"gather_nd: batch dim {dim} differs: {format_expr(data.shape[dim])} vs "
                                 f"{format_expr(indices.shape[dim])}")
    _check_constant_tuples("gather_nd", _constant_data(args[1]), data.shape, batch_dims)
    return TensorStructInfo(indices.shape[:-1] + data.shape[batch_dims + depth:], data.dtype)


def gather_nd_reference(arrays, attrs):
    data, indices = arrays
    batch_dims = int(attrs.get("batch_dims", 0))
    depth = indices.shape[-1]
    batch_shape = data.shape[:batch_dims]
    batch_count = int(np.prod(batch_shape, dtype=np.int64))
    flat_data = data.reshape((batch_count,) + data.shape[batch_dims:])
    flat_indices = indices.reshape((batch_count, -1, depth))
    index = _normalize(flat_indices, data.shape[batch_dims:batch_dims + depth], attrs, "gather_nd",
                       np.arange(batch_dims, batch_dims + depth))
    out = np.stack([flat_data[b][tuple(index[b].T)] for b in range(batch_count)]) if batch_count else \
        np.zeros((0, flat_indices.shape[1]) + data.shape[batch_dims + depth:], data.dtype)
    return np.ascontiguousarray(out.reshape(indices.shape[:-1] + data.shape[batch_dims + depth:]))


def legalize_gather_nd(context, call: Call):
    info = call.struct_info
    batch_dims = int(call.attrs.get("batch_dims", 0))
    index_shape = call.args[1].struct_info.shape
    depth = as_int(index_shape[-1])
    outer = len(index_shape) - 1  # output axes that run over the index tuples

    reader = _IndexReader(context, call, 1)

    def body(axes, buffers):
        data, indices = buffers
        picked = tuple(
            reader.index(indices, (*axes[:outer], IntImm(j)), data.shape[batch_dims + j], batch_dims + j)
            for j in range(depth)
        )
        return Gather(data, (*axes[:batch_dims], *picked, *axes[outer:]))

    return context.call_tir(make_program("gather_nd", call.args, info.shape, info.dtype, body), call.args)


register_op("gather_nd", deduce=deduce_gather_nd, reference=gather_nd_reference,
            legalize=needs_known_shapes(legalize_gather_nd), checks_data=True)


# scatters --------------------------------------------------------------------------------------


def _combine(reduction: str, old, new):
    if reduction == "none":
        return new
    return {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction](old, new)


def _deduce_scatter(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 3)
        data = require_tensor(args[0], name, 0)
        _require_indices(name, args[1], 1)
        updates = require_tensor(args[2], name, 2)
        if updates.dtype != data.dtype:
            raise DeductionError(f"{name}: the updates are {updates.dtype}, the data {data.dtype}")
        reduction = attrs.get("reduction", "none")
        if reduction not in REDUCTIONS:
            raise DeductionError(f"{name}: unknown reduction {reduction!r}; expected one of {', '.join(REDUCTIONS)}")
        if name == "scatter_elements" and data.ndim != -1:
            axis = normalize_axis(name, attrs.get("axis", 0), data.ndim)
            if data.shape is not None:
                _check_constant_indices(name, _constant_data(args[1]), data.shape[axis], axis)
        if name == "scatter_nd" and data.shape is not None:
            _check_constant_tuples(name, _constant_data(args[1]), data.shape, 0)
        return data

    return deduce


def scatter_elements_reference(arrays, attrs):
    data, indices, updates = arrays
    axis = int(attrs.get("axis", 0))
    axis = axis + data.ndim if axis < 0 else axis
    reduction = attrs.get("reduction", "none")
    out = np.array(data, copy=True)
    positions = _normalize(indices, data.shape[axis], attrs, "scatter_elements", axis)
    for index in np.ndindex(*indices.shape):
        target = list(index)
        target[axis] = positions[index]
        out[tuple(target)] = _combine(reduction, out[tuple(target)], updates[index])
    return out


def scatter_nd_reference(arrays, attrs):
    data, indices, updates = arrays
    reduction = attrs.get("reduction", "none")
    out = np.array(data, copy=True)
    depth = indices.shape[-1]
    positions = _normalize(indices, data.shape[:depth], attrs, "scatter_nd", np.arange(depth))
    for index in np.ndindex(*indices.shape[:-1]):
        target = tuple(positions[index])
        out[target] = _combine(reduction, out[target], updates[index])
    return out


def _scatter_result(reduction: str, data_value: ScalarExpr, matches: Callable[[ReduceCombiner, ScalarExpr], ScalarExpr],
                    last_update: Callable[[ScalarExpr], ScalarExpr], dtype: str) -> ScalarExpr:
    """The output element from the updates that land on it.

    ``matches(combiner, neutral)`` reduces ``select(lands here, contribution, neutral)`` over
    the update positions: for ``none`` the contribution is the position (the last one wins,
    as in the reference), for the others the update value.  ``last_update(position)`` loads
    the update at a position found that way."""
    if reduction == "none":
        last = matches(ReduceCombiner.MAX, FloatImm(-1, "int32"))
        return select(last.ge(0), last_update(last), data_value)
    if reduction == "add":
        return data_value + matches(ReduceCombiner.SUM, FloatImm(0, dtype))
    if reduction == "mul":
        return data_value * matches(ReduceCombiner.PROD, FloatImm(1, dtype))
    # max / min: the data value itself is the neutral element (no infinity constant needed)
    if reduction == "max":
        return maximum(data_value, matches(ReduceCombiner.MAX, data_value))
    return minimum(data_value, matches(ReduceCombiner.MIN, data_value))


def legalize_scatter_elements(context, call: Call):
    """One program: each output element scans the updates along ``axis`` that share its other
    coordinates (where the index tensor reaches them) for those whose index lands on it: the
    last one (reduction none) or all of them combined.  O(indices.shape[axis]) per element."""
    data, indices, updates = call.args
    info = call.struct_info
    rank = len(info.shape)
    axis = normalize_axis("scatter_elements", call.attrs.get("axis", 0), rank)
    reduction = call.attrs.get("reduction", "none")
    index_shape = tensor_shape(indices)
    reader = _IndexReader(context, call, 1)

    def body(axes, buffers):
        source, index_buffer, update_buffer = buffers
        r = SizeVar("r_")
        position = tuple(r if d == axis else axes[d] for d in range(rank))
        lands = reader.index(index_buffer, position, source.shape[axis], axis).eq(IndexValue(axes[axis]))

        def matches(combiner: ReduceCombiner, neutral: ScalarExpr) -> ScalarExpr:
            value = IndexValue(r) if reduction == "none" else Load(update_buffer, position)
            scanned: ScalarExpr = Reduce(combiner, r, index_shape[axis], select(lands, value, neutral))
            for d in reversed(range(rank)):  # coordinates the index tensor does not reach
                if d != axis and not prove_equal(index_shape[d], source.shape[d]):
                    scanned = select(IndexValue(axes[d]).lt(IndexValue(index_shape[d])), scanned, neutral)
            return scanned

        def last_update(found: ScalarExpr) -> ScalarExpr:
            return Gather(update_buffer, tuple(found if d == axis else axes[d] for d in range(rank)))

        return _scatter_result(reduction, Load(source, tuple(axes)), matches, last_update, info.dtype)

    program = make_program("scatter_elements", call.args, info.shape, info.dtype, body)
    return context.call_tir(program, call.args)


def legalize_scatter_nd(context, call: Call):
    """The indices are viewed as ``(count, depth)`` and the updates as ``(count, rest...)``
    (reshape copies), then one program: each output element scans the ``count`` index tuples
    for those equal to its leading ``depth`` coordinates.  O(count * depth) per element."""
    data, indices, updates = call.args
    info = call.struct_info
    reduction = call.attrs.get("reduction", "none")
    index_shape = tensor_shape(indices)
    depth = as_int(index_shape[-1])
    if depth is None:
        raise UnsupportedModelError(f"scatter_nd: the last dim of the indices ({format_expr(index_shape[-1])}) "
                                    "must be a constant")
    count = simplify(product(index_shape[:-1]))
    rest = tuple(info.shape[depth:])
    flat_indices = context.emit(context.call_tir(reshape_program(indices, (count, IntImm(depth))), (indices,)),
                                "scatter_nd_indices")
    flat_updates = context.emit(context.call_tir(reshape_program(updates, (count, *rest)), (updates,)),
                                "scatter_nd_updates")
    args = (data, flat_indices, flat_updates)
    reader = _IndexReader(context, call, 1)

    def body(axes, buffers):
        source, index_buffer, update_buffer = buffers
        r = SizeVar("r_")
        lands: ScalarExpr = FloatImm(1, "bool")
        for j in reversed(range(depth)):
            hit = reader.index(index_buffer, (r, IntImm(j)), source.shape[j], j).eq(IndexValue(axes[j]))
            lands = hit if j == depth - 1 else select(hit, lands, FloatImm(0, "bool"))

        def matches(combiner: ReduceCombiner, neutral: ScalarExpr) -> ScalarExpr:
            value = IndexValue(r) if reduction == "none" else Load(update_buffer, (r, *axes[depth:]))
            return Reduce(combiner, r, count, select(lands, value, neutral))

        def last_update(found: ScalarExpr) -> ScalarExpr:
            return Gather(update_buffer, (found, *axes[depth:]))

        return _scatter_result(reduction, Load(source, tuple(axes)), matches, last_update, info.dtype)

    program = make_program("scatter_nd", args, info.shape, info.dtype, body)
    return context.call_tir(program, args)


register_op("scatter_elements", deduce=_deduce_scatter("scatter_elements"), reference=scatter_elements_reference,
            legalize=needs_known_shapes(legalize_scatter_elements), checks_data=True)
register_op("scatter_nd", deduce=_deduce_scatter("scatter_nd"), reference=scatter_nd_reference,
            legalize=needs_known_shapes(legalize_scatter_nd), checks_data=True)


# nonzero ---------------------------------------------------------------------------------------


def deduce_nonzero(args, attrs) -> TensorStructInfo:
    expect_args("nonzero", args, 1)
    require_tensor(args[0], "nonzero", 0)
    return TensorStructInfo(None, "int64", 2)


def legalize_nonzero(context, call: Call):
    """Three programs and a read-back, all compute definitions (O(size) per element, meant
    for the small tensors masks usually are): the count of non-zero elements (read back and
    bound to a fresh size variable), each element's rank among the non-zero ones (the count
    before it in row-major order), then ``out[c, j]`` = coordinate c of the non-zero element
    whose rank is j (int64)."""
    data = call.args[0]
    shape = tensor_shape(data)
    ndim = len(shape)
    if ndim == 0:
        raise UnsupportedModelError("nonzero: a 0-d input has no GPU lowering")
    inner = tuple(SizeVar(f"r{d}_") for d in range(ndim))

    def nonzero_at(source: Buffer, position) -> ScalarExpr:
        return Load(source, tuple(position)).ne(0)

    def over_all(body: ScalarExpr) -> ScalarExpr:
        for d in reversed(range(ndim)):
            body = Reduce(ReduceCombiner.SUM, inner[d], shape[d], body)
        return body

    def flat(position) -> PrimExpr:
        total: PrimExpr = IntImm(0)
        for index, dim in zip(position, shape):
            total = total * dim + index
        return simplify(total)

    def count_body(axes, buffers):
        return over_all(select(nonzero_at(buffers[0], inner), const(1), 0))

    def rank_body(axes, buffers):
        earlier = IndexValue(flat(inner)).lt(IndexValue(flat(axes)))
        return over_all(select(both(earlier, nonzero_at(buffers[0], inner)), const(1), 0))

    def coordinates_body(axes, buffers):
        source, ranks = buffers
        coordinate: ScalarExpr = IndexValue(inner[ndim - 1])
        for c in reversed(range(ndim - 1)):
            coordinate = select(IndexValue(axes[0]).eq(const(c)), IndexValue(inner[c]), coordinate)
        hit = both(nonzero_at(source, inner), Load(ranks, inner).eq(IndexValue(axes[1])))
        return Cast("int64", over_all(select(hit, coordinate, 0)))

    count = context.emit(context.call_tir(make_program("nonzero_count", [data], (IntImm(1),), "int32", count_body),
                                          (data,)), "nonzero_count")
    ranks = context.emit(context.call_tir(make_program("nonzero_rank", [data], shape, "int32", rank_body), (data,)),
                         "nonzero_rank")
    value = context.emit(TensorToPrim(count), "nonzero_count_value")
    found = SizeVar(context.fresh_name("nonzero_k"))
    context.emit_match_cast(value, PrimStructInfo("int64", found), "nonzero_k",
                            reason=read_reason(context, "the number of non-zero elements"))
    program = make_program("nonzero", [data, ranks], (IntImm(ndim), found), "int64", coordinates_body)
    return context.call_tir(program, (data, ranks))


def _legalize_nonzero_checked(context, call: Call):
    info = call.args[0].struct_info
    if isinstance(info, TensorStructInfo) and info.shape is None:
        raise UnknownShapeError(f"nonzero: argument 0 has an unknown shape ({info}); legalization needs a known "
                                "shape: add a match_cast that gives its dims names")
    return legalize_nonzero(context, call)


register_op(
    "nonzero",
    deduce=deduce_nonzero,
    legalize=_legalize_nonzero_checked,
    reference=lambda arrays, attrs: np.array(np.nonzero(arrays[0]), dtype=np.int64).reshape(np.ndim(arrays[0]), -1),
    reads_back=True,
)


# reverse_sequence ------------------------------------------------------------------------------


def _sequence_axes(attrs) -> tuple[int, int]:
    batch_axis, time_axis = int(attrs.get("batch_axis", 1)), int(attrs.get("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        raise DeductionError(
            f"reverse_sequence: batch_axis and time_axis must be 0 and 1 (one each), got {batch_axis} and {time_axis}"
        )
    return batch_axis, time_axis


def deduce_reverse_sequence(args, attrs) -> TensorStructInfo:
    expect_args("reverse_sequence", args, 2)
    data = require_tensor(args[0], "reverse_sequence", 0)
    lengths = _require_indices("reverse_sequence", args[1], 1)
    batch_axis, _ = _sequence_axes(attrs)
    if data.ndim != -1 and data.ndim < 2:
        raise DeductionError(f"reverse_sequence: the data needs at least 2 dims, got {data.ndim}")
    if lengths.ndim not in (-1, 1):
        raise DeductionError(f"reverse_sequence: the sequence lengths must be a 1-D tensor, got {lengths.ndim} dims")
    if data.shape is not None and lengths.shape is not None and not prove_equal(data.shape[batch_axis], lengths.shape[0]):
        raise DeductionError(
            f"reverse_sequence: {format_expr(lengths.shape[0])} sequence lengths for a batch of "
            f"{format_expr(data.shape[batch_axis])} (dim {batch_axis} of the data)"
        )
    time = as_int(data.shape[1 - batch_axis]) if data.shape is not None else None
    if isinstance(args[1], Constant) and time is not None:  # constant lengths: checked here, not in the kernel
        bad = [int(v) for v in np.asarray(args[1].data).reshape(-1) if not 0 <= int(v) <= time]
        if bad:
            raise DeductionError(f"reverse_sequence: sequence length {bad[0]} is out of range [0, {time}] "
                                 f"(the time axis' extent)")
    return data


#: What the kernels and the reference say of a sequence length outside ``[0, time extent]``,
#: as onnxruntime refuses it (the values as the kernels report them: the length, and the
#: time axis' extent plus one).
NEGATIVE_LENGTH = "sequence length {0} is negative"
LENGTH_PAST_TIME = "sequence length {0} is not below {1} (the time axis' extent plus one)"


def reverse_sequence_reference(arrays, attrs):
    data, lengths = np.asarray(arrays[0]), np.asarray(arrays[1])
    batch_axis, time_axis = _sequence_axes(attrs)
    result = data.copy()
    node, op = node_named(attrs, "reverse_sequence")
    for length in lengths.tolist():
        if length < 0:
            raise RunCheckError(run_error_message(node, op, NEGATIVE_LENGTH, (length,)))
        if length > data.shape[time_axis]:
            raise RunCheckError(run_error_message(node, op, LENGTH_PAST_TIME, (length, data.shape[time_axis] + 1)))
    for batch, length in enumerate(lengths.tolist()):
        picked = [slice(None)] * data.ndim
        picked[batch_axis], picked[time_axis] = batch, slice(0, length)
        reversed_ = list(picked)
        reversed_[time_axis] = slice(length - 1, None, -1) if length else slice(0, 0)
        result[tuple(picked)] = data[tuple(reversed_)]
    return result


def legalize_reverse_sequence(context, call: Call):
    """``out[.., b, t, ..] = data[.., b, length[b] - 1 - t, ..]`` where ``t < length[b]``,
    ``data`` as it is elsewhere: one gather along the time axis.  A length from data is
    checked as onnxruntime checks it, in ``[0, time extent]``: a negative one through a
    :class:`CheckedIndex` of extent 0 (every index fails it; it is evaluated only for a
    negative length), one past the time axis through a CheckedIndex of extent ``T + 1``."""
    info = call.struct_info
    batch_axis, time_axis = _sequence_axes(call.attrs)
    checked = not isinstance(call.args[1], Constant)
    if checked:
        negative = context.error_site(call, NEGATIVE_LENGTH)
        past_time = context.error_site(call, LENGTH_PAST_TIME)

    def body(axes, buffers):
        data, lengths = buffers
        length = int32(Load(lengths, (axes[batch_axis],)))
        if checked:
            at_least_zero = select(length.lt(0), CheckedIndex(negative, length, IntImm(0)), length)
            length = CheckedIndex(past_time, at_least_zero, data.shape[time_axis] + 1)
        t = IndexValue(axes[time_axis])
        source = select(t.lt(length), length - t - 1, t)
        return Gather(data, tuple(source if d == time_axis else axes[d] for d in range(len(axes))))

    program = make_program("reverse_sequence", call.args, info.shape, info.dtype, body)
    return context.call_tir(program, call.args)


register_op("reverse_sequence", deduce=deduce_reverse_sequence, reference=reverse_sequence_reference,
            legalize=needs_known_shapes(legalize_reverse_sequence), checks_data=True)


# one_hot ---------------------------------------------------------------------------------------


def _one_hot_depth(args, attrs) -> PrimExpr | None:
    """The depth when known at compile time (the attribute, or a prim value argument), else
    None (a run-time tensor)."""
    if len(args) == 2:
        return IntImm(int(attrs["depth"]))
    info = args[2].struct_info
    if isinstance(info, PrimStructInfo):
        return info.value
    info = require_tensor(args[2], "one_hot", 2)
    if info.shape is not None and as_int(product(info.shape)) not in (None, 1):
        raise DeductionError(f"one_hot: the depth must be one value, got shape {info.shape}")
    return None


def deduce_one_hot(args, attrs) -> TensorStructInfo:
    if len(args) not in (2, 3):
        raise DeductionError(f"one_hot: takes 2 or 3 argument(s) (indices, values, and the depth as a prim value "
                             f"or a run-time tensor), got {len(args)}")
    indices = require_tensor(args[0], "one_hot", 0)
    values = require_tensor(args[1], "one_hot", 1)
    if indices.dtype == "bool":
        raise DeductionError("one_hot: the indices must be numbers, got bool")
    if values.shape is not None and (len(values.shape) != 1 or not prove_equal(values.shape[0], 2)):
        raise DeductionError(f"one_hot: the values must be [off_value, on_value], got shape {values.shape}")
    depth = _one_hot_depth(args, attrs)
    if depth is not None and as_int(depth) is not None and as_int(depth) < 0:
        raise DeductionError(f"one_hot: depth is {as_int(depth)}")
    if indices.ndim == -1:
        return TensorStructInfo(None, values.dtype, -1)
    axis = normalize_axis("one_hot", attrs.get("axis", -1), indices.ndim + 1)
    if indices.shape is None or depth is None:
        return TensorStructInfo(None, values.dtype, indices.ndim + 1)
    return TensorStructInfo(indices.shape[:axis] + (depth,) + indices.shape[axis:], values.dtype)


def one_hot_reference(arrays, attrs):
    indices, values = np.asarray(arrays[0]).astype(np.int64), np.asarray(arrays[1])
    depth = int(np.asarray(arrays[2]).reshape(-1)[0]) if len(arrays) == 3 else int(attrs["depth"])
    axis = normalize_axis("one_hot", attrs.get("axis", -1), indices.ndim + 1)
    wrapped = np.expand_dims(np.where(indices < 0, indices + depth, indices), axis)
    positions = np.arange(max(depth, 0)).reshape((-1,) + (1,) * (indices.ndim - axis))
    return np.where(wrapped == positions, values[1], values[0]).astype(values.dtype)


def legalize_one_hot(context, call: Call):
    """``out[.., j, ..] = on if wrap(indices[..]) == j else off``: an index outside
    ``[-depth, depth)`` matches no position (all off_value), as ONNX.  A depth known only at
    run time is read back first (one host stage), like TopK's k."""
    indices_arg, values_arg = call.args[:2]
    shape = tensor_shape(indices_arg)
    axis = normalize_axis("one_hot", call.attrs.get("axis", -1), len(shape) + 1)
    depth = _one_hot_depth(call.args, call.attrs)
    if depth is None:
        (depth,) = read_back_dims(context, (call.args[2],), [
            lambda buffers: int32(Load(buffers[0], tuple(IntImm(0) for _ in buffers[0].shape)))
        ], "one_hot_depth")
    out_shape = shape[:axis] + (depth,) + shape[axis:]
    dtype = tensor_dtype(values_arg)

    def body(axes, buffers):
        indices, values = buffers
        index = int32(Load(indices, axes[:axis] + axes[axis + 1:]))  # a float index truncates
        wrapped = select(index.lt(0), index + IndexValue(depth), index)
        return select(wrapped.eq(IndexValue(axes[axis])), Load(values, (IntImm(1),)), Load(values, (IntImm(0),)))

    program = make_program("one_hot", (indices_arg, values_arg), out_shape, dtype, body)
    return context.call_tir(program, (indices_arg, values_arg))


def _legalize_one_hot_checked(context, call: Call):
    for position, arg in enumerate(call.args[:2]):
        if arg.struct_info.shape is None:
            raise UnknownShapeError(f"one_hot: argument {position} has an unknown shape ({arg.struct_info}); "
                                    "legalization needs a known shape: add a match_cast that gives its dims names")
    return legalize_one_hot(context, call)


register_op("one_hot", deduce=deduce_one_hot, reference=one_hot_reference, legalize=_legalize_one_hot_checked,
            reads_back=True)
