"""The library kernels' WebAssembly (``relaxweb/cpu/library``): each builder's kernel,
assembled into a kernels.wasm with the math functions it calls, run on numpy arrays as the
runtime runs it (params block as the host writes it, units split into ranges run last
first) and compared with the kernel's numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.cpu import KernelFunctions, assemble_kernels_module, wat_to_wasm
from relaxweb.cpu.library import RENDERERS, library_kernel_wat
from relaxweb.cpu.library.attention import WASM_KEY_BLOCK, WASM_ROWS
from relaxweb.cpu.math import MATH_FUNCTIONS
from relaxweb.ir.kernel_builders import _BUILDERS, build_library_kernel
from relaxweb.ir.symbolic import IntImm, SizeVar, evaluate
from relaxweb.library import (
    attention_kernel, kv_cache_write_kernel, paged_attention_kernel, paged_kv_write_kernel, recurrence_kernel, sequence_write_kernel,
    unique_count_kernel, unique_values_kernel, write_row_kernel,
)
from tests.helpers import F32, F32_LOOSE, assert_close, rand
from tests.wasm_kernels import run_wasm_kernel

KERNEL_INDEX = 3  # any index: the assembler names the functions after it


def run_library_kernel(kernel, arrays: list[np.ndarray], sizes: dict[str, int], output: np.ndarray,
                       ranges: int = 3) -> np.ndarray:
    """``kernel``'s WebAssembly on ``arrays`` (device dtypes), writing into ``output``; the
    params block holds element_count (the dispatch count) and ``sizes`` in the kernel's order."""
    library_wat = library_kernel_wat(kernel)
    assert library_wat is not None, f"{kernel.name} has no WebAssembly version"
    wat = assemble_kernels_module([KernelFunctions(KERNEL_INDEX, kernel.name, library_wat.text)], "test",
                                  MATH_FUNCTIONS)
    params = [int(evaluate(kernel.dispatch_count, sizes))] + [sizes[var.name] for var in kernel.size_vars]
    return run_wasm_kernel(wat_to_wasm(wat), KERNEL_INDEX, arrays, output, params,
                           scratch_bytes=library_wat.scratch_bytes, ranges=ranges)


def expected_in_place(kernel, arrays: list[np.ndarray], sizes: dict[str, int], output: np.ndarray) -> np.ndarray:
    expected = output.copy()
    kernel.reference(arrays, expected, sizes)
    return expected


#: The builders this file runs: every registered one (a new library kernel brings its
#: WebAssembly renderer and its tests here, or bundles using it have no kernels.wasm).
TESTED_BUILDERS = {"write_row", "sequence_write", "kv_cache_write", "unique_count", "unique_values", "attention",
                   "recurrence", "paged_kv_write", "paged_attention"}


def test_every_library_kernel_builder_is_tested_here() -> None:
    assert set(_BUILDERS) == TESTED_BUILDERS == set(RENDERERS)


def test_a_kernel_rebuilt_from_its_ir_text_arguments_has_the_same_wasm() -> None:
    """The IR text records the builder and its arguments; the parser's rebuild renders the same WAT."""
    kernel = attention_kernel("attention", (2, 6), SizeVar("new"), SizeVar("past") + SizeVar("new"), 8, 4,
                              (2, 1, 1, SizeVar("past") + SizeVar("new")), 0.5, True, kv_batch=(2, 2), key_rows=IntImm(16))
    rebuilt = build_library_kernel(kernel.builder, dict(kernel.builder_args))
    assert rebuilt == kernel and library_kernel_wat(rebuilt) == library_kernel_wat(kernel)


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


