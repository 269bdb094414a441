"""The WebAssembly backend's tensor programs (relaxweb/cpu): every entry of each op table
against the interpreter, the WGSL semantics of edge cases (integer division by zero, floor
division of negative operands, NaN through max / min, saturating casts, clamped gathers),
whole compiled modules call site by call site, and kernels.wasm in bundles."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from typing import Callable

import numpy as np
import pytest
import wasmtime
from onnx import TensorProto, helper

import relaxweb
from relaxweb.compiler import compile_model
from relaxweb.cpu.emit import (
    BINARY_RENDERINGS, COMBINER_RENDERINGS, COMPARE_RENDERINGS, FLOAT, UNARY_RENDERINGS,
    VECTOR_BINARY_RENDERINGS, VECTOR_UNARY_RENDERINGS,
)
from relaxweb.cpu.helpers import HELPER_FUNCTIONS
from relaxweb.cpu.kernels import KernelsWasm, WasmUnavailable, emit_kernels_wasm
from relaxweb.cpu.math import MATH_FUNCTIONS
from relaxweb.cpu.module import KernelFunctions, assemble_kernels_module, wat_to_wasm
from relaxweb.cpu.relaxed_simd import relaxed_madd_sites
from relaxweb.cpu import library, schedules
from relaxweb.cpu.schedules.factor_forms import branched_interior, lane_vectors
from relaxweb.ir import interpreter
from relaxweb.ir.dtype import dtype_info
from relaxweb.ir.launch import dispatch_count
from relaxweb.ir.library_kernel import WASM, WEBGPU, LibraryKernel
from relaxweb.ir.symbolic import FloorDiv, FloorMod, IntImm, SizeVar, evaluate
from relaxweb.ir.tir import (
    Binary, BinaryOp, Buffer, Cast, Compare, CompareOp, FloatImm, Gather, IndexValue, Load, Reduce, ReduceCombiner,
    Select, TensorProgram, Unary, UnaryOp,
)
from relaxweb.ir.wasm_schedule import MatrixVectorSchedule, PackedMatmulSchedule, WasmSchedule, WindowSchedule
from relaxweb.passes.schedule_programs import choose_schedules
from relaxweb.runtime.manifest import manifest_problem
from relaxweb.runtime.relaxed_simd import lower_relaxed_simd
from tests.helpers import F32, F32_LOOSE, Tolerance, assert_close, make_model, rand
from tests.wasm_kernels import run_wasm_kernel

n = SizeVar("n")
i, j, k = SizeVar("i"), SizeVar("j"), SizeVar("k")
LIBRARY = {**MATH_FUNCTIONS, **HELPER_FUNCTIONS}
PACKED = PackedMatmulSchedule()  # the pass's packed matmul (its defaults)
MATMUL_SCRATCH_BYTES = MatrixVectorSchedule().scratch_bytes  # the most scratch a kernel of the pass's asks for
PANEL_DEPTH = PACKED.max_depth

WasmChange = Callable[[WasmSchedule], WasmSchedule]  # a program's wasm schedule -> the one a test renders


def scheduled(program: TensorProgram, wasm: WasmChange | None = None) -> TensorProgram:
    """``program`` as schedule_programs schedules it (unless it is scheduled already), its wasm
    schedule changed by ``wasm``."""
    if program.schedule is None:
        program = replace(program, schedule=choose_schedules(program))
    if wasm is not None:
        program = replace(program, schedule=replace(program.schedule, wasm=wasm(program.schedule.wasm)))
    return program


def render_program(program: TensorProgram, parts: dict[str, int] | None = None, wasm: WasmChange | None = None) -> str:
    """The WAT of the program's kernel, as :func:`scheduled` schedules it."""
    return schedules.render_program(scheduled(program, wasm), parts)


def packed(**changes) -> WasmChange:
    """A matmul's wasm schedule with its packed kind's parameters changed (``max_depth=1``: the
    block kind runs every reduction; a matrix-vector kind's depth refit to the new scratch)."""
    def change(schedule: WasmSchedule) -> WasmSchedule:
        if isinstance(schedule, PackedMatmulSchedule):
            return replace(schedule, **changes)
        if isinstance(schedule, MatrixVectorSchedule):
            otherwise = replace(schedule.otherwise, **changes)
            depth = MatrixVectorSchedule.deepest(schedule.max_rows, schedule.columns, otherwise)
            return replace(schedule, otherwise=otherwise, max_depth=depth)
        return schedule
    return change


def without_matrix_vector(schedule: WasmSchedule) -> WasmSchedule:
    """A matmul's wasm schedule without its matrix-vector kind (the packed kind runs)."""
    return schedule.otherwise if isinstance(schedule, MatrixVectorSchedule) else schedule


def compile_program(program: TensorProgram, wasm: WasmChange | None = None) -> bytes:
    """The kernels.wasm of one program (kernel 0)."""
    text = render_program(program, wasm=wasm)
    wat = assemble_kernels_module([KernelFunctions(0, program.name, text)], "test", LIBRARY)
    return wat_to_wasm(wat)


def device_array(array: np.ndarray) -> np.ndarray:
    """``array`` as kernels.wasm holds it (float32, int32, uint32 or int64; a bool as 0 / 1)."""
    return np.ascontiguousarray(array.astype(dtype_info(str(array.dtype)).wasm_dtype))


def run_on_wasm(program: TensorProgram, arrays: list[np.ndarray], size_vars: dict[str, int],
                wasm: WasmChange | None = None) -> np.ndarray:
    """The program's output computed by its wasm kernel (in the output's wasm dtype)."""
    shape = tuple(int(evaluate(d, size_vars)) for d in program.output.shape)
    output = np.zeros(shape, dtype_info(program.output.dtype).wasm_dtype)
    params = [int(evaluate(dispatch_count(program), size_vars)), *(size_vars[v.name] for v in program.size_vars)]
    return run_wasm_kernel(compile_program(program, wasm), 0, [device_array(a) for a in arrays], output, params,
                           scratch_bytes=MATMUL_SCRATCH_BYTES)


def check_program(program: TensorProgram, arrays: list[np.ndarray], size_vars: dict[str, int] | None = None,
                  tolerance=F32, wasm: WasmChange | None = None) -> np.ndarray:
    """The wasm kernel against the interpreter: floats within ``tolerance``, the rest exact."""
    size_vars = dict(size_vars or {})
    expected = interpreter.run_program(program, arrays, size_vars)
    actual = run_on_wasm(program, arrays, size_vars, wasm)
    if dtype_info(program.output.dtype).is_float:
        assert_close(actual, expected.astype(np.float32), tolerance)
    else:
        np.testing.assert_array_equal(actual, device_array(expected))
    return actual


def elementwise(body_of, dtypes: tuple[str, ...], out_dtype: str, shape=(n, 7)) -> TensorProgram:
    """``out[i, j] = body_of(A[i, j], B[i, j], ...)`` over buffers of ``dtypes``."""
    axes = (i, j)[:len(shape)]
    buffers = [Buffer(name, shape, dtype) for name, dtype in zip("ABC", dtypes)]
    return TensorProgram("program", tuple(buffers), Buffer("out", shape, out_dtype), axes,
                         body_of(*(Load(b, axes) for b in buffers)))


def operands(dtype: str, count: int, rows: int = 5, seed: int = 0) -> list[np.ndarray]:
    generator = np.random.default_rng(seed)
    if dtype == "float32":
        return [rand(rows, 7, seed=seed + s, low=0.1, high=2.0) for s in range(count)]
    if dtype == "uint32":
        return [generator.integers(0, 1000, (rows, 7)).astype(np.uint32) for _ in range(count)]
    return [generator.integers(-1000, 1000, (rows, 7)).astype(np.int32) for _ in range(count)]


# -- the tables ---------------------------------------------------------------------------------


def test_every_op_has_a_rendering() -> None:
    for table, enum in ((BINARY_RENDERINGS, BinaryOp), (UNARY_RENDERINGS, UnaryOp), (COMPARE_RENDERINGS, CompareOp),
                        (COMBINER_RENDERINGS, ReduceCombiner)):
        assert set(table) == set(enum), enum.__name__


def _float_ops(table) -> list:
    return [op for op, entry in table.items() if FLOAT in entry]


