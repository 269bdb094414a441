"""Relaxed SIMD in kernels.wasm: the kernels' multiply-adds as ``f32x4.relaxed_madd``, and the
plain SIMD128 form of the same module for engines without it.

The kernels are rendered once, with :func:`multiply_add` at every ``sum + a * b`` of f32x4
that sits on a hot loop (the matmul tiers' micro-kernels and rows, the attention kernels'
dot products).  Where the CPU has fused multiply-add (x86 with FMA3, every ARM64) an engine
with relaxed SIMD (Chromium from 114, Firefox from 120, wasmtime) turns it into one
instruction instead of a multiply and an add, which halves the arithmetic of a micro-kernel:
bench/wasm_peak.py measures the f32x4 peak both ways.  The bundle keeps both modules
(``kernels-relaxed.wasm`` and ``kernels.wasm``); each runtime takes the relaxed one where its
engine validates it (docs/bundle-format.md, "kernels.wasm").

:func:`plain_simd` is the lowering for the other module: each ``(f32x4.relaxed_madd a b c)``
becomes ``(f32x4.add (f32x4.mul a b) c)``, the operands evaluated in the same order.  The
relaxed instruction may round once (fused) or twice (as the plain form); the specification
lets the engine pick, so results may differ in the last bit between machines, never between
two runs on one.
"""

from __future__ import annotations

RELAXED_MADD = "f32x4.relaxed_madd"
"""The relaxed SIMD instruction the kernels use: ``a * b + c``, fused or not."""

RELAXED_FILE = "kernels-relaxed.wasm"
"""The bundle's file of the module with relaxed SIMD (the manifest's ``wasm.relaxed_file``)."""


def multiply_add(a: str, b: str, c: str) -> str:
    """``a * b + c`` on f32x4 values (WAT folded instructions), as one relaxed instruction."""
    return f"({RELAXED_MADD} {a} {b} {c})"


def uses_relaxed_simd(wat: str) -> bool:
    return f"({RELAXED_MADD} " in wat


def plain_simd(wat: str) -> str:
    """``wat`` with every ``(f32x4.relaxed_madd a b c)`` written as ``(f32x4.add (f32x4.mul a
    b) c)``: the module for engines without relaxed SIMD.  Operands are folded instructions
    or single tokens (as the kernels write them), relaxed ones nested inside included."""
    marker = f"({RELAXED_MADD} "
    pieces, position = [], 0
    while (start := wat.find(marker, position)) >= 0:
        pieces.append(wat[position:start])
        operands, end = _operands(wat, start + len(marker), 3)
        a, b, c = (plain_simd(operand) for operand in operands)
        pieces.append(f"(f32x4.add (f32x4.mul {a} {b}) {c})")
        position = end
    pieces.append(wat[position:])
    return "".join(pieces)


def _operands(text: str, position: int, count: int) -> tuple[list[str], int]:
    """``count`` operands of a folded instruction from ``position`` (after its name) and the
    position after its closing parenthesis; a text that is not so shaped is a compiler bug."""
    operands = []
    while True:
        while text[position].isspace():
            position += 1
        if text[position] == ")":
            if len(operands) != count:
                raise ValueError(f"{RELAXED_MADD} with {len(operands)} operands in the kernels' text: "
                                 f"{text[max(0, position - 80):position + 1]!r}")
            return operands, position + 1
        start = position
        if text[position] == "(":
            depth = 0
            while True:
                depth += {"(": 1, ")": -1}.get(text[position], 0)
                position += 1
                if depth == 0:
                    break
        else:
            while not text[position].isspace() and text[position] != ")":
                position += 1
        operands.append(text[start:position])
