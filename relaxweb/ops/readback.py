"""Data-dependent shapes through read-backs, shared by the legalizations that need them
(``squeeze`` / ``expand_dims`` / ``dynamic_reshape`` / ``dynamic_slice`` with run-time
operands, ``nonzero``).

Each unknown extent is computed on the GPU by a one-element tensor program from the run-time
operands, read back by the host (``tensor_to_prim``: the host stops, the runtime reads the
value and resumes) and bound to a fresh size variable by a ``match_cast``::

    extent = call_tir(squeeze_dim0, (x, axes))        # Tensor((1,), int32)
    value = tensor_to_prim(extent)
    squeeze_d0 = match_cast(value, Prim(squeeze_d0))  # checked >= 0, then bound

Each extent is one read (one host stage); that is fine for the few dims these ops have.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..ir.expr import Expr, TensorToPrim, tensor_dtype, tensor_shape
from ..ir.struct_info import PrimStructInfo
from ..ir.symbolic import IntImm, PrimExpr, SizeVar
from ..ir.tir import (
    Buffer, Cast, FloatImm, IndexValue, Load, ScalarExpr, TensorProgram, maximum, minimum, scalar_dtype, select,
)


def int32(value: ScalarExpr) -> ScalarExpr:
    """An integer scalar as int32, for use as an extent, an index or an axis: an int64 beyond
    int32 saturates (kernels.wasm holds int64 exactly), so that what checks it sees a value out
    of range, never its low 32 bits (on the GPU int64 is int32 already: the clamp does nothing)."""
    if _dtype(value) == "int64":
        value = minimum(maximum(value, FloatImm(-2**31, "int64")), FloatImm(2**31 - 1, "int64"))
    return value if _dtype(value) == "int32" else Cast("int32", value)


def _dtype(value: ScalarExpr) -> str:
    return scalar_dtype(value)


def const(value: int) -> ScalarExpr:
    return FloatImm(int(value), "int32")


def index(value: PrimExpr | int) -> ScalarExpr:
    return IndexValue(IntImm(value) if isinstance(value, int) else value)


def element(buffer: Buffer, position: int) -> ScalarExpr:
    """``buffer[position]`` of a 1-D integer tensor, as an int32."""
    return int32(Load(buffer, (IntImm(position),)))


def wrap_negative(value: ScalarExpr, extent: ScalarExpr) -> ScalarExpr:
    """``value + extent`` where ``value`` is negative (ONNX axes and indices)."""
    return select(value.lt(const(0)), value + extent, value)


def both(a: ScalarExpr, b: ScalarExpr) -> ScalarExpr:
    """``a and b`` on bools (a Select: only evaluates ``b`` where ``a`` holds)."""
    return select(a, b, FloatImm(0, "bool"))


def count_true(conditions: Sequence[ScalarExpr]) -> ScalarExpr:
    """How many of ``conditions`` hold, as an int32."""
    total: ScalarExpr = const(0)
    for condition in conditions:
        total = total + select(condition, const(1), const(0))
    return total


def read_back_dims(context, args: Sequence[Expr], extents: Sequence[Callable[[list[Buffer]], ScalarExpr]],
                   name: str, source: str = "", reason: str = "") -> tuple[SizeVar, ...]:
    """One fresh size variable per function of ``extents`` (each builds the int32 value of an
    extent from buffers of ``args``), computed on the GPU and read back.  ``source`` names
    where the op comes from (``Reshape node 'r'``; by default the call's, ``context.source``)
    for the errors of the checks of what is read back; ``reason``, what a single extent's checks
    say instead of ``{source}: dimension 0 of the result``."""
    source = source or getattr(context, "source", "")
    buffers = [Buffer(chr(ord("A") + i), tensor_shape(arg), tensor_dtype(arg)) for i, arg in enumerate(args)]
    dims = []
    for position, extent in enumerate(extents):
        program = TensorProgram(
            f"{name}_dim{position}", tuple(buffers), Buffer("out", (IntImm(1),), "int32"), (SizeVar("i0_"),),
            int32(extent(buffers)),
        )
        tensor = context.emit(context.call_tir(program, tuple(args)), f"{name}_dim{position}")
        value = context.emit(TensorToPrim(tensor), f"{name}_dim{position}_value")
        var = SizeVar(context.fresh_name(f"{name}_d{position}"))
        context.emit_match_cast(value, PrimStructInfo("int64", var), f"{name}_d{position}",
                                reason=reason or (extent_reason(source, position) if source else ""))
        dims.append(var)
    return tuple(dims)


def extent_reason(source: str, position: int) -> str:
    """What the read-back of extent ``position`` of an op's result states in its errors."""
    return f"{source}: dimension {position} of the result"


def read_reason(context, what: str) -> str:
    """The ``reason`` of a cast of a value read back (``Range node 'r': the number of
    elements``): ``what`` after where the call being legalized comes from; "" where it
    comes from no node (the host then names the cast)."""
    source = getattr(context, "source", "")
    return f"{source}: {what}" if source else ""