@pytest.mark.parametrize("op", _float_ops(BINARY_RENDERINGS), ids=str)
def test_binary_float(op: BinaryOp) -> None:
    check_program(elementwise(lambda a, b: Binary(op, a, b), ("float32",) * 2, "float32"), operands("float32", 2),
                  {"n": 5})


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
@pytest.mark.parametrize("op", [op for op in BinaryOp if op is not BinaryOp.POWER], ids=str)
def test_binary_integer(op: BinaryOp, dtype: str) -> None:
    arrays = operands(dtype, 2)
    if op is BinaryOp.DIVIDE:
        arrays[1][arrays[1] == 0] = 3  # (division by zero: test_integer_division_never_traps)
    if op is BinaryOp.SHIFT_RIGHT:
        arrays[1] = arrays[1] % 32
    program = elementwise(lambda a, b: Binary(op, a, b), (dtype,) * 2, dtype)
    if op is BinaryOp.DIVIDE:  # numpy's divide is a float one: the interpreter casts it back
        expected = (np.sign(arrays[0]) * np.sign(arrays[1]) * (np.abs(arrays[0]) // np.abs(arrays[1]))).astype(dtype)
        np.testing.assert_array_equal(run_on_wasm(program, arrays, {"n": 5}), expected)
        return
    check_program(program, arrays, {"n": 5})


@pytest.mark.parametrize("op", [op for op, entry in UNARY_RENDERINGS.items() if FLOAT in entry and op not in (UnaryOp.IS_NAN, UnaryOp.IS_FINITE)],
                         ids=str)
def test_unary_float(op: UnaryOp) -> None:
    low, high = {UnaryOp.ASIN: (-0.99, 0.99), UnaryOp.ACOS: (-0.99, 0.99), UnaryOp.ATANH: (-0.99, 0.99),
                 UnaryOp.ACOSH: (1.0, 5.0), UnaryOp.LOG: (0.01, 5.0), UnaryOp.SQRT: (0.01, 5.0),
                 UnaryOp.TAN: (-1.5, 1.5)}.get(op, (-4.0, 4.0))
    values = rand(5, 7, low=low, high=high)
    if op is UnaryOp.ROUND:
        values[0, :3] = [0.5, 1.5, -2.5]  # halves to even
    check_program(elementwise(lambda a: Unary(op, a), ("float32",), "float32"), [values], {"n": 5})


def test_unary_integer_and_bits() -> None:
    check_program(elementwise(lambda a: Unary(UnaryOp.NEGATIVE, a), ("int32",), "int32"), operands("int32", 1), {"n": 5})
    values = rand(5, 7)
    values[1, 2] = np.nan
    values[2, 3] = -np.inf
    values[3, 4] = np.inf
    for test in (UnaryOp.IS_NAN, UnaryOp.IS_FINITE):
        check_program(elementwise(lambda a, test=test: Unary(test, a), ("float32",), "bool"), [values], {"n": 5})
    halves = np.array([0x3C00, 0xC000, 0x7BFF, 0x0001, 0x7C00, 0xFC00, 0x3555], np.uint32).reshape(1, 7)
    halves = np.repeat(halves | np.uint32(0xABCD0000), 5, axis=0)  # the high half is ignored
    check_program(elementwise(lambda a: Unary(UnaryOp.UNPACK_HALF, a), ("uint32",), "float32"), [halves], {"n": 5})


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint32", "bool"])
@pytest.mark.parametrize("op", list(CompareOp), ids=str)
def test_compare(op: CompareOp, dtype: str) -> None:
    if dtype == "bool":
        generator = np.random.default_rng(1)
        arrays = [generator.integers(0, 2, (5, 7)).astype(bool) for _ in range(2)]
    else:
        arrays = operands(dtype, 2)
        arrays[1][0] = arrays[0][0]  # equal operands too
    check_program(elementwise(lambda a, b: Compare(op, a, b), (dtype, dtype), "bool"), arrays, {"n": 5})


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint32", "int8", "uint8", "bool"])
@pytest.mark.parametrize("combiner", list(ReduceCombiner), ids=str)
def test_reductions(combiner: ReduceCombiner, dtype: str) -> None:
    """Each combiner over a symbolic extent, and over an empty one (its identity).  (Bools
    are only maxed and minned: ONNX sums and multiplies numbers.)"""
    if dtype == "bool" and combiner in (ReduceCombiner.SUM, ReduceCombiner.PROD):
        return
    m = SizeVar("m")
    data = Buffer("A", (n, m), dtype)
    program = TensorProgram("reduce", (data,), Buffer("out", (n,), dtype), (i,),
                            Reduce(combiner, k, m, Load(data, (i, k))))
    generator = np.random.default_rng(2)
    if dtype == "float32":
        values = rand(3, 5, low=0.5, high=1.5)
    elif dtype == "bool":
        values = generator.integers(0, 2, (3, 5)).astype(bool)
    else:
        info = np.iinfo(dtype)
        values = generator.integers(max(info.min, -3), min(info.max, 4), (3, 5)).astype(dtype)
    check_program(program, [values], {"n": 3, "m": 5})
    if dtype != "bool":  # (the interpreter has no bool identity)
        check_program(program, [np.zeros((3, 0), dtype)], {"n": 3, "m": 0})


UNARY_RANGES = {UnaryOp.ASIN: (-0.99, 0.99), UnaryOp.ACOS: (-0.99, 0.99), UnaryOp.ATANH: (-0.99, 0.99),
                UnaryOp.ACOSH: (1.0, 5.0), UnaryOp.LOG: (0.01, 5.0), UnaryOp.SQRT: (0.01, 5.0), UnaryOp.TAN: (-1.5, 1.5)}


@pytest.mark.parametrize("op", list(VECTOR_BINARY_RENDERINGS) + list(VECTOR_UNARY_RENDERINGS), ids=str)
def test_vectorized(op) -> None:
    """Float programs whose last dimension is a multiple of 4 run four elements at a time:
    each op's f32x4 form, with a buffer constant along the last axis splatted."""
    row = Buffer("R", (n, 1), "float32")
    data = Buffer("A", (n, 8), "float32")
    low, high = UNARY_RANGES.get(op, (0.1, 2.0))
    if isinstance(op, BinaryOp):
        body = Binary(op, Load(data, (i, j)), Load(row, (i, IntImm(0))) + 0.5)
    else:
        body = Unary(op, Load(data, (i, j)) * Load(row, (i, IntImm(0))))
        low, high = low / 1.01, high / 1.01
    program = TensorProgram("vector", (row, data), Buffer("out", (n, 8), "float32"), (i, j), body)
    assert "(v128.store" in render_program(program)
    values = rand(3, 8, low=low, high=high)
    values[0, 0] = np.nan
    if op is UnaryOp.ROUND:
        values[1, :3] = [0.5, 1.5, -2.5]
    check_program(program, [rand(3, 1, seed=1, low=1.0, high=1.01), values], {"n": 3})


@pytest.mark.parametrize("combiner", list(ReduceCombiner), ids=str)
def test_vector_reductions_along_the_last_axis(combiner: ReduceCombiner) -> None:
    """A float reduction reading along its axis runs four steps at a time, then one by one:
    every remainder, an empty range, NaN, and a part of the body that does not depend on the
    axis (another reduction) computed once."""
    m = SizeVar("m")
    data = Buffer("A", (n, m), "float32")
    mean = Reduce(ReduceCombiner.SUM, SizeVar("l"), m, Load(data, (i, SizeVar("l")))) / 4.0
    body = Unary(UnaryOp.EXP, Load(data, (i, k)) - mean) if combiner is ReduceCombiner.SUM else Load(data, (i, k)) * 1.5
    program = TensorProgram("reduce", (data,), Buffer("out", (n,), "float32"), (i,), Reduce(combiner, k, m, body))
    assert "f32x4.extract_lane" in render_program(program)
    for extent in (0, 3, 4, 5, 11):
        values = rand(3, extent, low=0.5, high=1.5)
        if extent:
            values[1, extent // 2] = np.nan
        actual = check_program(program, [values], {"n": 3, "m": extent})
        assert np.isnan(actual[1]) == bool(extent)


@pytest.mark.parametrize("columns", [16, 5])
def test_weight_in_parts_is_read_through_its_first_part(columns: int) -> None:
    """A kernel reading a weight in parts takes one address per part and reads the whole
    weight through the first (the wasm backend never splits weights)."""
    data, weight = Buffer("A", (n, 8), "float32"), Buffer("W", (8, columns), "float32")
    program = TensorProgram("matmul", (data, weight), Buffer("out", (n, columns), "float32"), (i, j),
                            Reduce(ReduceCombiner.SUM, k, IntImm(8), Load(data, (i, k)) * Load(weight, (k, j))))
    text = render_program(program, {"W": 3})
    wasm = wat_to_wasm(assemble_kernels_module([KernelFunctions(0, "parts", text)], "test", LIBRARY))
    arrays = [rand(6, 8), rand(8, columns, seed=1)]
    ignored = np.full(4, np.nan, np.float32)  # what the other parts' addresses point at (the runtime passes 0)
    actual = run_wasm_kernel(wasm, 0, [*arrays, ignored, ignored], np.zeros((6, columns), np.float32), [0, 6],
                             scratch_bytes=MATMUL_SCRATCH_BYTES)
    assert_close(actual, interpreter.run_program(program, arrays, {"n": 6}))


def test_reductions_compute_their_invariant_reductions_once() -> None:
    """A softmax denominator along a non-contiguous axis (no f32x4 steps): the column max in
    its body is computed once per output element, before the loop (also over an empty range,
    and next to a Select whose branch is not hoisted)."""
    m = SizeVar("m")
    data = Buffer("A", (m, 6), "float32")
    column_max = Reduce(ReduceCombiner.MAX, SizeVar("l"), m, Load(data, (SizeVar("l"), j)))
    term = Unary(UnaryOp.EXP, Load(data, (k, j)) - column_max)
    guarded = Select(Compare(CompareOp.GT, IndexValue(j), FloatImm(2, "int32")), term, term * 2.0)
    program = TensorProgram("denominator", (data,), Buffer("out", (6,), "float32"), (j,),
                            Reduce(ReduceCombiner.SUM, k, m, guarded + term))
    text = render_program(program)
    assert text.count("(loop $reduce") == 2  # the sum's (reduce0) and, once, the max's before it
    assert text.index("(loop $reduce1") < text.index("(loop $reduce0")
    for extent in (0, 1, 7):
        check_program(program, [rand(extent, 6)], {"m": extent})


def test_nan_through_max_and_min() -> None:
    values = rand(5, 7)
    other = rand(5, 7, seed=1)
    values[0, 0] = np.nan
    other[1, 1] = np.nan
    for op in (BinaryOp.MAXIMUM, BinaryOp.MINIMUM):
        actual = check_program(elementwise(lambda a, b: Binary(op, a, b), ("float32",) * 2, "float32"), [values, other],
                               {"n": 5})
        assert np.isnan(actual[0, 0]) and np.isnan(actual[1, 1]) and np.isfinite(actual[2:]).all()
    data = Buffer("A", (n, 7), "float32")
    for combiner in (ReduceCombiner.MAX, ReduceCombiner.MIN):
        program = TensorProgram("reduce", (data,), Buffer("out", (n,), "float32"), (i,),
                                Reduce(combiner, k, IntImm(7), Load(data, (i, k))))
        actual = check_program(program, [values], {"n": 5})
        assert np.isnan(actual[0]) and np.isfinite(actual[1:]).all()


@pytest.mark.parametrize("constant", [6.0, -1.5, np.inf, 0.0, -0.0])
def test_vector_extremum_against_a_constant_as_the_exact_one(constant: float) -> None:
    """f32x4 min and max against a constant neither zero nor NaN take the pseudo forms (one
    instruction on x86); those agree with the exact ones in every lane: a NaN operand stays
    NaN, and -0 against +0 (the case where they differ) keeps the exact forms.  abs of a float
    is f32x4.abs: NaN stays NaN, -0 gives +0."""
    values = np.array([[np.nan, -0.0, 0.0, np.inf, -np.inf, 5.0, -5.0, -1.5]], np.float32)
    for op, pseudo, exact in ((BinaryOp.MINIMUM, "f32x4.pmin", np.fmin), (BinaryOp.MAXIMUM, "f32x4.pmax", np.fmax)):
        for body in (lambda x, op=op: Binary(op, x, FloatImm(constant, "float32")),
                     lambda x, op=op: Binary(op, FloatImm(constant, "float32"), x)):
            program = elementwise(body, ("float32",), "float32", shape=(1, 8))
            text = render_program(program)
            assert "(v128.store" in text and (f"({pseudo} " in text) == (constant != 0)
            actual = run_on_wasm(program, [values], {})
            expected = np.where(np.isnan(values), np.nan, exact(values, np.float32(constant)))
            for index in np.flatnonzero(values[0] == 0) if constant == 0 else ():  # -0 orders below +0
                signs = (np.signbit(values[0, index]), np.signbit(constant))
                negative = any(signs) if op is BinaryOp.MINIMUM else all(signs)
                expected[0, index] = -0.0 if negative else 0.0
            np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
            numbers = ~np.isnan(expected)
            np.testing.assert_array_equal(np.signbit(actual[numbers]), np.signbit(expected[numbers]))
            np.testing.assert_array_equal(actual[numbers], expected[numbers])
    program = elementwise(lambda x: Unary(UnaryOp.ABSOLUTE, x), ("float32",), "float32", shape=(1, 8))
    assert "(f32x4.abs " in render_program(program)
    actual = run_on_wasm(program, [values], {})
    assert np.isnan(actual[0, 0]) and not np.signbit(actual).any()
    np.testing.assert_array_equal(actual[0, 1:], np.abs(values[0, 1:]))


def test_integer_division_never_traps() -> None:
    """WGSL's integer division: a / 0 is a, INT_MIN / -1 is INT_MIN, a % 0 is 0 (wasm's
    i32.div_s would trap on both)."""
    a = np.array([[7, -7, -2**31, -2**31, 5, 0, 9]], np.int32)
    b = np.array([[0, 2, -1, 0, -2, 0, 4]], np.int32)
    program = elementwise(lambda x, y: Binary(BinaryOp.DIVIDE, x, y), ("int32",) * 2, "int32", shape=(1, 7))
    np.testing.assert_array_equal(run_on_wasm(program, [a, b], {}), [[7, -3, -2**31, -2**31, -2, 0, 2]])
    unsigned = elementwise(lambda x, y: Binary(BinaryOp.DIVIDE, x, y), ("uint32",) * 2, "uint32", shape=(1, 7))
    np.testing.assert_array_equal(run_on_wasm(unsigned, [a.view(np.uint32), np.abs(b).astype(np.uint32)], {}),
                                  [[7, (2**32 - 7) // 2, 2**31, 2**31, 2, 0, 2]])


def test_floor_division_of_negative_operands() -> None:
    """Index ``//`` and ``%`` round toward negative infinity, by constants and by size
    variables of either sign, and by zero (a / 0 is a, a % 0 is 0: as the WGSL helpers)."""
    d = SizeVar("d")
    axis = SizeVar("i")
    value = axis - 9  # -9 .. 9
    for divisor in (IntImm(4), IntImm(-4), d):
        for kind in (FloorDiv, FloorMod):
            program = TensorProgram("index", (), Buffer("out", (19,), "int32"), (axis,), IndexValue(kind(value, divisor)))
            for d_value in ((3, -3, 0) if divisor == d else (1,)):
                actual = run_on_wasm(program, [], {"d": d_value})
                numerator = np.arange(19) - 9
                divisor_value = d_value if divisor == d else divisor.value
                if divisor_value == 0:
                    expected = numerator if kind is FloorDiv else np.zeros(19)
                else:
                    expected = numerator // divisor_value if kind is FloorDiv else numerator % divisor_value
                np.testing.assert_array_equal(actual, expected, err_msg=f"{kind.__name__} by {divisor} = {d_value}")


def test_index_division_by_a_size_variable_is_an_instruction_that_never_traps() -> None:
    """A non-negative index divided by a size variable is ``i32.div_u`` / ``i32.rem_u`` (no
    helper call), a divisor of 0 taken as 1: a / 0 is a, a % 0 is 0, as the helpers give
    (wasm's instructions would trap)."""
    d, axis = SizeVar("d"), SizeVar("i")
    for kind in (FloorDiv, FloorMod):
        program = TensorProgram("index", (), Buffer("out", (19,), "int32"), (axis,), IndexValue(kind(axis, d)))
        wat = render_program(program)
        assert "call $div_s_i32" not in wat and "call $rem_s_i32" not in wat
        assert ("i32.div_u" if kind is FloorDiv else "i32.rem_u") in wat
        numerator = np.arange(19)
        for d_value in (3, 1, 0):
            expected = (numerator if kind is FloorDiv else np.zeros(19)) if d_value == 0 else (
                numerator // d_value if kind is FloorDiv else numerator % d_value)
            np.testing.assert_array_equal(run_on_wasm(program, [], {"d": d_value}), expected)


@pytest.mark.parametrize("target", ["int32", "uint32", "int8", "uint8", "int16", "uint16", "int64", "bool", "float16",
                                    "float32"])
def test_casts_from_float(target: str) -> None:
    """Float to integer truncates toward zero and saturates; to float16 rounds to half."""
    values = np.array([[1.7, -1.7, 3e9, -3e9, 300.4, -129.5, 0.0]], np.float32)
    program = elementwise(lambda a: Cast(target, a), ("float32",), target, shape=(1, 7))
    actual = run_on_wasm(program, [values], {})
    if target == "int32":
        expected = [[1, -1, 2**31 - 1, -2**31, 300, -129, 0]]
    elif target == "int64":  # exact in kernels.wasm
        expected = [[1, -1, 3_000_000_000, -3_000_000_000, 300, -129, 0]]
    elif target == "uint32":
        expected = [[1, 0, 3_000_000_000, 0, 300, 0, 0]]
    elif target in ("int8", "uint8", "int16", "uint16"):  # the low bits of the saturated int32
        expected = np.array([[1, -1, 2**31 - 1, -2**31, 300, -129, 0]], np.int64).astype(target)
    elif target == "bool":
        expected = [[1, 1, 1, 1, 1, 1, 0]]
    else:
        expected = values.astype(target).astype(np.float32)
    np.testing.assert_array_equal(actual, np.asarray(expected).astype(actual.dtype))


@pytest.mark.parametrize("source", ["int32", "uint32", "bool", "int8"])
def test_casts_from_integers(source: str) -> None:
    values = (np.array([[1, 0, 5, 1, 0, 1, 1]], bool) if source == "bool" else
              np.array([[1, -1, 127, -128, 70000, 0, 3]]).astype(source))
    for target in ("float32", "int32", "uint32", "bool", "uint8", "float16"):
        program = elementwise(lambda a: Cast(target, a), (source,), target, shape=(1, 7))
        check_program(program, [values], {})


def test_float16_rounding() -> None:
    values = np.concatenate([rand(4, 7, low=-70000, high=70000), rand(4, 7, low=-1e-4, high=1e-4),
                             np.array([[65504, 65519, 65520, -65520, 2.0**-25, 3 * 2.0**-26, np.nan]], np.float32)])
    program = elementwise(lambda a: Cast("float16", a), ("float32",), "float32", shape=(n, 7))
    actual = run_on_wasm(program, [values], {"n": 9})
    np.testing.assert_array_equal(actual, values.astype(np.float16).astype(np.float32))


def test_gather_clamps_its_run_time_indices() -> None:
    table = Buffer("T", (4, 3), "float32")
    indices = Buffer("I", (n,), "int64")
    program = TensorProgram("gather", (table, indices), Buffer("out", (n, 3), "float32"), (i, j),
                            Gather(table, (Cast("int32", Load(indices, (i,))), j)))
    check_program(program, [rand(4, 3), np.array([0, 3, -1, 4, 2**31 - 1, -2**31], np.int64)], {"n": 6})


def test_select_evaluates_only_the_branch_it_picks() -> None:
    """A concatenation reads each input only where it is chosen: the other branch's index is
    far out of bounds (it would trap on wasm's memory if evaluated)."""
    first, second = Buffer("A", (3,), "float32"), Buffer("B", (n,), "float32")
    far = 100_000_000
    body = Select(Compare(CompareOp.LT, IndexValue(i), FloatImm(3, "int32")), Load(first, (i,)),
                  Load(second, ((i - 3) * far,)))
    program = TensorProgram("concat", (first, second), Buffer("out", (n + 3,), "float32"), (i,), body)
    actual = run_on_wasm(program, [rand(3), rand(1, seed=1)], {"n": 1})
    np.testing.assert_array_equal(actual, np.concatenate([rand(3), rand(1, seed=1)]))
    cheap = Select(Compare(CompareOp.GT, Load(first, (i,)), FloatImm(0.5)), FloatImm(1.0), FloatImm(-1.0))
    check_program(TensorProgram("sign", (first,), Buffer("out", (3,), "float32"), (i,), cheap), [rand(3)])


def test_repeated_subexpressions_and_nested_reductions() -> None:
    """A fused softmax (the row max and sum reused) and a reduction nested in another."""
    data = Buffer("A", (n, 9), "float32")
    row_max = Reduce(ReduceCombiner.MAX, k, IntImm(9), Load(data, (i, k)))
    shifted = Load(data, (i, j)) - row_max
    total = Reduce(ReduceCombiner.SUM, SizeVar("l"), IntImm(9), Load(data, (i, SizeVar("l"))) - row_max)
    program = TensorProgram("fused", (data,), Buffer("out", (n, 9), "float32"), (i, j), shifted * shifted + total)
    check_program(program, [rand(4, 9)], {"n": 4})


# -- whole modules --------------------------------------------------------------------------------


def call_sites(module, feeds: dict[str, np.ndarray], monkeypatch) -> list[tuple]:
    """Each kernel call of the module's host function in the interpreter: (program name,
    inputs, output before, output after, size variables)."""
    calls = []
    original = interpreter.run_kernel_into
    programs = {id(p): name for name, p in module.programs.items()}

    def recording(kernel, arrays, output, size_vars):
        before = np.array(output, copy=True)
        original(kernel, arrays, output, size_vars)
        calls.append((programs[id(kernel)], [np.array(a, copy=True) for a in arrays], before,
                      np.array(output, copy=True), dict(size_vars)))

    monkeypatch.setattr(interpreter, "run_kernel_into", recording)
    interpreter.run_host_function(module.main, module.programs, feeds)
    monkeypatch.undo()
    return calls


def check_module(model, feeds: dict[str, np.ndarray], monkeypatch, tolerance=F32_LOOSE,
                 wasm: WasmChange | None = None, ranges: int = 3) -> int:
    """Every call site of the compiled model: its wasm kernel (its wasm schedule changed by
    ``wasm``; its units called as ``ranges`` ranges) against the interpreter's result of that
    program.  Returns the number of call sites checked."""
    module = compile_model(model)
    if wasm is not None:
        module = module.replace(programs={name: scheduled(p, wasm) if isinstance(p, TensorProgram) else p
                                          for name, p in module.programs.items()})
    order = list(dict.fromkeys(d.program for d in module.main.dispatches))
    kernels = emit_kernels_wasm(module, [(name, {}) for name in order])
    assert isinstance(kernels, KernelsWasm), kernels
    calls = call_sites(module, feeds, monkeypatch)
    assert calls
    for name, arrays, before, after, size_vars in calls:
        program = module.programs[name]
        params = [int(evaluate(dispatch_count(program), size_vars)), *(size_vars[v.name] for v in program.size_vars)]
        # a kernel that reads its second factor prepacked gets its region, as a call site binding a weight does
        factor = kernels.prepacked.get(order.index(name))
        region = 0 if factor is None else factor.region_bytes(
            arrays[[b.name for b in program.inputs].index(factor.buffer)].shape) or 0
        actual = run_wasm_kernel(kernels.wasm, order.index(name), [device_array(a) for a in arrays],
                                 device_array(before), params, scratch_bytes=kernels.scratch_bytes, ranges=ranges,
                                 prepacked_bytes=region)
        if dtype_info(program.output.dtype).is_float:
            assert_close(actual, after.astype(np.float32), tolerance, err_msg=name)
        else:
            np.testing.assert_array_equal(actual, device_array(after), err_msg=name)
    return len(calls)


def test_mlp_module(monkeypatch) -> None:
    w1, b1, w2 = rand(16, 32, seed=1), rand(32, seed=2), rand(32, 8, seed=3)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y0"]),
         helper.make_node("ReduceMax", ["y0"], ["m"], axes=[-1], keepdims=1),
         helper.make_node("Sub", ["y0", "m"], ["y"])],
        [("x", TensorProto.FLOAT, ["batch", 16])], ["y"], {"w1": w1, "b1": b1, "w2": w2})
    assert check_module(model, {"x": rand(5, 16)}, monkeypatch) >= 2


def test_convolution_module(monkeypatch) -> None:
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Relu", ["c"], ["r"]), helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2]),
         helper.make_node("Transpose", ["p"], ["y"], perm=[0, 2, 3, 1])],
        [("x", TensorProto.FLOAT, [1, 3, 9, 9])], ["y"], {"w": rand(4, 3, 3, 3, seed=1), "b": rand(4, seed=2)})
    assert check_module(model, {"x": rand(1, 3, 9, 9)}, monkeypatch) >= 1


# The matmul-like kernels run the packed kind up to its max_depth reduction steps and the block
# path beyond: each test runs both (a capacity of 1 step sends every reduction to the blocks).
PATHS = pytest.mark.parametrize("capacity", [PANEL_DEPTH, 1], ids=["packed", "blocks"])


@PATHS
@pytest.mark.parametrize("shape_a, shape_b", [((8, 24), (24, 32)), ((9, 20), (20, 37)), ((2, 5, 7), (7, 19)),
                                              ((3, 4, 6), (3, 6, 16)), ((70, 12), (12, 40)), ((33, 3), (3, 8))])
def test_matmul_blocks(shape_a, shape_b, capacity: int, monkeypatch) -> None:
    """Matmuls in whole blocks and at the edges (of micro-kernels, panels and column blocks),
    batched, with a bias and relu epilogue."""
    change = packed(max_depth=capacity)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["s"]),
                        helper.make_node("Relu", ["s"], ["y"])], [("x", TensorProto.FLOAT, list(shape_a))], ["y"],
                       {"w": rand(*shape_b, seed=1), "bias": rand(shape_b[-1], seed=2)})
    assert check_module(model, {"x": rand(*shape_a)}, monkeypatch, wasm=change) >= 1


