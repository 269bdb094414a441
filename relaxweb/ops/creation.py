"""Ops that create tensors from sizes and values: ``full``, ``arange``, ``shape_to_tensor``,
``eye_like``.

Their sizes come from shape values or prim values, so they may be symbolic; the programs
they legalize to have no input buffers and write values computed from the output axes and
size variables (``IndexValue``).

- ``full(shape, value=0.0, dtype="float32")``: a tensor of ``shape`` (a shape value, or a
  run-time 1-D integer tensor: then only the rank is known) filled with ``value``.
- ``arange(start, limit, delta, dtype="int64")``: ONNX Range.  With prim values (possibly
  symbolic; ``delta`` a non-zero constant) the length is
  ``max(ceil((limit - start) / delta), 0)``, e.g. ``arange(0, seq, 1)`` is ``Tensor((seq,))``.
  With run-time scalar tensors (any dtype) the length is data-dependent (``Tensor(ndim=1)``):
  legalization computes it on the GPU (float32) and reads it back, as ``full`` does its
  extents with a run-time shape.
- ``shape_to_tensor(value, dtype="int64")``: a shape value (``ShapeExpr``) as a 1-D tensor,
  or a prim value (``PrimValue``) as a 0-d tensor: how a symbolic shape computation feeds an
  op that needs a tensor (see ``frontend/converters/shape_values.materialize``).
- ``eye_like(x, k=0, dtype=None)``: ONNX EyeLike, a matrix of ``x``'s shape (2-D, possibly
  symbolic; its values are not read) with ones on the ``k``-th diagonal (``k > 0`` above the
  main one) and zeros elsewhere, of ``dtype`` (``x``'s by default).
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from ..ir.dtype import GPU_DTYPES
from ..ir.expr import Call
from ..ir.op_registry import DeductionError, node_text, register_op
from ..ir.struct_info import PrimStructInfo, ShapeStructInfo, StructInfo, TensorStructInfo
from ..ir.symbolic import IntImm, PrimExpr, as_int, expr_max, prove_less_equal, simplify
from ..ir.tir import (
    Cast, FloatImm, IndexValue, Load, ScalarExpr, ceil, is_finite, maximum, scalar_dtype, select,
)
from .common import UnknownShapeError, expect_args, make_program, needs_known_shapes
from .shape_operands import int_list, shape_operand
from .readback import both, element, int32, read_back_dims


def index_value_as(value: PrimExpr, dtype: str) -> ScalarExpr:
    """An index expression's value as a scalar of ``dtype`` (int64 stays the int32 index:
    tensor programs compute indices in 32 bits)."""
    if dtype == "bool":
        return IndexValue(value).ne(IndexValue(0))
    if dtype in GPU_DTYPES and dtype != "int32":
        return Cast(dtype, IndexValue(value))
    return IndexValue(value)


# full ------------------------------------------------------------------------------------------


def deduce_full(args, attrs) -> TensorStructInfo:
    expect_args("full", args, 1)
    shape = shape_operand(args[0], "full", "the shape")
    dtype = attrs.get("dtype", "float32")
    if shape.values is None:
        return TensorStructInfo(None, dtype, shape.ndim)
    for position, dim in enumerate(shape.values):
        if as_int(dim) is not None and as_int(dim) < 0:
            raise DeductionError(f"full: dimension {position} is {as_int(dim)}")
    return TensorStructInfo(shape.values, dtype)


def legalize_full(context, call: Call):
    info = call.struct_info
    value = call.attrs.get("value", 0)
    program = make_program("full", [], info.shape, info.dtype, lambda axes, buffers: FloatImm(value, info.dtype))
    return context.call_tir(program, ())


def full_reference(arrays, attrs):
    return np.full(tuple(int_list(arrays[0])), attrs.get("value", 0), dtype=attrs.get("dtype", "float32"))


def legalize_full_run_time(context, call: Call):
    """A run-time shape tensor: each extent is read back (``relaxweb/ops/readback.py``)."""
    (shape_tensor,) = call.args
    shape = shape_tensor.struct_info.shape
    length = as_int(shape[0]) if shape is not None and len(shape) == 1 else None
    if length is None:
        raise UnsupportedModelError("full: the shape needs a 1-D tensor of known length")
    dims = read_back_dims(context, call.args, [lambda buffers, j=j: element(buffers[0], j) for j in range(length)],
                          "full")
    dtype = call.struct_info.dtype
    value = call.attrs.get("value", 0)
    program = make_program("full", [], dims, dtype, lambda axes, buffers: FloatImm(value, dtype))
    return context.call_tir(program, ())


def _legalize_full_any(context, call: Call):
    if isinstance(call.args[0].struct_info, TensorStructInfo):
        return legalize_full_run_time(context, call)
    return needs_known_shapes(legalize_full)(context, call)


register_op("full", deduce=deduce_full, legalize=_legalize_full_any, reference=full_reference, reads_back=True)


# arange ----------------------------------------------------------------------------------------


def _scalar_operand(info: StructInfo, position: int) -> PrimExpr | None:
    """The symbolic value of a prim-value operand; None for a run-time scalar tensor."""
    if isinstance(info, PrimStructInfo):
        return info.value
    if isinstance(info, TensorStructInfo):
        if info.ndim not in (-1, 0) and not (info.ndim == 1 and info.shape is not None and as_int(info.shape[0]) == 1):
            raise DeductionError(f"arange: argument {position} must be a scalar, got {info}")
        return None
    raise DeductionError(f"arange: argument {position} must be a prim value or a scalar tensor, got {info}")


def arange_length(start: PrimExpr, limit: PrimExpr, delta: int) -> PrimExpr:
    """``max(ceil((limit - start) / delta), 0)`` for a constant non-zero ``delta``."""
    span = simplify(limit - start) if delta > 0 else simplify(start - limit)
    step = abs(delta)
    length = simplify((span + (step - 1)) // step)
    if prove_less_equal(span, 0):
        return IntImm(0)
    if not prove_less_equal(0, span):
        length = simplify(expr_max(length, 0))
    return length


def deduce_arange(args, attrs) -> TensorStructInfo:
    expect_args("arange", args, 3)
    dtype = attrs.get("dtype", "int64")
    start, limit, delta = (_scalar_operand(arg.struct_info, i) for i, arg in enumerate(args))
    if start is None or limit is None or delta is None or as_int(delta) is None:
        return TensorStructInfo(None, dtype, 1)
    if as_int(delta) == 0:
        raise DeductionError("arange: delta is 0")
    return TensorStructInfo((arange_length(start, limit, as_int(delta)),), dtype)


def legalize_arange(context, call: Call):
    info = call.struct_info
    start, _, delta = (arg.struct_info.value for arg in call.args)
    program = make_program(
        "arange", [], info.shape, info.dtype,
        lambda axes, buffers: index_value_as(simplify(start + axes[0] * delta), info.dtype),
    )
    return context.call_tir(program, ())


def arange_reference(arrays, attrs):
    dtype = np.dtype(attrs.get("dtype", "int64"))
    start, limit, delta = (np.asarray(a).reshape(-1)[0] for a in arrays)
    if delta == 0:
        raise ValueError("arange: delta is 0")
    with np.errstate(all="ignore"):
        count = np.ceil((np.float64(limit) - np.float64(start)) / np.float64(delta))
    if not np.isfinite(count):
        where = node_text(attrs) or "arange"
        raise ValueError(f"{where}: {ARANGE_LENGTH} is not a finite value (start {start}, limit {limit}, delta {delta})")
    return np.arange(start, limit, delta).astype(dtype)


ARANGE_LENGTH = "the number of elements ceil((limit - start) / delta)"
NOT_FINITE = -1
"""What the read-back length of a run-time arange is where it is not a finite value (a NaN or
infinite start, limit or delta): onnxruntime refuses such a Range, and so does the host's
check of the length (>= 0), naming the node."""


def legalize_arange_run_time(context, call: Call):
    """Run-time scalar operands: the length ``max(ceil((limit - start) / delta), 0)`` is
    computed on the GPU (in float32) and read back, then ``start + i * delta``."""
    dtype = call.struct_info.dtype
    tensors = [arg for arg in call.args if isinstance(arg.struct_info, TensorStructInfo)]
    for arg in tensors:
        if arg.struct_info.shape is None:
            raise UnknownShapeError(f"arange: an operand has an unknown shape ({arg.struct_info}); legalization "
                                    "needs a known shape")

    def operands(buffers) -> list[ScalarExpr]:
        found, position = [], 0
        for arg in call.args:
            if isinstance(arg.struct_info, TensorStructInfo):
                buffer = buffers[position]
                position += 1
                found.append(Load(buffer, tuple(IntImm(0) for _ in buffer.shape)))
            else:
                found.append(IndexValue(arg.struct_info.value))
        return found

    def as_dtype(value: ScalarExpr, target: str) -> ScalarExpr:
        return value if scalar_dtype(value) == target else Cast(target, value)

    def length(buffers):
        if dtype in ("int32", "int64"):  # exactly, in int64 (exact in kernels.wasm, checked on the GPU)
            start, limit, delta = (as_dtype(v, "int64") for v in operands(buffers))
            span = limit - start
            quotient = span / select(delta.eq(0), FloatImm(1, "int64"), delta)  # truncates
            rounded_up = both((quotient * delta).ne(span), span.lt(0).eq(delta.lt(0)))
            count = maximum(quotient + select(rounded_up, FloatImm(1, "int64"), FloatImm(0, "int64")),
                            FloatImm(0, "int64"))
            return select(delta.eq(0), FloatImm(NOT_FINITE, "int32"), int32(count))
        start, limit, delta = (as_dtype(v, "float32") for v in operands(buffers))
        count = ceil((limit - start) / delta)
        return select(is_finite(count), Cast("int32", maximum(count, 0.0)), FloatImm(NOT_FINITE, "int32"))

    source = node_text(call.attrs) or "arange"
    reason = (f"{source}: {ARANGE_LENGTH} ({NOT_FINITE} where it is not a finite value: a NaN or infinite start, "
              "limit or delta, or a delta of 0)")
    (count,) = read_back_dims(context, tuple(tensors), [length], "arange", reason=reason)

    def body(axes, buffers):
        start, _, delta = operands(buffers)
        compute = "float32" if dtype.startswith("float") else dtype if dtype in ("int32", "int64") else "int32"
        step = as_dtype(IndexValue(axes[0]), compute) * as_dtype(delta, compute)
        return as_dtype(as_dtype(start, compute) + step, dtype if dtype in GPU_DTYPES else compute)

    program = make_program("arange", tensors, (count,), dtype, body)
    return context.call_tir(program, tuple(tensors))


def _legalize_arange_any(context, call: Call):
    if any(isinstance(arg.struct_info, TensorStructInfo) for arg in call.args) or \
            as_int(call.args[2].struct_info.value) is None:
        if not any(isinstance(arg.struct_info, TensorStructInfo) for arg in call.args):
            raise UnsupportedModelError("arange: a symbolic delta has no GPU lowering")
        return legalize_arange_run_time(context, call)
    return needs_known_shapes(legalize_arange)(context, call)


register_op("arange", deduce=deduce_arange, legalize=_legalize_arange_any, reference=arange_reference, reads_back=True)


# shape_to_tensor -------------------------------------------------------------------------------


def deduce_shape_to_tensor(args, attrs) -> TensorStructInfo:
    expect_args("shape_to_tensor", args, 1)
    info = args[0].struct_info
    dtype = attrs.get("dtype", "int64")
    if isinstance(info, PrimStructInfo):
        return TensorStructInfo((), dtype)
    if isinstance(info, ShapeStructInfo):
        if info.ndim == -1:
            return TensorStructInfo(None, dtype, 1)
        return TensorStructInfo((info.ndim,), dtype)
    raise DeductionError(f"shape_to_tensor: the argument must be a shape value or a prim value, got {info}")


def legalize_shape_to_tensor(context, call: Call):
    info = call.struct_info
    source = call.args[0].struct_info
    if isinstance(source, PrimStructInfo):
        values = [source.value]
    else:
        values = list(source.values)
    if any(v is None for v in values):
        raise UnknownShapeError("shape_to_tensor: the value is not known symbolically")

    def body(axes, buffers):
        if not axes:
            return index_value_as(values[0], info.dtype)
        if not values:
            return FloatImm(0, info.dtype)
        expr = index_value_as(values[-1], info.dtype)
        for position in range(len(values) - 2, -1, -1):
            here = IndexValue(axes[0]).eq(IndexValue(position))
            expr = select(here, index_value_as(values[position], info.dtype), expr)
        return expr

    program = make_program("shape_to_tensor", [], info.shape, info.dtype, body)
    return context.call_tir(program, ())


def shape_to_tensor_reference(arrays, attrs):
    return np.asarray(arrays[0]).astype(attrs.get("dtype", "int64"))


register_op("shape_to_tensor", deduce=deduce_shape_to_tensor, legalize=needs_known_shapes(legalize_shape_to_tensor),
            reference=shape_to_tensor_reference)


# eye_like --------------------------------------------------------------------------------------


def deduce_eye_like(args, attrs) -> TensorStructInfo:
    expect_args("eye_like", args, 1)
    info = args[0].struct_info
    if not isinstance(info, TensorStructInfo):
        raise DeductionError(f"eye_like: the argument must be a tensor, got {info}")
    if info.ndim not in (-1, 2):
        raise DeductionError(f"eye_like: the argument must be a 2-D tensor, got {info.ndim} dims")
    return TensorStructInfo(info.shape, attrs.get("dtype") or info.dtype, 2)


def legalize_eye_like(context, call: Call):
    """``out[i, j] = 1 if j == i + k else 0``: a program with no input (only the shape of
    ``x`` matters, and the call's sizes bind it)."""
    info = call.struct_info
    k = int(call.attrs.get("k", 0))

    def body(axes, buffers):
        row, column = axes
        on_diagonal = IndexValue(column).eq(IndexValue(row + k))
        return select(on_diagonal, FloatImm(1, info.dtype), FloatImm(0, info.dtype))

    return context.call_tir(make_program("eye_like", [], info.shape, info.dtype, body), ())


def eye_like_reference(arrays, attrs):
    x = np.asarray(arrays[0])
    return np.eye(x.shape[0], x.shape[1], k=int(attrs.get("k", 0)), dtype=attrs.get("dtype") or x.dtype)


register_op("eye_like", deduce=deduce_eye_like, legalize=needs_known_shapes(legalize_eye_like),
            reference=eye_like_reference)