@pytest.mark.parametrize("lengths, length, offset", [
    ([5, 3], 1, 5),          # a ragged decode step: entry 1 holds 3 rows of a past of 5
    ([0, 9, -2], 2, 6),      # lengths past the past, and negative ones, clamped into [0, 6]
    ([100], 300, 100),       # runs cross the units' boundaries
])
def test_a_ragged_kv_cache_write_starts_each_entry_after_its_own_past(lengths: list, length: int, offset: int) -> None:
    """GroupQueryAttention's cache: entry b's rows from clamp(lengths[b], 0, offset) on."""
    batch, heads, head, capacity = len(lengths), 2, 4, 512
    kernel = kv_cache_write_kernel("kv_cache_write", (SizeVar("batch"), IntImm(heads)), SizeVar("new"), (IntImm(head),),
                                   capacity, "float32", "past", ragged=True)
    value = rand((batch, heads, length, head), seed=5)
    output = rand((batch, heads, capacity, head), seed=6)
    sizes = {"batch": batch, "new": length, "past": offset}
    arrays = [value, np.array(lengths, np.int32)]
    result = run_library_kernel(kernel, arrays, sizes, output)
    expected = expected_in_place(kernel, arrays, sizes, output)
    for entry, start in enumerate(min(max(n, 0), offset) for n in lengths):
        np.testing.assert_array_equal(expected[entry, :, start:start + length], value[entry])
    np.testing.assert_array_equal(result, expected)


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


# -- attention ----------------------------------------------------------------------------------

S, T = SizeVar("s"), SizeVar("t")


def check_attention(kernel, arrays: list[np.ndarray], sizes: dict[str, int], tolerance=F32) -> np.ndarray:
    """The kernel's wasm against its reference: NaN exactly where the reference has NaN."""
    output = np.full(kernel.reference(arrays, sizes).shape if kernel.sized_reference else
                     kernel.reference(arrays).shape, 7.0, np.float32)
    got = run_library_kernel(kernel, arrays, sizes, output, ranges=4)
    wanted = kernel.reference(arrays, sizes) if kernel.sized_reference else kernel.reference(arrays)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(wanted))
    assert_close(got, wanted, tolerance)
    return got