@PATHS
def test_matmul_with_a_transposed_weight(capacity: int, monkeypatch) -> None:
    """Gemm with transB: the second factor is read across its rows (evaluated per column)."""
    change = packed(max_depth=capacity)
    model = make_model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5)],
                       [("x", TensorProto.FLOAT, [6, 10])], ["y"], {"w": rand(20, 10, seed=1), "c": rand(20, seed=2)})
    assert check_module(model, {"x": rand(6, 10)}, monkeypatch, wasm=change) >= 1


@PATHS
@pytest.mark.parametrize("stride, pad, group, channels", [(1, 1, 1, 8), (2, 0, 1, 8), (1, 1, 2, 8), (1, 1, 1, 20),
                                                           (2, 1, 1, 32)])
def test_convolution_blocks(stride: int, pad: int, group: int, channels: int, capacity: int, monkeypatch) -> None:
    """Convolutions as blocks over output positions (few output channels) or over output
    channels read from the weight at constant distances (16 or more)."""
    change = packed(max_depth=capacity)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[pad] * 4, strides=[stride] * 2, group=group)],
                       [("x", TensorProto.FLOAT, [2, 4, 11, 10])], ["y"],
                       {"w": rand(channels, 4 // group, 3, 3, seed=1)})
    assert check_module(model, {"x": rand(2, 4, 11, 10)}, monkeypatch, wasm=change) >= 1


@PATHS
def test_convolution_with_a_fused_prologue(capacity: int, monkeypatch) -> None:
    """A 3x3 convolution of a SiLU's output (as in YOLOv8): the sigmoid and the padding's
    selects fused into its input, which the packed path evaluates once per element."""
    change = packed(max_depth=capacity)
    model = make_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["a"]),
                        helper.make_node("Conv", ["a", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Sigmoid", ["c"], ["t"]), helper.make_node("Mul", ["c", "t"], ["y"])],
                       [("x", TensorProto.FLOAT, [1, 6, 9, 7])], ["y"], {"w": rand(24, 6, 3, 3, seed=1),
                                                                          "b": rand(24, seed=2)})
    assert check_module(model, {"x": rand(1, 6, 9, 7)}, monkeypatch, wasm=change) >= 1


@pytest.mark.parametrize("kernel, pad, width", [(3, 1, 12), (3, 1, 10), (5, 2, 9), (1, 0, 8), (3, 0, 13)])
def test_convolution_input_packed_four_positions_at_a_time(kernel: int, pad: int, width: int, monkeypatch) -> None:
    """A stride-1 convolution of a per-channel scale and a SiLU (fused into its input): the
    packed path evaluates four output positions on one row as f32x4 where the window is
    inside the input (the scale a splat), lane by lane at the padded borders, one by one
    across a row's end (widths 10, 9, 13 are no multiple of 4)."""
    model = make_model([helper.make_node("Mul", ["x", "scale"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
                        helper.make_node("Mul", ["m", "s"], ["a"]),
                        helper.make_node("Conv", ["a", "w", "b"], ["y"], pads=[pad] * 4)],
                       [("x", TensorProto.FLOAT, [1, 5, 7, width])], ["y"],
                       {"scale": rand(5, 1, 1, seed=3), "w": rand(24, 5, kernel, kernel, seed=1), "b": rand(24, seed=2)})
    module = compile_model(model)
    assert any("$interior_" in render_program(program) for program in module.programs.values())
    assert check_module(model, {"x": rand(1, 5, 7, width)}, monkeypatch) >= 1


@pytest.mark.parametrize("kernel, stride, pad, width", [(3, 2, 1, 17), (3, 2, 1, 16), (7, 2, 3, 23), (1, 2, 0, 15),
                                                         (3, 3, 1, 20), (2, 2, 0, 9)])
@pytest.mark.parametrize("symbolic", [False, True], ids=["fixed", "symbolic"])
def test_strided_convolution_input_packed_four_positions_at_a_time(kernel: int, stride: int, pad: int, width: int,
                                                                   symbolic: bool, monkeypatch) -> None:
    """A strided convolution (ResNet's and YOLOv8n's stems and downsamples): the packed path
    evaluates four output positions on one row as f32x4, reading every second input element
    with two loads and a shuffle at stride 2 (one by one at stride 3), lane by lane at the
    padded borders, one by one across a row's end; a ReLU epilogue; height and width fixed
    or size variables.  Stride 2 without padding (kernel 2) reads the last input column."""
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, strides=[stride] * 2),
                        helper.make_node("Relu", ["c"], ["y"])],
                       [("x", TensorProto.FLOAT, [1, 5, "h", "w"] if symbolic else [1, 5, 11, width])], ["y"],
                       {"w": rand(12, 5, kernel, kernel, seed=1), "b": rand(12, seed=2)})
    text = "".join(render_program(program) for program in compile_model(model).programs.values())
    assert "$interior_" in text
    assert ("(i8x16.shuffle 0 1 2 3 8 9 10 11 20 21 22 23 28 29 30 31" in text) == (stride == 2)
    assert check_module(model, {"x": rand(1, 5, 11, width)}, monkeypatch) >= 1


@PATHS
def test_matmuls_with_fused_prologues(capacity: int, monkeypatch) -> None:
    """Matmuls of a layer norm's and of a tanh's output (as in GPT-2), fused into their
    inputs: the packed path evaluates them four reduction steps at a time (K = 22: two
    steps one by one at the end)."""
    change = packed(max_depth=capacity)
    model = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
                        helper.make_node("MatMul", ["n", "w1"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
                        helper.make_node("Mul", ["h", "t"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["y"])],
                       [("x", TensorProto.FLOAT, [2, 7, 22])], ["y"],
                       {"g": rand(22, seed=1), "b": rand(22, seed=2), "w1": rand(22, 22, seed=3),
                        "w2": rand(22, 12, seed=4)})
    assert check_module(model, {"x": rand(2, 7, 22)}, monkeypatch, wasm=change) >= 2


def gelu_matmul_model(rows, depth: int, columns: int, *, bias: bool = True, transposed: bool = False):
    """BERT's FFN down in small: ``(x + b)`` (or ``x``), its exact GELU through Erf nodes, fused
    into a matmul's first factor; ``transposed``: the factor read as ``x``'s transpose."""
    nodes, source = [], "x"
    if transposed:
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]))
        source = "xt"
    if bias:
        nodes.append(helper.make_node("Add", [source, "b"], ["h"]))
        source = "h"
    nodes += [helper.make_node("Div", [source, "root2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
              helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", [source, "e1"], ["g0"]),
              helper.make_node("Mul", ["g0", "half"], ["g"]), helper.make_node("MatMul", ["g", "w"], ["y"])]
    shape = [depth, rows] if transposed else [rows, depth]
    constants = {"root2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
                 "half": np.array(0.5, np.float32), "w": rand(depth, columns, seed=4)}
    if bias:
        constants["b"] = rand(depth, seed=5)
    return make_model(nodes, [("x", TensorProto.FLOAT, shape)], ["y"], constants)


def gelu_inputs(rows: int, depth: int) -> np.ndarray:
    """Inputs over erf's ranges: |x / sqrt 2| below 0.75 and above (2, 5, past 10), and in the
    last row infinities, a NaN and zeros."""
    x = rand(rows, depth, seed=7, low=-1.0, high=1.0)
    x[1::3] *= 3.0
    x[2::3] *= 16.0
    if rows > 4:
        x[-1, :4] = [np.inf, -np.inf, np.nan, 0.0]
    return x


@PATHS
@pytest.mark.parametrize("rows", [9, 16])
@pytest.mark.parametrize("bias", [True, False])
def test_matmul_of_a_gelu_packed_as_f32x4(rows: int, bias: bool, capacity: int, monkeypatch) -> None:
    """The exact GELU (erf: polynomials, a select on |x|, exp) fused into a matmul's first
    factor is packed four rows at a time as one f32x4 evaluation (the bias a lane
    invariant); 9 rows leave one packed by the scalar path.  Every erf range, infinities and
    a NaN match the interpreter."""
    change = packed(max_depth=capacity)
    model = gelu_matmul_model(rows, 22, 12, bias=bias)
    if capacity == PANEL_DEPTH:
        module = compile_model(model)
        assert any("four lanes as one f32x4" in render_program(p) for p in module.programs.values())
    assert check_module(model, {"x": gelu_inputs(rows, 22)}, monkeypatch, wasm=change) >= 1


@pytest.mark.parametrize("rows", [6, 13])
def test_matmul_of_a_gelu_of_symbolic_size(rows: int, monkeypatch) -> None:
    """Rows a size variable (BERT's batch x sequence): the four-lane form up to the last
    multiple of 4 below the run-time count, the rest lane by lane."""
    model = gelu_matmul_model("tokens", 22, 12)
    assert check_module(model, {"x": gelu_inputs(rows, 22)}, monkeypatch) >= 1


def test_matmul_of_a_transposed_gelu_reads_four_rows_at_once(monkeypatch) -> None:
    """The factor's rows contiguous in memory (a transposed input): one ``v128.load`` a step."""
    model = gelu_matmul_model(11, 20, 8, transposed=True)
    module = compile_model(model)
    texts = [render_program(p) for p in module.programs.values()]
    assert any("four lanes as one f32x4 a step (0 loads lane by lane, 1 contiguous" in t for t in texts)
    assert check_module(model, {"x": gelu_inputs(11, 20).T.copy()}, monkeypatch) >= 1


def test_lane_vectors_fall_back() -> None:
    """A select whose branch loads what nothing reads unconditionally (a padding guard), an
    integer op on the lanes and a bare load read lane by lane keep the scalar path."""
    rows, depth = SizeVar("rows"), SizeVar("depth")
    x = Buffer("X", (rows, depth), "float32")
    element = Load(x, (i, k))
    guarded = Select(Compare(CompareOp.LT, IndexValue(i), IndexValue(IntImm(3))), element, FloatImm(0.0))
    assert lane_vectors(guarded, (i,), (rows,)) is None
    assert lane_vectors(element, (i,), (rows,)) is None
    cast = Cast("float32", IndexValue(i))
    assert lane_vectors(element * cast, (i,), (rows,)) is None
    erf_like = Select(Compare(CompareOp.LT, element, FloatImm(0.0)), -element, element) * FloatImm(2.0)
    vectors = lane_vectors(erf_like, (i,), (rows,))
    assert vectors is not None and vectors.gathered == (element,)


@PATHS
def test_convolution_of_symbolic_size(capacity: int, monkeypatch) -> None:
    """A strided convolution whose height and width are size variables: the output's extents
    ((height + pad - 3) // 2 + 1) are computed once at the kernel's start, from the params."""
    change = packed(max_depth=capacity)
    model = make_model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["a"]),
                        helper.make_node("Conv", ["a", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
                       [("x", TensorProto.FLOAT, [1, 5, "h", "w"])], ["y"], {"w": rand(12, 5, 3, 3, seed=1)})
    assert check_module(model, {"x": rand(1, 5, 13, 10)}, monkeypatch, wasm=change) >= 1


@pytest.mark.parametrize("rows, panel_a_bytes", [(293, PACKED.panel_bytes), (293, 4 * 32 * 12 * 3),
                                                  (40, PACKED.panel_bytes)])
def test_matmul_units_of_several_panels(rows: int, panel_a_bytes: int, monkeypatch) -> None:
    """A packed unit holds several 32-row panels (about 8 units, as many panels as
    packed kind's ``panel_bytes`` holds: here 2, or 3 when it holds only 3 at K = 12), the last
    partial; the second factor is copied per column block (37 columns: a block at the edge
    packed), the bias and ReLU applied four columns at a time (one by one at the edge); rows
    symbolic."""
    change = packed(panel_bytes=panel_a_bytes)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["s"]),
                        helper.make_node("Relu", ["s"], ["y"])], [("x", TensorProto.FLOAT, ["n", 12])], ["y"],
                       {"w": rand(12, 37, seed=1), "bias": rand(37, seed=2)})
    [program] = [scheduled(p, change) for p in compile_model(model).programs.values() if "$copy" in render_program(p)]
    assert "(v128.store (local.get $address" in render_program(program)  # the epilogue four columns at a time
    panels = -(-rows // 32)
    group = max(1, min(-(-panels // PACKED.units_wanted), panel_a_bytes // (4 * 32 * 12)))
    slices = 1
    if panels < PACKED.units_wanted:  # few rows of a weight: all in one group, the columns split
        group, slices = panels, min(PACKED.units_wanted, -(-37 // PACKED.panel_columns))
    assert units_of(program, {"n": rows}) == -(-rows // (32 * group)) * slices
    assert check_module(model, {"x": rand(rows, 12)}, monkeypatch, wasm=change) >= 1


@pytest.mark.parametrize("rows, depth, columns, split_bytes", [
    (128, 24, 200, PACKED.split_bytes),  # 4 panels in one group, 8 slices of 32 columns (the last 8)
    (70, 12, 37, PACKED.split_bytes),  # 3 panels (the last partial), 5 slices of one block (the last partial)
    (12, 16, 20, PACKED.split_bytes),  # one partial panel, 3 slices (the last partial)
    (128, 24, 200, 4 * 32 * 24 * 2),  # 2 panels fit: 2 row groups of 4 slices
    (300, 12, 37, PACKED.split_bytes),  # 10 panels: not few, units of rows only
])
def test_matmul_of_a_weight_split_by_columns(rows: int, depth: int, columns: int, split_bytes: int,
                                             monkeypatch) -> None:
    """With few rows (fewer panels than ``units_wanted``) and a weight as the second factor, the
    packed kind's units take all the rows (as many panels as its ``split_bytes`` holds) and a
    slice of the columns, each starting on a column block (so each copies its part of the
    weight once); rows symbolic, the bias and ReLU epilogue four columns at a time."""
    change = packed(split_bytes=split_bytes)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["s"]),
                        helper.make_node("Relu", ["s"], ["y"])], [("x", TensorProto.FLOAT, ["n", depth])], ["y"],
                       {"w": rand(depth, columns, seed=1), "bias": rand(columns, seed=2)})
    [program] = [scheduled(p, change) for p in compile_model(model).programs.values() if "$copy" in render_program(p)]
    assert "$slice_columns" in render_program(program)
    panels, blocks = -(-rows // 32), -(-columns // PACKED.panel_columns)
    if panels < PACKED.units_wanted:
        group = max(1, min(panels, split_bytes // (4 * 32 * depth)))
        groups = -(-panels // group)
        units = groups * min(-(-PACKED.units_wanted // groups), blocks)
    else:
        units = -(-panels // max(1, min(-(-panels // PACKED.units_wanted), PACKED.panel_bytes // (4 * 32 * depth))))
    assert units_of(program, {"n": rows}) == units
    assert check_module(model, {"x": rand(rows, depth)}, monkeypatch, wasm=change) >= 1


@pytest.mark.parametrize("ranges", [1, 2, 4])
def test_a_calls_consecutive_units_of_one_batch_index_run_together(ranges: int, monkeypatch) -> None:
    """A call of several units of a packed matmul takes its consecutive row groups of one batch
    index together (the second factor packed once for them), never across a batch index: 3
    batch indices of 3 row groups, their 9 units called in 1, 2 or 4 ranges; and with a
    weight, its consecutive column slices of one row group."""
    model = make_model([helper.make_node("MatMul", ["x", "v"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                       [("x", TensorProto.FLOAT, ["b", "n", 12]), ("v", TensorProto.FLOAT, ["b", 12, 20])], ["y"])
    [program] = [p for p in compile_model(model).programs.values() if "$panel" in render_program(p)]
    assert units_of(program, {"b": 3, "n": 70}) == 9
    assert check_module(model, {"x": rand(3, 70, 12), "v": rand(3, 12, 20, seed=1)}, monkeypatch, ranges=ranges) >= 1
    weight = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["b", "n", 16])],
                        ["y"], {"w": rand(16, 44, seed=2)})
    assert check_module(weight, {"x": rand(3, 21, 16)}, monkeypatch, ranges=ranges) >= 1


def test_batched_matmul_of_a_weight_split_by_columns(monkeypatch) -> None:
    """A weight shared by the batch indices of a 3-D first factor (batch and rows symbolic):
    units of (batch index or row group, column slice) where the rows are few."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["bias", "m"], ["y"])],
                       [("x", TensorProto.FLOAT, ["b", "n", 16])], ["y"],
                       {"w": rand(16, 44, seed=1), "bias": rand(44, seed=2)})
    assert check_module(model, {"x": rand(3, 21, 16)}, monkeypatch) >= 1
    assert check_module(model, {"x": rand(1, 70, 16)}, monkeypatch) >= 1


@pytest.mark.parametrize("rows", [40, 128])
def test_projection_into_heads_split_by_columns(rows: int, monkeypatch) -> None:
    """BERT's query projection in small: the output [batch, heads, tokens, 8] (two column
    axes, the weight's flat columns contiguous), tokens symbolic; its column slices of 8
    blocks each fall across the heads."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["bias", "m"], ["s"]),
                        helper.make_node("Reshape", ["s", "heads"], ["r"]),
                        helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])],
                       [("x", TensorProto.FLOAT, [1, "n", 24])], ["y"],
                       {"w": rand(24, 72, seed=1), "bias": rand(72, seed=2),
                        "heads": np.array([1, -1, 9, 8], np.int64)})
    assert any("$slice_columns" in render_program(p) for p in compile_model(model).programs.values())
    assert check_module(model, {"x": rand(1, rows, 24)}, monkeypatch) >= 1


@pytest.mark.parametrize("rows", [40, 128])
def test_matmul_of_a_layer_norm_split_by_columns(rows: int, monkeypatch) -> None:
    """GPT-2's matmuls that read a layer norm in small (its LM head, its QKV and FFN
    projections): the normalization's few operations are packed once per column slice
    (``matmul_layout.cheap_to_pack``), so the units split the weight's columns."""
    model = make_model([helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], axis=-1, epsilon=1e-5),
                        helper.make_node("MatMul", ["n", "w"], ["y"])],
                       [("x", TensorProto.FLOAT, [1, "t", 24])], ["y"],
                       {"gamma": rand(24, seed=1), "beta": rand(24, seed=2), "w": rand(24, 70, seed=3)})
    module = compile_model(model)
    assert any("$slice_columns" in render_program(p) for p in module.programs.values()
               if isinstance(p, TensorProgram) and "matmul" in p.name)
    assert check_module(model, {"x": rand(1, rows, 24)}, monkeypatch) >= 1


def test_column_split_only_where_the_first_factor_is_cheap_to_pack(monkeypatch) -> None:
    """No column split where the first factor is not cheap to pack (a GELU prologue would be
    evaluated once per slice); a second factor that is not a weight (an activation of
    symbolic shape: a matmul of two inputs) splits like one, its slices' columns packed
    from wherever they start, at few rows (12: one panel, 8 slices) and at many (no split)."""
    gelu = compile_model(gelu_matmul_model("n", 16, 24))
    assert not any("$slice_columns" in render_program(p) for p in gelu.programs.values())
    model = make_model([helper.make_node("MatMul", ["x", "z"], ["y"])],
                       [("x", TensorProto.FLOAT, ["n", 16]), ("z", TensorProto.FLOAT, [16, "m"])], ["y"], {})
    assert any("$slice_columns" in render_program(p) for p in compile_model(model).programs.values())
    for rows, columns in ((12, 301), (40, 30)):
        assert check_module(model, {"x": rand(rows, 16), "z": rand(16, columns, seed=3)}, monkeypatch) >= 1


def test_convolution_window_steps_written_out_or_looped(monkeypatch) -> None:
    """The packing of a padded 3x3 convolution's input over 4 channels (32 output channels: the
    input is the first factor) loops over the channels, the window's rows and its columns
    (``unroll_steps`` 1), writes out the columns (3) or the window's 9 steps (9, the default),
    the channels looped; every form packs the same panel."""
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       [("x", TensorProto.FLOAT, [1, 4, 9, 10])], ["y"], {"w": rand(32, 4, 3, 3, seed=1)})
    loops = {}
    for unroll in (1, 3, 9):
        change = packed(unroll_steps=unroll)
        [program] = [scheduled(p, change) for p in compile_model(model).programs.values()
                     if isinstance(p, TensorProgram) and "conv" in p.name]
        loops[unroll] = render_program(program).count("(loop $step_p")
        assert check_module(model, {"x": rand(1, 4, 9, 10)}, monkeypatch, wasm=change) >= 1
    # the packings' window column loops are gone at 3, and their row loops too at 9
    assert loops[1] > loops[3] > loops[9], loops


def test_convolution_weight_packed_once_per_unit_of_panels(monkeypatch) -> None:
    """A padded 3x3 convolution over 40 x 39 output positions (rows: 49 panels, 7 a unit,
    the last partial) and 20 output channels (a column block at the edge), its weight packed
    once per unit; a SiLU epilogue along the channels, element by element."""
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Sigmoid", ["c"], ["t"]), helper.make_node("Mul", ["c", "t"], ["y"])],
                       [("x", TensorProto.FLOAT, [1, 3, 40, 39])], ["y"], {"w": rand(20, 3, 3, 3, seed=1),
                                                                           "b": rand(20, seed=2)})
    assert check_module(model, {"x": rand(1, 3, 40, 39)}, monkeypatch) >= 1


def window_programs(model) -> list[str]:
    """The names of the model's programs that render as sliding windows (``render_window``)."""
    module = compile_model(model)
    return [name for name, program in module.programs.items()
            if isinstance(program, TensorProgram) and isinstance(program.schedule.wasm, WindowSchedule)]


def depthwise(channels: int, kernel: int, stride: int, pad: int, shape, activation: str | None = None,
              residual: bool = False):
    """A depthwise convolution with a bias, then an activation and / or a residual add."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[pad] * 4, strides=[stride] * 2, group=channels)]
    last = "c"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["a"]))
        last = "a"
    if residual:
        nodes.append(helper.make_node("Add", [last, "x"], ["r"]))
        last = "r"
    nodes[-1].output[0] = "y"
    return make_model(nodes, [("x", TensorProto.FLOAT, list(shape))], ["y"],
                      {"w": rand(channels, 1, kernel, kernel, seed=1, low=-1.0), "b": rand(channels, seed=2)})


def border_form(masked: bool) -> WasmChange:
    """A window's wasm schedule with its borders masked (the default) or tested at every step."""
    def change(schedule: WasmSchedule) -> WasmSchedule:
        return replace(schedule, masked_borders=masked) if isinstance(schedule, WindowSchedule) else schedule
    return change


@pytest.mark.parametrize("masked", [True, False], ids=["masked borders", "borders tested per step"])
@pytest.mark.parametrize("kernel, stride, pad, height, width, activation", [
    (3, 1, 1, 6, 16, "Relu"),  # two wide iterations a row, borders masked
    (3, 1, 1, 5, 9, None),  # a wide iteration, then four positions overlapping it
    (5, 1, 2, 7, 7, "HardSwish"),  # MobileNetV3's 7x7 layers: every iteration at a border
    (3, 2, 1, 9, 13, "Relu"),  # stride 2: two loads and a shuffle
    (5, 2, 2, 11, 11, "HardSwish"),
    (3, 3, 0, 8, 26, None),  # stride 3: lane by lane loads, no padding (no guards)
    (3, 1, 0, 8, 19, None),
    (3, 1, 1, 6, 4, "Relu"),  # a row of exactly four
    (7, 1, 3, 9, 12, "Relu"),  # a window wider than four lanes' reach
    (3, 1, 2, 6, 5, None),  # more padding than the kernel's half: lanes inside only in the middle
])
def test_depthwise_convolution_windows(kernel: int, stride: int, pad: int, height: int, width: int, activation,
                                       masked: bool, monkeypatch) -> None:
    """Depthwise convolutions run as sliding windows along each output row (eight, then four
    positions at a time): inside the padding, at its borders (each step's lanes masked, or
    tested at every step: masked lanes, or lane by lane), at strides 1, 2 and 3, with a
    fused epilogue."""
    model = depthwise(3, kernel, stride, pad, (2, 3, height, width), activation)
    [name] = window_programs(model)
    text = render_program(compile_model(model).programs[name], wasm=border_form(masked))
    assert ("(local $mask0 v128)" in text) == (masked and pad > 0 and kernel <= 8), "masks where there are borders"
    assert check_module(model, {"x": rand(2, 3, height, width, low=-1.0)}, monkeypatch, wasm=border_form(masked)) >= 1


@pytest.mark.parametrize("masked", [True, False], ids=["masked borders", "borders tested per step"])
@pytest.mark.parametrize("kernel, stride, pad, height, width, symbolic", [
    (3, 2, 1, 13, 17, False),  # ResNet's 3x3 stride-2 max pool: two loads and a shuffle, borders
    (3, 2, 1, 12, 12, True),
    (5, 1, 2, 10, 10, False),  # YOLOv8n's SPPF: 5x5 stride 1, every iteration at a border
    (2, 2, 0, 8, 20, False),  # no padding (no guards)
    (3, 3, 1, 9, 25, False),  # stride 3: lane by lane loads
    (3, 1, 1, 7, 9, True),  # symbolic: masked border lanes
    (3, 1, 1, 5, 3, True),  # rows shorter than four: the element form
])
def test_max_pool_windows(kernel: int, stride: int, pad: int, height: int, width: int, symbolic: bool,
                          masked: bool, monkeypatch) -> None:
    """Max pools run as sliding windows (f32x4.max from -inf): the padding's fill (the lowest
    float) is skipped like a convolution's zeros, the masked border lanes select -inf; all
    values negative, so a padded position taken for 0 would show."""
    shape = [1, 3, "h", "w"] if symbolic else [1, 3, height, width]
    model = make_model([helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[kernel] * 2, strides=[stride] * 2,
                                         pads=[pad] * 4), helper.make_node("Relu", ["p"], ["r"]),
                        helper.make_node("Sub", ["p", "r"], ["y"])],  # min(p, 0): an epilogue on the maxima
                       [("x", TensorProto.FLOAT, shape)], ["y"], {})
    assert window_programs(model)
    x = rand(1, 3, height, width, low=-2.0) - 1.5
    assert check_module(model, {"x": x}, monkeypatch, wasm=border_form(masked)) >= 1


def test_min_reduction_window(monkeypatch) -> None:
    """A ReduceMin over a middle axis (no guards) slides along the last axis as a window of
    f32x4.min from +inf (eight positions, then the last four, overlapping)."""
    model = make_model([helper.make_node("ReduceMin", ["x"], ["y"], axes=[1], keepdims=0)],
                       [("x", TensorProto.FLOAT, [2, 5, 11])], ["y"], {})
    assert window_programs(model)
    x = rand(2, 5, 11, low=-1.0)
    assert check_module(model, {"x": x}, monkeypatch) >= 1


def test_depthwise_window_masks_lanes_past_the_row(monkeypatch) -> None:
    """Masked border lanes read past their row (the row before's last column, here +inf):
    their values are dropped, not multiplied by 0 (inf * 0 would be NaN)."""
    model = depthwise(2, 3, 1, 1, (1, 2, 5, 10), None)
    x = rand(1, 2, 5, 10, low=-1.0)
    x[..., -1] = np.inf
    assert window_programs(model)
    assert check_module(model, {"x": x}, monkeypatch) >= 1


def test_depthwise_window_with_a_residual_add(monkeypatch) -> None:
    """An epilogue reading another tensor along the row (a residual add): ``v128.load``s."""
    model = depthwise(4, 3, 1, 1, (1, 4, 6, 11), "Relu", residual=True)
    assert window_programs(model)
    assert check_module(model, {"x": rand(1, 4, 6, 11, low=-1.0)}, monkeypatch) >= 1


@pytest.mark.parametrize("height, width", [(9, 10), (5, 3), (4, 1), (6, 4)])
def test_depthwise_window_of_symbolic_size(height: int, width: int, monkeypatch) -> None:
    """Height and width are size variables: rows shorter than four run the element form
    (chosen at run time), the others the window."""
    model = depthwise(3, 3, 1, 1, (1, 3, "h", "w"), "HardSwish")
    assert window_programs(model)
    assert check_module(model, {"x": rand(1, 3, height, width, low=-1.0)}, monkeypatch) >= 1


def test_depthwise_windows_of_shared_kernel_sizes(monkeypatch) -> None:
    """A 3x3, a 5x5 and a 4x4 depthwise convolution of one program (``share_programs`` makes
    the kernel size and padding size variables): the innermost steps unrolled for 3 and 5,
    chosen at run time, and looped for 4."""
    nodes = [helper.make_node("Conv", ["x", "w3", "b"], ["c3"], pads=[1] * 4, group=4),
             helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("Conv", ["r3", "w5", "b"], ["c5"], pads=[2] * 4, group=4),
             helper.make_node("Relu", ["c5"], ["r5"]),
             helper.make_node("Conv", ["r5", "w4", "b"], ["c4"], pads=[1] * 4, group=4),
             helper.make_node("Relu", ["c4"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 4, 10, 12])], ["y"],
                       {"w3": rand(4, 1, 3, 3, seed=1, low=-1.0), "w5": rand(4, 1, 5, 5, seed=2, low=-1.0),
                        "w4": rand(4, 1, 4, 4, seed=3, low=-1.0), "b": rand(4, seed=4)})
    [name] = window_programs(model)
    module = compile_model(model)
    assert [d.program for d in module.main.dispatches] == [name] * 3
    assert module.programs[name].size_vars
    text = render_program(module.programs[name])
    assert "(i32.const 3))" in text and "(i32.const 5))" in text and "(loop $step_" in text
    assert check_module(model, {"x": rand(1, 4, 10, 12, low=-1.0)}, monkeypatch) == 3


def test_grouped_convolution_window(monkeypatch) -> None:
    """A grouped convolution (two input channels a group: a reduction over channels too)."""
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, group=2)],
                       [("x", TensorProto.FLOAT, [1, 4, 7, 9])], ["y"], {"w": rand(6, 2, 3, 3, seed=1, low=-1.0)})
    assert window_programs(model)
    assert check_module(model, {"x": rand(1, 4, 7, 9, low=-1.0)}, monkeypatch) >= 1


