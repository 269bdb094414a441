"""Ops that change a tensor's shape but not its elements' order: reshape, transpose, and the
data-dependent dynamic_reshape / squeeze / expand_dims.

They legalize to copy programs whose load indices are index arithmetic on the output axes
(later work may turn a contiguous reshape into a view of the same storage).
``dynamic_reshape`` and ``squeeze`` / ``expand_dims`` with run-time axes legalize by computing
each result extent on the GPU and reading it back (``relaxweb/ops/readback.py``: a fresh size
variable per dim, one host stage each), then a copy.  Ops after a data-dependent result still
see an unknown shape (only its rank) and need a ``match_cast`` to legalize.

Signatures (args, then attributes):

- ``reshape(x, shape, count_checked=False)``: ``shape`` is a shape value; one entry may be
  ``-1``, inferred from the element count.  0 means a dimension of size 0 here (ONNX's "copy
  the input's dim" 0 is resolved by the frontend).  The element counts must be equal (and a
  count divisible for ``-1``): provably, or, where the analyzer cannot decide, checked at run
  time by a ``match_cast`` of the count bound just before; ``count_checked=True`` says so.
  A ``-1`` is inferred only where the other target dims are not 0 (onnxruntime refuses a
  zero-element reshape like ``[0, 4] -> [0, -1]`` as ambiguous): refused at build where they
  are 0, checked at run time where they may be (``others_checked=True``); except with
  ``allowzero=True`` (ONNX's attribute: the target's zeros are zeros), where onnxruntime infers
  it at run time from the dims that are not 0, as the symbolic ``count // others`` does.
- ``dynamic_reshape(x, shape, copy_zeros=False)``: with a run-time 1-D integer
  tensor ``shape`` (data-dependent; extents read back); ``copy_zeros`` gives ONNX's meaning to
  its zeros (Reshape without ``allowzero``).  A -1 beside other extents that multiply to 0 is
  refused with ``copy_zeros`` and otherwise (allowzero) inferred as onnxruntime does: the
  product of the input's dims that are not 0 over that of the target's.  The element count of the target is checked at
  run time (on the GPU path and in the reference alike); that error names the node the call
  comes from (``Reshape node 'r'``: ``op_registry.node_text``).
- ``transpose(x, axes=[...])``: a permutation of the dims.
- ``squeeze(x[, axes])`` / ``expand_dims(x, axes)``: with a 1-D tensor of axes (squeeze
  without axes drops every dim of extent 1); only the rank is deduced (none for squeeze).
  The frontend uses them for run-time axes or inputs of unknown shape; with constant axes
  and known dims it writes a ``reshape``.
"""

from __future__ import annotations


import numpy as np

from ..errors import InputShapeError, UnsupportedModelError
from ..ir.expr import Call, Constant, Expr, PrimValue, tensor_dtype, tensor_shape
from ..ir.op_registry import AssumptionError, DeductionError, node_text, register_op
from ..ir.struct_info import PrimStructInfo, TensorStructInfo
from ..ir.symbolic import (
    IntImm, PrimExpr, as_int, expr_min, format_expr, product, prove_equal,
    prove_less, prove_less_equal, prove_not_equal, simplify,
)
from ..ir.tir import Load, maximum, select
from .common import (
    expect_args, make_program, needs_known_shapes,
    require_tensor,
)
from .readback import both, const, count_true, element, extent_reason, index, int32, read_back_dims, wrap_negative
from .shape_operands import int_list, needs_known_data_shape, shape_operand, shape_values


class ReshapeInferenceError(AssumptionError):
    """The -1 of a reshape target is inferred only if the element count is a multiple of the
    other dims, which the analyzer cannot prove (the model may be fine for the sizes it is made
    for): a builder checks it at run time."""


# reshape ---------------------------------------------------------------------------------------


