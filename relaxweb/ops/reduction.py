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
``log_sum_exp`` (a max, then a shifted sum) has no GPU lowering yet.

``argmax`` / ``argmin(x, axis=0, keepdims=True, select_last_index=False)``: int64 indices of
the first (or last) extreme along ``axis``; no GPU lowering (int64 output).

``cumsum(x, axis, exclusive=False, reverse=False)``: the running sum along ``axis``;
legalized as a masked sum over the axis.

``topk(x, k, axis=-1, largest=True)``: a tuple (values, int64 indices) of the ``k`` largest
(or smallest) elements along ``axis``, sorted, ties broken by the lower index; no GPU
lowering yet.

Deduction: the reduced dims are removed (or become 1); with an input of unknown shape the
result's rank is still known when the input's is (or when every axis is reduced without
keepdims: a 0-d result).

Values known only at run time: the reductions also take the axes as a second (integer
tensor) argument (``noop_with_empty_axes`` then says what an empty one means), ``topk`` its
``k`` and ``cumsum`` its axis.  The result's shape is then unknown (the rank usually is
not: the length of the axes tensor, or keepdims, gives it); such calls run in the
interpreter, and legalization asks for constants.
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from ..ir.expr import Call, tensor_shape
from ..ir.struct_info import TensorStructInfo, TupleStructInfo
from ..ir.symbolic import IntImm, SizeVar, as_int, product, prove_less_equal, format_expr
from ..ir.tir import Binary, Cast, Compare, FloatImm, IndexValue, Load, Reduce, Select, Unary
from .common import (
    expect_args, make_program, needs_known_shapes, normalize_axis, normalize_axes, require_float, require_tensor,
)
from .registry import DeductionError, register_op


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

# Legalizable reductions: (combiner, element transform).
LEGALIZED = {
    "sum": ("sum", lambda x: x),
    "mean": ("sum", lambda x: x),
    "max": ("max", lambda x: x),
    "min": ("min", lambda x: x),
    "l1_norm": ("sum", lambda x: Binary("maximum", x, Unary("negative", x))),
    "sum_square": ("sum", lambda x: Binary("multiply", x, x)),
    "prod": ("prod", lambda x: x),
    "l2_norm": ("sum", lambda x: Binary("multiply", x, x)),
    "log_sum": ("sum", lambda x: x),
}
# Applied to the reduced value.
FINISH = {"l2_norm": lambda x: Unary("sqrt", x), "log_sum": lambda x: Unary("log", x)}

REDUCTIONS = {name: LEGALIZED.get(name, (None, None))[0] for name in NUMPY}
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


def _legalize(name: str):
    combiner, element = LEGALIZED[name]

    def legalize(context, call: Call):
        data = call.args[0]
        info = call.struct_info
        source_shape = tensor_shape(data)
        axes = _reduced_axes(name, call.attrs, len(source_shape))
        keepdims = bool(call.attrs.get("keepdims", False))

        def body(out_axes, buffers):
            (source,) = buffers
            reduce_vars = {d: SizeVar(f"r{d}_") for d in axes}
            index, position = [], 0
            for dim in range(len(source_shape)):
                if dim in reduce_vars:
                    index.append(reduce_vars[dim])
                    position += keepdims
                else:
                    index.append(out_axes[position])
                    position += 1
            expr = element(Load(source, tuple(index)))
            for dim in reversed(axes):
                expr = Reduce(combiner, reduce_vars[dim], source_shape[dim], expr)
            if name == "mean":
                count = product(source_shape[d] for d in axes)
                expr = Binary("divide", expr, Cast(info.dtype, IndexValue(count)))
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
        with np.errstate(all="ignore"):
            result = function(x, axis, bool(attrs.get("keepdims", False)))
        return np.asarray(result).astype(x.dtype)

    return reference


def needs_constant_args(op_what: str, legalize):
    """Wrap a legalization: the call must have only its data argument (the others are known at
    compile time, as attributes), and known shapes."""
    def wrapper(context, call: Call):
        if len(call.args) > 1:
            raise UnsupportedModelError(
                f"{call.op}: {op_what} computed at run time cannot be lowered to the GPU yet "
                "(they decide the result's shape); make them constants"
            )
        return needs_known_shapes(legalize)(context, call)

    return wrapper


