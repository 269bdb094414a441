"""prove_integer_checks: the integer checks value ranges prove never fail are dropped.

What the pass promises (relaxweb/passes/prove_integer_checks.py): a ``checked_integer``
whose operation provably fits int32 at every call site becomes the operation, a
``checked_divisor`` provably non-zero becomes the divisor; the ranges come from the call
sites (the bounds of the sizes bound there, a constant's elements, what the program that
computed an argument can hold); the error sites left unused leave the table and the others
are numbered again; programs that became identical are shared.  What may fail stays.
"""

from __future__ import annotations

import numpy as np

from relaxweb.passes import PassContext
from relaxweb.passes.prove_integer_checks import prove_integer_checks
from tests.passes.rewrite import check_rewrite, check_unchanged

SITES = '''attrs = {"relaxweb.error_sites": [["range_node", "Add", "the int64 result does not fit"], ["mul_node", "Mul", "the int64 result does not fit"], ["div_node", "Div", "integer division by zero"]]}
'''

PROGRAMS = '''
@tensor_program
def arange(out: Buffer((n,), "int64")):
    out[i0_] = int64(index(i0_))

@tensor_program
def add(A: Buffer((n,), "int64"), out: Buffer((n,), "int64")):
    out[i0_] = checked_integer(1, (A[i0_] + int64(1)))

@tensor_program
def multiply(A: Buffer((n,), "int64"), B: Buffer((n,), "int64"), out: Buffer((n,), "int64")):
    out[i0_] = checked_integer(2, (A[i0_] * B[i0_]))

@tensor_program
def divide(A: Buffer((n,), "int64"), B: Buffer((n,), "int64"), out: Buffer((n,), "int64")):
    out[i0_] = checked_integer(2, (A[i0_] / checked_divisor(3, B[i0_])))
'''

MAIN = '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n,), "int64")) -> Tensor((n,), "int64"):
    with dataflow():
        r: Tensor((n,), "int64") = call_tir("arange", (), sizes={"n": n})
        s: Tensor((n,), "int64") = call_tir("add", (r,), sizes={"n": n})
        p: Tensor((n,), "int64") = call_tir("multiply", (s, x), sizes={"n": n})
        y: Tensor((n,), "int64") = call_tir("divide", (p, s), sizes={"n": n})
        output(y)
    return y
'''

FEEDS = {"x": np.array([3, -7, 11, 0], np.int64)}


def test_index_arithmetic_on_bounded_dims_and_nonzero_divisors_lose_their_checks() -> None:
    """``arange + 1`` fits when ``n <= 4096`` (from the arange's range, in another kernel),
    and divides without a zero (a positive divisor: no ``INT32_MIN / -1`` either); the
    product with data stays checked, as site 1 now."""
    expected = '''attrs = {"relaxweb.error_sites": [["mul_node", "Mul", "the int64 result does not fit"]]}

@tensor_program
def arange(out: Buffer((n,), "int64")):
    out[i0_] = int64(index(i0_))

@tensor_program
def add(A: Buffer((n,), "int64"), out: Buffer((n,), "int64")):
    out[i0_] = (A[i0_] + int64(1))

@tensor_program
def multiply(A: Buffer((n,), "int64"), B: Buffer((n,), "int64"), out: Buffer((n,), "int64")):
    out[i0_] = checked_integer(1, (A[i0_] * B[i0_]))

@tensor_program
def divide(A: Buffer((n,), "int64"), B: Buffer((n,), "int64"), out: Buffer((n,), "int64")):
    out[i0_] = (A[i0_] / B[i0_])
''' + MAIN
    with PassContext(bounds={"n": 4096}):
        check_rewrite(prove_integer_checks, SITES + PROGRAMS + MAIN, expected, FEEDS)


def test_without_bounds_the_unbounded_index_arithmetic_keeps_its_check() -> None:
    """Unbounded ``n``: an axis index is below int32's largest value (kernels index in
    i32), so ``index(i) + 1`` still fits, and is a divisor >= 1."""
    expected = '''attrs = {"relaxweb.error_sites": [["mul_node", "Mul", "the int64 result does not fit"]]}
''' + PROGRAMS.replace("checked_integer(1, (A[i0_] + int64(1)))", "(A[i0_] + int64(1))").replace(
        "checked_integer(2, (A[i0_] * B[i0_]))", "checked_integer(1, (A[i0_] * B[i0_]))").replace(
        "checked_integer(2, (A[i0_] / checked_divisor(3, B[i0_])))", "(A[i0_] / B[i0_])") + MAIN
    check_rewrite(prove_integer_checks, SITES + PROGRAMS + MAIN, expected, FEEDS)


def test_checks_on_data_stay() -> None:
    text = '''attrs = {"relaxweb.error_sites": [["sum_node", "ReduceSum", "the int64 result does not fit"], ["div_node", "Div", "integer division by zero"]]}

@tensor_program
def total(A: Buffer((n,), "int64"), out: Buffer((), "int64")):
    out[()] = checked_integer(1, sum(A[r_] for r_ in range(n)))

@tensor_program
def divide(A: Buffer((n,), "int64"), B: Buffer((), "int64"), out: Buffer((n,), "int64")):
    out[i0_] = (A[i0_] / checked_divisor(2, B[()]))

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n,), "int64")) -> Tensor((n,), "int64"):
    with dataflow():
        t: Tensor((), "int64") = call_tir("total", (x,), sizes={"n": n})
        y: Tensor((n,), "int64") = call_tir("divide", (x, t), sizes={"n": n})
        output(y)
    return y
'''
    check_unchanged(prove_integer_checks, text, FEEDS)


def test_a_constant_argument_gives_its_range_and_identical_programs_are_shared() -> None:
    """``x + c`` with a constant ``c`` of small values still may not fit (``x`` is data);
    ``c * 3`` fits: its check goes, and the two programs that became one are shared."""
    before = '''attrs = {"relaxweb.error_sites": [["a", "Mul", "the int64 result does not fit"], ["b", "Mul", "the int64 result does not fit"]]}

@tensor_program
def triple(A: Buffer((4,), "int64"), out: Buffer((4,), "int64")):
    out[i0_] = checked_integer(1, (A[i0_] * int64(3)))

@tensor_program
def triple1(A: Buffer((4,), "int64"), out: Buffer((4,), "int64")):
    out[i0_] = checked_integer(2, (A[i0_] * int64(3)))

@function(inputs=["x"], outputs=["y", "z"])
def main(x: Tensor((4,), "int64")) -> Tuple(Tensor((4,), "int64"), Tensor((4,), "int64")):
    with dataflow():
        y: Tensor((4,), "int64") = call_tir("triple", (const("c"),), sizes={})
        z: Tensor((4,), "int64") = call_tir("triple1", (const("c"),), sizes={})
        output(y, z)
    return (y, z)
'''
    expected = '''
@tensor_program
def triple(A: Buffer((4,), "int64"), out: Buffer((4,), "int64")):
    out[i0_] = (A[i0_] * int64(3))

@function(inputs=["x"], outputs=["y", "z"])
def main(x: Tensor((4,), "int64")) -> Tuple(Tensor((4,), "int64"), Tensor((4,), "int64")):
    with dataflow():
        y: Tensor((4,), "int64") = call_tir("triple", (const("c"),), sizes={})
        z: Tensor((4,), "int64") = call_tir("triple", (const("c"),), sizes={})
        output(y, z)
    return (y, z)
'''
    constants = {"c": np.array([1, -2, 5, 7], np.int64)}
    check_rewrite(prove_integer_checks, before, expected, {"x": np.zeros(4, np.int64)}, constants)