def deduce_reshape(args, attrs) -> TensorStructInfo:
    expect_args("reshape", args, 2)
    data = require_tensor(args[0], "reshape", 0)
    target = shape_values(args[1], "reshape", "the target shape")
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
        if not attrs.get("others_checked", False) and not attrs.get("allowzero", False) and not prove_less(0, known):
            raise AssumptionError(
                f"reshape: cannot infer -1 (target dim {position}) if the other target dims multiply to 0",
                argument=0, dim=None, actual=simplify(expr_min(known, 1)), expected=simplify(1),
                quantity=f"the -1 of the target (dim {position}): inferred only where the other target dims "
                f"({format_expr(known)}) are not 0, as in onnxruntime; min(1, {format_expr(known)})",
                checked_attrs={"others_checked": True},
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


def _matched_groups(source: tuple[PrimExpr, ...], target: tuple[PrimExpr, ...]) -> list[tuple[list[int], list[int]]] | None:
    """The dims of both shapes (those of extent 1 left out) as consecutive groups whose
    products are provably equal, each as small as that allows (``[N, O, H, 2, W, 2]`` and
    ``[N, O, 2H, 2W]``: N-N, O-O, (H, 2)-2H, (W, 2)-2W), or None where they cannot be
    matched so."""
    kept_source = [i for i, d in enumerate(source) if as_int(d) != 1]
    kept_target = [j for j, d in enumerate(target) if as_int(d) != 1]
    groups, i, j = [], 0, 0
    while i < len(kept_source) and j < len(kept_target):
        group_source, group_target = [kept_source[i]], [kept_target[j]]
        source_size, target_size = source[kept_source[i]], target[kept_target[j]]
        i, j = i + 1, j + 1
        while not prove_equal(source_size, target_size):
            if i < len(kept_source) and prove_less_equal(source_size, target_size):
                group_source.append(kept_source[i])
                source_size, i = simplify(source_size * source[kept_source[i]]), i + 1
            elif j < len(kept_target) and prove_less_equal(target_size, source_size):
                group_target.append(kept_target[j])
                target_size, j = simplify(target_size * target[kept_target[j]]), j + 1
            else:
                return None
        groups.append((group_source, group_target))
    return groups if i == len(kept_source) and j == len(kept_target) else None


def _grouped_indices(source: tuple[PrimExpr, ...], target: tuple[PrimExpr, ...], axes) -> tuple[PrimExpr, ...] | None:
    """The source's indices of the element at ``axes`` of the target, computed within each
    group of :func:`_matched_groups` (divided by the group's own inner extents only, constants
    where those are), or None where the dims do not group."""
    groups = _matched_groups(source, target)
    if groups is None:
        return None
    indices: list[PrimExpr] = [IntImm(0)] * len(source)
    for group_source, group_target in groups:
        flat = sum((axes[j] * product(target[k] for k in group_target[position + 1:])
                    for position, j in enumerate(group_target)), simplify(0))
        for position, i in enumerate(group_source):
            stride = product(source[k] for k in group_source[position + 1:])
            value = flat if as_int(stride) == 1 else flat // stride
            indices[i] = simplify(value if position == 0 else value % source[i])
    return tuple(indices)


def reshape_program(data: Expr, shape: tuple[PrimExpr, ...], name: str = "reshape"):
    """The copy program of a reshape of ``data`` (a known shape) to ``shape`` (row-major order):
    each source index computed within the group of dims it shares with the target
    (:func:`_grouped_indices`), else from the element's flat position."""
    def body(axes, buffers):
        (source,) = buffers
        if any(as_int(d) == 0 for d in (*shape, *source.shape)) or not source.shape:  # nothing is ever loaded, or a scalar
            return Load(source, tuple(axes[0] if axes else IntImm(0) for _ in source.shape))
        grouped = _grouped_indices(tuple(source.shape), tuple(shape), axes)
        if grouped is not None:
            return Load(source, grouped)
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


def reshape_reference(arrays, attrs):
    data, target = arrays[0], int_list(arrays[1])
    if attrs.get("copy_zeros"):
        target = [data.shape[position] if value == 0 else value for position, value in enumerate(target)]
    if -1 in target:  # as deduction infers it (numpy refuses a -1 beside a 0)
        target = [_minus_one(data.shape, target, allowzero=True) if value == -1 else value for value in target]
    return np.asarray(data.reshape(tuple(target)), order="C")  # (ascontiguousarray makes a 0-d result 1-d)


def dynamic_reshape_reference(arrays, attrs):
    """A reshape whose target, from data, is checked as on the GPU path."""
    data, target = arrays[0], int_list(arrays[1])
    if attrs.get("copy_zeros"):
        target = [data.shape[position] if value == 0 else value for position, value in enumerate(target)]
    target = _checked_target(data.shape, target, node_text(attrs), allowzero=not attrs.get("copy_zeros"))
    return np.asarray(data.reshape(tuple(target)), order="C")


def count_reason(source: str) -> str:
    """What the element-count check of a ``dynamic_reshape`` states (see match_cast's reason)."""
    return f"{source or 'dynamic_reshape'}: the element count of the target shape"


def _minus_one(shape: tuple[int, ...], target: list[int], allowzero: bool) -> int:
    """The value of a target's -1: the element count over the product of the other entries;
    where that is 0, with ``allowzero`` onnxruntime's (the product of the input's dims that are
    not 0 over that of the other entries), else -1 (refused as negative)."""
    others = int(np.prod([value for value in target if value != -1], dtype=np.int64))
    if others:
        return int(np.prod(shape, dtype=np.int64)) // others
    if allowzero:
        nonzero = int(np.prod([value or 1 for value in target if value != -1], dtype=np.int64))
        return int(np.prod([dim or 1 for dim in shape], dtype=np.int64)) // nonzero
    return -1


def _checked_target(shape: tuple[int, ...], target: list[int], source: str, allowzero: bool) -> list[int]:
    """The target with its -1 resolved as the GPU path resolves it (the count over the
    product of the others; where that is 0, with ``allowzero`` the product of the input's dims
    that are not 0 over that of the others, else -1, refused), refused with the GPU path's
    error when it does not hold the input's element count or has a negative extent."""
    count = int(np.prod(shape, dtype=np.int64))
    inferred = _minus_one(shape, target, allowzero)
    resolved = [inferred if value == -1 else value for value in target]
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
            others, nonzero_others = const(1), const(1)
            for other in range(length):
                if other != position:
                    others = others * resolved(buffers, other)
                    nonzero_others = nonzero_others * select(resolved(buffers, other).eq(const(0)), const(1),
                                                             resolved(buffers, other))
            # the other extents multiplying to 0: onnxruntime refuses the -1 when the zeros were
            # copied (-1 here, refused as negative), else infers it from the extents that are not 0
            nonzero_count = const(1)
            for dim in shape:
                nonzero_count = nonzero_count * maximum(int32(index(dim)), const(1))
            ambiguous = const(-1) if copy_zeros else nonzero_count / maximum(nonzero_others, const(1))
            inferred = select(others.eq(const(0)), ambiguous, int32(index(product(shape)) / maximum(others, const(1))))
            value = resolved(buffers, position)
            return select(value.eq(const(-1)), inferred, value)
        return build

    dims = read_back_dims(context, (data, target), [extent(j) for j in range(length)], "reshape",
                          node_text(call.attrs) or "dynamic_reshape")
    context.emit_match_cast(PrimValue(product(dims)), PrimStructInfo("int64", product(shape)), "reshape_count",
                            reason=count_reason(node_text(call.attrs)))
    return context.call_tir(reshape_program(data, dims), (data,))


register_op("dynamic_reshape", deduce=deduce_dynamic_reshape, reference=dynamic_reshape_reference,
            legalize=needs_known_data_shape(legalize_dynamic_reshape), reads_back=True)


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
            legalize=needs_known_data_shape(legalize_squeeze), reads_back=True)
register_op("expand_dims", deduce=_deduce_axes_op("expand_dims", 1), reference=expand_dims_reference,
            legalize=needs_known_data_shape(legalize_expand_dims), reads_back=True)
