"""Helpers shared by op families: argument checks, broadcasting, axes, building programs.

Deduction accepts tensors whose shape is unknown (``Tensor(ndim=2)``, or ``Tensor(ndim=-1)``
when even the rank is unknown) and deduces as much as it can; legalization needs every
shape known (:func:`needs_known_shapes`), which a ``match_cast`` provides.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import UnsupportedModelError
from ..ir.dtype import DTYPES
from ..ir.expr import Call, Expr, Tuple, tensor_dtype, tensor_shape
from ..ir.op_registry import AssumptionError, DeductionError
from ..ir.struct_info import StructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, expr_size, format_expr, prove_equal, prove_not_equal
from ..ir.tir import Buffer, Load, ScalarExpr, TensorProgram


class UnknownShapeError(DeductionError, UnsupportedModelError):
    """Legalizing a call whose argument or result shape is not known at compile time (a model
    the GPU build cannot compile yet: a ``match_cast`` that names the dims is missing)."""


def integer_arithmetic(args: Sequence[Expr], attrs: dict) -> bool:
    """Whether a call computes on integers (an argument is an integer tensor, or it casts to
    int64): its kernels may check int64 overflow and zero divisors at run time
    (``relaxweb/ir/integer_checks.py``), so it carries the node it comes from
    (``register_op(checks_data=integer_arithmetic)``)."""
    dtypes = [getattr(arg.struct_info, "dtype", None) for arg in args]
    return attrs.get("dtype") == "int64" or any(
        dtype in DTYPES and DTYPES[dtype].is_integer for dtype in dtypes if isinstance(dtype, str))


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


@dataclass(frozen=True)
class DimOf:
    """An extent a deduction compares: dimension ``dim`` of argument ``argument`` (None when
    it is not a tensor argument's, e.g. an entry of a target shape)."""

    extent: PrimExpr
    argument: int | None
    dim: int


def require_equal(a: DimOf, b: DimOf, message: str) -> None:
    """Deduction needs ``a.extent == b.extent``; ``message`` says where (op, dims, values).

    Nothing happens when they are provably equal.  When no input can make them equal
    (``3`` vs ``4``, ``n`` vs ``n + 1``), or neither is a tensor argument's, it is a
    :class:`DeductionError`.  Otherwise it is an :class:`AssumptionError`: a builder makes the
    fact a run-time check of the more complex extent against the simpler one, so the result
    keeps the simpler (a constant, then ``(h + 15) // 16`` rather than ``(h + 31) // 32 * 2``);
    on a tie, the later argument is checked against the earlier.
    """
    if prove_equal(a.extent, b.extent):
        return
    if prove_not_equal(a.extent, b.extent) or (a.argument is None and b.argument is None):
        raise DeductionError(message)
    checked, kept = (a, b) if _checked_first(a, b) else (b, a)
    raise AssumptionError(
        f"{message} (not provably equal; a match_cast can state that they are)",
        argument=checked.argument, dim=checked.dim, actual=checked.extent, expected=kept.extent,
    )


def _checked_first(a: DimOf, b: DimOf) -> bool:
    """Whether ``a`` (rather than ``b``) is the extent checked against the other."""
    if a.argument is None or b.argument is None:
        return b.argument is None
    if (as_int(a.extent) is None) != (as_int(b.extent) is None):
        return as_int(b.extent) is not None
    size_a, size_b = expr_size(a.extent), expr_size(b.extent)
    return size_a > size_b or (size_a == size_b and a.argument > b.argument)


def broadcast_shapes(
    op: str, shapes: Sequence[tuple[PrimExpr, ...]], scope: str = "the result",
    origins: Sequence[tuple[int | None, int]] | None = None,
) -> tuple[PrimExpr, ...]:
    """Numpy broadcasting with symbolic dims.

    Dims are aligned from the right.  A dim that is the constant 1 takes the other side;
    otherwise the two must be equal (:func:`require_equal`): provably (``n`` with ``n``),
    or, when the analyzer cannot decide (``n`` against ``m``, or ``n`` against ``4``), as a
    fact checked at run time.  ``origins[i]`` is (argument, first dim) of ``shapes[i]`` in
    the op's arguments (by default shape i is all of argument i; argument None: not a tensor
    argument).  A dim that is 1 only at run time is not broadcast: it must equal the other.
    """
    origins = list(origins) if origins is not None else [(i, 0) for i in range(len(shapes))]
    rank = max(len(s) for s in shapes)
    result: list[PrimExpr] = []
    for position in range(rank):
        chosen: DimOf | None = None
        for index, shape in enumerate(shapes):
            offset = position - (rank - len(shape))
            if offset < 0:
                continue
            argument, first = origins[index]
            dim = DimOf(shape[offset], argument, first + offset)
            if as_int(dim.extent) == 1:
                continue
            if chosen is None:
                chosen = dim
                continue
            require_equal(chosen, dim, (
                f"{op}: cannot broadcast dimension {position} of {scope}: "
                f"{format_expr(chosen.extent)} vs {format_expr(dim.extent)} (dim {chosen.dim} of "
                f"{_argument(chosen.argument)} vs dim {dim.dim} of {_argument(dim.argument)})"
            ))
        result.append(IntImm(1) if chosen is None else chosen.extent)
    return tuple(result)


def _argument(argument: int | None) -> str:
    return "the target" if argument is None else f"argument {argument}"


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