for _name in NUMPY:
    register_op(
        _name,
        deduce=_deduce(_name),
        legalize=needs_constant_args("axes", _legalize(_name)) if _name in LEGALIZED else None,
        reference=_reference(_name),
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


for _name in ("argmax", "argmin"):
    register_op(_name, deduce=_deduce_arg(_name), legalize=None, reference=_arg_reference(_name))


# cumsum ---------------------------------------------------------------------------------------


def deduce_cumsum(args, attrs) -> TensorStructInfo:
    if len(args) not in (1, 2):
        raise DeductionError(f"cumsum: takes 1 or 2 argument(s) (data, and an axis known at run time), got {len(args)}")
    data = require_tensor(args[0], "cumsum", 0)
    if data.dtype == "bool":
        raise DeductionError("cumsum: argument 0 must be a numeric tensor, got bool")
    if len(args) == 2:
        axis = require_integer_tensor("cumsum", args[1], 1, "the axis")
        if axis.ndim > 1:
            raise DeductionError(f"cumsum: the axis must be a 0-d or 1-d tensor, got {axis.ndim} dims")
    elif data.ndim != -1:
        normalize_axis("cumsum", attrs.get("axis", 0), data.ndim)
    return data


def cumsum_reference(arrays, attrs):
    x = np.asarray(arrays[0])
    axis = int(np.asarray(arrays[1]).reshape(-1)[0]) if len(arrays) == 2 else attrs.get("axis", 0)
    axis = normalize_axis("cumsum", axis, x.ndim)
    if attrs.get("reverse", False):
        x = np.flip(x, axis)
    if attrs.get("exclusive", False):
        # each element is the sum of the ones before it: shift the inclusive sums by one
        head = np.take(x, np.arange(max(x.shape[axis] - 1, 0)), axis=axis)
        zeros = np.zeros_like(np.take(x, np.arange(min(x.shape[axis], 1)), axis=axis))
        result = np.concatenate([zeros, np.cumsum(head, axis=axis, dtype=x.dtype)], axis=axis)
    else:
        result = np.cumsum(x, axis=axis, dtype=x.dtype)
    if attrs.get("reverse", False):
        result = np.flip(result, axis)
    return np.ascontiguousarray(result)


def legalize_cumsum(context, call: Call):
    """``out[.., i, ..] = sum(r < n: select(r <= i, A[.., r, ..], 0))`` (<, >=, > for the
    exclusive and reverse forms)."""
    data = call.args[0]
    info = call.struct_info
    shape = tensor_shape(data)
    axis = normalize_axis("cumsum", call.attrs.get("axis", 0), len(shape))
    reverse, exclusive = bool(call.attrs.get("reverse", False)), bool(call.attrs.get("exclusive", False))
    operator = {(False, False): "le", (False, True): "lt", (True, False): "ge", (True, True): "gt"}[(reverse, exclusive)]

    def body(axes, buffers):
        (source,) = buffers
        r = SizeVar("r_")
        index = tuple(r if d == axis else axes[d] for d in range(len(shape)))
        keep = Compare(operator, IndexValue(r), IndexValue(axes[axis]))
        return Reduce("sum", r, shape[axis], Select(keep, Load(source, index), FloatImm(0, info.dtype)))

    program = make_program("cumsum", [data], info.shape, info.dtype, body)
    return context.call_tir(program, (data,))


register_op("cumsum", deduce=deduce_cumsum, legalize=needs_constant_args("an axis", legalize_cumsum),
            reference=cumsum_reference)


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


register_op("topk", deduce=deduce_topk, legalize=None, reference=topk_reference)


# unique ----------------------------------------------------------------------------------------


def deduce_unique(args, attrs) -> TensorStructInfo:
    """The sorted distinct values of a 1-D tensor: how many is known only at run time."""
    expect_args("unique", args, 1)
    data = require_tensor(args[0], "unique", 0)
    if data.ndim not in (-1, 1):
        raise DeductionError(f"unique: needs a 1-d tensor, got {data.ndim} dims ({data})")
    return TensorStructInfo(None, data.dtype, 1)


def legalize_unique(context, call: Call):
    """Two library kernels, a read-back of the count and a prefix copy (relaxweb/library/unique.py)."""
    from ..library.unique import legalize_unique as lower_with_library

    return lower_with_library(context, call)


register_op(
    "unique",
    deduce=deduce_unique,
    legalize=legalize_unique,
    reference=lambda arrays, attrs: np.unique(arrays[0]),
)