def test_window_of_a_sum_over_rows(monkeypatch) -> None:
    """A sum over a middle axis reads the output's last axis contiguously: a window of no
    guards; a sum along the last axis, or an output row shorter than four, is not one."""
    over_rows = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                           [("x", TensorProto.FLOAT, [3, 5, 10])], ["y"], {"axes": np.array([1], np.int64)})
    assert window_programs(over_rows)
    assert check_module(over_rows, {"x": rand(3, 5, 10)}, monkeypatch) >= 1
    along = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                       [("x", TensorProto.FLOAT, [3, 5, 10])], ["y"], {"axes": np.array([2], np.int64)})
    assert not window_programs(along)
    assert not window_programs(depthwise(2, 3, 1, 1, (1, 2, 5, 3)))


@pytest.mark.parametrize("kernel, channels, width", [(3, 20, 9), (3, 16, 8), (5, 24, 5)])
def test_convolution_weight_gathered_a_step_at_a_time(kernel: int, channels: int, width: int, monkeypatch) -> None:
    """A convolution's weight [O, C, kh, kw] (its reduction contiguous, the output channels
    a constant distance apart) gathered into the panel a reduction step at a time for a whole
    column block of 8 channels ($gather), packed element by element at the edge (20
    channels: 8, 8, then 4); 49 and 45 output positions (first-factor panels packed as strips
    of 4 rows, the last strip and panel partial)."""
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[kernel // 2] * 4),
                        helper.make_node("Relu", ["c"], ["y"])],
                       [("x", TensorProto.FLOAT, [1, 6, 7, width])], ["y"],
                       {"w": rand(channels, 6, kernel, kernel, seed=1), "b": rand(channels, seed=2)})
    [program] = [p for p in compile_model(model).programs.values() if "$pack_panels" in render_program(p)]
    assert "$gather" in render_program(program) and "(loop $transposed" in render_program(program)
    assert check_module(model, {"x": rand(1, 6, 7, width)}, monkeypatch) >= 1


