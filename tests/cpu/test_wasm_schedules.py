"""The WebAssembly renderer of each wasm schedule kind (relaxweb/cpu/schedules/): it renders
exactly the schedule it is given (any kind that fits the program, any parameters), its
``$units`` counts what the schedule says (``WasmSchedule.units``), and the kernels compute
what the interpreter does; the WAT builder's constructs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import pytest
import wasmtime

from relaxweb.cpu.emit import (
    VECTOR_BINARY_RENDERINGS, VECTOR_COMPARE_RENDERINGS, VECTOR_UNARY_RENDERINGS, Function,
)
from relaxweb.cpu.helpers import HELPER_FUNCTIONS
from relaxweb.cpu.math import MATH_FUNCTIONS
from relaxweb.cpu.module import KernelFunctions, assemble_kernels_module, wat_to_wasm
from relaxweb.cpu.schedules import RENDERERS, prepacked_factor_of, render_program
from relaxweb.cpu.wat_builder import Body, const, get, op
from relaxweb.ir import interpreter
from relaxweb.ir.matmul_layout import CHEAP_PACK_OPERATIONS, cheap_to_pack, oriented
from relaxweb.ir.pattern import analyze_matmul
from relaxweb.ir.launch import LANES, vector_access, vectorizable
from relaxweb.ir.schedule_fit import VECTOR_BINARY_OPS, VECTOR_COMPARE_OPS, VECTOR_UNARY_OPS, wasm_vectorizable
from relaxweb.ir.symbolic import IntImm, SizeVar, evaluate, product
from relaxweb.ir.tir import (
    Binary, BinaryOp, Buffer, Compare, CompareOp, FloatImm, IndexValue, Load, Reduce, ReduceCombiner, Select, TensorProgram,
    Unary, UnaryOp,
)
from relaxweb.ir.wasm_schedule import (
    WASM_SCHEDULE_KINDS, BlockMatmulSchedule, KernelSizes, MatrixVectorSchedule, PackedMatmulSchedule,
    WasmElementSchedule, WasmSchedule, WasmVectorizedSchedule, WindowSchedule,
)
from tests.helpers import F32_LOOSE, assert_close, rand
from tests.wasm_kernels import run_wasm_kernel

LIBRARY = {**MATH_FUNCTIONS, **HELPER_FUNCTIONS}
n, m, c = SizeVar("n"), SizeVar("m"), SizeVar("c")
i, j, k = SizeVar("i"), SizeVar("j"), SizeVar("k")


def kernel(program: TensorProgram, schedule: WasmSchedule) -> bytes:
    text = render_program(program, {}, schedule)
    return wat_to_wasm(assemble_kernels_module([KernelFunctions(0, program.name, text)], "test", LIBRARY))


def units_of(wasm: bytes, program: TensorProgram, sizes: dict[str, int]) -> int:
    """What the kernel's ``$units`` returns for these sizes."""
    store = wasmtime.Store(wasmtime.Engine())
    memory = wasmtime.Memory(store, wasmtime.MemoryType(wasmtime.Limits(2, 65536)))
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, wasm), [memory])
    memory.write(store, np.array([0, *(sizes[v.name] for v in program.size_vars)], np.int32).tobytes(), 65536)
    return instance.exports(store)["k0_units"](store, 65536)


def kernel_sizes(program: TensorProgram, schedule: WasmSchedule, sizes: dict[str, int]) -> KernelSizes:
    """The program's sizes as ``WasmSchedule.units`` takes them (a matmul's oriented as the
    schedule says; a window's rows: every output axis but the last)."""
    shape = [int(evaluate(d, sizes)) for d in program.output.shape]
    elements = int(np.prod(shape))
    info = analyze_matmul(program)
    if info is None:
        return KernelSizes(elements, rows=int(np.prod(shape[:-1])))
    info = oriented(info, getattr(schedule, "swap_factors", False))
    depth = int(evaluate(product(info.reduce_extents), sizes))
    return KernelSizes(elements, int(np.prod([shape[p] for p in info.rows])), int(np.prod([shape[p] for p in info.columns])),
                       depth, int(np.prod([shape[p] for p in info.batch])))


