"""The library kernels' WebAssembly (``LibraryKernel.wasm_source``): each builder's kernel,
assembled into a kernels.wasm with the math functions it calls, run on numpy arrays as the
runtime runs it (params block as the host writes it, units split into ranges run last
first) and compared with the kernel's numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.cpu import KernelFunctions, assemble_kernels_module, wat_to_wasm
from relaxweb.ir.symbolic import IntImm, SizeVar, evaluate
from relaxweb.library import (
    kv_cache_write_kernel, sequence_write_kernel, unique_count_kernel, unique_values_kernel, write_row_kernel,
)
from tests.helpers import assert_close, rand
from tests.wasm_kernels import run_wasm_kernel

KERNEL_INDEX = 3  # any index: the assembler names the functions after it


def run_library_kernel(kernel, arrays: list[np.ndarray], sizes: dict[str, int], output: np.ndarray,
                       ranges: int = 3) -> np.ndarray:
    """``kernel``'s wasm_source on ``arrays`` (device dtypes), writing into ``output``; the
    params block holds element_count (the dispatch count) and ``sizes`` in the kernel's order."""
    assert kernel.wasm_source, f"{kernel.name} has no wasm_source"
    wat = assemble_kernels_module([KernelFunctions(KERNEL_INDEX, kernel.name, kernel.wasm_source)], "test")
    params = [int(evaluate(kernel.dispatch_count, sizes))] + [sizes[var.name] for var in kernel.size_vars]
    return run_wasm_kernel(wat_to_wasm(wat), KERNEL_INDEX, arrays, output, params,
                           scratch_bytes=kernel.wasm_scratch_bytes, ranges=ranges)


def expected_in_place(kernel, arrays: list[np.ndarray], sizes: dict[str, int], output: np.ndarray) -> np.ndarray:
    expected = output.copy()
    kernel.reference(arrays, expected, sizes)
    return expected


# -- copies into part of the output ------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint32"])
@pytest.mark.parametrize("row_shape, rows, row", [((5,), 4, 2), ((3, 700), 3, 0), ((2, 1100), 2, 1), ((), 6, 5)])
def test_write_row_writes_one_row_and_keeps_the_others(dtype: str, row_shape: tuple, rows: int, row: int) -> None:
    n = SizeVar("n")
    kernel = write_row_kernel("write_row", IntImm(rows), (n, *row_shape[1:]) if row_shape else (), dtype, "iteration")
    value = rand(row_shape, seed=1, dtype=dtype if dtype != "uint32" else "int32").astype(dtype)
    output = rand((rows, *row_shape), seed=2, dtype=dtype if dtype != "uint32" else "int32").astype(dtype)
    sizes = {"n": row_shape[0] if row_shape else 1, "iteration": row}
    result = run_library_kernel(kernel, [value], sizes, output)
    np.testing.assert_array_equal(result, expected_in_place(kernel, [value], sizes, output))


@pytest.mark.parametrize("count, arena, offset", [(1, 8, 7), (6, 20, 3), (2500, 6000, 1001), (0, 4, 2)])
def test_sequence_write_appends_at_the_offset(count: int, arena: int, offset: int) -> None:
    kernel = sequence_write_kernel("float32")
    value = rand(count, seed=3)
    output = rand(arena, seed=4)
    sizes = {"count": count, "arena": arena, "offset": offset}
    result = run_library_kernel(kernel, [value], sizes, output)
    np.testing.assert_array_equal(result, expected_in_place(kernel, [value], sizes, output))


@pytest.mark.parametrize("outer, length, inner, capacity, offset", [
    ((2, 3), 1, (8,), 16, 5),        # one decode step, [batch, heads, capacity, head]
    ((2, 3), 7, (8,), 16, 9),        # a prompt of 7 after 9 cached rows, up to the last row
    ((1,), 300, (4, 2), 512, 100),   # runs cross the units' boundaries
    ((), 5, (3,), 9, 0),             # no outer dims
    ((4,), 3, (), 10, 2),            # no inner dims
])
def test_kv_cache_write_writes_only_the_new_rows(outer: tuple, length: int, inner: tuple, capacity: int,
                                                 offset: int) -> None:
    kernel = kv_cache_write_kernel("kv_cache_write", tuple(IntImm(d) for d in outer[:1]) + tuple(outer[1:]),
                                   SizeVar("new"), inner, capacity, "float32", "past")
    value = rand((*outer, length, *inner), seed=5)
    output = rand((*outer, capacity, *inner), seed=6)
    sizes = {"new": length, "past": offset}
    result = run_library_kernel(kernel, [value], sizes, output)
    np.testing.assert_array_equal(result, expected_in_place(kernel, [value], sizes, output))
    assert not np.array_equal(result, output)  # something was written


# -- unique ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint32"])
@pytest.mark.parametrize("length", [1, 7, 40])
def test_unique_count_and_values_match_numpy(dtype: str, length: int) -> None:
    n = SizeVar("n")
    values = rand(length, seed=7, low=0, high=6, dtype="int32").astype(dtype)
    if dtype == "float32":
        values = values - np.float32(2.5)  # negative values too
    if dtype == "uint32":
        values[::3] += np.uint32(0x80000000)  # above INT_MAX: compared unsigned
    sizes = {"n": length}
    count = unique_count_kernel("unique_count", n, dtype)
    result = run_library_kernel(count, [values], sizes, np.full(1, -1, np.int32))
    np.testing.assert_array_equal(result, count.reference([values]))
    distinct = unique_values_kernel("unique_values", n, dtype)
    result = run_library_kernel(distinct, [values], sizes, np.zeros(length, values.dtype))
    np.testing.assert_array_equal(result, distinct.reference([values]))


def test_unique_count_of_nothing_writes_nothing() -> None:
    """Zero values: no unit (the WGSL dispatches no invocation), the output is kept."""
    count = unique_count_kernel("unique_count", SizeVar("n"), "float32")
    result = run_library_kernel(count, [np.zeros(0, np.float32)], {"n": 0}, np.full(1, 7, np.int32))
    np.testing.assert_array_equal(result, [7])