@pytest.mark.parametrize("depth", [13, 15, 16])
def test_columns_a_size_variable_apart_gathered_from_strided_addresses(depth: int, monkeypatch) -> None:
    """A matmul of a transposed second factor of symbolic row length (its columns ``k``
    elements apart, its reduction contiguous): no constant distances, so each block of 8
    columns is gathered from addresses ``k`` elements apart ($gather_stride2: the distances
    computed once a block), the partial last block (19 columns: 8, 8, then 3) packed
    element by element."""
    model = make_model([helper.make_node("Transpose", ["w"], ["t"], perm=[1, 0]),
                        helper.make_node("MatMul", ["x", "t"], ["y"])],
                       [("x", TensorProto.FLOAT, [40, "k"]), ("w", TensorProto.FLOAT, [19, "k"])], ["y"])
    [program] = [p for p in compile_model(model).programs.values() if "$pack_panels" in render_program(p)]
    assert "(loop $gather" in render_program(program) and "$gather_stride2" in render_program(program)
    assert "(loop $transposed" in render_program(program)  # four steps at a time while four remain
    assert check_module(model, {"x": rand(40, depth), "w": rand(19, depth, seed=1)}, monkeypatch) >= 1


@pytest.mark.parametrize("kernel, stride, size", [(3, 1, (7, 9)), (1, 2, (17, 19))])
def test_shared_convolution_program_gathers_its_weight(kernel: int, stride: int, size: tuple[int, int],
                                                       monkeypatch) -> None:
    """Two convolutions of 6 and 20 input channels share one program (``share_programs``: the
    channel count a size variable), so the weight's output channels are a size variable
    apart: gathered from strided addresses a whole block of 8 at a time, not packed element
    by element (20 output channels: two whole blocks, then 4 packed).  Padded 3x3: the input
    the rows as it is; strided 1x1: the factors swap as with constant channel counts (the
    strided input packed once as the rows, the weight the gathered second factor)."""
    attributes = {"pads": [kernel // 2] * 4, "strides": [stride] * 2}
    nodes = [helper.make_node("Conv", ["x", "w1", "b"], ["c1"], **attributes), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b"], ["c2"], **attributes), helper.make_node("Relu", ["c2"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 6, *size])], ["y"],
                       {"w1": rand(20, 6, kernel, kernel, seed=1, low=-1.0),
                        "w2": rand(20, 20, kernel, kernel, seed=2, low=-1.0), "b": rand(20, seed=3)})
    module = compile_model(model)
    [program] = [p for p in module.programs.values() if "$pack_panels" in render_program(p)]
    assert [d.program for d in module.main.dispatches].count(program.name) == 2
    assert "$gather_stride2" in render_program(program)
    assert check_module(model, {"x": rand(1, 6, *size, low=-1.0)}, monkeypatch) >= 1


@pytest.mark.parametrize("residual_shape, vector", [((1, 40, 6, 7), True), ((1, 40, 1, 7), False)])
def test_convolution_epilogue_four_positions_at_a_time(residual_shape, vector: bool, monkeypatch) -> None:
    """A 1x1 convolution (its output positions [H, W] the columns) with a bias, a residual
    add and ReLU: the epilogue four flat positions at a time (42 per channel: quads across
    a row's end of 7, one by one past the last whole quad of a block), the residual one
    ``v128.load``; a residual broadcast along H is not contiguous in the flat position, so
    that epilogue runs element by element."""
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Add", ["c", "r"], ["s"]),
                        helper.make_node("Relu", ["s"], ["y"])],
                       [("x", TensorProto.FLOAT, [1, 12, 6, 7]), ("r", TensorProto.FLOAT, list(residual_shape))], ["y"],
                       {"w": rand(40, 12, 1, 1, seed=1), "b": rand(40, seed=2)})
    [program] = [p for p in compile_model(model).programs.values() if "$pack_panels" in render_program(p)]
    assert ("$yq" in render_program(program)) == vector
    assert check_module(model, {"x": rand(1, 12, 6, 7), "r": rand(*residual_shape, seed=4)}, monkeypatch) >= 1


