"""WebAssembly text for the library kernels (docs/bundle-format.md,
"kernels.wasm"): the two functions every kernel defines, its params fields, and index
expressions of size variables as i32 arithmetic.

A kernel's text defines ``$units (params) -> units`` and ``$main (params, first, end,
scratch, <one address per binding>)``; the module assembler renames them after the kernel's
index.  Helper functions are named ``$main_...`` (renamed with ``$main``), so each kernel
carries the index helpers it uses (:func:`index_helpers`).  Buffers hold 4-byte device
elements: element ``i`` of binding ``b`` is at byte ``b + 4 * i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ...ir.lower_index import Constant, IndexOp, Operation, TargetIndex, Variable, lower_index
from ...ir.params_block import FIELD_BYTES, ParamsLayout
from ...ir.symbolic import Analyzer, PrimExpr, simplify
from ...ir.syntax import comment_text

@dataclass(frozen=True)
class LibraryWat:
    """A library kernel's WebAssembly text (``$units``, ``$main`` and its ``$main_...``
    helpers) and the private scratch memory ``$main`` needs per thread."""

    text: str
    scratch_bytes: int = 0


#: The WAT instruction of each i32 operation, or the helper function it calls.
_INSTRUCTIONS = {
    IndexOp.ADD: "i32.add", IndexOp.SUBTRACT: "i32.sub", IndexOp.MULTIPLY: "i32.mul",
    IndexOp.TRUNCATING_DIVIDE: "call $main_div", IndexOp.TRUNCATING_REMAINDER: "call $main_rem",
    IndexOp.FLOOR_DIVIDE: "call $main_floor_div", IndexOp.FLOOR_MODULO: "call $main_floor_mod",
    IndexOp.MINIMUM: "call $main_min", IndexOp.MAXIMUM: "call $main_max",
}

#: The index helpers, WGSL's semantics: a division truncates and never traps (by zero it gives
#: the dividend, INT_MIN / -1 gives INT_MIN; the remainder of either is 0); the floor forms
#: round toward negative infinity (the IR's ``//`` and ``%``).
_HELPERS = {
    "div": [
        "(func $main_div (param $a i32) (param $b i32) (result i32)",
        "  ;; a / b truncated; a when b is 0 or the quotient overflows (WGSL's rule)",
        "  (if (result i32) (i32.or (i32.eqz (local.get $b))",
        "                           (i32.and (i32.eq (local.get $a) (i32.const 0x80000000)) (i32.eq (local.get $b) (i32.const -1))))",
        "    (then (local.get $a))",
        "    (else (i32.div_s (local.get $a) (local.get $b)))))",
    ],
    "rem": [
        "(func $main_rem (param $a i32) (param $b i32) (result i32)",
        "  ;; a % b with a's sign; 0 when b is 0 or -1 (WGSL's rule)",
        "  (if (result i32) (i32.or (i32.eqz (local.get $b)) (i32.eq (local.get $b) (i32.const -1)))",
        "    (then (i32.const 0))",
        "    (else (i32.rem_s (local.get $a) (local.get $b)))))",
    ],
    "floor_div": [
        "(func $main_floor_div (param $a i32) (param $b i32) (result i32)",
        "  ;; the IR's a // b: one less than the truncated quotient when it is negative and not whole",
        "  (i32.sub (call $main_div (local.get $a) (local.get $b))",
        "           (i32.and (i32.ne (call $main_rem (local.get $a) (local.get $b)) (i32.const 0))",
        "                    (i32.lt_s (i32.xor (local.get $a) (local.get $b)) (i32.const 0)))))",
    ],
    "floor_mod": [
        "(func $main_floor_mod (param $a i32) (param $b i32) (result i32)",
        "  ;; the IR's a % b: takes b's sign",
        "  (local $r i32)",
        "  (local.set $r (call $main_rem (local.get $a) (local.get $b)))",
        "  (select (i32.add (local.get $r) (local.get $b)) (local.get $r)",
        "          (i32.and (i32.ne (local.get $r) (i32.const 0))",
        "                   (i32.lt_s (i32.xor (local.get $r) (local.get $b)) (i32.const 0)))))",
    ],
    "min": [
        "(func $main_min (param $a i32) (param $b i32) (result i32)",
        "  (select (local.get $a) (local.get $b) (i32.lt_s (local.get $a) (local.get $b))))",
    ],
    "max": [
        "(func $main_max (param $a i32) (param $b i32) (result i32)",
        "  (select (local.get $a) (local.get $b) (i32.gt_s (local.get $a) (local.get $b))))",
    ],
}
_HELPER_DEPENDENCIES = {"floor_div": ("div", "rem"), "floor_mod": ("rem",)}


class IndexText:
    """Index expressions of one kernel rendered as WAT, remembering which helpers they call.

    ``variable(name)`` is the WAT of a variable by its IR name (a params field, a local)."""

    def __init__(self, variable: Callable[[str], str]) -> None:
        self.variable = variable
        self.analyzer = Analyzer()

    def __call__(self, expr: PrimExpr) -> str:
        """``expr`` (i32, the IR's floor semantics) as a folded WAT expression."""
        return self._render(lower_index(simplify(expr), self.analyzer))

    def _render(self, target: TargetIndex) -> str:
        if isinstance(target, Constant):
            return f"(i32.const {target.value})"
        if isinstance(target, Variable):
            return self.variable(target.name)
        assert isinstance(target, Operation)
        a, b = self._render(target.a), self._render(target.b)
        if target.op == IndexOp.TRUNCATING_DIVIDE and isinstance(target.b, Constant) and target.b.value > 0:
            return f"(i32.div_s {a} {b})"  # a positive constant divisor never traps
        if target.op == IndexOp.TRUNCATING_REMAINDER and isinstance(target.b, Constant) and target.b.value > 0:
            return f"(i32.rem_s {a} {b})"
        return f"({_INSTRUCTIONS[target.op]} {a} {b})"


def index_helpers(text: str) -> list[str]:
    """The WAT of the index helpers that ``text`` calls, with their dependencies."""
    needed = [name for name in _HELPERS if f"call $main_{name} " in text or f"call $main_{name})" in text]
    for name in list(needed):
        needed += [dependency for dependency in _HELPER_DEPENDENCIES.get(name, ()) if dependency not in needed]
    return [line for name in _HELPERS if name in needed for line in _HELPERS[name]]


def params_field(layout: ParamsLayout, name: str) -> str:
    """The i32 field ``name`` of the params block at ``$params``."""
    return f"(i32.load offset={FIELD_BYTES * layout.fields.index(name)} (local.get $params))"


def element(buffer: str, index: str, shift: int = 2) -> str:
    """The byte address of element ``index`` (a WAT i32 expression) of ``$buffer``, whose
    elements take ``1 << shift`` bytes (4; 8 for an int64 buffer: ``emit.element_shift``)."""
    return f"(i32.add (local.get ${buffer}) (i32.shl {index} (i32.const {shift})))"


def kernel_text(title: str, bindings: Iterable[str], units: list[str], main_locals: Iterable[tuple[str, str]],
                main_body: list[str], helpers: list[str] = ()) -> str:
    """The WAT of a library kernel: a comment naming it, ``$units`` (body ``units``) and
    ``$main`` with one address parameter per binding (``bindings``, in binding order),
    its locals ``(name, type)`` and body; then helper functions (``$main_...``, e.g. from
    :func:`index_helpers`). Bodies are lists of lines, indented here."""
    params = " ".join(f"(param ${name} i32)" for name in bindings)
    lines = [
        ";; " + comment_text(title),
        "(func $units (param $params i32) (result i32)",
        *indent(units),
        ")",
        f"(func $main (param $params i32) (param $first i32) (param $end i32) (param $scratch i32) {params}",
        *(f"  (local ${name} {kind})" for name, kind in main_locals),
        *indent(main_body),
        ")",
        *helpers,
    ]
    return "\n".join(lines) + "\n"


def indent(lines: Iterable[str], depth: int = 1) -> list[str]:
    return [("  " * depth + line) if line else line for line in lines]


def loop(label: str, condition_to_leave: str, body: list[str]) -> list[str]:
    """``while (!condition_to_leave) { body }`` as a block and a loop labelled ``label`` (the
    body advances what the condition tests)."""
    return [
        f"(block ${label}_done",
        f"  (loop ${label}",
        f"    (br_if ${label}_done {condition_to_leave})",
        *indent(body, 2),
        f"    (br ${label})))",
    ]


def repeat(label: str, condition_to_continue: str, body: list[str]) -> list[str]:
    """``do { body } while (condition_to_continue)``: a loop labelled ``label`` whose body runs
    at least once, one branch per iteration (where :func:`loop` takes two)."""
    return [f"(loop ${label}", *indent(body), f"  (br_if ${label} {condition_to_continue}))"]


def shuffle(a: str, b: str, lanes: tuple[int, int, int, int]) -> str:
    """The f32 lanes ``lanes`` of the eight lanes of ``a`` (0-3) and ``b`` (4-7), as one v128."""
    indices = " ".join(str(4 * lane + byte) for lane in lanes for byte in range(4))
    return f"(i8x16.shuffle {indices} {a} {b})"


def broadcast_lane(vector: str, lane: int) -> str:
    """Lane ``lane`` of the f32x4 ``vector`` in all four lanes."""
    return shuffle(vector, vector, (lane,) * 4)


def fold(instruction: str, operands: list[str]) -> str:
    """``operands`` combined left to right by a binary ``instruction`` (``f32.add``: a sum)."""
    result = operands[0]
    for operand in operands[1:]:
        result = f"({instruction} {result} {operand})"
    return result