def check(program: TensorProgram, schedule: WasmSchedule, arrays: list[np.ndarray], sizes: dict[str, int]) -> None:
    """The kernel against the interpreter, and its ``$units`` against the schedule's count;
    one that can read its second factor prepacked, with a region and without."""
    wasm = kernel(program, schedule)
    assert units_of(wasm, program, sizes) == schedule.units(kernel_sizes(program, schedule, sizes)), (schedule, sizes)
    shape = tuple(int(evaluate(d, sizes)) for d in program.output.shape)
    params = [0, *(sizes[v.name] for v in program.size_vars)]
    expected = interpreter.run_program(program, arrays, sizes).astype(np.float32)
    factor = prepacked_factor_of(program, schedule, {})
    size = None if factor is None else factor.region_bytes(
        arrays[[buffer.name for buffer in program.inputs].index(factor.buffer)].shape)
    for region in [0] if size is None else [0, size]:
        actual = run_wasm_kernel(wasm, 0, arrays, np.zeros(shape, np.float32), params,
                                 scratch_bytes=schedule.scratch_bytes, prepacked_bytes=region)
        assert_close(actual, expected, F32_LOOSE, err_msg=f"region of {region} bytes")



def test_every_kind_has_a_renderer_and_the_vector_ops_their_forms() -> None:
    assert set(RENDERERS) == set(WASM_SCHEDULE_KINDS.values())
    assert set(VECTOR_BINARY_RENDERINGS) == VECTOR_BINARY_OPS
    assert set(VECTOR_UNARY_RENDERINGS) == VECTOR_UNARY_OPS
    assert set(VECTOR_COMPARE_RENDERINGS) == VECTOR_COMPARE_OPS


# out[i, j] = relu(sum(A[i, k] * B[k, j] for k) + bias[j]): rows, depth and columns size variables
A, B, BIAS = Buffer("A", (n, m), "float32"), Buffer("B", (m, c), "float32"), Buffer("bias", (c,), "float32")
MATMUL = TensorProgram("matmul", (A, B, BIAS), Buffer("out", (n, c), "float32"), (i, j), Binary(
    BinaryOp.MAXIMUM, Reduce(ReduceCombiner.SUM, k, m, Load(A, (i, k)) * Load(B, (k, j))) + Load(BIAS, (j,)),
    FloatImm(0.0)))
BLOCKS = BlockMatmulSchedule()
SWAPPED_BLOCKS = BlockMatmulSchedule(swap_factors=True)
MATMUL_KINDS = {
    "blocks": BLOCKS,
    "blocks swapped": SWAPPED_BLOCKS,
    "blocks of 2 x 8": BlockMatmulSchedule(rows=2, columns=8),
    "packed": PackedMatmulSchedule(),
    "packed, depth 6, split": PackedMatmulSchedule(max_depth=6, split_columns=True, chunk=4),
    "packed swapped": PackedMatmulSchedule(swap_factors=True, beyond=SWAPPED_BLOCKS),
    "matrix-vector": MatrixVectorSchedule(otherwise=PackedMatmulSchedule(split_columns=True)),
    "matrix-vector of 2 rows, 8 columns": MatrixVectorSchedule(max_rows=2, columns=8, steps=2),
}


@pytest.mark.parametrize("schedule", MATMUL_KINDS.values(), ids=MATMUL_KINDS.keys())
@pytest.mark.parametrize("rows, depth, columns", [(1, 7, 37), (2, 5, 9), (5, 6, 40), (33, 9, 17), (3, 0, 5)])
def test_each_matmul_kind_renders_as_given(schedule: WasmSchedule, rows: int, depth: int, columns: int) -> None:
    """Every matmul kind alone or falling back, with other parameters and either factor as
    the rows: the same outputs, and ``$units`` as the schedule counts them, at sizes on both
    sides of each kind's run-time test (rows above 2 or 8, depth above 6)."""
    arrays = [rand(rows, depth), rand(depth, columns, seed=1), rand(columns, seed=2)]
    check(MATMUL, schedule, arrays, {"n": rows, "m": depth, "c": columns})


PREPACKING_KINDS = {name: MATMUL_KINDS[name] for name in ("packed", "packed, depth 6, split", "packed swapped",
                                                             "matrix-vector")}


