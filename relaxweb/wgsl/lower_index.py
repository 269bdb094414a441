"""The IR's index arithmetic in WGSL's integer operations: the lowering of
``relaxweb/ir/lower_index.py`` (floor ``//`` and ``%`` as truncating operators where they
agree, helper functions elsewhere) rendered as WGSL.

WGSL's i32 ``/`` and ``%`` truncate toward zero.  Where a divisor is 0 after all, WGSL
defines ``a / 0 == a`` and ``a % 0 == 0``, and the helpers give the same as the truncating
operators: nothing is undefined.  :func:`render_wgsl` writes a lowered tree as WGSL text; a
shader declares the helper functions its expressions use (:func:`helpers_used`).
"""

from __future__ import annotations

from typing import Callable

from ..ir.lower_index import (  # noqa: F401  (the lowering, re-exported for the WGSL emitters)
    FLOOR_OPS, INFIX_OPS, Constant, IndexLowering, IndexOp, Operation, TargetIndex, Variable, helpers_used,
    lower_index, operations, truncation_agrees, with_axis,
)


def render_wgsl(target: TargetIndex, variable: Callable[[str], str]) -> str:
    """WGSL text of a lowered expression; ``variable`` names a variable in the shader.
    Every infix operation is parenthesised; negative constants too."""
    if isinstance(target, Constant):
        return f"{target.value}" if target.value >= 0 else f"({target.value})"
    if isinstance(target, Variable):
        return variable(target.name)
    assert isinstance(target, Operation)
    a, b = render_wgsl(target.a, variable), render_wgsl(target.b, variable)
    if target.op in INFIX_OPS:
        return f"({a} {target.op.value} {b})"
    return f"{target.op.value}({a}, {b})"


# The floor helpers, from WGSL's truncating operators.  Truncation rounds the quotient toward
# zero: where the exact quotient is negative and not whole (the remainder is non-zero and the
# operands' signs differ), the floor is one less, and the remainder moves by the divisor.
# The two conditions are joined with `&`, not `&&`: WGSL's `&&` short-circuits, so it is a
# branch, and a factor calls these in every step of a matmul's reduction loop, once per block
# row or column.  SwiftShader's compile time grows much faster than the branches of a loop
# body: a melspectrogram's mel kernel with 130 calls compiled for more than three minutes
# (Chromium lost its GPU process); branch-free, in 0.3 s (tests/wgsl/test_index_semantics.py).
HELPER_FUNCTIONS = {
    IndexOp.FLOOR_DIVIDE: (
        "// the IR's a // b: rounds toward negative infinity (WGSL's / truncates toward zero)",
        "fn floor_div_i32(a: i32, b: i32) -> i32 {",
        "  let quotient = a / b;",
        "  return select(quotient, quotient - 1, (a % b != 0) & ((a < 0) != (b < 0)));",
        "}",
    ),
    IndexOp.FLOOR_MODULO: (
        "// the IR's a % b: takes the sign of b (WGSL's % takes the sign of a)",
        "fn floor_mod_i32(a: i32, b: i32) -> i32 {",
        "  let remainder = a % b;",
        "  return select(remainder, remainder + b, (remainder != 0) & ((remainder < 0) != (b < 0)));",
        "}",
    ),
}


def helper_declarations(helpers: set[IndexOp]) -> list[str]:
    """The WGSL declarations of the given helpers, in a fixed order, a blank line before each."""
    lines: list[str] = []
    for op in FLOOR_OPS:
        if op in helpers:
            lines += ["", *HELPER_FUNCTIONS[op]]
    return lines
