"""Reductions: ``sum``, ``mean``, ``max`` and ``min`` over some axes.

``op(x, axes=None, keepdims=False)``: ``axes`` None reduces every axis (an empty list reduces
none, as in numpy); negative axes count from the end; ``keepdims`` keeps each reduced axis
with extent 1.  Each legalizes to one tensor program with nested ``Reduce`` over the reduced
axes; ``mean`` divides the sum by the element count, converted from the (symbolic) extents
with ``Cast(IndexValue(...))``.

Deduction: the reduced dims are removed (or become 1); with an input of unknown shape the
result's rank is still known when the input's is (or when every axis is reduced without
keepdims: a 0-d result).
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, tensor_shape
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, SizeVar, as_int, product
from ..ir.tir import Binary, Cast, IndexValue, Load, Reduce
from .common import expect_args, make_program, needs_known_shapes, normalize_axes, require_float, require_tensor
from .registry import DeductionError, register_op

REDUCTIONS = {"sum": "sum", "mean": "sum", "max": "max", "min": "min"}
NUMPY = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def _reduced_axes(name: str, attrs, ndim: int) -> list[int]:
    axes = attrs.get("axes")
    if axes is None:
        return list(range(ndim))
    return sorted(normalize_axes(name, [int(a) for a in axes], ndim))


def _deduce(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 1)
        data = require_tensor(args[0], name, 0)
        if name == "mean":
            require_float(name, data)
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
        shape = []
        for dim, extent in enumerate(data.shape):
            if dim not in axes:
                shape.append(extent)
            elif keepdims:
                shape.append(IntImm(1))
        return TensorStructInfo(tuple(shape), data.dtype)

    return deduce


def _legalize(name: str):
    combiner = REDUCTIONS[name]

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
            expr = Load(source, tuple(index))
            for dim in reversed(axes):
                expr = Reduce(combiner, reduce_vars[dim], source_shape[dim], expr)
            if name == "mean":
                count = product(source_shape[d] for d in axes)
                expr = Binary("divide", expr, Cast(info.dtype, IndexValue(count)))
            return expr

        program = make_program(name, [data], info.shape, info.dtype, body)
        return context.call_tir(program, (data,))

    return legalize


def _reference(name: str):
    def reference(arrays, attrs):
        x = arrays[0]
        axes = attrs.get("axes")
        axis = None if axes is None else tuple(int(a) for a in axes)
        result = NUMPY[name](x, axis=axis, keepdims=bool(attrs.get("keepdims", False)))
        return np.asarray(result).astype(x.dtype)

    return reference


for _name in REDUCTIONS:
    register_op(
        _name,
        deduce=_deduce(_name),
        legalize=needs_known_shapes(_legalize(_name)),
        reference=_reference(_name),
    )


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
