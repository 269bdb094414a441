"""Helpers shared by op families: argument checks, broadcasting, axes, building programs.

Deduction accepts tensors whose shape is unknown (``Tensor(ndim=2)``, or ``Tensor(ndim=-1)``
when even the rank is unknown) and deduces as much as it can; legalization needs every
shape known (:func:`needs_known_shapes`), which a ``match_cast`` provides.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

from ..errors import UnsupportedModelError
from ..ir.expr import Call, Expr, Tuple, tensor_dtype, tensor_shape
from ..ir.op_registry import DeductionError
from ..ir.struct_info import StructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, format_expr, prove_equal
from ..ir.tir import Buffer, Load, ScalarExpr, TensorProgram


class UnknownShapeError(DeductionError, UnsupportedModelError):
    """Legalizing a call whose argument or result shape is not known at compile time (a model
    the GPU build cannot compile yet: a ``match_cast`` that names the dims is missing)."""


def expect_args(op: str, args: Sequence[Expr], count: int) -> None:
    if len(args) != count:
        raise DeductionError(f"{op}: takes {count} argument(s), got {len(args)}")


def require_tensor(expr: Expr, op: str, position: int) -> TensorStructInfo:
    """The annotation of a tensor argument; its shape (even its rank) may be unknown."""
    info = expr.struct_info
    if not isinstance(info, TensorStructInfo):
        raise DeductionError(f"{op}: argument {position} must be a tensor, got {info}")
    return info


def require_float(op: str, info: TensorStructInfo, position: int = 0) -> None:
    if not info.dtype.startswith("float"):
        raise DeductionError(f"{op}: argument {position} must be a float tensor, got {info.dtype}")


def same_dtype(op: str, infos: Sequence[TensorStructInfo]) -> str:
    for position, info in enumerate(infos[1:], start=1):
        if info.dtype != infos[0].dtype:
            raise DeductionError(
                f"{op}: dtypes differ ({infos[0].dtype} vs {info.dtype}; argument 0 vs argument {position})"
            )
    return infos[0].dtype


def unknown_rank_join(ranks: Sequence[int]) -> int:
    """The rank of a broadcast result when some shape is unknown: the largest, or -1."""
    return -1 if any(r == -1 for r in ranks) else max(ranks, default=0)


def normalize_axis(op: str, axis: int, ndim: int, what: str = "axis") -> int:
    """A non-negative axis (``-1`` is the last); an error naming the axis if out of range."""
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise DeductionError(f"{op}: {what} {axis} is out of range for a {ndim}-d tensor")
    return axis + ndim if axis < 0 else axis


def normalize_axes(op: str, axes: Sequence[int], ndim: int) -> list[int]:
    normalized = [normalize_axis(op, a, ndim) for a in axes]
    for position, axis in enumerate(normalized):
        if axis in normalized[:position]:
            raise DeductionError(f"{op}: axis {axis} is given twice (axes {list(axes)})")
    return normalized


def broadcast_shapes(
    op: str, shapes: Sequence[tuple[PrimExpr, ...]], scope: str = "the result"
) -> tuple[PrimExpr, ...]:
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
        chosen_from: tuple[int, int] | None = None  # (argument, its dim)
        for argument, shape in enumerate(shapes):
            offset = position - (rank - len(shape))
            if offset < 0:
                continue
            dim = shape[offset]
            if as_int(dim) == 1:
                continue
            if chosen_from is None:
                chosen, chosen_from = dim, (argument, offset)
            elif not prove_equal(chosen, dim):
                symbolic = as_int(chosen) is None or as_int(dim) is None
                hint = " (not provably equal; a match_cast can state that they are)" if symbolic else ""
                raise DeductionError(
                    f"{op}: cannot broadcast dimension {position} of {scope}: "
                    f"{format_expr(chosen)} vs {format_expr(dim)} (dim {chosen_from[1]} of argument "
                    f"{chosen_from[0]} vs dim {offset} of argument {argument}){hint}"
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


def buffer_name(position: int) -> str:
    """Input buffers are named A, B, C… (then A26, A27… past Z)."""
    return chr(ord("A") + position) if position < 26 else f"A{position}"


def make_program(
    name: str,
    args: Sequence[Expr],
    output_shape: tuple[PrimExpr, ...],
    output_dtype: str,
    body: Callable[[tuple[SizeVar, ...], list[Buffer]], ScalarExpr],
) -> TensorProgram:
    """A tensor program whose inputs have the shapes of ``args`` (named A, B, C…)."""
    buffers = [Buffer(buffer_name(i), tensor_shape(arg), tensor_dtype(arg)) for i, arg in enumerate(args)]
    axes = axis_vars(len(output_shape))
    return TensorProgram(name, tuple(buffers), Buffer("out", output_shape, output_dtype), axes, body(axes, buffers))


def load_broadcast(buffer: Buffer, axes: tuple[SizeVar, ...]) -> Load:
    return Load(buffer, broadcast_indices(buffer.shape, axes))


def _unknown_shape(info: StructInfo) -> bool:
    if isinstance(info, TensorStructInfo):
        return info.shape is None
    if isinstance(info, TupleStructInfo):
        return any(_unknown_shape(f) for f in info.fields)
    return False


def check_known_shapes(call: Call) -> None:
    """Legalization writes tensor programs over concrete symbolic shapes: every tensor
    argument and the result must have one."""
    def visit(expr: Expr, where: str) -> None:
        if isinstance(expr, Tuple):
            for index, field in enumerate(expr.fields):
                visit(field, f"{where}, field {index}")
        elif _unknown_shape(expr.struct_info):
            raise UnknownShapeError(
                f"{call.op}: {where} has an unknown shape ({expr.struct_info}); legalization "
                "needs a known shape: add a match_cast that gives its dims names"
            )

    for position, arg in enumerate(call.args):
        visit(arg, f"argument {position}")
    if _unknown_shape(call.struct_info):
        raise UnknownShapeError(
            f"{call.op}: the result has an unknown shape ({call.struct_info}); legalization needs a "
            "known shape: add a match_cast on its arguments (or on the data-dependent value it comes from)"
        )


def needs_known_shapes(legalize: Callable) -> Callable:
    """Wrap a legalization so that it first checks :func:`check_known_shapes`."""
    @functools.wraps(legalize)
    def wrapper(context, call: Call):
        check_known_shapes(call)
        return legalize(context, call)

    return wrapper
