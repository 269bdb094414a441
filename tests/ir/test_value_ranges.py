"""relaxweb/ir/value_ranges.py: which int64 arithmetic provably fits the int32 the device holds.

Each case is a program in the IR's text form and the int64 operations of its body the
analysis must leave checked (every other one it must prove), under the given bounds.
"""

from __future__ import annotations

import pytest

from relaxweb.ir.parser import parse_module
from relaxweb.ir.tir import format_scalar, scalar_nodes
from relaxweb.ir.value_ranges import ProgramRanges, ValueRange, is_int64_arithmetic


def checked_operations(text: str, bounds: dict[str, int] | None = None) -> set[str]:
    """The int64 operations of the module's one program that need a run-time check, as text,
    and ``/ zero`` after each division whose divisor may be 0."""
    (program,) = parse_module(text).programs.values()
    ranges = ProgramRanges(program, {name: (0, bound) for name, bound in (bounds or {}).items()})
    found = set()
    for node in scalar_nodes(program.body):
        if ranges.needs_overflow_check(node):
            found.add(format_scalar(node))
        if ranges.needs_zero_divisor_check(node):
            found.add(f"{format_scalar(node)} / zero")
    return found


def program(signature: str, body: str) -> str:
    return f"@tensor_program\ndef p({signature}):\n    out[i0_] = {body}\n"


def test_data_arithmetic_is_checked() -> None:
    text = program('A: Buffer((n,), "int64"), out: Buffer((n,), "int64")', "(A[i0_] * int64(5))")
    assert checked_operations(text) == {"(A[i0_] * int64(5))"}


def test_arithmetic_of_narrow_integers_fits() -> None:
    text = program('A: Buffer((n,), "int8"), out: Buffer((n,), "int64")',
                   "((int64(A[i0_]) * int64(A[i0_])) + int64(100000))")
    assert checked_operations(text) == set()


def test_index_arithmetic_on_bounded_dims_fits_and_unbounded_does_not() -> None:
    text = program('out: Buffer((n,), "int64")', "((int64(index(i0_)) + int64(1)) * int64(index(m)))")
    assert checked_operations(text, {"n": 4096, "m": 512}) == set()
    assert checked_operations(text) == {"((int64(index(i0_)) + int64(1)) * int64(index(m)))"}


def test_a_flat_index_below_a_buffer_size_fits_without_bounds() -> None:
    """An exporter's flat index ``i3 + i0 * seq`` into a ``(batch * seq,)`` buffer: below its
    element count, which kernels address in i32."""
    text = ('@tensor_program\ndef p(A: Buffer((batch * seq,), "float32"), out: Buffer((batch, seq), "int64")):\n'
            "    out[i0_, i1_] = (int64(index(i1_)) + (int64(index(i0_)) * int64(index(seq))))\n")
    assert checked_operations(text) == set()


def test_sums_fit_when_every_partial_sum_does() -> None:
    short = program('A: Buffer((n, 8), "int8"), out: Buffer((n,), "int64")',
                    "sum(int64(A[i0_, r_]) for r_ in range(8))")
    assert checked_operations(short) == set()
    of_int64 = program('A: Buffer((n, 8), "int64"), out: Buffer((n,), "int64")', "sum(A[i0_, r_] for r_ in range(8))")
    assert checked_operations(of_int64) == {"sum(A[i0_, r_] for r_ in range(8))"}
    unbounded = program('A: Buffer((n, k), "int8"), out: Buffer((n,), "int64")',
                        "sum(int64(A[i0_, r_]) for r_ in range(k))")
    assert len(checked_operations(unbounded)) == 1
    assert checked_operations(unbounded, {"k": 1000}) == set()


def test_division_checks_the_divisor_and_int32_min_over_minus_one() -> None:
    text = program('A: Buffer((n,), "int64"), B: Buffer((n,), "int64"), out: Buffer((n,), "int64")',
                   "(A[i0_] / B[i0_])")
    assert checked_operations(text) == {"(A[i0_] / B[i0_])", "(A[i0_] / B[i0_]) / zero"}
    by_constant = program('A: Buffer((n,), "int64"), out: Buffer((n,), "int64")', "(A[i0_] / int64(3))")
    assert checked_operations(by_constant) == set()
    int32 = program('A: Buffer((n,), "int32"), B: Buffer((n,), "int32"), out: Buffer((n,), "int32")',
                    "(A[i0_] / B[i0_])")
    assert checked_operations(int32) == {"(A[i0_] / B[i0_]) / zero"}  # int32 wraps, as onnxruntime


@pytest.mark.parametrize("source, checked", [("float32", True), ("uint32", True), ("int32", False), ("bool", False)])
def test_casts_to_int64_are_checked_from_values_outside_int32(source: str, checked: bool) -> None:
    text = program(f'A: Buffer((n,), "{source}"), out: Buffer((n,), "int64")', "int64(A[i0_])")
    assert checked_operations(text) == ({"int64(A[i0_])"} if checked else set())


def test_int32_arithmetic_is_never_checked_for_overflow() -> None:
    text = program('A: Buffer((n,), "int32"), out: Buffer((n,), "int32")', "((A[i0_] * A[i0_]) + negative(A[i0_]))")
    assert checked_operations(text) == set()


def test_value_range_operations() -> None:
    assert ValueRange(-3, 5).union(ValueRange(0, 9)) == ValueRange(-3, 9)
    assert ValueRange(None, 5).intersect(ValueRange(0, 9)) == ValueRange(0, 5)
    assert ValueRange(-2**31, 2**31 - 1).fits_int32 and not ValueRange(0, 2**31).fits_int32
    assert not ValueRange(None, 0).fits_int32 and ValueRange(None, 0).contains(-10**20)


def test_only_the_int64_operations_that_can_leave_int32_are_candidates() -> None:
    text = program('A: Buffer((n,), "int64"), out: Buffer((n,), "int64")', "maximum(A[i0_], int64(0))")
    (parsed,) = parse_module(text).programs.values()
    assert not any(is_int64_arithmetic(node) for node in scalar_nodes(parsed.body))
