"""Reductions, arg-reductions, scans and top-k.

``op(x, axes=None, keepdims=False)`` for ``sum``, ``mean``, ``max``, ``min``, ``prod``,
``l1_norm`` (sum of absolute values), ``l2_norm`` (square root of the sum of squares),
``sum_square``, ``log_sum`` (log of the sum) and ``log_sum_exp`` (computed stably, shifted by
the maximum): ``axes`` None reduces every axis (an empty list reduces none, as in numpy, so
``sum_square`` then squares each element); negative axes count from the end; ``keepdims``
keeps each reduced axis with extent 1.  Over an empty range a reduction gives its identity
(``sum`` 0, ``prod`` 1, ``log_sum`` and ``log_sum_exp`` -inf); ``max`` and ``min`` of an empty
range are a deduction error (the ONNX importer folds them to constants when it can).

``sum``, ``mean``, ``max``, ``min``, ``prod``, ``l1_norm``, ``l2_norm``, ``sum_square`` and
``log_sum`` legalize to one tensor program with nested ``Reduce`` over the reduced axes;
``mean`` divides the sum by the element count, converted from the (symbolic) extents with
``Cast(IndexValue(...))``; ``l2_norm`` / ``log_sum`` apply sqrt / log to the sum.
``log_sum_exp`` legalizes to two: the maximum over the reduced axes (0 where it is not
finite), then ``log(sum(exp(x - shift))) + shift``.

``argmax`` / ``argmin(x, axis=0, keepdims=True, select_last_index=False)``: int64 indices of
the first (or last) extreme along ``axis``; legalized as the extreme (one program), then the
smallest (largest) position holding it (int64 on the host, i32 on the device).

``cumsum(x, axis, exclusive=False, reverse=False)``: the running sum along ``axis``;
legalized as a masked sum over the axis (with the axis as a run-time tensor: a masked sum
over the whole tensor, the axis chosen in the kernel).  ``cumprod`` likewise: the running
product, a masked product (an exclusive product starts from 1).

``topk(x, k, axis=-1, largest=True)``: a tuple (values, int64 indices) of the ``k`` largest
(or smallest) elements along ``axis``, sorted, ties broken by the lower index; legalized as
each element's rank along the axis (O(n) per element), then the position of each rank below
``k`` and a gather of the values.

Deduction: the reduced dims are removed (or become 1); with an input of unknown shape the
result's rank is still known when the input's is (or when every axis is reduced without
keepdims: a 0-d result).

Values known only at run time: the reductions also take the axes as a second (integer
tensor) argument (``noop_with_empty_axes`` then says what an empty one means), ``topk`` its
``k`` and ``cumsum`` / ``cumprod`` their axis.  The result's shape is then unknown (the rank
usually is not: the length of the axes tensor, or keepdims, gives it).  Legalization computes the
result's extents on the GPU and reads them back (``relaxweb/ops/readback.py``; a fresh
size variable per dim), then reduces with the reduced dims chosen in the kernel from the axes
(O(input size) per output element); ``topk`` reads its ``k`` back; the shape of ``cumsum`` and
``cumprod`` does not depend on their axis, which is chosen in the kernel.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from ..ir.dtype import dtype_info
from ..ir.expr import Call, TensorToPrim, Tuple, tensor_dtype, tensor_shape
from ..ir.integer_checks import checking_every_operation
from ..ir.op_registry import DeductionError, call_op, register_op
from ..ir.struct_info import PrimStructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import IntImm, SizeVar, as_int, product, prove_less_equal, format_expr
from ..ir.tir import (
    Cast, Compare, CompareOp, FloatImm, Gather, IndexValue, Load, Reduce, ReduceCombiner, ScalarExpr, exp, is_nan, log,
    maximum, minimum, scalar_dtype, select, sqrt,
)
from ..library import unique_count_kernel, unique_values_kernel
from .common import (
    UnknownShapeError, expect_args, integer_arithmetic, make_program, needs_known_shapes, normalize_axis, normalize_axes, require_float, require_tensor,
)
from .readback import (
    both, const, count_true, element as axis_entry, index, int32, read_back_dims, read_reason, wrap_negative,
)


def _lowest(dtype: np.dtype):
    if dtype == np.bool_:
        return False
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).min
    return -np.inf


def _highest(dtype: np.dtype):
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).max
    return np.inf


def _log_sum_exp(x: np.ndarray, axis, keepdims: bool) -> np.ndarray:
    if x.size == 0:
        return np.full(np.sum(x, axis=axis, keepdims=keepdims).shape, -np.inf, dtype=x.dtype)
    finite = np.where(np.isinf(x), -np.inf, x)
    shift = np.max(finite, axis=axis, keepdims=True)
    shift = np.where(np.isfinite(shift), shift, 0)
    total = np.sum(np.exp(x - shift), axis=axis, keepdims=True)
    result = np.log(total) + shift
    if not keepdims:
        result = np.squeeze(result, axis=axis if axis is not None else tuple(range(x.ndim)))
    return result


NUMPY = {
    "sum": lambda x, axis, keepdims: np.sum(x, axis=axis, keepdims=keepdims),
    "mean": lambda x, axis, keepdims: np.mean(x, axis=axis, keepdims=keepdims),
    "max": lambda x, axis, keepdims: np.max(x, axis=axis, keepdims=keepdims, initial=_lowest(x.dtype)),
    "min": lambda x, axis, keepdims: np.min(x, axis=axis, keepdims=keepdims, initial=_highest(x.dtype)),
    "prod": lambda x, axis, keepdims: np.prod(x, axis=axis, keepdims=keepdims, dtype=x.dtype),
    "l1_norm": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
    "l2_norm": lambda x, axis, keepdims: np.sqrt(np.sum(np.square(x), axis=axis, keepdims=keepdims)),
    "sum_square": lambda x, axis, keepdims: np.sum(np.square(x), axis=axis, keepdims=keepdims),
    "log_sum": lambda x, axis, keepdims: np.log(np.sum(x, axis=axis, keepdims=keepdims)),
    "log_sum_exp": _log_sum_exp,
}

SUM, PROD, MAX, MIN = ReduceCombiner.SUM, ReduceCombiner.PROD, ReduceCombiner.MAX, ReduceCombiner.MIN
FALSE = FloatImm(0, "bool")

# Legalizable reductions: (combiner, element transform).
LEGALIZED = {
    "sum": (SUM, lambda x: x),
    "mean": (SUM, lambda x: x),
    "max": (MAX, lambda x: x),
    "min": (MIN, lambda x: x),
    "l1_norm": (SUM, lambda x: maximum(x, -x)),
    "sum_square": (SUM, lambda x: x * x),
    "prod": (PROD, lambda x: x),
    "l2_norm": (SUM, lambda x: x * x),
    "log_sum": (SUM, lambda x: x),
}
# Applied to the reduced value.
FINISH = {"l2_norm": sqrt, "log_sum": log}

REDUCTIONS = {name: LEGALIZED.get(name, (None, None))[0] for name in NUMPY}
# The reductions onnxruntime computes in 64 bits on int32 data, its result saturated to int32
# (and the mean, exact): on the device, each int32 step is checked (the run fails where one
# does not fit, rather than answer a wrapped value).
WIDE_INT32 = {"sum", "prod", "sum_square", "l1_norm"}
CHECKED_INT32 = WIDE_INT32 | {"mean"}
INT32_OVERFLOW_MESSAGE = "the int32 result does not fit in 32 bits"
FLOAT_ONLY = {"mean", "log_sum", "log_sum_exp"}


def _reduced_axes(name: str, attrs, ndim: int) -> list[int]:
    axes = attrs.get("axes")
    if axes is None:
        return list(range(ndim))
    return sorted(normalize_axes(name, [int(a) for a in axes], ndim))


def _reduced_shape(shape, axes, keepdims: bool) -> tuple:
    result = []
    for dim, extent in enumerate(shape):
        if dim not in axes:
            result.append(extent)
        elif keepdims:
            result.append(IntImm(1))
    return tuple(result)


def require_integer_tensor(op: str, expr, position: int, what: str) -> TensorStructInfo:
    info = require_tensor(expr, op, position)
    if not info.dtype.startswith(("int", "uint")):
        raise DeductionError(f"{op}: argument {position} ({what}) must be an integer tensor, got {info.dtype}")
    return info


def _runtime_axes_count(info: TensorStructInfo) -> int | None:
    """How many axes a 1-d (or 0-d) axes tensor holds, when its shape says so."""
    if info.shape is None:
        return None
    if len(info.shape) == 0:
        return 1
    return as_int(info.shape[0]) if len(info.shape) == 1 else None


def _deduce_runtime_axes(name: str, data: TensorStructInfo, axes: TensorStructInfo, attrs) -> TensorStructInfo:
    """Axes known only at run time: the result's shape is unknown, its rank often is not."""
    if bool(attrs.get("keepdims", False)):
        return TensorStructInfo(None, data.dtype, data.ndim)
    count = _runtime_axes_count(axes)
    if data.ndim == -1 or count is None:
        return TensorStructInfo(None, data.dtype, -1)
    if count == 0:
        return TensorStructInfo(None, data.dtype, data.ndim if attrs.get("noop_with_empty_axes") else 0)
    if count > data.ndim:
        raise DeductionError(f"{name}: {count} axes for a {data.ndim}-d tensor")
    return TensorStructInfo(None, data.dtype, data.ndim - count)


