"""Comparisons, logical ops, selection and dtype conversion.

- ``equal``, ``not_equal``, ``less``, ``less_equal``, ``greater``, ``greater_equal``: two
  tensors of one dtype, broadcast; the result is ``bool``.
- ``logical_and``, ``logical_or``, ``logical_xor`` (two ``bool`` tensors, broadcast) and
  ``logical_not`` (one).
- ``where(condition, a, b)``: ``a`` where the ``bool`` condition holds, else ``b``; the
  three broadcast together and ``a`` and ``b`` share a dtype.
- ``isnan(x)``, ``isinf(x, detect_positive=True, detect_negative=True)``: float in, bool out.
- ``cast(x, dtype=...)``: numpy conversion (floats to integers truncate toward zero; to
  ``bool`` is "non-zero").

All of them legalize to one tensor program of ``Compare`` / ``Select`` / ``Cast`` (``cast``
only to the dtypes the scalar ``Cast`` supports: float32, int32, uint32, bool).
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from ..ir.dtype import DTYPES, GPU_DTYPES
from ..ir.expr import Call, tensor_dtype
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.tir import Cast, Compare, CompareOp, FloatImm, Select, is_nan, select
from .common import (
    expect_args, integer_arithmetic, load_broadcast, make_program, needs_known_shapes, require_float, require_tensor, same_dtype,
)
from .elementwise import broadcast_info


def _program_call(context, call: Call, name: str, body):
    info = call.struct_info
    program = make_program(name, call.args, info.shape, info.dtype,
                           lambda axes, buffers: body([load_broadcast(b, axes) for b in buffers]))
    return context.call_tir(program, call.args)


# Comparisons ----------------------------------------------------------------------------------

COMPARISONS = {
    "equal": (CompareOp.EQ, np.equal),
    "not_equal": (CompareOp.NE, np.not_equal),
    "less": (CompareOp.LT, np.less),
    "less_equal": (CompareOp.LE, np.less_equal),
    "greater": (CompareOp.GT, np.greater),
    "greater_equal": (CompareOp.GE, np.greater_equal),
}


def _deduce_comparison(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 2)
        infos = [require_tensor(arg, name, i) for i, arg in enumerate(args)]
        same_dtype(name, infos)
        return broadcast_info(name, infos, "bool")

    return deduce


def _legalize_comparison(name: str):
    operator = COMPARISONS[name][0]
    return lambda context, call: _program_call(context, call, name, lambda loads: Compare(operator, *loads))


for _name, (_operator, _function) in COMPARISONS.items():
    register_op(
        _name,
        deduce=_deduce_comparison(_name),
        legalize=needs_known_shapes(_legalize_comparison(_name)),
        reference=(lambda function: lambda arrays, attrs: np.asarray(function(arrays[0], arrays[1])))(_function),
    )


# Logical ops ----------------------------------------------------------------------------------

TRUE, FALSE = FloatImm(1, "bool"), FloatImm(0, "bool")

LOGICAL = {
    "logical_and": (np.logical_and, lambda a, b: select(a, b, FALSE)),
    "logical_or": (np.logical_or, lambda a, b: select(a, TRUE, b)),
    "logical_xor": (np.logical_xor, lambda a, b: a.ne(b)),
    "logical_not": (np.logical_not, lambda a: a.eq(FALSE)),
}


def _deduce_logical(name: str):
    count = 1 if name == "logical_not" else 2

    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, count)
        infos = [require_tensor(arg, name, i) for i, arg in enumerate(args)]
        for position, info in enumerate(infos):
            if info.dtype != "bool":
                raise DeductionError(f"{name}: argument {position} must be a bool tensor, got {info.dtype}")
        return broadcast_info(name, infos, "bool")

    return deduce


def _legalize_logical(name: str):
    body = LOGICAL[name][1]
    return lambda context, call: _program_call(context, call, name, lambda loads: body(*loads))


for _name, (_function, _body) in LOGICAL.items():
    register_op(
        _name,
        deduce=_deduce_logical(_name),
        legalize=needs_known_shapes(_legalize_logical(_name)),
        reference=(lambda function: lambda arrays, attrs: np.asarray(function(*arrays)))(_function),
    )


# where ----------------------------------------------------------------------------------------


def deduce_where(args, attrs) -> TensorStructInfo:
    expect_args("where", args, 3)
    condition, a, b = (require_tensor(arg, "where", i) for i, arg in enumerate(args))
    if condition.dtype != "bool":
        raise DeductionError(f"where: argument 0 (the condition) must be a bool tensor, got {condition.dtype}")
    dtype = same_dtype("where", [a, b])
    return broadcast_info("where", [condition, a, b], dtype)


register_op(
    "where",
    deduce=deduce_where,
    legalize=needs_known_shapes(
        lambda context, call: _program_call(context, call, "where", lambda loads: Select(*loads))
    ),
    reference=lambda arrays, attrs: np.asarray(np.where(*arrays)).astype(np.asarray(arrays[1]).dtype),
)


# isnan, isinf ---------------------------------------------------------------------------------


def _deduce_float_test(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 1)
        info = require_tensor(args[0], name, 0)
        require_float(name, info)
        return TensorStructInfo(info.shape, "bool", info.ndim)

    return deduce


def _isinf_reference(arrays, attrs):
    x = np.asarray(arrays[0])
    positive, negative = attrs.get("detect_positive", True), attrs.get("detect_negative", True)
    return (np.isposinf(x) & bool(positive)) | (np.isneginf(x) & bool(negative))


def _isinf_body(loads, attrs, dtype):
    # x is +inf exactly when it exceeds the largest finite value (no infinite literal needed)
    (x,) = loads
    largest = float(np.finfo(np.dtype(dtype)).max)
    checks = []
    if attrs.get("detect_positive", True):
        checks.append(x.gt(largest))
    if attrs.get("detect_negative", True):
        checks.append(x.lt(-largest))
    if not checks:
        return FALSE.ne(FALSE)
    return checks[0] if len(checks) == 1 else select(checks[0], TRUE, checks[1])


register_op(
    "isnan",
    deduce=_deduce_float_test("isnan"),
    legalize=needs_known_shapes(
        lambda context, call: _program_call(context, call, "isnan", lambda loads: is_nan(loads[0]))
    ),
    reference=lambda arrays, attrs: np.isnan(arrays[0]),
)
register_op(
    "isinf",
    deduce=_deduce_float_test("isinf"),
    legalize=needs_known_shapes(lambda context, call: _program_call(
        context, call, "isinf", lambda loads: _isinf_body(loads, call.attrs, tensor_dtype(call.args[0])))),
    reference=_isinf_reference,
)


# cast -----------------------------------------------------------------------------------------


def deduce_cast(args, attrs) -> TensorStructInfo:
    expect_args("cast", args, 1)
    info = require_tensor(args[0], "cast", 0)
    dtype = str(attrs.get("dtype"))
    if dtype not in DTYPES:
        raise DeductionError(f"cast: unsupported target dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return TensorStructInfo(info.shape, dtype, info.ndim)


def cast_reference(arrays, attrs):
    x = np.asarray(arrays[0])
    dtype = np.dtype(attrs["dtype"])
    if dtype == np.bool_:
        return x != 0
    with np.errstate(all="ignore"):
        return x.astype(dtype)


def legalize_cast(context, call: Call):
    dtype = call.attrs["dtype"]
    if dtype not in GPU_DTYPES:
        raise UnsupportedModelError(
            f"cast: no GPU lowering yet for a cast to {dtype} (only to {', '.join(GPU_DTYPES)})"
        )
    if dtype == "bool":
        return _program_call(context, call, "cast", lambda loads: loads[0].ne(0))
    return _program_call(context, call, "cast", lambda loads: Cast(dtype, loads[0]))


register_op("cast", deduce=deduce_cast, legalize=needs_known_shapes(legalize_cast), reference=cast_reference,
            checks_data=integer_arithmetic)