@pytest.mark.parametrize("head, value_head", [(8, 4), (6, 5), (3, 1), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_the_reference_at_every_head_size(head: int, value_head: int, causal: bool) -> None:
    kernel = attention_kernel("attention", (2, 3), S, T, head, value_head, scale=0.3, causal=causal)
    for seed, (queries, keys) in enumerate([(70, 70), (5, 40), (40, 5), (1, 1), (3, 6)]):
        arrays = [rand(2, 3, queries, head, seed=seed), rand(2, 3, keys, head, seed=seed + 1),
                  rand(2, 3, keys, value_head, seed=seed + 2)]
        got = check_attention(kernel, arrays, {"s": queries, "t": keys}, F32 if head < 64 else F32_LOOSE)
        if causal and queries > keys:  # the first rows see no key: NaN, as an additive -inf mask gives
            assert np.isnan(got[:, :, 0]).all() and np.isfinite(got[:, :, -1]).all()


@pytest.mark.parametrize("mask_shape", [(1, 1, "s", "t"), (2, 1, 1, "t"), ("s", "t"), (2, 3, "s", 1)])
def test_attention_adds_a_broadcast_mask(mask_shape: tuple) -> None:
    """-inf entries hide keys (a row with none left is NaN), -3.4e38 ones (torch's) keep it finite."""
    dims = {"s": S, "t": T}
    kernel = attention_kernel("attention", (2, 3), S, T, 8, 8, tuple(dims.get(d, d) for d in mask_shape), scale=0.5)
    queries, keys = 6, 9
    concrete = tuple({"s": queries, "t": keys}.get(d, d) for d in mask_shape)
    mask = rand(concrete, seed=4)
    mask = np.where(mask > 1.0, -np.inf, np.where(mask < -1.2, np.float32(-3.4e38), mask)).astype(np.float32)
    if tuple(mask_shape[-2:]) == ("s", "t"):
        mask[..., 1, :] = -np.inf  # query row 1 sees no key
    arrays = [rand(2, 3, queries, 8, seed=5), rand(2, 3, keys, 8, seed=6), rand(2, 3, keys, 8, seed=7), mask]
    got = check_attention(kernel, arrays, {"s": queries, "t": keys})
    if tuple(mask_shape[-2:]) == ("s", "t"):
        assert np.isnan(got[:, :, 1]).all() and np.isfinite(got[:, :, 0]).all()


def test_attention_with_no_keys_is_zero_and_a_nan_score_makes_its_row_nan() -> None:
    kernel = attention_kernel("attention", (2,), S, T, 4, 4)
    got = check_attention(kernel, [rand(2, 3, 4, seed=1), rand(2, 0, 4), rand(2, 0, 4)], {"s": 3, "t": 0})
    assert (got == 0).all()
    query = rand(2, 3, 4, seed=1)
    query[1, 2, 0] = np.nan
    got = check_attention(kernel, [query, rand(2, 5, 4, seed=2), rand(2, 5, 4, seed=3)], {"s": 3, "t": 5})
    assert np.isnan(got[1, 2]).all() and np.isfinite(got[0]).all()


@pytest.mark.parametrize("kv_batch", [(2, 2), (2, 1), (1, 6)])
def test_grouped_query_heads_read_their_key_value_head(kv_batch: tuple) -> None:
    """Query head h reads key / value head h // group (transformers' repeat_kv order)."""
    kernel = attention_kernel("attention", (2, 6), S, T, 8, 4, (2, 1, S, T), 0.5, kv_batch=kv_batch)
    mask = np.where(rand(2, 1, 5, 7, seed=1) > 1.0, -np.inf, 0.0).astype(np.float32)
    arrays = [rand(2, 6, 5, 8, seed=2), rand(*kv_batch, 7, 8, seed=3), rand(*kv_batch, 7, 4, seed=4), mask]
    check_attention(kernel, arrays, {"s": 5, "t": 7})


@pytest.mark.parametrize("queries, keys", [(9, 9), (6, 23), (WASM_ROWS * 5, 37), (WASM_ROWS + 1, 4)])
def test_attention_rows_of_a_block_share_key_groups_then_finish_alone(queries: int, keys: int) -> None:
    """A unit's WASM_ROWS rows walk the key groups they all see together, then each finishes
    its own: full and partial blocks, causal rows past the shared groups, and rows whose first
    groups are masked out entirely (-inf: the row starts late) or whose mask is -3.4e38."""
    kernel = attention_kernel("attention", (2, 3), S, T, 12, 8, (2, 1, S, T), scale=0.4, causal=True)
    mask = rand(2, 1, queries, keys, seed=8)
    mask[:, :, ::3, :6] = -np.inf
    mask[:, :, 1::3, :] = np.float32(-3.4e38)
    arrays = [rand(2, 3, queries, 12, seed=9), rand(2, 3, keys, 12, seed=10), rand(2, 3, keys, 8, seed=11), mask]
    got = check_attention(kernel, arrays, {"s": queries, "t": keys})
    assert np.isfinite(got[:, :, -1]).all()


@pytest.mark.parametrize("queries, past", [(1, 0), (1, 15), (3, 4), (16, 0)])
def test_attention_reads_the_valid_prefix_of_a_kv_cache(queries: int, past: int) -> None:
    """k and v [b, 2, 16, .] (a cache of capacity 16) of which the first past + new rows are
    valid, causal (a decode step's query sees every key); rows past them hold NaN."""
    new = SizeVar("new")
    kernel = attention_kernel("attention", (1, 6), new, SizeVar("past") + new, 8, 8, scale=0.5, causal=True,
                              kv_batch=(1, 2), key_rows=IntImm(16))
    cache = [rand(1, 2, 16, 8, seed=1), rand(1, 2, 16, 8, seed=2)]
    for tensor in cache:
        tensor[:, :, past + queries:] = np.nan
    check_attention(kernel, [rand(1, 6, queries, 8, seed=3), *cache], {"new": queries, "past": past})


LONG = 2 * WASM_KEY_BLOCK + 22  # keys: two whole key blocks, a partial one, and 2 past the last group


@pytest.mark.parametrize("value_head", [8, 12, 64, 5])
@pytest.mark.parametrize("queries, causal", [(WASM_ROWS * 3, False), (WASM_ROWS * 3 + 1, True), (LONG, True)])
def test_attention_over_several_key_blocks(value_head: int, queries: int, causal: bool) -> None:
    """Keys in blocks of WASM_KEY_BLOCK shared by a unit's rows (Dv a multiple of 4; 5 takes
    the groups of 4 keys): rows whose first block is masked out entirely (-inf: the row starts
    in the second), rows with -3.4e38 (torch's), a maximum growing from block to block (the
    accumulators corrected), a causal row's keys past the shared ones, a partial last unit."""
    kernel = attention_kernel("attention", (2, 3), S, T, 12, value_head, (2, 1, S, T), scale=0.4, causal=causal)
    assert (f"blocks of {WASM_KEY_BLOCK} keys" in library_kernel_wat(kernel).text) == (value_head % 4 == 0)
    mask = rand(2, 1, queries, LONG, seed=12)
    mask[:, :, ::3, :WASM_KEY_BLOCK + 5] = -np.inf
    mask[:, :, 1::3, :] = np.float32(-3.4e38)
    mask[:, :, 2::3, :] += np.linspace(0, 12, LONG, dtype=np.float32)  # each block's maximum above the last
    arrays = [rand(2, 3, queries, 12, seed=13), rand(2, 3, LONG, 12, seed=14), rand(2, 3, LONG, value_head, seed=15),
              mask]
    got = check_attention(kernel, arrays, {"s": queries, "t": LONG}, F32_LOOSE)
    assert np.isfinite(got[:, :, -1]).all()


def test_attention_key_blocks_keep_nan_scores_and_rows_that_see_no_key() -> None:
    """A NaN score in a later block makes its row NaN (the blocks' maximum passes over it, its
    weight does not); a row whose every key is -inf is NaN; its neighbours are untouched."""
    kernel = attention_kernel("attention", (1, 2), S, T, 8, 8, (1, 1, S, T), scale=0.5)
    queries = 2 * WASM_ROWS
    mask = rand(1, 1, queries, LONG, seed=16)
    mask[0, 0, 0, 2 * WASM_KEY_BLOCK + 3] = np.nan
    mask[0, 0, 1, :] = -np.inf
    mask[0, 0, 2, :2 * WASM_KEY_BLOCK] = -np.inf  # the first two blocks hidden, the partial third seen
    arrays = [rand(1, 2, queries, 8, seed=17), rand(1, 2, LONG, 8, seed=18), rand(1, 2, LONG, 8, seed=19), mask]
    got = check_attention(kernel, arrays, {"s": queries, "t": LONG})
    assert np.isnan(got[:, :, :2]).all() and np.isfinite(got[:, :, 2:]).all()


@pytest.mark.parametrize("kv_batch", [(2, 1), (1, 6), (2, 2)])
def test_grouped_query_heads_over_several_key_blocks(kv_batch: tuple) -> None:
    kernel = attention_kernel("attention", (2, 6), S, T, 16, 8, None, 0.25, kv_batch=kv_batch)
    arrays = [rand(2, 6, 7, 16, seed=20), rand(*kv_batch, LONG, 16, seed=21), rand(*kv_batch, LONG, 8, seed=22)]
    check_attention(kernel, arrays, {"s": 7, "t": LONG})


@pytest.mark.parametrize("queries, past", [(1, LONG), (WASM_ROWS * 2, LONG - 8), (WASM_ROWS * 2 + 1, 100)])
def test_attention_key_blocks_read_the_valid_prefix_of_a_kv_cache(queries: int, past: int) -> None:
    """A cache of 256 rows of which past + new are valid (the rest NaN): the key blocks stop
    at the rows every query sees, a decode step's single row goes alone."""
    new = SizeVar("new")
    kernel = attention_kernel("attention", (1, 4), new, SizeVar("past") + new, 8, 16, scale=0.5, causal=True,
                              kv_batch=(1, 2), key_rows=IntImm(256))
    cache = [rand(1, 2, 256, 8, seed=23), rand(1, 2, 256, 16, seed=24)]
    for tensor in cache:
        tensor[:, :, past + queries:] = np.nan
    check_attention(kernel, [rand(1, 4, queries, 8, seed=25), *cache], {"new": queries, "past": past})


# -- paged KV cache -----------------------------------------------------------------------------

BATCH, LENGTH = SizeVar("batch"), SizeVar("length")


class PagedLayer:
    """One layer's paged KV cache as a model runs it: the write kernel puts each run's new keys and
    values in their pages (pools of ``pages`` pages, NaN where nothing was written: no read of a
    row past a token's position may reach the result), then the attention reads them."""

    def __init__(self, heads: int, kv_heads: int, head: int, value_head: int, pages: int, page_size: int,
                 table_pages: int, *, fill: float = np.nan, seed: int = 0) -> None:
        """``fill``: NaN pools, or (any number) random ones."""
        rows = (pages, kv_heads, page_size)  # a pool's rows
        self.write_keys = paged_kv_write_kernel("paged_kv_write", BATCH, kv_heads, LENGTH, head, pages, page_size,
                                                table_pages, "float32")
        self.write_values = paged_kv_write_kernel("paged_kv_write", BATCH, kv_heads, LENGTH, value_head, pages,
                                                  page_size, table_pages, "float32")
        self.attention = paged_attention_kernel("paged_attention", BATCH, heads, kv_heads, LENGTH, head, value_head,
                                                pages, page_size, table_pages, float(1 / np.sqrt(head)), "float32")
        self.keys = np.full((*rows, head), fill, np.float32) if np.isnan(fill) else rand(*rows, head, seed=seed)
        self.values = (np.full((*rows, value_head), fill, np.float32) if np.isnan(fill) else
                       rand(*rows, value_head, seed=seed + 1))
        self.heads, self.kv_heads, self.head, self.value_head, self.seed = heads, kv_heads, head, value_head, seed

    def write(self, table: np.ndarray, positions: np.ndarray, ranges: int = 3) -> None:
        """New keys and values for tokens ``[batch, length]`` (random), checked exactly against the reference."""
        batch, length = positions.shape
        sizes = {"batch": batch, "length": length}
        self.seed += 2
        for kernel, name, size in [(self.write_keys, "keys", self.head), (self.write_values, "values", self.value_head)]:
            arrays = [rand(batch, self.kv_heads, length, size, seed=self.seed + (name == "values")), table, positions]
            pool = getattr(self, name)
            got = run_library_kernel(kernel, arrays, sizes, pool, ranges)
            np.testing.assert_array_equal(got, expected_in_place(kernel, arrays, sizes, pool))
            setattr(self, name, got)

    def attend(self, query: np.ndarray, table: np.ndarray, positions: np.ndarray, ranges: int = 4) -> np.ndarray:
        """The attention's wasm (a unit per query row, in ``ranges`` ranges) against its reference."""
        batch, _, length, _ = query.shape
        arrays = [query, self.keys, self.values, table, positions]
        output = np.full((batch, self.heads, length, self.value_head), 7.0, np.float32)
        got = run_library_kernel(self.attention, arrays, {"batch": batch, "length": length}, output, ranges)
        assert_close(got, self.attention.reference(arrays), F32 if self.head < 32 else F32_LOOSE)
        return got


def sequence_tables(sequences: int, table_pages: int, pages: int, seed: int) -> np.ndarray:
    """Each sequence's page table: distinct pages in a random order."""
    return np.random.default_rng(seed).permutation(pages)[:sequences * table_pages].reshape(sequences, table_pages)


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4)])
@pytest.mark.parametrize("head, value_head", [(8, 8), (32, 64), (32, 128)])
@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_decode_of_sequences_at_different_positions(heads: int, kv_heads: int, head: int, value_head: int,
                                                          page_size: int) -> None:
    """Four sequences' histories written in one packed run (batch 1, as the runtimes pack them),
    then a decode step (one token each, at positions 0 .. 3 pages deep) writes its rows and attends."""
    table_pages, done = 4, [2 * page_size + 3, 0, page_size - 1, 4 * page_size - 1]  # the tokens before each
    layer = PagedLayer(heads, kv_heads, head, value_head, 4 * table_pages + 3, page_size, table_pages)
    tables = sequence_tables(4, table_pages, 4 * table_pages + 3, seed=page_size)
    history = np.array([[t for sequence, count in enumerate(done) for t in range(count)]], np.int32)
    owner = [sequence for sequence, count in enumerate(done) for _ in range(count)]
    layer.write(tables[owner][None].astype(np.int32), history)
    table, positions = tables[:, None].astype(np.int32), np.array(done, np.int32)[:, None]
    layer.write(table, positions)
    got = layer.attend(rand(4, heads, 1, head, seed=9), table, positions)
    assert np.isfinite(got).all()  # no NaN row of the pools past a position was read