@pytest.mark.parametrize("batch, height, width", [(1, 6, 7), (2, 5, 5), (1, 1, 3)])
def test_convolution_epilogue_four_rows_at_a_time(batch: int, height: int, width: int, monkeypatch) -> None:
    """A padded 3x3 convolution (its output positions [H, W] the rows: its input the first
    factor, the weight the second) with a bias, a residual add and SiLU: the epilogue takes
    four flat positions of each output channel at a time ($yv: the bias splatted, the
    residual one ``v128.load``), the positions past the last whole four of a panel one by one
    (42 = 32 + 10 per channel; 3 positions: none whole), per batch index."""
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
                        helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Sigmoid", ["s"], ["g"]),
                        helper.make_node("Mul", ["s", "g"], ["y"])],
                       [("x", TensorProto.FLOAT, ["n", 6, "h", "w"]), ("r", TensorProto.FLOAT, ["n", 40, "h", "w"])],
                       ["y"], {"w": rand(40, 6, 3, 3, seed=1), "b": rand(40, seed=2)})
    [program] = [p for p in compile_model(model).programs.values() if "$pack_panels" in render_program(p)]
    assert "$yv" in render_program(program) and "$yq" not in render_program(program)
    assert check_module(model, {"x": rand(batch, 6, height, width), "r": rand(batch, 40, height, width, seed=4)},
                        monkeypatch) >= 1


