"""The scalar nodes of run-time integer checks: int64 kept exact, no division by zero.

The device holds an int64 tensor as int32 (``relaxweb/ir/dtype.py``) and kernels compute
int64 in 32 bits.  Legalization wraps each int64 operation that can leave int32 in a
:class:`CheckedInteger` and each divisor of ONNX Div and Mod in a :class:`CheckedDivisor`;
both report into the run status (``relaxweb/ir/error_sites.py``) where the data makes them
fail, so the run fails naming the node instead of answering a wrapped value.  The pass
``prove_integer_checks`` removes those that value ranges prove never fail
(``relaxweb/ir/value_ranges.py``).  The printer, the parser and the functors know them by
their kinds (``checked_integer(site, value)``, ``checked_divisor(site, divisor)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .dtype import DtypeKind, dtype_info
from .symbolic import PrimExpr, as_expr
from .tir import BinaryOp, ReduceCombiner, ScalarExpr, UnaryOp, format_scalar, map_scalar


@dataclass(frozen=True)
class CheckedInteger(ScalarExpr):
    """An integer operation whose exact result must fit the 32 bits kernels compute it in:
    ``value`` is an int64 add, subtract, multiply, divide, negative, sum or prod, or a cast to
    int64 (the device holds an int64 as int32: ``relaxweb/ir/value_ranges.py`` says which
    need the check), or an int32 sum or product of a reduction op (onnxruntime reduces int32
    in 64 bits).  Its value is ``value``'s.  Where the exact result does not fit (a
    reduction: at any step), the kernel reports ``site`` (as :class:`CheckedIndex`'s, with
    no values) and the run fails.  The node has an effect: a backend evaluates it only where
    the program's value needs it."""

    scalar_kind: ClassVar[str] = "checked_integer"

    site: PrimExpr
    value: ScalarExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "site", as_expr(self.site))
        if checked_operation(self.value) is None:
            raise TypeError(f"CheckedInteger: not an integer operation it can check: {format_scalar(self.value)}")

    @property
    def dtype(self) -> str:
        return self.value.dtype


#: The operations a :class:`CheckedInteger` checks, by kind: the ops (or combiners) of each.
CHECKED_OPERATIONS: dict[str, frozenset] = {
    "binary": frozenset({BinaryOp.ADD, BinaryOp.SUBTRACT, BinaryOp.MULTIPLY, BinaryOp.DIVIDE}),
    "unary": frozenset({UnaryOp.NEGATIVE}),
    "reduce": frozenset({ReduceCombiner.SUM, ReduceCombiner.PROD}),
}


def checked_operation(expr: ScalarExpr) -> str | None:
    """The name of the operation a :class:`CheckedInteger` of ``expr`` checks (``add``,
    ``negative``, ``sum``, ``cast`` ...), or None where ``expr`` is none it can check: an
    int32 or int64 operation of :data:`CHECKED_OPERATIONS`, or a cast to int64 of a value
    that may lie outside int32 (a float, a uint32)."""
    if expr.dtype not in ("int32", "int64"):
        return None
    kind = expr.scalar_kind
    if kind == "cast":
        return "cast" if expr.dtype == "int64" and _may_exceed_int32(expr.a.dtype) else None
    operator = {"binary": "op", "unary": "op", "reduce": "combiner"}.get(kind)
    if operator is None or getattr(expr, operator) not in CHECKED_OPERATIONS[kind]:
        return None
    return str(getattr(expr, operator))


def _may_exceed_int32(dtype: str) -> bool:
    """Whether a value of ``dtype`` may lie outside int32 (a float, a uint32)."""
    info = dtype_info(dtype)
    return info.is_float or (info.kind is DtypeKind.UINT and info.device_bytes == 4 and info.bytes == 4)


@dataclass(frozen=True)
class CheckedDivisor(ScalarExpr):
    """An integer divisor that must not be 0 (ONNX Div and Mod: onnxruntime refuses the
    run): its value is ``divisor``'s; a 0 is reported at ``site`` (as
    :class:`CheckedIndex`'s, with no values) and divides as 1, so the kernel goes on until
    the run fails.  The node has an effect: a backend evaluates it only where needed."""

    scalar_kind: ClassVar[str] = "checked_divisor"

    site: PrimExpr
    divisor: ScalarExpr

    def __post_init__(self) -> None:
        object.__setattr__(self, "site", as_expr(self.site))
        if not dtype_info(self.divisor.dtype).is_integer:
            raise TypeError(f"CheckedDivisor: the divisor is {self.divisor.dtype}, not an integer: "
                            f"{format_scalar(self.divisor)}")

    @property
    def dtype(self) -> str:
        return self.divisor.dtype


def checking_every_operation(expr: ScalarExpr, site: int, dtype: str) -> ScalarExpr:
    """``expr`` with each of its ``dtype`` operations a :class:`CheckedInteger` can check
    wrapped in one of ``site`` (an int32 reduction whose every partial result must fit, as
    onnxruntime computes it in 64 bits)."""
    def check(node: ScalarExpr) -> ScalarExpr | None:
        return CheckedInteger(site, node) if node.dtype == dtype and checked_operation(node) is not None else None

    return map_scalar(expr, check)