@pytest.mark.parametrize("page_size", [4, 16])
@pytest.mark.parametrize("heads, kv_heads, head, value_head", [(4, 2, 32, 64), (2, 2, 8, 128)])
def test_paged_prefill_of_one_sequence_of_37_tokens(page_size: int, heads: int, kv_heads: int, head: int,
                                                    value_head: int) -> None:
    """37 tokens of one sequence in one run (causal: token t sees positions 0 .. t), pages out of
    order; each token's row is the one it gets alone in a decode step, and the bytes are the same
    however the units are split."""
    table_pages = -(-37 // page_size)
    layer = PagedLayer(heads, kv_heads, head, value_head, table_pages + 2, page_size, table_pages)
    table = np.tile(sequence_tables(1, table_pages, table_pages + 2, seed=3), (1, 37, 1)).astype(np.int32)
    positions = np.arange(37, dtype=np.int32)[None]
    layer.write(table, positions, ranges=5)
    query = rand(1, heads, 37, head, seed=10)
    got = layer.attend(query, table, positions, ranges=7)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(layer.attend(query, table, positions, ranges=1), got)
    for t in (0, page_size - 1, page_size, 36):
        alone = layer.attend(query[:, :, t:t + 1], table[:, t:t + 1], positions[:, t:t + 1], ranges=1)
        np.testing.assert_array_equal(alone, got[:, :, t:t + 1])


@pytest.mark.parametrize("heads, kv_heads, head, value_head, page_size", [(3, 1, 6, 5, 5), (2, 2, 3, 2, 3)])
def test_paged_attention_at_sizes_that_are_not_multiples_of_4(heads: int, kv_heads: int, head: int, value_head: int,
                                                              page_size: int) -> None:
    """Scalar tails of head and value_head, and pages whose rows are not whole groups of 4 keys."""
    layer = PagedLayer(heads, kv_heads, head, value_head, 9, page_size, 4)
    tables = sequence_tables(2, 4, 9, seed=4)
    prompt = np.array([list(range(2 * page_size + 2)) * 2], np.int32)
    layer.write(np.repeat(tables, 2 * page_size + 2, axis=0)[None].astype(np.int32), prompt)
    positions = np.array([[2 * page_size + 1], [page_size]], np.int32)
    got = layer.attend(rand(2, heads, 1, head, seed=11), tables[:, None].astype(np.int32), positions)
    assert np.isfinite(got).all()


def test_paged_kernels_clamp_positions_and_page_ids() -> None:
    """Positions outside [0, table_pages * page_size) and page ids outside [0, pages) are clamped:
    negative ones to 0, others to the last; where tokens land on one row the last one's is kept."""
    layer = PagedLayer(4, 2, 8, 8, 5, 4, 2, fill=0.0, seed=12)
    positions = np.array([[-5, 3, 8, 100, 7, 2], [0, 1, 6, 2, -1, 5]], np.int32)
    table = np.array([[[-3, 2]] * 6, [[1, 99]] * 6], np.int32)
    table[0, 5] = [4, 7]
    layer.write(table, positions, ranges=2)
    got = layer.attend(rand(2, 4, 6, 8, seed=13), table, positions, ranges=5)
    assert np.isfinite(got).all()


# -- recurrence ---------------------------------------------------------------------------------

RECURRENT_GATES = {"lstm": 4, "gru": 3, "rnn": 1}
DEFAULT_ACTIVATIONS = {"lstm": (("sigmoid", 0, 0), ("tanh", 0, 0), ("tanh", 0, 0)),
                       "gru": (("sigmoid", 0, 0), ("tanh", 0, 0)), "rnn": (("tanh", 0, 0),)}


def check_recurrence(cell: str, direction: str, *, steps: int = 5, batch: int = 3, hidden: int = 6,
                     activations: tuple | None = None, optional: tuple = (), lengths: list[int] | None = None,
                     batch_major_states: bool = False, seed: int = 0, **options) -> None:
    """The kernel's wasm against its reference on random inputs: the rows of Y, Y_h (and the
    cell state Y_c) of the output (a GRU's scratch rows after them are the kernel's own)."""
    directions = 2 if direction == "bidirectional" else 1
    if activations is None:
        activations = DEFAULT_ACTIVATIONS[cell] * directions
    kernel = recurrence_kernel("recurrence", cell, SizeVar("T"), SizeVar("B"), IntImm(hidden), direction,
                               activations, optional=optional, batch_major_states=batch_major_states, **options)
    gates = RECURRENT_GATES[cell] * hidden
    states = (batch, directions, hidden) if batch_major_states else (directions, batch, hidden)
    given = {"bias": rand(directions, 2 * gates, seed=seed + 3),
             "sequence_lens": np.array(lengths if lengths is not None else [steps] * batch, np.int32),
             "initial_h": rand(states, seed=seed + 4), "initial_c": rand(states, seed=seed + 5),
             "peepholes": rand(directions, 3 * hidden, seed=seed + 6)}
    arrays = [rand(steps, batch, directions, gates, seed=seed + 1),
              rand(directions, hidden, gates, seed=seed + 2) * np.float32(0.5 / np.sqrt(hidden)),
              *(given[buffer.name] for buffer in kernel.inputs[2:])]
    wanted = kernel.reference(arrays)
    output = rand(wanted.shape, seed=seed + 7)  # every row checked below is written
    got = run_library_kernel(kernel, arrays, {"T": steps, "B": batch}, output)
    rows = steps + (2 if cell == "lstm" else 1)
    assert_close(got[:rows], wanted[:rows], F32_LOOSE)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrence_with_every_input(cell: str, direction: str) -> None:
    """Initial states, per-batch lengths (one 0, one past the steps: clamped), peepholes."""
    optional = ("sequence_lens", "initial_h", *(("initial_c", "peepholes") if cell == "lstm" else ()))
    check_recurrence(cell, direction, optional=optional, lengths=[3, 0, 9])


@pytest.mark.parametrize("cell, hidden", [("lstm", 130), ("gru", 70), ("rnn", 5), ("lstm", 1)])
def test_recurrence_at_hidden_sizes_that_are_not_multiples_of_4(cell: str, hidden: int) -> None:
    check_recurrence(cell, "bidirectional", hidden=hidden, steps=4, batch=2, optional=("initial_h",))


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_recurrence_clips_and_reads_batch_major_states(cell: str) -> None:
    optional = ("initial_h", *(("initial_c", "peepholes") if cell == "lstm" else ()))
    check_recurrence(cell, "bidirectional", clip=0.3, optional=optional, batch_major_states=True)


@pytest.mark.parametrize("optional", [("bias", "sequence_lens", "initial_h"), ()])
def test_gru_linear_before_reset(optional: tuple) -> None:
    check_recurrence("gru", "bidirectional", linear_before_reset=True, optional=optional, lengths=[5, 2, 1])


def test_lstm_with_coupled_input_and_forget_gates() -> None:
    check_recurrence("lstm", "forward", input_forget=True, optional=("peepholes",))


@pytest.mark.parametrize("name, alpha, beta", [
    ("relu", 0, 0), ("tanh", 0, 0), ("sigmoid", 0, 0), ("affine", 0.7, -0.2), ("leakyrelu", 0.1, 0),
    ("thresholdedrelu", 0.4, 0), ("scaledtanh", 0.9, 1.3), ("hardsigmoid", 0.3, 0.45), ("elu", 0.8, 0),
    ("softsign", 0, 0), ("softplus", 0, 0)])
def test_rnn_with_each_activation(name: str, alpha: float, beta: float) -> None:
    check_recurrence("rnn", "forward", activations=((name, alpha, beta),), optional=("initial_h",))


def test_each_direction_has_its_own_activations() -> None:
    check_recurrence("lstm", "bidirectional", activations=(
        ("hardsigmoid", 0.3, 0.45), ("softsign", 0, 0), ("elu", 0.9, 0),
        ("sigmoid", 0, 0), ("tanh", 0, 0), ("leakyrelu", 0.05, 0)))
    check_recurrence("gru", "bidirectional", activations=(
        ("hardsigmoid", 0.3, 0.45), ("affine", 0.9, 0.1), ("sigmoid", 0, 0), ("scaledtanh", 0.5, 1.5)))