@pytest.mark.parametrize("batch, stride, copied", [(1, 1, True), (2, 1, True), (3, 2, False), (1, 3, False)])
def test_one_by_one_convolution_input_copied_in_place(batch: int, stride: int, copied: bool, monkeypatch) -> None:
    """A 1x1 convolution of symbolic batch, height and width: its input rows of output
    positions [H, W] (the flat columns past the batch axis, a column axis too) are copied a
    block of 8 at a time ($copy) where a block lies within one batch index (6 x 7 = 42
    positions: blocks 0..39 copied, 40..47 across the batch's end packed element by element,
    as the last partial block); with stride 2 the positions are not consecutive elements,
    so the factors swap (``relaxweb.ir.matmul_layout.cheap_columns``): the input packed once as the
    rows, the weight gathered (44 channels: 5 whole blocks, the sixth packed).  Unswapped,
    the bias and ReLU apply to four positions at a time where they lie within one batch
    index (the flat positions past the batch axis), else one by one."""
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[stride] * 2),
                        helper.make_node("Relu", ["c"], ["y"])],
                       [("x", TensorProto.FLOAT, ["n", 12, "h", "w"])], ["y"],
                       {"w": rand(44, 12, 1, 1, seed=1), "b": rand(44, seed=2)})
    [program] = [p for p in compile_model(model).programs.values() if "$pack_panels" in render_program(p)]
    assert ("(loop $copy" in render_program(program)) == copied
    # the epilogue four positions at a time within one batch index; strided, the factors
    # swapped: the positions the rows, the weight gathered 8 output channels at a time
    assert ("$yq" in render_program(program)) == copied
    assert ("$gather" in render_program(program)) == (not copied)
    size = 6 * stride - stride + 1
    assert check_module(model, {"x": rand(batch, 12, size, 7 * stride - stride + 1)}, monkeypatch) >= 1


@pytest.mark.parametrize("inputs, width, pad, branched", [(2, 8, 0, True), (3, 10, 0, True), (2, 13, 0, True),
                                                           (2, 8, 1, False)])
def test_convolution_of_a_concatenation_packed_four_positions_at_a_time(inputs: int, width: int, pad: int,
                                                                        branched: bool, monkeypatch) -> None:
    """A 1x1 convolution (SiLU after) of a channel concatenation (YOLOv8's C2f: inputs of 5, 3
    and 4 channels), symbolic batch, height and width: the packed path reads four positions
    of one row as one f32x4 from the input the channel's select chooses ($branched_, only
    that input read: the others' channel index is out of range), one by one across a row's
    end (widths 10, 13); the first factor and the whole kernel match.  Padded (a 3x3 window),
    the selects lie under the padding's guards: the existing path, no $branched_."""
    channels = (5, 3, 4)[:inputs]
    names = [f"x{n}" for n in range(inputs)]
    kernel = 3 if pad else 1
    model = make_model([helper.make_node("Concat", names, ["cat"], axis=1),
                        helper.make_node("Conv", ["cat", "w", "b"], ["c"], pads=[pad] * 4),
                        helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])],
                       [(name, TensorProto.FLOAT, ["n", c, "h", "w"]) for name, c in zip(names, channels)], ["y"],
                       {"w": rand(20, sum(channels), kernel, kernel, seed=1), "b": rand(20, seed=2)})
    [program] = [p for p in compile_model(model).programs.values() if "$pack_panels" in render_program(p)]
    assert ("$branched_" in render_program(program)) == branched
    feeds = {name: rand(1 + (width == 13), c, 6, width, seed=3 + n) for n, (name, c) in enumerate(zip(names, channels))}
    assert check_module(model, feeds, monkeypatch) >= 1


@pytest.mark.parametrize("axis, branched", [(2, True), (3, False)])
def test_convolution_of_a_spatial_concatenation(axis: int, branched: bool, monkeypatch) -> None:
    """A 1x1 convolution of a concatenation along the height: the select's condition reads
    the height, the same for four positions of one row ($branched_) but not across a row's
    end (width 10: those four positions packed one by one, $split_).  Along the width the
    lanes of one row differ: the existing path."""
    model = make_model([helper.make_node("Concat", ["a", "b"], ["cat"], axis=axis),
                        helper.make_node("Conv", ["cat", "w", "b0"], ["y"])],
                       [("a", TensorProto.FLOAT, [1, 6, "h", "w"]), ("b", TensorProto.FLOAT, [1, 6, "h", "w"])], ["y"],
                       {"w": rand(12, 6, 1, 1, seed=1), "b0": rand(12, seed=2)})
    [program] = [p for p in compile_model(model).programs.values() if "$pack_panels" in render_program(p)]
    assert ("$branched_" in render_program(program)) == branched
    assert check_module(model, {"a": rand(1, 6, 3, 10, seed=3), "b": rand(1, 6, 3, 10, seed=4)}, monkeypatch) >= 1


def test_branched_interior_forms() -> None:
    """:func:`branched_interior` takes selects of contiguous loads whose conditions
    the lane axis does not change; not a condition that reads the lane axis, not a padded
    leaf, not a bare load (the interior path's)."""
    c, w = SizeVar("c"), SizeVar("w")
    a, b = Buffer("A", (4, SizeVar("width")), "float32"), Buffer("B", (4, SizeVar("width")), "float32")
    first, second = Load(a, (c, w)), Load(b, (c - 2, w))
    split = Compare(CompareOp.LT, IndexValue(c), IndexValue(IntImm(2)))
    chosen = Select(split, first, second)
    assert branched_interior(chosen, w) is chosen
    assert branched_interior(first, w) is None
    along = Compare(CompareOp.LT, IndexValue(w), IndexValue(IntImm(2)))
    assert branched_interior(Select(along, first, second), w) is None
    assert branched_interior(Select(split, Select(along, first, FloatImm(0.0)), second), w) is None


@pytest.mark.parametrize("depth, chunk", [(37, 8), (40, 8), (7, 8), (0, 8), (300, PACKED.chunk)])
def test_micro_kernels_in_chunks_of_the_reduction(depth: int, chunk: int, monkeypatch) -> None:
    """The micro-kernels run the reduction in chunks of ``chunk`` steps over all of a
    panel's strips, the sums reloaded after the first: a last chunk partial (37 = 4 x 8 + 5),
    whole (40), one chunk (7), none (an empty reduction: the epilogue of 0); 70 rows (a
    partial strip and panel) and 37 columns (a partial block), the depth symbolic."""
    change = packed(chunk=chunk)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"])],
                       [("x", TensorProto.FLOAT, [70, "k"]), ("w", TensorProto.FLOAT, ["k", 37])], ["y"],
                       {"bias": rand(37, seed=2)})
    [program] = [p for p in compile_model(model).programs.values() if "$pack_panels" in render_program(p)]
    assert "$chunk" in render_program(program, wasm=change)
    assert check_module(model, {"x": rand(70, depth), "w": rand(depth, 37, seed=1)}, monkeypatch, wasm=change) >= 1


def units_of(program: TensorProgram, size_vars: dict[str, int]) -> int:
    """What the program's ``$units`` returns for these sizes."""
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    memory = wasmtime.Memory(store, wasmtime.MemoryType(wasmtime.Limits(2, 65536)))
    instance = wasmtime.Instance(store, wasmtime.Module(engine, compile_program(program)), [memory])
    memory.write(store, np.array([0, *(size_vars[v.name] for v in program.size_vars)], np.int32).tobytes(), 65536)
    return instance.exports(store)["k0_units"](store, 65536)


def test_packed_path_capacity(monkeypatch) -> None:
    """A reduction of a run-time length runs the packed path up to the capacity (one panel of
    ``panel_rows`` rows, its 9 columns in 2 slices of a block each), the block path one step
    beyond (a unit per block), and an empty one gives the epilogue of 0."""
    m, c = SizeVar("m"), SizeVar("c")
    a, b = Buffer("A", (IntImm(5), m), "float32"), Buffer("B", (m, c), "float32")
    body = Reduce(ReduceCombiner.SUM, k, m, Load(a, (i, k)) * Load(b, (k, j))) + FloatImm(1.0)
    program = TensorProgram("matmul", (a, b), Buffer("out", (IntImm(5), c), "float32"), (i, j), body)
    # 5 rows: without its matrix-vector kind, else that runs
    program = scheduled(program, lambda schedule: packed(max_depth=20)(without_matrix_vector(schedule)))
    for steps, columns, units in ((20, 9, 2), (21, 9, 2), (0, 9, 2), (3, 0, 1)):
        assert units_of(program, {"m": steps, "c": columns}) == units
        check_program(program, [rand(5, steps), rand(steps, columns, seed=1)], {"m": steps, "c": columns})


# The matrix-vector kind runs matmuls of at most ``max_rows`` rows whose weight is read in
# place; without it they run the packed kind, so each test compares both.
MATVEC = pytest.mark.parametrize("matvec", [True, False], ids=["matvec", "packed"])


@MATVEC
@pytest.mark.parametrize("shape_a, shape_b", [((1, 24), (24, 32)), ((1, 7), (7, 37)), ((4, 22), (22, 300)),
                                              ((2, 1, 9), (9, 1030)), ((3, 1, 6), (3, 6, 16)), ((8, 5), (5, 12)),
                                              ((9, 8), (8, 12)), ((1, 0), (0, 5))])
