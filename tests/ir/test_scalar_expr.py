"""Scalar expressions of tensor programs (relaxweb/ir/tir.py): typed ops, the tables every
backend keeps per op, dtype checks, and the operators legalizations are written with."""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.ir import interpreter
from relaxweb.ir.pattern import Pattern
from relaxweb.ir.symbolic import IntImm, SizeVar
from relaxweb.ir.tir import (
    BITWISE_OPS, COMPARE_OPS, Binary, BinaryOp, Buffer, Cast, Compare, CompareOp, FloatImm, IndexValue, Load, Reduce,
    ReduceCombiner, Select, TensorProgram, Unary, UnaryOp, cast, exp, format_scalar, maximum, minimum, power, select, shift_right, unpack_half,
    sqrt,
)
from relaxweb.wgsl import emit
from tests.gpu_kernels import run_kernel_on_gpu
from tests.helpers import F32, Tolerance, assert_close

I = SizeVar("i")
X = Load(Buffer("x", (4,), "float32"), (I,))
Y = Load(Buffer("y", (4,), "float32"), (I,))
N = Load(Buffer("n", (4,), "int32"), (I,))


# Ops are enums ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Binary("bogus", X, X), "unknown BinaryOp 'bogus'; expected one of add, subtract, .*power"),
    (lambda: Unary("bogus", X), "unknown UnaryOp 'bogus'"),
    (lambda: Compare("bogus", X, X), "unknown CompareOp 'bogus'; expected one of lt, le, gt, ge, eq, ne"),
    (lambda: Reduce("mean", SizeVar("k"), IntImm(4), X), "unknown ReduceCombiner 'mean'; expected one of sum, max, min, prod"),
])
def test_an_unknown_op_is_an_error(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_valid_name_becomes_its_member_and_prints_as_the_name() -> None:
    by_name = Binary("maximum", X, Y)
    assert by_name.op is BinaryOp.MAXIMUM
    assert by_name == Binary(BinaryOp.MAXIMUM, X, Y) and hash(by_name) == hash(Binary(BinaryOp.MAXIMUM, X, Y))
    assert str(BinaryOp.MAXIMUM) == f"{BinaryOp.MAXIMUM}" == "maximum" == BinaryOp.MAXIMUM
    assert format_scalar(by_name) == "maximum(x[i], y[i])"
    assert format_scalar(Reduce("sum", SizeVar("k"), IntImm(4), X)) == "sum(x[i] for k in range(4))"
    assert format_scalar(Compare("le", X, Y)) == "(x[i] <= y[i])"
    assert str(Pattern.MATMUL) == "matmul" and list(Pattern)[0] is Pattern.ELEMENTWISE


@pytest.mark.parametrize(("table", "enum"), [
    (emit.BINARY_RENDERINGS, BinaryOp), (emit.UNARY_RENDERINGS, UnaryOp), (emit.COMPARE_RENDERINGS, CompareOp),
    (emit.COMBINER_RENDERINGS, ReduceCombiner), (interpreter.BINARY_FUNCTIONS, BinaryOp),
    (interpreter.UNARY_FUNCTIONS, UnaryOp), (interpreter.COMPARE_FUNCTIONS, CompareOp),
    (interpreter.COMBINER_FUNCTIONS, ReduceCombiner), (COMPARE_OPS, CompareOp),
], ids=lambda value: getattr(value, "__name__", ""))
def test_every_table_has_every_op(table: dict, enum) -> None:
    """Adding an op without a WGSL rendering or a numpy function fails here."""
    assert set(table) == set(enum)
    assert all(isinstance(key, enum) for key in table)


def test_an_op_missing_from_a_table_is_an_error_not_a_guess() -> None:
    partial = {BinaryOp.ADD: emit.BINARY_RENDERINGS[BinaryOp.ADD]}
    with pytest.raises(NotImplementedError, match="no rendering of BinaryOp.MINIMUM"):
        emit.rendering(partial, BinaryOp.MINIMUM)


def _program(body) -> TensorProgram:
    """``out[i] = body`` over x and y; a bool body is written as 1.0 / 0.0."""
    if body.dtype == "bool":
        body = select(body, FloatImm(1.0, "float32"), 0.0)
    return TensorProgram("f", (X.buffer, Y.buffer), Buffer("out", (4,), "float32"), (I,), body)


K = SizeVar("k")
# One program per op (acosh on x + 1: its domain is x >= 1).
OP_PROGRAMS = {
    **{f"binary {op}": _program(Binary(op, X, Y)) for op in BinaryOp if op not in BITWISE_OPS},
    **{f"unary {op}": _program(Unary(op, X + 1.0 if op is UnaryOp.ACOSH else X)) for op in UnaryOp
       if op is not UnaryOp.UNPACK_HALF},  # (on words: below)
    **{f"compare {op}": _program(Compare(op, X, Y)) for op in CompareOp},
    **{f"reduce {op}": _program(Reduce(op, K, IntImm(4), Load(X.buffer, (K,)) * Y)) for op in ReduceCombiner},
}
# lavapipe's asin / acos are within 4e-4 relative (WGSL inherits their accuracy from atan2's)
TOLERANCE = {"unary asin": Tolerance(rtol=1e-3, atol=1e-6), "unary acos": Tolerance(rtol=1e-3, atol=1e-6)}


@pytest.mark.parametrize("name", OP_PROGRAMS)
def test_every_op_renders_in_wgsl_as_the_interpreter_evaluates_it(device, name: str) -> None:
    program = OP_PROGRAMS[name]
    x = np.array([0.25, 0.5, 0.75, 0.9], np.float32)
    y = np.array([0.5, 0.5, 2.0, 0.125], np.float32)
    expected = interpreter.run_program(program, [x, y], {})
    actual = run_kernel_on_gpu(device, program, [x, y], {})
    assert_close(actual, expected, TOLERANCE.get(name, F32))


@pytest.mark.parametrize("op", sorted(BITWISE_OPS - {BinaryOp.SHIFT_RIGHT}))
def test_bitwise_ops_render_in_wgsl_as_the_interpreter_evaluates_them(device, op: BinaryOp) -> None:
    """On int32 (the GPU helper's output sentinel is negative; unsigned dtypes run in
    tests/frontend/test_exporter_ops.py)."""
    a, b = (Load(Buffer(name, (6,), "int32"), (I,)) for name in ("a", "b"))
    program = TensorProgram("f", (a.buffer, b.buffer), Buffer("out", (6,), "int32"), (I,), Binary(op, a, b))
    values = [0, 1, 5, 0x7FFFFFFF, -1, -2**31]
    x, y = np.array(values, np.int32), np.array([3, -6, 12, -1, 0x55555555, 7], np.int32)
    expected = interpreter.run_program(program, [x, y], {})
    np.testing.assert_array_equal(expected, BINARY_NUMPY[op](x, y))
    np.testing.assert_array_equal(run_kernel_on_gpu(device, program, [x, y], {}), expected)


def test_word_fields_render_in_wgsl_as_the_interpreter_evaluates_them(device) -> None:
    """shift_right and unpack_half read the fields of packed uint32 words (ops/packed_weights.py):
    each 4-bit field of a word, and each float16 half of it, on the GPU and in the interpreter."""
    word = Load(Buffer("w", (8,), "uint32"), (I,))
    amount = Load(Buffer("s", (8,), "uint32"), (I,))
    field = cast("int32", Binary("bitwise_and", shift_right(word, amount), FloatImm(15, "uint32")))  # (int32: the
    # GPU helper's output sentinel is negative)
    halves = np.array([1.5, -2.25, 65504.0, 6.1e-5, 0.0, -0.0, 3.0, 0.333], np.float16).view(np.uint16)
    words = (halves.astype(np.uint32) << 16 | halves[::-1].astype(np.uint32)).astype(np.uint32)
    amounts = np.arange(0, 32, 4, dtype=np.uint32)
    for body, expected in (
        (field, (words >> amounts) & 15),
        (unpack_half(word), halves[::-1].view(np.float16).astype(np.float32)),
        (unpack_half(shift_right(word, 16)), halves.view(np.float16).astype(np.float32)),
    ):
        program = TensorProgram("f", (word.buffer, amount.buffer), Buffer("out", (8,), body.dtype), (I,), body)
        np.testing.assert_array_equal(interpreter.run_program(program, [words, amounts], {}), expected)
        np.testing.assert_array_equal(run_kernel_on_gpu(device, program, [words, amounts], {}), expected)


def test_unpack_half_takes_a_word() -> None:
    with pytest.raises(TypeError, match="unpack_half takes a uint32, got float32"):
        unpack_half(X)


def test_bitwise_ops_take_integers_only() -> None:
    with pytest.raises(TypeError, match="bitwise_and takes integers, got float32"):
        Binary(BinaryOp.BITWISE_AND, X, Y)


BINARY_NUMPY = {BinaryOp.BITWISE_AND: np.bitwise_and, BinaryOp.BITWISE_OR: np.bitwise_or,
                BinaryOp.BITWISE_XOR: np.bitwise_xor}


# Dtypes ----------------------------------------------------------------------------------------


def test_each_expression_has_a_dtype() -> None:
    assert X.dtype == "float32" and N.dtype == "int32"
    assert IndexValue(I).dtype == "int32"
    assert Compare("lt", X, Y).dtype == "bool" and Unary("is_nan", X).dtype == "bool"
    assert Unary("exp", X).dtype == "float32" and Binary("add", N, N).dtype == "int32"
    assert Cast("int8", X).dtype == "int8" and Select(Compare("lt", X, Y), N, N).dtype == "int32"
    assert Reduce("max", SizeVar("k"), IntImm(4), N).dtype == "int32"


@pytest.mark.parametrize("make", [
    lambda: Binary("add", X, N),
    lambda: Binary("power", X, N),
    lambda: Compare("eq", X, N),
    lambda: Select(Compare("lt", X, Y), X, N),
], ids=["binary", "power", "compare", "select"])
def test_operands_of_different_dtypes_are_an_error(make) -> None:
    with pytest.raises(TypeError, match=r"operands of different dtypes \(float32 and int32\)"):
        make()


def test_operands_computed_in_one_dtype_may_differ() -> None:
    """float16 and float32 are both f32 on the GPU (kernels compute in 32 bits), as int64 and
    int32 are both i32; a bool and its uint32 device form are not."""
    half = Load(Buffer("h", (4,), "float16"), (I,))
    assert (half * X).dtype == "float16"
    assert Binary("add", Load(Buffer("l", (4,), "int64"), (I,)), N).dtype == "int64"
    flag = Load(Buffer("b", (4,), "bool"), (I,))
    with pytest.raises(TypeError, match=r"different dtypes \(bool and uint32\)"):
        Compare("eq", flag, Load(Buffer("u", (4,), "uint32"), (I,)))


def test_a_select_needs_a_bool_condition() -> None:
    with pytest.raises(TypeError, match="Select: the condition is float32, not bool"):
        Select(X, X, Y)


# Operators -------------------------------------------------------------------------------------


def test_operators_build_the_nodes_in_operand_order() -> None:
    assert X + Y == Binary(BinaryOp.ADD, X, Y)
    assert X - 1.0 == Binary(BinaryOp.SUBTRACT, X, FloatImm(1.0, "float32"))
    assert 2 * X == Binary(BinaryOp.MULTIPLY, FloatImm(2, "float32"), X)
    assert 1.0 / X == Binary(BinaryOp.DIVIDE, FloatImm(1.0, "float32"), X)
    assert 3 - N == Binary(BinaryOp.SUBTRACT, FloatImm(3, "int32"), N)
    assert -X == Unary(UnaryOp.NEGATIVE, X)
    assert format_scalar((X - 1.0) * 2 / Y) == "(((x[i] - float32(1.0)) * float32(2)) / y[i])"


def test_a_number_takes_the_other_operands_dtype_and_stays_as_written() -> None:
    assert format_scalar(N + 1) == "(n[i] + int32(1))"
    assert format_scalar(X + 1.5) == "(x[i] + float32(1.5))"
    assert format_scalar(X * 2) != format_scalar(X * 2.0)  # 2 and 2.0 print as written
    product = np.float32(0.5) * X  # numpy scalars defer to the expression
    assert product == Binary(BinaryOp.MULTIPLY, FloatImm(0.5, "float32"), X)
    assert type(product.a.value) is float
    with pytest.raises(TypeError, match="cannot combine"):
        X + True
    with pytest.raises(TypeError, match="cannot combine"):
        X * "2"


def test_comparisons_are_methods_and_equality_stays_structural() -> None:
    assert X.lt(0.0) == Compare(CompareOp.LT, X, FloatImm(0.0, "float32"))
    assert [X.le(Y).op, X.gt(Y).op, X.ge(Y).op, X.eq(Y).op, X.ne(Y).op] == [
        CompareOp.LE, CompareOp.GT, CompareOp.GE, CompareOp.EQ, CompareOp.NE]
    assert (X + 1 == X + 1) is True and (X == Y) is False
    assert {X + 1: "cached"}[X + 1] == "cached"


def test_functions_for_what_has_no_operator() -> None:
    assert maximum(X, 0.0) == Binary(BinaryOp.MAXIMUM, X, FloatImm(0.0, "float32"))
    assert minimum(1.0, X) == Binary(BinaryOp.MINIMUM, FloatImm(1.0, "float32"), X)
    assert power(X, 2.0) == Binary(BinaryOp.POWER, X, FloatImm(2.0, "float32"))
    assert select(X.lt(0.0), -X, X) == Select(Compare("lt", X, FloatImm(0.0)), Unary("negative", X), X)
    assert select(X.lt(0.0), 1, N) == Select(Compare("lt", X, FloatImm(0.0)), FloatImm(1, "int32"), N)
    assert exp(X) == Unary(UnaryOp.EXP, X) and sqrt(X) == Unary(UnaryOp.SQRT, X)
    assert cast("float32", X) is X and cast("int32", X) == Cast("int32", X)
    with pytest.raises(TypeError, match="at least one operand"):
        maximum(1.0, 2.0)


def test_interpreter_divides_integers_as_the_backends_do():
    """Integer division truncates toward zero and a division by zero gives the dividend (WGSL's
    rule, which the wasm backend follows): the reference must not give numpy's float quotient."""
    a = np.array([7, -7, 7, -7, 5, -2**31], np.int32)
    b = np.array([2, 2, -2, -2, 0, -1], np.int32)
    quotient = interpreter.divide(a, b)
    assert quotient.dtype == np.int32
    assert quotient.tolist() == [3, -3, -3, 3, 5, -2**31]
    assert interpreter.divide(np.float32(1), np.float32(4)) == np.float32(0.25)


def test_a_reduction_extent_given_as_an_int_is_an_index_expression() -> None:
    """Like a load's indices: analyses walk the extent as a symbolic expression (a Python int
    there made pattern analysis fail with an AttributeError)."""
    k = SizeVar("k")
    reduction = Reduce("sum", k, 4, Load(Buffer("x", (4,), "float32"), (k,)))
    assert reduction.extent == IntImm(4) and reduction == Reduce("sum", k, IntImm(4), reduction.body)


# Hashes are kept -------------------------------------------------------------------------------


def test_a_node_keeps_its_hash_and_leaves_it_out_of_a_pickle():
    """Expressions hash once (hash_once.py): equal trees hash the same, the hash is kept on
    the node after the first call, and a pickle carries no hash (string hashes differ
    between processes), so the copy computes its own."""
    import pickle
    import subprocess
    import sys

    first = select(X.lt(Y), exp(X) * 2.0, Y + X)
    second = select(X.lt(Y), exp(X) * 2.0, Y + X)
    assert first == second and first is not second
    assert hash(first) == hash(second)
    assert first.__dict__["_hash"] == hash(first)
    assert "_hash" not in pickle.loads(pickle.dumps(first)).__dict__
    assert "_hash" not in pickle.loads(pickle.dumps(I + 1)).__dict__
    # another process (another string hash seed) finds the unpickled node in its own dict
    script = ("import dataclasses, pickle, sys; node = pickle.loads(sys.stdin.buffer.read()); "
              "print({dataclasses.replace(node): 1}.get(node, 0), hash(node) == hash(dataclasses.replace(node)))")
    result = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(first), capture_output=True, check=True,
                            env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=".")
    assert result.stdout.split() == [b"1", b"True"]