@pytest.mark.parametrize("schedule", PREPACKING_KINDS.values(), ids=PREPACKING_KINDS.keys())
@pytest.mark.parametrize("rows, depth, columns", [(33, 9, 17), (9, 6, 40), (5, 7, 37), (12, 0, 5)])
def test_a_prepacked_second_factor_is_packed_once_and_read_in_place(schedule: WasmSchedule, rows: int, depth: int,
                                                                     columns: int) -> None:
    """A matmul kernel with a packed tier exports ``kK_pack``: given a region, it packs the
    second factor (the weight B, or A where the factors swap) into it where the packed tier
    runs at this depth (1), else leaves it (0: depth above 6 with ``max_depth`` 6).  Once
    packed, the kernel's packed tier reads the panels in place: the factor overwritten with
    zeros after the pack leaves the output as it was (the matrix-vector tier, at 8 rows or
    fewer, reads the panels too).  A region too small for the panels is not packed and the
    kernel packs per call."""
    arrays = [rand(rows, depth), rand(depth, columns, seed=1), rand(columns, seed=2)]
    sizes = {"n": rows, "m": depth, "c": columns}
    wasm = kernel(MATMUL, schedule)
    factor = prepacked_factor_of(MATMUL, schedule, {})
    assert factor is not None and factor.buffer == ("A" if schedule.swap_factors else "B")
    position = [buffer.name for buffer in MATMUL.inputs].index(factor.buffer)
    name = next(name for name, kind in PREPACKING_KINDS.items() if kind == schedule)
    packs_here = depth <= 6 if name == "packed, depth 6, split" else True
    expected = interpreter.run_program(MATMUL, arrays, sizes).astype(np.float32)
    params = [0, rows, depth, columns]
    size = 16 + 4 * 8 * -(-(rows if schedule.swap_factors else columns) // 8) * depth  # header, then blocks of 8 columns
    assert factor.region_bytes(arrays[position].shape) == (size if packs_here else None)
    for region, packed_expected in ((size, int(packs_here)), (size - 4, 0)):
        packed: list[int] = []
        zeros = {position: np.zeros_like(arrays[position])}
        actual = run_wasm_kernel(wasm, 0, arrays, np.zeros((rows, columns), np.float32), params,
                                 scratch_bytes=schedule.scratch_bytes, prepacked_bytes=region,
                                 after_pack=zeros if packed_expected else None, packed=packed)
        assert packed == [packed_expected]
        assert_close(actual, expected, F32_LOOSE, err_msg=f"region of {region} bytes")


def matrix_vector_program(depth: int, columns: int, dot: bool, constant: bool) -> TensorProgram:
    """``out[i, j] = sum(A[i, k] * W[k, j] for k) + bias[j]`` over ``n`` rows, W read as
    rows [depth, columns] (streamed) or as columns [columns, depth] (``dot``: each column
    contiguous along the reduction); the depth and columns constants or size variables
    (``m``, ``c``: the distance between two steps, or two columns, known at run time only)."""
    depth_, columns_ = (IntImm(depth), IntImm(columns)) if constant else (m, c)
    a = Buffer("A", (n, depth_), "float32")
    w = Buffer("W", (columns_, depth_) if dot else (depth_, columns_), "float32")
    bias = Buffer("bias", (columns_,), "float32")
    product = Load(a, (i, k)) * Load(w, (j, k) if dot else (k, j))
    return TensorProgram("matvec", (a, w, bias), Buffer("out", (n, columns_), "float32"), (i, j),
                         Reduce(ReduceCombiner.SUM, k, depth_, product) + Load(bias, (j,)))


ROW_GROUPS = {
    "defaults": {},
    "groups of 3 and 1, 3 steps, 3 columns": {"steps": 3, "dot_rows": 3, "dot_columns": 3},
    "blocks of 8 columns": {"columns": 8, "steps": 2, "dot_rows": 4, "dot_columns": 2},
}


@pytest.mark.parametrize("dot", [False, True], ids=["streamed", "dot products"])
@pytest.mark.parametrize("constant", [True, False], ids=["constant sizes", "size variables"])
@pytest.mark.parametrize("changes", ROW_GROUPS.values(), ids=ROW_GROUPS.keys())
@pytest.mark.parametrize("depth, columns", [(37, 23), (70, 600)])
def test_matrix_vector_rows_are_computed_alone(dot: bool, constant: bool, changes: dict, depth: int,
                                               columns: int) -> None:
    """Whatever the rows a call has (1 to ``max_rows``, taken in groups that share each load
    of the second factor), each row's outputs are bit for bit those of the row alone: the
    sums of a row add their products in the same order in any group (sequences generated
    together give the tokens each gives alone).  Both units, steps and columns past the last
    whole f32x4 and ``steps``, one column block or several (600 columns: 2 units), the
    second factor's steps or columns a constant distance apart or not."""
    schedule = replace(MatrixVectorSchedule(dot_products=dot), **changes)
    program = matrix_vector_program(depth, columns, dot, constant)
    wasm = kernel(program, schedule)
    weight = rand(*((columns, depth) if dot else (depth, columns)), seed=1)
    bias, rows = rand(columns, seed=2), rand(8, depth, seed=3)

    def run(a: np.ndarray) -> np.ndarray:
        sizes = {"n": len(a), "m": depth, "c": columns}
        params = [0, *(sizes[v.name] for v in program.size_vars)]
        return run_wasm_kernel(wasm, 0, [a, weight, bias], np.zeros((len(a), columns), np.float32), params,
                               scratch_bytes=schedule.scratch_bytes)

    alone = [run(rows[r:r + 1])[0] for r in range(8)]
    for count in range(1, 9):
        together = run(rows[:count])
        for r in range(count):
            np.testing.assert_array_equal(together[r], alone[r], err_msg=f"row {r} of {count}")
    assert_close(together, rows @ (weight.T if dot else weight) + bias, F32_LOOSE)
    # the brief's case: 8 rows whose row 3 is the one row run alone
    single = rand(1, depth, seed=4)
    eight = rows.copy()
    eight[3] = single[0]
    np.testing.assert_array_equal(run(eight)[3], run(single)[0])


@pytest.mark.parametrize("depth, columns", [(37, 23), (70, 600)])
def test_matrix_vector_reads_prepacked_panels_rows_alone_and_split_anywhere(depth: int, columns: int) -> None:
    """Where the call site's weight is prepacked, the matrix-vector tier reads its panels
    (the weight zeroed after the pack leaves the outputs as they were): each row's outputs
    are bit for bit those of the row alone, those of one call whatever ranges the units are
    split into (ranges that start or end in the middle of a panel of 8 columns: a unit is
    4), and (in whole f32x4 of columns) those of the weight read in place, without a
    region.  One column block or several;
    rows in groups of 4, 2 and 1."""
    schedule = MatrixVectorSchedule(max_rows=8, columns=16, steps=3, otherwise=PackedMatmulSchedule())
    program = matrix_vector_program(depth, columns, dot=False, constant=True)
    wasm = kernel(program, schedule)
    factor = prepacked_factor_of(program, schedule, {})
    assert factor is not None and factor.buffer == "W"
    weight, bias, rows = rand(depth, columns, seed=1), rand(columns, seed=2), rand(8, depth, seed=3)
    region = factor.region_bytes(weight.shape)
    assert region is not None

    def run(a: np.ndarray, ranges: int = 1, prepacked: bool = True) -> np.ndarray:
        packed: list[int] = []
        outputs = run_wasm_kernel(wasm, 0, [a, weight, bias], np.zeros((len(a), columns), np.float32), [0, len(a)],
                                  scratch_bytes=schedule.scratch_bytes, prepacked_bytes=region if prepacked else 0,
                                  after_pack={1: np.zeros_like(weight)} if prepacked else None, packed=packed,
                                  ranges=ranges)
        assert packed == [int(prepacked)]
        return outputs

    alone = [run(rows[r:r + 1])[0] for r in range(8)]
    for count in range(1, 9):
        together = run(rows[:count])
        for r in range(count):
            np.testing.assert_array_equal(together[r], alone[r], err_msg=f"row {r} of {count}")
        for ranges in (2, 5, 13):
            np.testing.assert_array_equal(run(rows[:count], ranges), together, err_msg=f"{ranges} ranges")
        whole = columns // 4 * 4  # in place, the columns past the last whole f32x4 take scalar steps
        np.testing.assert_array_equal(run(rows[:count], prepacked=False)[:, :whole], together[:, :whole],
                                      err_msg="the weight in place")
    assert_close(together, rows @ weight + bias, F32_LOOSE)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("ranges", [1, 2, 5, 13])
def test_matrix_vector_units_split_anywhere_give_the_same_outputs(rows: int, ranges: int) -> None:
    """A unit is four columns of one batch index; a call takes its range of units as one run
    of columns per batch index, in blocks of at most ``columns`` columns (``columns x
    max_rows`` for one row, whose sums may fill every row's).  Split into ranges that end
    inside a block, inside a group of four past the last column (23 columns) or across batch
    indices, as threads split them, the outputs are bit for bit those of one call."""
    b, r = SizeVar("b"), SizeVar("r")
    depth, columns = 19, 23
    a, w = Buffer("A", (b, n, depth), "float32"), Buffer("W", (b, depth, columns), "float32")
    program = TensorProgram("batched_matvec", (a, w), Buffer("out", (b, n, columns), "float32"), (i, j, k),
                            Reduce(ReduceCombiner.SUM, r, depth, Load(a, (i, j, r)) * Load(w, (i, r, k))))
    schedule = MatrixVectorSchedule(max_rows=4, columns=8, steps=3)  # blocks of 32 columns for one row, 8 for more
    wasm = kernel(program, schedule)
    assert "$matvec_block" in render_program(program, {}, schedule)
    sizes = {"b": 3, "n": rows}
    assert units_of(wasm, program, sizes) == 3 * 6 == schedule.units(kernel_sizes(program, schedule, sizes))
    arrays = [rand(3, rows, depth), rand(3, depth, columns, seed=1)]
    params = [0, *(sizes[v.name] for v in program.size_vars)]

    def run(count: int) -> np.ndarray:
        return run_wasm_kernel(wasm, 0, arrays, np.zeros((3, rows, columns), np.float32), params,
                               scratch_bytes=schedule.scratch_bytes, ranges=count)

    split = run(ranges)
    np.testing.assert_array_equal(split, run(1))
    assert_close(split, arrays[0] @ arrays[1], F32_LOOSE)


def test_any_program_runs_the_element_kind() -> None:
    """The element kind renders a matmul too (one output element at a time)."""
    for per_unit in (64, 5):
        check(MATMUL, WasmElementSchedule(elements_per_unit=per_unit), [rand(9, 4), rand(4, 6, seed=1), rand(6, seed=2)],
              {"n": 9, "m": 4, "c": 6})


def test_the_vectorized_kind_and_its_units() -> None:
    """Rows of 8, 20 and 36: an iteration of 4 x 4 or 3 x 4 elements where they fit the
    row and the call's units (20: one such, then one of four; 8: never), else one of four;
    the element kind alike, one element at a time or 4 or 3 to an iteration (units of 5:
    the call's end inside a row)."""
    schedules = (WasmVectorizedSchedule(), WasmVectorizedSchedule(elements_per_unit=8),
                 WasmVectorizedSchedule(elements_per_unit=8, unroll=3), WasmVectorizedSchedule(unroll=1),
                 WasmElementSchedule(), WasmElementSchedule(unroll=4), WasmElementSchedule(elements_per_unit=5, unroll=3))
    for width in (8, 20, 36):
        data, bias = Buffer("A", (n, IntImm(width)), "float32"), Buffer("B", (IntImm(width),), "float32")
        program = TensorProgram("tanh", (data, bias), Buffer("out", (n, IntImm(width)), "float32"), (i, j),
                                Unary(UnaryOp.TANH, Load(data, (i, j))) + Load(bias, (j,)))
        for schedule in schedules:
            for rows in (0, 1, 9, 17):
                check(program, schedule, [rand(rows, width), rand(width, seed=1)], {"n": rows})


def test_the_vectorized_kind_takes_a_concatenation_by_an_index_at_any_offset() -> None:
    """A key/value cache's concatenation (past positions, then the new ones read out of a fused
    projection at a column offset that is a size variable): the select's condition is the same
    for the four lanes, the second piece's f32x4 loads start at any element (here odd ones).
    A select along the last axis is not taken."""
    p, s, off = SizeVar("p"), SizeVar("s"), SizeVar("off")
    i0, i1, i2, i3 = (SizeVar(f"i{d}") for d in range(4))
    past, fused = Buffer("past", (IntImm(1), IntImm(2), p, IntImm(8)), "float32"), Buffer("qkv", (IntImm(1), s, IntImm(40)), "float32")
    condition = Compare(CompareOp.LT, IndexValue(i2), IndexValue(p))
    body = Select(condition, Load(past, (i0, i1, i2, i3)), Load(fused, (i0, i2 - p, i1 * 8 + i3 + off)) * FloatImm(2.0))
    program = TensorProgram("concat", (past, fused), Buffer("out", (IntImm(1), IntImm(2), p + s, IntImm(8)), "float32"),
                            (i0, i1, i2, i3), body)
    assert wasm_vectorizable(program) and not vectorizable(program, 4)  # WGSL's kind: no select, aligned reads only
    for schedule in (WasmVectorizedSchedule(), WasmVectorizedSchedule(elements_per_unit=8)):
        for past_length, new, offset in ((5, 1, 1), (0, 3, 7), (4, 0, 0), (3, 2, 24)):
            check(program, schedule, [rand(1, 2, past_length, 8), rand(1, new, 40, seed=1)],
                  {"p": past_length, "s": new, "off": offset})
    x = Buffer("X", (n, 8), "float32")
    by_column = TensorProgram("halves", (x,), Buffer("out", (n, 8), "float32"), (i, j),
                              Select(Compare(CompareOp.LT, IndexValue(j), IndexValue(IntImm(4))), Load(x, (i, j)), FloatImm(0.0)))
    assert not wasm_vectorizable(by_column)
    with pytest.raises(ValueError, match="halves is scheduled as vectorized"):
        render_program(by_column, {}, WasmVectorizedSchedule())


def test_the_vectorized_kind_reads_a_split_axis_whose_flat_offset_is_contiguous() -> None:
    """A reshape that split the last axis into [2w, 2]: ``A[i, j // 2, j % 2]``'s flat offset
    is ``i * 4w + j``, so four lanes are one f32x4 load.  ``A[i, j % 2, j // 2]`` (the halves
    interleaved, as a transposed convolution's tiles are read as its output) is not
    contiguous: read lane by lane, the sigmoid after it still on f32x4."""
    w = SizeVar("w")
    tiles = Buffer("A", (n, w * 2, IntImm(2)), "float32")
    split = TensorProgram("sigmoid", (tiles,), Buffer("out", (n, w * 4), "float32"), (i, j),
                          Unary(UnaryOp.SIGMOID, Load(tiles, (i, j // 2, j % 2)) + FloatImm(0.5)))
    assert wasm_vectorizable(split) and not vectorizable(split, 4)
    for schedule in (WasmVectorizedSchedule(), WasmVectorizedSchedule(elements_per_unit=8, unroll=1)):
        for rows, quarter in ((1, 1), (3, 3), (2, 5)):
            check(split, schedule, [rand(rows, quarter * 2, 2)], {"n": rows, "w": quarter})
    swapped = Buffer("A", (n, IntImm(2), w * 2), "float32")
    interleaved = TensorProgram("interleave", (swapped,), Buffer("out", (n, w * 4), "float32"), (i, j),
                                Unary(UnaryOp.SIGMOID, Load(swapped, (i, j % 2, j // 2))))
    assert wasm_vectorizable(interleaved) and vector_access(interleaved, 4, wasm=True) == {"A": LANES}
    assert "f32x4.replace_lane 3" in render_program(interleaved, {}, WasmVectorizedSchedule())
    for schedule in (WasmVectorizedSchedule(), WasmVectorizedSchedule(elements_per_unit=8, unroll=1)):
        for rows, quarter in ((1, 1), (3, 3), (2, 5)):
            check(interleaved, schedule, [rand(rows, 2, quarter * 2)], {"n": rows, "w": quarter})


def test_the_window_kind_and_its_parameters() -> None:
    """A depthwise row filter (width 3) over rows of a variable width: 8 or 4 lanes an
    iteration, the innermost axis unrolled (constant 3 up to ``unroll``) or looped."""
    x, w = Buffer("X", (c, m), "float32"), Buffer("W", (c, IntImm(3)), "float32")
    body = Reduce(ReduceCombiner.SUM, k, IntImm(3), Load(x, (i, j + k)) * Load(w, (i, k)))
    program = TensorProgram("depthwise", (x, w), Buffer("out", (c, m - 2), "float32"), (i, j), body)
    for schedule in (WindowSchedule(), WindowSchedule(lanes=4, unroll=2), WindowSchedule(lanes=12, unrolled_widths=())):
        for width in (3, 6, 13, 30):
            check(program, schedule, [rand(2, width), rand(2, 3, seed=1)], {"c": 2, "m": width})


def test_a_kind_the_program_does_not_fit_is_an_error() -> None:
    data = Buffer("A", (n, 6), "int32")
    copy = TensorProgram("copy", (data,), Buffer("out", (n, 6), "int32"), (i, j), Load(data, (i, j)))
    with pytest.raises(ValueError, match="copy is scheduled as vectorized"):
        render_program(copy, {}, WasmVectorizedSchedule())
    with pytest.raises(ValueError, match="copy is scheduled as window"):
        render_program(copy, {}, WindowSchedule())
    with pytest.raises(ValueError, match="copy is scheduled as packed_matmul but is not matmul-like"):
        render_program(copy, {}, PackedMatmulSchedule())


def test_a_kind_without_a_renderer_is_an_error() -> None:
    @dataclass(frozen=True)
    class Unrolled(WasmSchedule):
        kind: ClassVar[str] = "unrolled"

    with pytest.raises(NotImplementedError, match="matmul: the WebAssembly backend has no renderer for the schedule unrolled"):
        render_program(MATMUL, {}, Unrolled())


def test_the_schedules_validate_their_parameters() -> None:
    with pytest.raises(ValueError, match="micro_rows must be 4"):
        PackedMatmulSchedule(micro_rows=8)
    with pytest.raises(ValueError, match="panel_columns must be a power of 2"):
        PackedMatmulSchedule(panel_columns=12)
    with pytest.raises(ValueError, match="orient the factors alike"):
        PackedMatmulSchedule(swap_factors=True)  # its blocks would not
    with pytest.raises(ValueError, match="lanes must be a positive multiple of 4"):
        WindowSchedule(lanes=6)
    assert replace(MatrixVectorSchedule(), columns=8).max_depth == MatrixVectorSchedule().max_depth  # kept as given
    assert PackedMatmulSchedule().scratch_bytes == (1 << 20) + 4 * 8 * 4608 + 4 * 32 * 8


def test_a_first_factor_of_a_few_additions_and_multiplications_is_cheap_to_pack() -> None:
    """``cheap_to_pack`` (column splits pack the first factor once per slice): a load, a layer
    norm's (x - mean) * rstd * gamma + beta; not a division, a function or many operations."""
    x, mean, rstd = (Load(Buffer(name, (n, m), "float32"), (i, j)) for name in ("x", "mean", "rstd"))
    gamma, beta = (Load(Buffer(name, (m,), "float32"), (j,)) for name in ("gamma", "beta"))
    normalized = Binary(BinaryOp.ADD, Binary(BinaryOp.MULTIPLY, Binary(BinaryOp.MULTIPLY,
                        Binary(BinaryOp.SUBTRACT, x, mean), rstd), gamma), beta)
    assert cheap_to_pack(x) and cheap_to_pack(normalized)
    assert cheap_to_pack(Binary(BinaryOp.MAXIMUM, x, FloatImm(0.0)))
    assert not cheap_to_pack(Binary(BinaryOp.DIVIDE, x, rstd))
    assert not cheap_to_pack(Unary(UnaryOp.TANH, x))
    many = x
    for _ in range(CHEAP_PACK_OPERATIONS + 1):
        many = Binary(BinaryOp.ADD, many, gamma)
    assert not cheap_to_pack(many)


def test_the_builder_nests_and_closes_its_constructs() -> None:
    """Each ``with`` closes its construct on the last line written in it, or on a line of its
    own after a comment (which would swallow the parenthesis)."""
    function = Function()
    body = Body(function)
    total, index = body.named("total"), body.named("index")
    with body.block("$done"):
        body.br_if("$done", op("i32.eqz", get("$params")))
        with body.loop("$count"):
            with body.if_(op("i32.and", get(index), const(1))):
                with body.then():
                    body.increment(total, get(index))
                with body.else_():
                    body.comment("even: nothing")
            body.increment(index)
            body.br_if("$count", op("i32.lt_u", get(index), get("$params")))
    body.line(get(total))
    wat = f"(module {function.text('$sum_odd (param $params i32) (result i32)')} (export \"sum_odd\" (func $sum_odd)))"
    store = wasmtime.Store(wasmtime.Engine())
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, wat_to_wasm(wat)), [])
    assert [instance.exports(store)["sum_odd"](store, count) for count in (0, 1, 4, 7)] == [0, 0, 4, 9]