def test_matvec_matmuls(shape_a, shape_b, matvec: bool, monkeypatch) -> None:
    """Matmuls of 1 to 8 rows with a bias and relu epilogue: one column block or several
    (1030 columns: 3 blocks of 344, 344 and 342), f32x4 columns and the 1-3 past them (37,
    1030), reduction steps 8 at a time and the 1-7 past them (7, 22, 9, 5), batched weights
    (a unit per batch index and column block), an empty reduction (the epilogue of 0); 9
    rows run the packed path."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["s"]),
                        helper.make_node("Relu", ["s"], ["y"])], [("x", TensorProto.FLOAT, list(shape_a))], ["y"],
                       {"w": rand(*shape_b, seed=1), "bias": rand(shape_b[-1], seed=2)})
    change = None if matvec else without_matrix_vector
    assert check_module(model, {"x": rand(*shape_a)}, monkeypatch, wasm=change) >= 1


@MATVEC
def test_matvec_with_fused_prologues(matvec: bool, monkeypatch) -> None:
    """GPT-2's decode step in small: a layer norm and a tanh fused into the matmuls' first
    factor (packed once per block, four reduction steps at a time), one row."""
    change = None if matvec else without_matrix_vector
    model = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
                        helper.make_node("MatMul", ["n", "w1"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
                        helper.make_node("Mul", ["h", "t"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["y"])],
                       [("x", TensorProto.FLOAT, [1, 1, 22])], ["y"],
                       {"g": rand(22, seed=1), "b": rand(22, seed=2), "w1": rand(22, 270, seed=3),
                        "w2": rand(270, 12, seed=4)})
    module = compile_model(model)
    forms = ["$matvec_block" in render_program(p, wasm=change) for p in module.programs.values() if "matmul" in p.name]
    assert forms and all(form == matvec for form in forms)
    assert check_module(model, {"x": rand(1, 1, 22)}, monkeypatch, wasm=change) >= 2


def test_matvec_of_symbolic_sizes() -> None:
    """Rows, reduction and columns all size variables: the form is chosen at run time (at
    most ``max_rows`` rows and ``max_depth`` steps), and ``$units`` follows the same choice
    (9 rows: the packed path, one panel, its columns in 8 slices)."""
    s, m, c = SizeVar("s"), SizeVar("m"), SizeVar("c")
    a, b = Buffer("A", (s, m), "float32"), Buffer("B", (m, c), "float32")
    body = Reduce(ReduceCombiner.SUM, k, m, Load(a, (i, k)) * Load(b, (k, j))) * FloatImm(0.5)
    program = TensorProgram("matmul", (a, b), Buffer("out", (s, c), "float32"), (i, j), body)
    assert "$matvec_block" in render_program(program)
    deep = MatrixVectorSchedule().max_depth + 1  # beyond the form's depth: the packed path
    for rows, steps, columns, units in ((1, 30, 1100, 275), (4, 5, 512, 128), (8, 3, 513, 129), (9, 9, 600, 8),
                                        (3, 0, 9, 3), (2, 4, 0, 0), (0, 4, 9, 3), (1, deep, 7, 1)):
        sizes = {"s": rows, "m": steps, "c": columns}
        assert units_of(program, sizes) == units, sizes
        if steps <= 64:  # (the deep case: its units only)
            check_program(program, [rand(rows, steps), rand(steps, columns, seed=1)], sizes)


def test_matvec_falls_back_where_the_weight_is_computed(monkeypatch) -> None:
    """One row, but a second factor computed (a relu fused into it, read from an input):
    no matrix-vector form, the packed path."""
    nodes = [helper.make_node("Relu", ["w"], ["r"]), helper.make_node("MatMul", ["x", "r"], ["y"])]
    shape = [10, 20]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 10]), ("w", TensorProto.FLOAT, shape)], ["y"], {})
    module = compile_model(model)
    assert not any("$matvec_block" in render_program(p) for p in module.programs.values())
    assert check_module(model, {"x": rand(1, 10), "w": rand(*shape, seed=1)}, monkeypatch) >= 1


@pytest.mark.parametrize("rows, depth, columns", [(1, 10, 20), (1, 1280, 1000), (3, 7, 9), (2, 3, 5), (8, 33, 4)])
def test_matvec_dot_products_of_a_transposed_weight(rows: int, depth: int, columns: int, monkeypatch) -> None:
    """Gemm with transB (a classifier's [classes, features] weight, an input here so nothing
    folds it): each column is contiguous along the reduction, so its sum is a dot product
    (four columns at a time and the 1-3 past them, four steps per load and the 1-3 past
    them), with the bias as epilogue; 1 to 8 rows, each packed in turn.  Four partial sums per
    column round differently from one: 1280 products of about 1 differ by up to ~1e-4."""
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [rows, depth]), ("w", TensorProto.FLOAT, [columns, depth])],
                       ["y"], {"b": rand(columns, seed=2)})
    module = compile_model(model)
    assert any("$dot_row" in render_program(p) for p in module.programs.values())
    tolerance = Tolerance(rtol=1e-4, atol=1e-5 * max(1, depth // 64))
    assert check_module(model, {"x": rand(rows, depth), "w": rand(columns, depth, seed=1)}, monkeypatch,
                        tolerance) >= 1


def test_matvec_dot_products_of_a_squeeze_and_excitation_block(monkeypatch) -> None:
    """MobileNetV3's squeeze-and-excitation: a global average pool, then 1x1 convolutions on
    the 1x1 result (the weight [O, C, 1, 1]: three reduction axes, two of extent 1, contiguous
    flattened) with ReLU and hard-sigmoid, scaling the input; height and width symbolic."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c2"]), helper.make_node("HardSigmoid", ["c2"], ["g"]),
             helper.make_node("Mul", ["x", "g"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 24, "h", "w"])], ["y"],
                       {"w1": rand(10, 24, 1, 1, seed=1), "b1": rand(10, seed=2), "w2": rand(24, 10, 1, 1, seed=3),
                        "b2": rand(24, seed=4)})
    module = compile_model(model)
    assert any("$dot_row" in render_program(p) for p in module.programs.values())  # both convolutions' program
    assert check_module(model, {"x": rand(1, 24, 5, 7)}, monkeypatch) >= 1


def test_integer_and_index_module(monkeypatch) -> None:
    """Gathers, concatenation, casts, comparisons and where over int64 and bool tensors."""
    model = make_model(
        [helper.make_node("Gather", ["table", "ids"], ["g"], axis=0),
         helper.make_node("Concat", ["g", "g"], ["c"], axis=1),
         helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Greater", ["f", "half"], ["mask"]),
         helper.make_node("Unsqueeze", ["mask", "one"], ["mask2"]),
         helper.make_node("Where", ["mask2", "c", "zero"], ["y"]),
         helper.make_node("Mod", ["ids", "three"], ["m"])],
        [("ids", TensorProto.INT64, ["n"])], ["y", ("m", TensorProto.INT64, None)],
        {"table": rand(6, 4), "half": np.array(2.5, np.float32), "one": np.array([1], np.int64),
         "zero": np.array(0.0, np.float32), "three": np.array(-3, np.int64)})
    assert check_module(model, {"ids": np.array([0, 5, -1, 3, 2], np.int64)}, monkeypatch) >= 1


# -- bundles ----------------------------------------------------------------------------------------


def test_bundle_has_kernels_wasm(tmp_path) -> None:
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["batch", 8])],
                       ["y"], {"w": rand(8, 4)})
    bundle = relaxweb.build(model, tmp_path, debug=True)  # kernels.wat too
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    text = (tmp_path / "kernels.wat").read_text()
    # the weight's region: a 16-byte header, then one block of 8 columns (4 of them the weight's) at 8 steps
    # its kK_pack's params: element_count 0, then the program's size variables (the rows' 1)
    program = compile_model(model).programs[manifest["kernels"][0]["name"]]
    assert [var.name for var in program.size_vars] == ["batch"]
    assert manifest["wasm"] == {"file": "kernels.wasm", "relaxed_madd_sites": relaxed_madd_sites(text),
                                "scratch_bytes": MATMUL_SCRATCH_BYTES,
                                "prepacked": [{"call_site": 0, "bytes": 16 + 8 * 8 * 4, "params": [0, 1]}]}
    assert manifest["wasm"]["relaxed_madd_sites"] > 0 and not (tmp_path / "kernels-relaxed.wasm").exists()
    assert manifest_problem(manifest) is None
    wasm = (tmp_path / "kernels.wasm").read_bytes()  # one module: its multiply-adds relaxed, lowered at load where need be
    exports = {export.name for export in wasm_exports(wasm)}
    assert exports == {f"k{index}{suffix}" for index in range(len(manifest["kernels"]))
                       for suffix in ("", "_units", "_pack")}
    plain = lower_relaxed_simd(wasm, manifest["wasm"]["relaxed_madd_sites"])
    assert {export.name for export in wasm_exports(plain)} == exports
    assert RELAXED_MADD_OPCODE in wasm and RELAXED_MADD_OPCODE not in plain
    assert text.startswith(";; kernels.wasm of")
    assert f"kernels.wasm: {len(wasm)} bytes" in str(bundle)


RELAXED_MADD_OPCODE = bytes([0xFD, 0x85, 0x02])  # f32x4.relaxed_madd


def wasm_exports(wasm: bytes):
    return wasmtime.Module(wasmtime.Engine(), wasm).exports


def test_manifest_wasm_entry_is_one_of_two_forms() -> None:
    base = json.loads(json.dumps(_minimal_manifest()))
    relaxed = {"file": "kernels.wasm", "relaxed_madd_sites": 12, "scratch_bytes": 0}
    for entry, ok in (({"file": "kernels.wasm", "scratch_bytes": 0}, True), ({"unavailable": "why"}, True), (relaxed, True),
                      ({**relaxed, "relaxed_madd_sites": 0}, False), ({**relaxed, "relaxed_madd_sites": "12"}, False),
                      ({"relaxed_madd_sites": 12, "unavailable": "why"}, False),
                      ({"file": "kernels.wasm"}, False), ({"file": "kernels.wasm", "scratch_bytes": 0, "unavailable": "x"}, False),
                      ({"file": "../x.wasm", "scratch_bytes": 0}, False), ({}, False)):
        problem = manifest_problem({**base, "wasm": entry})
        assert (problem is None) == ok, (entry, problem)


def _minimal_manifest() -> dict:
    return {"format": "relaxweb-bundle", "version": 2, "model": "m", "dtypes": {}, "inputs": [], "outputs": [],
            "symbolic_vars": [], "storages": [], "weights": [], "shards": [], "kernels": [], "call_sites": [],
            "params_bytes": 256, "errors": [], "max_rank": 8, "required_limits": {}}


def rnn_model():
    """A model with a library kernel (the RNN's recurrence) next to tensor programs."""
    return make_model([helper.make_node("RNN", ["x", "w", "r"], ["y"], hidden_size=3)],
                      [("x", TensorProto.FLOAT, [2, 1, 4])], ["y"], {"w": rand(1, 3, 4), "r": rand(1, 3, 3, seed=1)})


def test_library_kernel_without_wasm_leaves_the_bundle_without_kernels_wasm(tmp_path) -> None:
    """A library kernel with no WebAssembly version: the manifest says why, the build
    succeeds with a note, and a rebuild removes the last build's kernels.wasm."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["batch", 8])],
                       ["y"], {"w": rand(8, 4)})
    relaxweb.build(model, tmp_path)
    assert (tmp_path / "kernels.wasm").exists()
    module = compile_model(rnn_model())
    recurrence = module.programs["rnn_recurrence"]
    assert isinstance(recurrence, LibraryKernel)
    if WASM in recurrence.targets:
        module.programs["rnn_recurrence"] = dataclasses.replace(recurrence, targets=(WEBGPU,))
    order = [(name, {}) for name in module.programs]
    assert emit_kernels_wasm(module, order) == WasmUnavailable(
        "the library kernel rnn_recurrence has no WebAssembly version")
    if WASM in recurrence.targets:
        return  # (the bundle below has its kernel's WebAssembly version)
    notes: list[str] = []
    relaxweb.build(rnn_model(), tmp_path, progress=notes.append)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["wasm"] == {"unavailable": "the library kernel rnn_recurrence has no WebAssembly version"}
    assert any(note.startswith("note: no kernels.wasm") for note in notes)
    assert not (tmp_path / "kernels.wasm").exists() and not (tmp_path / "kernels.wat").exists()
    assert manifest_problem(manifest) is None


def test_library_kernels_bring_their_own_functions(monkeypatch) -> None:
    """A library kernel's WebAssembly (its builder's renderer) goes into kernels.wasm under its
    index, its scratch bytes into the module's."""
    module = compile_model(rnn_model())
    source = """\
(func $main (param $params i32) (param $first i32) (param $end i32) (param $scratch i32) (param $b1 i32) (param $b2 i32)
  (call $main_helper))
(func $main_helper)
(func $units (param $params i32) (result i32)
  (i32.const 1))"""
    monkeypatch.setitem(library.RENDERERS, "recurrence",
                        lambda kernel: library.LibraryWat(source, MATMUL_SCRATCH_BYTES + 1000))
    order = [(name, {}) for name in module.programs]
    kernels = emit_kernels_wasm(module, order)
    assert isinstance(kernels, KernelsWasm) and kernels.scratch_bytes == MATMUL_SCRATCH_BYTES + 1000
    index = list(module.programs).index("rnn_recurrence")
    assert f"(func $k{index}_helper)" in kernels.wat
    assert {e.name for e in wasm_exports(kernels.wasm)} == {
        *(f"k{i}{s}" for i in range(len(order)) for s in ("", "_units")), *(f"k{i}_pack" for i in kernels.prepacked)}