def _deduce(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        if len(args) not in (1, 2):
            raise DeductionError(f"{name}: takes 1 or 2 argument(s) (data, and axes known at run time), got {len(args)}")
        data = require_tensor(args[0], name, 0)
        if name in FLOAT_ONLY:
            require_float(name, data)
        if len(args) == 2:
            return _deduce_runtime_axes(name, data, require_integer_tensor(name, args[1], 1, "the axes"), attrs)
        keepdims = bool(attrs.get("keepdims", False))
        if data.ndim == -1:
            if attrs.get("axes") is None and not keepdims:
                return TensorStructInfo((), data.dtype)
            return TensorStructInfo(None, data.dtype, -1)
        axes = _reduced_axes(name, attrs, data.ndim)
        if data.shape is None:
            return TensorStructInfo(None, data.dtype, data.ndim if keepdims else data.ndim - len(axes))
        if name in ("max", "min"):
            for axis in axes:
                if as_int(data.shape[axis]) == 0:
                    raise DeductionError(f"{name}: cannot reduce dimension {axis}: its extent is 0")
        return TensorStructInfo(_reduced_shape(data.shape, axes, keepdims), data.dtype)

    return deduce


def _source_index(rank: int, axes, out_axes, keepdims: bool) -> tuple[tuple, dict]:
    """The index into the reduced tensor for one output element: a reduction variable
    (``r<dim>_``) at each reduced dim, the output's axes elsewhere (a kept dim of extent 1
    skips its output axis).  Returns the index and the reduction variables by dim."""
    reduce_vars = {d: SizeVar(f"r{d}_") for d in axes}
    index, position = [], 0
    for dim in range(rank):
        if dim in reduce_vars:
            index.append(reduce_vars[dim])
            position += keepdims
        else:
            index.append(out_axes[position])
            position += 1
    return tuple(index), reduce_vars


def _legalize(name: str):
    combiner, element = LEGALIZED[name]

    def legalize(context, call: Call):
        data = call.args[0]
        info = call.struct_info
        source_shape = tensor_shape(data)
        axes = _reduced_axes(name, call.attrs, len(source_shape))
        keepdims = bool(call.attrs.get("keepdims", False))
        checked = info.dtype == "int32" and name in CHECKED_INT32
        site = context.error_site(call, INT32_OVERFLOW_MESSAGE) if checked else None

        def body(out_axes, buffers):
            (source,) = buffers
            index, reduce_vars = _source_index(len(source_shape), axes, out_axes, keepdims)
            expr = _as_number(element(Load(source, index)))
            for dim in reversed(axes):
                expr = Reduce(combiner, reduce_vars[dim], source_shape[dim], expr)
            if checked:
                expr = checking_every_operation(expr, site, "int32")
            if info.dtype == "bool":
                expr = _to_bool(expr, combiner)
            if name == "mean":
                count = product(source_shape[d] for d in axes)
                expr = expr / Cast(info.dtype, IndexValue(count))
            if name in FINISH:
                expr = FINISH[name](expr)
            return expr

        program = make_program(name, [data], info.shape, info.dtype, body)
        return context.call_tir(program, (data,))

    return legalize


def _reference(name: str):
    function = NUMPY[name]

    def reference(arrays, attrs):
        x = np.asarray(arrays[0])
        if len(arrays) == 2:  # axes given at run time; none means every one (or none: noop)
            axes = [int(a) for a in np.asarray(arrays[1]).reshape(-1)]
            if not axes:
                axes = [] if attrs.get("noop_with_empty_axes") else None
        else:
            axes = attrs.get("axes")
        axis = None if axes is None else tuple(normalize_axes(name, axes, x.ndim))
        wide = x.dtype == np.int32 and name in WIDE_INT32
        with np.errstate(all="ignore"):
            # Python integers for a product (int64 would wrap), int64 for the sums
            widened = x.astype(object if name == "prod" else np.int64) if wide else x
            result = function(widened, axis, bool(attrs.get("keepdims", False)))
        if wide:
            result = np.clip(result, np.iinfo(np.int32).min, np.iinfo(np.int32).max)
        return np.asarray(result).astype(x.dtype)

    return reference


# The largest finite float32: |m| <= FLOAT32_MAX tells a finite maximum from an infinite one
# without an infinity constant (WGSL compilers may assume there are none).
FLOAT32_MAX = 3.4028234663852886e38


def legalize_log_sum_exp(context, call: Call):
    """Two programs: the maximum over the reduced axes (kept as extent-1 dims), then
    ``log(sum(exp(x - shift))) + shift`` where ``shift`` is that maximum when it is finite and
    0 otherwise (all -inf, or an empty range: the sum is 0 and the log -inf; a +inf element
    makes the sum +inf), as the numpy reference."""
    data = call.args[0]
    info = call.struct_info
    shape = tensor_shape(data)
    axes = _reduced_axes("log_sum_exp", call.attrs, len(shape))
    keepdims = bool(call.attrs.get("keepdims", False))
    kept_shape = _reduced_shape(shape, axes, True)
    dtype = info.dtype

    def reduced(element, combiner, out_axes, kept: bool):
        index, reduce_vars = _source_index(len(shape), axes, out_axes, kept)
        expr = element(index)
        for dim in reversed(axes):
            expr = Reduce(combiner, reduce_vars[dim], shape[dim], expr)
        return expr

    def shift_body(out_axes, buffers):
        (source,) = buffers
        largest = reduced(lambda index: Load(source, index), MAX, out_axes, True)
        return select(_is_finite(largest), largest, 0)

    shift = context.emit(context.call_tir(
        make_program("log_sum_exp_shift", [data], kept_shape, dtype, shift_body), (data,)), "log_sum_exp_shift")

    def body(out_axes, buffers):
        source, offsets = buffers
        kept_index, position = [], 0
        for dim in range(len(shape)):
            if dim in axes:
                kept_index.append(IntImm(0))
                position += keepdims
            else:
                kept_index.append(out_axes[position])
                position += 1
        offset = Load(offsets, tuple(kept_index))
        total = reduced(lambda index: exp(Load(source, index) - offset), SUM, out_axes, keepdims)
        return log(total) + offset

    program = make_program("log_sum_exp", [data, shift], info.shape, dtype, body)
    return context.call_tir(program, (data, shift))


SPECIAL_LEGALIZATIONS = {"log_sum_exp": legalize_log_sum_exp}


def _as_number(value: ScalarExpr) -> ScalarExpr:
    """Bools are reduced as int32 0/1 (WGSL has no max / min of bools; ONNX allows
    ReduceMax / ReduceMin on them), and cast back."""
    return Cast("int32", value) if scalar_dtype(value) == "bool" else value


def _to_bool(value: ScalarExpr, combiner: ReduceCombiner) -> ScalarExpr:
    """A bool reduction's int32 result back to bool; over an empty range max is false and min
    true (the int32 extremes are clamped to 0 / 1 first)."""
    if combiner is MAX:
        value = maximum(value, 0)
    elif combiner is MIN:
        value = minimum(value, 1)
    return Cast("bool", value)


def _is_finite(value: ScalarExpr) -> ScalarExpr:
    """``|value| <= FLOAT32_MAX``: false for infinities and NaN, without an infinity constant."""
    return maximum(value, -value).le(FLOAT32_MAX)


def _neutral(combiner: ReduceCombiner, dtype: str) -> FloatImm:
    """What a skipped element contributes (max / min: the extreme finite value: no infinity
    constant in WGSL, so an all -inf (+inf) reduction gives the finite extreme instead)."""
    if combiner in (SUM, PROD):
        return FloatImm(0 if combiner is SUM else 1, dtype)
    if dtype.startswith("float"):
        return FloatImm(-FLOAT32_MAX if combiner is MAX else FLOAT32_MAX, dtype)
    info = np.iinfo(np.dtype("int32" if dtype == "int64" else dtype))
    return FloatImm(info.min if combiner is MAX else info.max, dtype)


def _legalize_run_time_axes(name: str):
    """Axes given as a run-time 1-D tensor (of known length): whether each dim is reduced is
    a scalar computed in the kernels from the axes.  The result's extents (1 or the dim with
    keepdims; the kept dims otherwise) are computed on the GPU and read back
    (``relaxweb/ops/readback.py``), then each output element reduces every input element
    whose kept coordinates match it (O(input size) per output element: meant for the small
    tensors such models compute axes for).  An empty axes tensor is decided at compile time."""
    def legalize(context, call: Call):
        data, axes_tensor = call.args
        for position, arg in enumerate(call.args):
            if arg.struct_info.shape is None:
                raise UnknownShapeError(f"{name}: argument {position} has an unknown shape ({arg.struct_info}); "
                                        "legalization needs a known shape: add a match_cast that gives its dims names")
        shape = tensor_shape(data)
        rank = len(shape)
        axes_shape = tensor_shape(axes_tensor)
        count = 1 if len(axes_shape) == 0 else as_int(axes_shape[0])
        if count is None or len(axes_shape) > 1:
            raise UnsupportedModelError(f"{name}: the axes need a 1-D tensor of known length")
        keepdims = bool(call.attrs.get("keepdims", False))
        if count == 0:  # no axes: every one, or none with noop_with_empty_axes
            axes = [] if call.attrs.get("noop_with_empty_axes") else list(range(rank))
            static = call_op(name, data, axes=axes, keepdims=keepdims)
            return get_op_legalize(name)(context, static)
        dtype = call.struct_info.dtype

        def entry(buffer, k):
            return axis_entry(buffer, k) if buffer.shape else int32(Load(buffer, ()))

        def reduced(buffers, dim: int):
            named = [wrap_negative(entry(buffers[1], k), index(rank)).eq(index(dim)) for k in range(count)]
            return count_true(named).gt(index(0))

        out_rank = rank if keepdims else rank - count

        def extent(position: int):
            def build(buffers):
                if keepdims:
                    return select(reduced(buffers, position), index(1), index(shape[position]))
                total = index(0)
                for dim in range(rank):
                    kept = reduced(buffers, dim).eq(FALSE)
                    before = count_true([reduced(buffers, d).eq(FALSE) for d in range(dim)])
                    total = select(both(kept, before.eq(index(position))), index(shape[dim]), total)
                return total
            return build

        dims = read_back_dims(context, call.args, [extent(j) for j in range(out_rank)], name)
        inner = tuple(SizeVar(f"r{d}_") for d in range(rank))

        def matching(buffers, out_axes, value: ScalarExpr, combiner: ReduceCombiner) -> ScalarExpr:
            """``combiner`` over the input elements that reduce into this output element."""
            match: ScalarExpr = FloatImm(1, "bool")
            for dim in reversed(range(rank)):
                if keepdims:
                    coordinate: ScalarExpr = IndexValue(out_axes[dim])
                else:
                    before = count_true([reduced(buffers, d).eq(FALSE) for d in range(dim)])
                    coordinate = index(0)
                    for j in range(out_rank):
                        coordinate = select(before.eq(index(j)), IndexValue(out_axes[j]), coordinate)
                same = IndexValue(inner[dim]).eq(coordinate)
                match = select(reduced(buffers, dim), match, both(same, match))
            expr = select(match, value, _neutral(combiner, scalar_dtype(value)))
            for dim in reversed(range(rank)):
                expr = Reduce(combiner, inner[dim], shape[dim], expr)
            return expr

        if name == "log_sum_exp":
            def shift_body(out_axes, buffers):
                largest = matching(buffers, out_axes, Load(buffers[0], inner), MAX)
                return select(_is_finite(largest), largest, 0)

            shift = context.emit(context.call_tir(
                make_program("log_sum_exp_shift", call.args, dims, dtype, shift_body), call.args), "log_sum_exp_shift")

            def body(out_axes, buffers):
                offset = Load(buffers[2], tuple(out_axes))
                total = matching(buffers, out_axes, exp(Load(buffers[0], inner) - offset), SUM)
                return log(total) + offset

            args = (*call.args, shift)
            return context.call_tir(make_program(name, args, dims, dtype, body), args)

        combiner, element = LEGALIZED[name]

        def body(out_axes, buffers):
            expr = matching(buffers, out_axes, _as_number(element(Load(buffers[0], inner))), combiner)
            if dtype == "bool":
                expr = _to_bool(expr, combiner)
            if name == "mean":
                size = index(1)
                for dim in range(rank):
                    size = size * select(reduced(buffers, dim), index(shape[dim]), index(1))
                expr = expr / Cast(dtype, size)
            if name in FINISH:
                expr = FINISH[name](expr)
            return expr

        return context.call_tir(make_program(name, call.args, dims, dtype, body), call.args)

    return legalize


STATIC_LEGALIZATIONS: dict = {}


def get_op_legalize(name: str):
    return STATIC_LEGALIZATIONS[name]


def _with_run_time_axes(name: str, static):
    """The static legalization (constant axes, known shapes), or, with the axes as a second
    (tensor) argument, :func:`_legalize_run_time_axes`."""
    STATIC_LEGALIZATIONS[name] = needs_known_shapes(static)
    run_time = _legalize_run_time_axes(name)

    def legalize(context, call: Call):
        if len(call.args) == 2:
            return run_time(context, call)
        return STATIC_LEGALIZATIONS[name](context, call)

    return legalize


for _name in NUMPY:
    _legalization = _legalize(_name) if _name in LEGALIZED else SPECIAL_LEGALIZATIONS.get(_name)
    register_op(
        _name,
        deduce=_deduce(_name),
        legalize=_with_run_time_axes(_name, _legalization) if _legalization else None,
        reference=_reference(_name),
        reads_back=True,  # with run-time axes
        checks_data=integer_arithmetic,
    )


# argmax, argmin --------------------------------------------------------------------------------


def _deduce_arg(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 1)
        data = require_tensor(args[0], name, 0)
        keepdims = bool(attrs.get("keepdims", True))
        if data.ndim == -1:
            return TensorStructInfo(None, "int64", -1)
        axis = normalize_axis(name, attrs.get("axis", 0), data.ndim)
        if data.shape is None:
            return TensorStructInfo(None, "int64", data.ndim if keepdims else data.ndim - 1)
        if as_int(data.shape[axis]) == 0:
            raise DeductionError(f"{name}: cannot reduce dimension {axis}: its extent is 0")
        return TensorStructInfo(_reduced_shape(data.shape, [axis], keepdims), "int64")

    return deduce


def _arg_reference(name: str):
    function = np.argmax if name == "argmax" else np.argmin

    def reference(arrays, attrs):
        x = np.asarray(arrays[0])
        axis = normalize_axis(name, attrs.get("axis", 0), x.ndim)
        if attrs.get("select_last_index", False):
            result = x.shape[axis] - 1 - function(np.flip(x, axis), axis=axis)
        else:
            result = function(x, axis=axis)
        if attrs.get("keepdims", True):
            result = np.expand_dims(result, axis)
        return np.asarray(result).astype(np.int64)

    return reference


def _legalize_arg(name: str):
    """Two programs: the extreme along the axis (kept as an extent-1 dim), then the first (or,
    with ``select_last_index``, the last) position where the data equals it, as int64.  A
    row with a NaN has NaN as its extreme and gives the position of its first (last) NaN, as
    numpy."""
    combiner = MAX if name == "argmax" else MIN

    def legalize(context, call: Call):
        data = call.args[0]
        info = call.struct_info
        shape = tensor_shape(data)
        axis = normalize_axis(name, call.attrs.get("axis", 0), len(shape))
        keepdims = bool(call.attrs.get("keepdims", True))
        last = bool(call.attrs.get("select_last_index", False))
        extent = shape[axis]
        kept_shape = _reduced_shape(shape, [axis], True)
        r = SizeVar("r_")

        def source_index(out_axes, position):
            index = list(out_axes)
            if keepdims:
                index[axis] = position
            else:
                index.insert(axis, position)
            return tuple(index)

        def extreme_body(axes, buffers):
            index = list(axes)
            index[axis] = r
            return Reduce(combiner, r, extent, Load(buffers[0], tuple(index)))

        extreme = context.emit(context.call_tir(
            make_program(name + "_value", [data], kept_shape, info_dtype(data), extreme_body), (data,)), name + "_value")

        def index_body(axes, buffers):
            source, best = buffers
            best_index = list(source_index(axes, IntImm(0)))
            value, extreme_value = Load(source, source_index(axes, r)), Load(best, tuple(best_index))
            hit = value.eq(extreme_value)
            if dtype_info(source.dtype).is_float:  # the extreme of a row with a NaN is NaN: its first (last) NaN
                hit = select(is_nan(extreme_value), is_nan(value), hit)
            miss = IndexValue(IntImm(-1)) if last else IndexValue(extent)
            position = Reduce(MAX if last else MIN, r, extent, select(hit, IndexValue(r), miss))
            return Cast("int64", position)

        program = make_program(name, [data, extreme], info.shape, "int64", index_body)
        return context.call_tir(program, (data, extreme))

    return legalize


def info_dtype(expr) -> str:
    return expr.struct_info.dtype


for _name in ("argmax", "argmin"):
    register_op(_name, deduce=_deduce_arg(_name), legalize=needs_known_shapes(_legalize_arg(_name)),
                reference=_arg_reference(_name))


# cumsum, cumprod -----------------------------------------------------------------------------

# op -> (the combiner of its running total, numpy's running total, the value an exclusive scan starts from)
SCANS = {"cumsum": (SUM, np.cumsum, 0), "cumprod": (PROD, np.cumprod, 1)}


def _deduce_scan(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        if len(args) not in (1, 2):
            raise DeductionError(f"{name}: takes 1 or 2 argument(s) (data, and an axis known at run time), got {len(args)}")
        data = require_tensor(args[0], name, 0)
        if data.dtype == "bool":
            raise DeductionError(f"{name}: argument 0 must be a numeric tensor, got bool")
        if len(args) == 2:
            axis = require_integer_tensor(name, args[1], 1, "the axis")
            if axis.ndim > 1:
                raise DeductionError(f"{name}: the axis must be a 0-d or 1-d tensor, got {axis.ndim} dims")
        elif data.ndim != -1:
            normalize_axis(name, attrs.get("axis", 0), data.ndim)
        return data

    return deduce


def _scan_reference(name: str):
    _, running, start = SCANS[name]

    def reference(arrays, attrs):
        x = np.asarray(arrays[0])
        axis = int(np.asarray(arrays[1]).reshape(-1)[0]) if len(arrays) == 2 else attrs.get("axis", 0)
        axis = normalize_axis(name, axis, x.ndim)
        if attrs.get("reverse", False):
            x = np.flip(x, axis)
        if attrs.get("exclusive", False):
            # each element is the total of the ones before it: shift the inclusive totals by one
            head = np.take(x, np.arange(max(x.shape[axis] - 1, 0)), axis=axis)
            first = np.full_like(np.take(x, np.arange(min(x.shape[axis], 1)), axis=axis), start)
            result = np.concatenate([first, running(head, axis=axis, dtype=x.dtype)], axis=axis)
        else:
            result = running(x, axis=axis, dtype=x.dtype)
        if attrs.get("reverse", False):
            result = np.flip(result, axis)
        return np.ascontiguousarray(result)

    return reference


# (reverse, exclusive) -> how an element at position r along the axis compares to the one it adds into
_SCAN_ORDER = {(False, False): CompareOp.LE, (False, True): CompareOp.LT, (True, False): CompareOp.GE,
               (True, True): CompareOp.GT}


def _legalize_scan(name: str):
    combiner, _, start = SCANS[name]

    def legalize(context, call: Call):
        """``out[.., i, ..] = sum(r < n: select(r <= i, A[.., r, ..], 0))`` (<, >=, > for the
        exclusive and reverse forms; a product of ``select(.., A, 1)`` for cumprod)."""
        data = call.args[0]
        info = call.struct_info
        shape = tensor_shape(data)
        axis = normalize_axis(name, call.attrs.get("axis", 0), len(shape))
        reverse, exclusive = bool(call.attrs.get("reverse", False)), bool(call.attrs.get("exclusive", False))
        operator = _SCAN_ORDER[(reverse, exclusive)]

        def body(axes, buffers):
            (source,) = buffers
            r = SizeVar("r_")
            index = tuple(r if d == axis else axes[d] for d in range(len(shape)))
            keep = Compare(operator, IndexValue(r), IndexValue(axes[axis]))
            return Reduce(combiner, r, shape[axis], select(keep, Load(source, index), start))

        program = make_program(name, [data], info.shape, info.dtype, body)
        return context.call_tir(program, (data,))

    return legalize


def _legalize_scan_run_time_axis(name: str):
    combiner, _, start = SCANS[name]

    def legalize(context, call: Call):
        """The axis as a run-time tensor: each element combines every element that shares its
        other coordinates and comes before it (or at it) along the axis, which is chosen in the
        kernel from the axis value (O(size) per element; the shape does not depend on it)."""
        data, axis_tensor = call.args
        info = call.struct_info
        shape = tensor_shape(data)
        rank = len(shape)
        reverse, exclusive = bool(call.attrs.get("reverse", False)), bool(call.attrs.get("exclusive", False))
        operator = _SCAN_ORDER[(reverse, exclusive)]
        inner = tuple(SizeVar(f"r{d}_") for d in range(rank))

        def body(axes, buffers):
            source, axis_buffer = buffers
            axis = wrap_negative(int32(Load(axis_buffer, tuple(IntImm(0) for _ in axis_buffer.shape))), index(rank))
            match: ScalarExpr = FloatImm(1, "bool")
            for d in reversed(range(rank)):
                along = Compare(operator, IndexValue(inner[d]), IndexValue(axes[d]))
                same = IndexValue(inner[d]).eq(IndexValue(axes[d]))
                match = both(select(axis.eq(const(d)), along, same), match)
            expr = select(match, Load(source, inner), start)
            for d in reversed(range(rank)):
                expr = Reduce(combiner, inner[d], shape[d], expr)
            return expr

        program = make_program(name, call.args, info.shape, info.dtype, body)
        return context.call_tir(program, call.args)

    return legalize


def _legalize_scan_any(name: str):
    static, run_time = _legalize_scan(name), _legalize_scan_run_time_axis(name)

    def legalize(context, call: Call):
        return run_time(context, call) if len(call.args) == 2 else static(context, call)

    return legalize


for _name in SCANS:
    register_op(_name, deduce=_deduce_scan(_name), legalize=needs_known_shapes(_legalize_scan_any(_name)),
                reference=_scan_reference(_name), checks_data=integer_arithmetic)


# topk -----------------------------------------------------------------------------------------


def deduce_topk(args, attrs) -> TupleStructInfo:
    if len(args) not in (1, 2):
        raise DeductionError(f"topk: takes 1 or 2 argument(s) (data, and k known at run time), got {len(args)}")
    data = require_tensor(args[0], "topk", 0)
    if len(args) == 2:
        require_integer_tensor("topk", args[1], 1, "k")
        if data.ndim != -1:
            normalize_axis("topk", attrs.get("axis", -1), data.ndim)
        fields = (TensorStructInfo(None, data.dtype, data.ndim), TensorStructInfo(None, "int64", data.ndim))
        return TupleStructInfo(fields)
    k = int(attrs["k"])
    if k < 0:
        raise DeductionError(f"topk: k must not be negative, got {k}")
    if data.shape is None:
        fields = (TensorStructInfo(None, data.dtype, data.ndim), TensorStructInfo(None, "int64", data.ndim))
        return TupleStructInfo(fields)
    axis = normalize_axis("topk", attrs.get("axis", -1), data.ndim)
    extent = data.shape[axis]
    if not prove_less_equal(k, extent):
        if as_int(extent) is not None:
            raise DeductionError(f"topk: k = {k} is larger than dimension {axis} ({as_int(extent)})")
        raise DeductionError(
            f"topk: k = {k} is not provably at most dimension {axis} ({format_expr(extent)}); "
            "a match_cast can state the extent"
        )
    shape = tuple(IntImm(k) if d == axis else dim for d, dim in enumerate(data.shape))
    return TupleStructInfo((TensorStructInfo(shape, data.dtype), TensorStructInfo(shape, "int64")))


def topk_reference(arrays, attrs):
    x = np.asarray(arrays[0])
    k = int(np.asarray(arrays[1]).reshape(-1)[0]) if len(arrays) == 2 else int(attrs["k"])
    axis = normalize_axis("topk", attrs.get("axis", -1), x.ndim)
    if not 0 <= k <= x.shape[axis]:
        raise ValueError(f"topk: k = {k} is out of range for dimension {axis} ({x.shape[axis]})")
    keys = x.astype(np.int8) if x.dtype == np.bool_ else x
    if attrs.get("largest", True):
        # a stable sort of the negated keys keeps ties in index order (~ for integers: no overflow)
        keys = ~keys if np.issubdtype(keys.dtype, np.integer) else -keys
    order = np.argsort(keys, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)


def legalize_topk(context, call: Call):
    """Three programs: each element's rank along the axis (how many elements come before it:
    larger, or equal at a lower index; smaller for ``largest=False``), O(n) per element; the
    indices (the position whose rank is j, for j < k, as int64); the values (a gather)."""
    data = call.args[0]
    info = data.struct_info
    if info.shape is None:
        raise UnknownShapeError(f"topk: argument 0 has an unknown shape ({info}); legalization needs a known "
                                "shape: add a match_cast that gives its dims names")
    shape = tensor_shape(data)
    axis = normalize_axis("topk", call.attrs.get("axis", -1), len(shape))
    largest = bool(call.attrs.get("largest", True))
    dtype = info.dtype
    extent = shape[axis]
    if len(call.args) == 2:  # k known at run time: read it back (one host stage)
        (k,) = read_back_dims(context, (call.args[1],), [lambda buffers: _first_element(buffers[0])], "topk_k")
    else:
        k = IntImm(int(call.attrs["k"]))
    out_shape = tuple(k if d == axis else dim for d, dim in enumerate(shape))
    s = SizeVar("s_")

    def rank_body(axes, buffers):
        (source,) = buffers
        mine = Load(source, tuple(axes))
        other = Load(source, tuple(s if d == axis else axes[d] for d in range(len(shape))))
        better = other.gt(mine) if largest else other.lt(mine)
        tie_before = select(other.eq(mine), IndexValue(s).lt(IndexValue(axes[axis])), FALSE)
        before = select(better, FloatImm(1, "bool"), tie_before)
        return Reduce(SUM, s, extent, select(before, FloatImm(1, "int32"), 0))

    if dtype == "bool":
        raise UnsupportedModelError("topk: bool data has no GPU lowering")
    ranks = context.emit(context.call_tir(make_program("topk_rank", [data], shape, "int32", rank_body), (data,)),
                         "topk_rank")

    def index_body(axes, buffers):
        (rank,) = buffers
        at = Load(rank, tuple(s if d == axis else axes[d] for d in range(len(shape))))
        found = select(at.eq(IndexValue(axes[axis])), IndexValue(s), 0)
        return Cast("int64", Reduce(SUM, s, extent, found))

    indices = context.emit(context.call_tir(
        make_program("topk_indices", [ranks], out_shape, "int64", index_body), (ranks,)), "topk_indices")

    def value_body(axes, buffers):
        source, positions = buffers
        position = Cast("int32", Load(positions, tuple(axes)))
        return Gather(source, tuple(position if d == axis else axes[d] for d in range(len(shape))))

    values = context.emit(context.call_tir(
        make_program("topk_values", [data, indices], out_shape, dtype, value_body), (data, indices)),
        "topk_values")
    return Tuple((values, indices))


def _first_element(buffer):
    """The first element of a 0-d or 1-d tensor (k known at run time)."""
    return Load(buffer, tuple(IntImm(0) for _ in buffer.shape))


register_op("topk", deduce=deduce_topk, legalize=legalize_topk, reference=topk_reference, reads_back=True)


# unique ----------------------------------------------------------------------------------------


def deduce_unique(args, attrs) -> TensorStructInfo:
    """The sorted distinct values of a 1-D tensor: how many is known only at run time."""
    expect_args("unique", args, 1)
    data = require_tensor(args[0], "unique", 0)
    if data.ndim not in (-1, 1):
        raise DeductionError(f"unique: needs a 1-d tensor, got {data.ndim} dims ({data})")
    return TensorStructInfo(None, data.dtype, 1)


def legalize_unique(context, call: Call):
    """Two library kernels (``relaxweb/library/unique.py``), a read-back of the count, and a
    prefix copy."""
    data = call.args[0]
    (length,) = tensor_shape(data)
    dtype = tensor_dtype(data)
    count = context.emit(context.call_library(unique_count_kernel("unique_count", length, dtype), (data,)), "unique_count")
    values = context.emit(context.call_library(unique_values_kernel("unique_values", length, dtype), (data,)), "unique_values")
    read = context.emit(TensorToPrim(count), "unique_count_value")
    distinct = SizeVar(context.fresh_name("unique_k"))
    context.emit_match_cast(read, PrimStructInfo("int64", distinct), "unique_k",
                            reason=read_reason(context, "the number of distinct values"))
    program = make_program(
        "take_prefix", [values], (distinct,), dtype, lambda axes, buffers: Load(buffers[0], (axes[0],))
    )
    return context.call_tir(program, (values,))


register_op(
    "unique",
    deduce=deduce_unique,
    legalize=legalize_unique,
    reference=lambda arrays, attrs: np.unique(arrays[0]),
    reads_back=True,
)
