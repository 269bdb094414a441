"""Helpers shared by op families: broadcasting and building tensor programs."""

from __future__ import annotations

from typing import Callable, Sequence

from ..ir.expr import Expr, tensor_dtype, tensor_shape
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, format_expr, prove_equal
from ..ir.tir import Buffer, Load, ScalarExpr, TensorProgram
from .registry import DeductionError


def require_tensor(expr: Expr, op: str, position: int) -> TensorStructInfo:
    info = expr.struct_info
    if not isinstance(info, TensorStructInfo):
        raise DeductionError(f"{op}: argument {position} must be a tensor, got {info}")
    if info.shape is None:
        raise DeductionError(f"{op}: argument {position} needs a known shape (got {info})")
    return info


def broadcast_shapes(op: str, shapes: Sequence[tuple[PrimExpr, ...]]) -> tuple[PrimExpr, ...]:
    """Numpy broadcasting with symbolic dims.

    Dims are aligned from the right.  A dim that is the constant 1 takes the other side;
    otherwise the two must be provably equal (``n`` with ``n``, ``4`` with ``4``).  ``n``
    against ``m`` (or ``n`` against ``4``) cannot be decided at compile time and is an error
    naming the dimension; a model that relies on it needs a ``match_cast``.
    """
    rank = max(len(s) for s in shapes)
    result: list[PrimExpr] = []
    for position in range(rank):
        chosen: PrimExpr = IntImm(1)
        for shape in shapes:
            offset = position - (rank - len(shape))
            if offset < 0:
                continue
            dim = shape[offset]
            if as_int(dim) == 1:
                continue
            if as_int(chosen) == 1:
                chosen = dim
            elif not prove_equal(chosen, dim):
                raise DeductionError(
                    f"{op}: cannot broadcast dimension {position} of the result: "
                    f"{format_expr(chosen)} vs {format_expr(dim)}"
                )
        result.append(chosen)
    return tuple(result)


def broadcast_indices(shape: tuple[PrimExpr, ...], axes: tuple[SizeVar, ...]) -> tuple[PrimExpr, ...]:
    """Indices into a tensor of ``shape`` broadcast to an output indexed by ``axes``."""
    offset = len(axes) - len(shape)
    return tuple(
        IntImm(0) if as_int(dim) == 1 else axes[offset + i] for i, dim in enumerate(shape)
    )


def axis_vars(count: int) -> tuple[SizeVar, ...]:
    """Index variables for an output of ``count`` dims (names cannot clash with size vars)."""
    return tuple(SizeVar(f"i{d}_") for d in range(count))


def make_program(
    name: str,
    args: Sequence[Expr],
    output_shape: tuple[PrimExpr, ...],
    output_dtype: str,
    body: Callable[[tuple[SizeVar, ...], list[Buffer]], ScalarExpr],
) -> TensorProgram:
    """A tensor program whose inputs have the shapes of ``args`` (named A, B, C…)."""
    buffers = [
        Buffer(chr(ord("A") + i), tensor_shape(arg), tensor_dtype(arg)) for i, arg in enumerate(args)
    ]
    axes = axis_vars(len(output_shape))
    return TensorProgram(name, tuple(buffers), Buffer("out", output_shape, output_dtype), axes, body(axes, buffers))


def load_broadcast(buffer: Buffer, axes: tuple[SizeVar, ...]) -> Load:
    return Load(buffer, broadcast_indices(buffer.shape, axes))
