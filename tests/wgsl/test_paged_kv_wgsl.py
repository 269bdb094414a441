"""The paged KV cache's WGSL kernels (``relaxweb/wgsl/library/paged_kv.py``) on wgpu against
their numpy references (``relaxweb/library/paged_kv.py``), as a model runs them: each step
writes its tokens' new keys and values into their pages (in place), then attends over the pools.

Sequences own pages in shuffled order; the shapes cover pages of 4 and 16 positions,
grouped-query heads (4 query heads on 2 key / value heads) and plain ones (4 on 4), heads of
6, 8 and 32, value rows of 40, 64 and 128; the steps a decode of several sequences at different
positions (as a batch of one-token rows, and packed in one row as the runtimes pack them), a
prefill of 37 tokens, a decode past 512 keys (three chunks of the online softmax), and
positions and page ids out of range (clamped as the references clamp them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from relaxweb.ir.symbolic import SizeVar, evaluate
from relaxweb.library import paged_attention_kernel, paged_kv_write_kernel
from relaxweb.library.paged_kv import token_pages, token_positions
from relaxweb.wgsl.library import library_kernel_wgsl
from relaxweb.wgsl.library.paged_kv import CHUNK
from relaxweb.wgsl.ragged import ragged_problem
from tests.gpu_kernels import run_library_kernel_on_gpu
from tests.helpers import assert_close

BATCH, LENGTH = SizeVar("batch"), SizeVar("length")


@dataclass(frozen=True)
class Layer:
    """One attention layer's paged caches."""

    heads: int
    kv_heads: int
    head: int
    value_head: int
    page_size: int
    pages: int
    table_pages: int

    @property
    def capacity(self) -> int:
        """Positions a sequence's page table holds."""
        return self.table_pages * self.page_size

    def write_kernel(self, row: int):
        return paged_kv_write_kernel("paged_write", BATCH, self.kv_heads, LENGTH, row, self.pages, self.page_size,
                                     self.table_pages, "float32")

    def attention_kernel(self):
        return paged_attention_kernel("paged_attention", BATCH, self.heads, self.kv_heads, LENGTH, self.head,
                                      self.value_head, self.pages, self.page_size, self.table_pages,
                                      1 / math.sqrt(self.head), "float32")

    def empty_pools(self, rng) -> list[np.ndarray]:
        """The key and value pools before the first step: what earlier runs left (random)."""
        return [rng.standard_normal((self.pages, self.kv_heads, self.page_size, row)).astype(np.float32)
                for row in (self.head, self.value_head)]


LAYERS = {
    "pages_of_4_grouped": Layer(heads=4, kv_heads=2, head=8, value_head=64, page_size=4, pages=40, table_pages=10),
    "pages_of_16": Layer(heads=4, kv_heads=4, head=32, value_head=128, page_size=16, pages=14, table_pages=4),
    "odd_rows": Layer(heads=4, kv_heads=2, head=6, value_head=40, page_size=4, pages=40, table_pages=10),
}


def page_tables(layer: Layer, sequences: int, rng) -> np.ndarray:
    """Each sequence's page table ``[sequences, table_pages]``: distinct pages, out of order."""
    assert sequences * layer.table_pages <= layer.pages
    return rng.permutation(layer.pages)[:sequences * layer.table_pages].reshape(sequences, -1).astype(np.int32)


def run_step(device, layer: Layer, pools: list[np.ndarray], query: np.ndarray, keys: np.ndarray, values: np.ndarray,
             tables: np.ndarray, positions: np.ndarray, grid=None) -> tuple[list[np.ndarray], np.ndarray]:
    """One step of a layer: the tokens' keys and values into their pages, then their attention
    over the pools; each result checked against the reference.  ``tables`` is each token's
    page table ``[batch, length, table_pages]``.  The new pools and the attention's output."""
    batch, _, length, _ = query.shape
    sizes = {"batch": batch, "length": length}
    written = []
    for pool, new, row in zip(pools, (keys, values), (layer.head, layer.value_head)):
        kernel = layer.write_kernel(row)
        inputs = [new, tables, positions]
        result = run_library_kernel_on_gpu(device, kernel, inputs, sizes, initial=pool,
                                           grid=grid and grid(kernel, sizes))
        expected = pool.copy()
        kernel.reference(inputs, expected, sizes)
        np.testing.assert_array_equal(result, expected)
        written.append(result)
    kernel = layer.attention_kernel()
    inputs = [query, *written, tables, positions]
    output = run_library_kernel_on_gpu(device, kernel, inputs, sizes, grid=grid and grid(kernel, sizes))
    assert_close(output, kernel.reference(inputs))
    # the form for CPU adapters (no barriers: invocation 0 of each workgroup walks the keys)
    cpu_form = run_library_kernel_on_gpu(device, kernel, inputs, sizes, grid=grid and grid(kernel, sizes),
                                         target="webgpu_cpu")
    assert_close(cpu_form, kernel.reference(inputs))
    return written, output


def tokens(layer: Layer, batch: int, length: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random queries, keys and values of ``batch`` rows of ``length`` tokens."""
    return (rng.standard_normal((batch, layer.heads, length, layer.head)).astype(np.float32),
            rng.standard_normal((batch, layer.kv_heads, length, layer.head)).astype(np.float32),
            rng.standard_normal((batch, layer.kv_heads, length, layer.value_head)).astype(np.float32))


def prefill(device, layer: Layer, pools: list[np.ndarray], table: np.ndarray, count: int, rng) -> list[np.ndarray]:
    """A sequence's first ``count`` positions written into its pages (its prompt's keys and values)."""
    _, keys, values = tokens(layer, 1, count, rng)
    sizes = {"batch": 1, "length": count}
    inputs = [np.broadcast_to(table, (1, count, layer.table_pages)).copy(), np.arange(count, dtype=np.int32)[None]]
    return [run_library_kernel_on_gpu(device, layer.write_kernel(new.shape[-1]), [new, *inputs], sizes, initial=pool)
            for pool, new in zip(pools, (keys, values))]


@pytest.mark.parametrize("layer", LAYERS.values(), ids=LAYERS.keys())
def test_a_decode_step_of_several_sequences(device, layer: Layer) -> None:
    """Three sequences at different positions (one at its first, one at its table's last), one
    token each: as a batch of three one-token rows, then one step later packed in one row (as
    the runtimes run them).  A token's result is the same, bit for bit, run alone."""
    rng = np.random.default_rng(1)
    tables = page_tables(layer, 3, rng)
    positions = np.array([0, layer.page_size + 2, layer.capacity - 2], np.int32)
    pools = layer.empty_pools(rng)
    for table, position in zip(tables, positions):
        if position:
            pools = prefill(device, layer, pools, table, int(position), rng)
    query, keys, values = tokens(layer, 3, 1, rng)
    pools, output = run_step(device, layer, pools, query, keys, values, tables[:, None], positions[:, None])
    # the first token alone: the same workgroups' code, none of the others in the dispatch
    sizes = {"batch": 1, "length": 1}
    alone = run_library_kernel_on_gpu(device, layer.attention_kernel(),
                                      [query[:1], *pools, tables[:1, None], positions[:1, None]], sizes)
    np.testing.assert_array_equal(alone, output[:1])
    # the next step, packed: batch 1, three tokens
    query, keys, values = tokens(layer, 1, 3, rng)
    run_step(device, layer, pools, query, keys, values, tables[None], positions[None] + 1)


def flat_grid(columns: int):
    """A 2-D grid of ``columns`` workgroups a row, a row more than the kernel's workgroups need."""
    def grid(kernel, sizes: dict[str, int]) -> tuple[int, int, int]:
        workgroups = -(-int(evaluate(kernel.dispatch_count, sizes)) // 64)
        return columns, -(-workgroups // columns) + 1, 1
    return grid


@pytest.mark.parametrize("layer", LAYERS.values(), ids=LAYERS.keys())
def test_a_prefill_of_37_tokens(device, layer: Layer) -> None:
    """One sequence's 37 prompt tokens in one step (causal: each sees the positions up to its
    own), dispatched as a 2-D grid with idle workgroups past the end."""
    rng = np.random.default_rng(2)
    table = page_tables(layer, 1, rng)
    query, keys, values = tokens(layer, 1, 37, rng)
    run_step(device, layer, layer.empty_pools(rng), query, keys, values,
             np.broadcast_to(table, (1, 37, layer.table_pages)).copy(), np.arange(37, dtype=np.int32)[None],
             grid=flat_grid(7))


def test_a_decode_over_several_chunks(device) -> None:
    """Keys past 2 * CHUNK: the online softmax rescales over three chunks (and over two for
    the second sequence)."""
    layer = Layer(heads=4, kv_heads=2, head=8, value_head=64, page_size=16, pages=80, table_pages=40)
    rng = np.random.default_rng(3)
    tables = page_tables(layer, 2, rng)
    positions = np.array([2 * CHUNK + 90, CHUNK + 1], np.int32)
    pools = layer.empty_pools(rng)
    for table, position in zip(tables, positions):
        pools = prefill(device, layer, pools, table, int(position), rng)
    query, keys, values = tokens(layer, 1, 2, rng)
    run_step(device, layer, pools, query, keys, values, tables[None], positions[None])


def test_positions_and_page_ids_out_of_range_are_clamped(device) -> None:
    """Positions below 0 and past the table, page ids below 0 and past the pool: the kernels
    read and write inside the pools (the runner checks past their end) and give what the
    references give."""
    layer = LAYERS["pages_of_4_grouped"]
    rng = np.random.default_rng(4)
    tables = page_tables(layer, 3, rng)
    tables[0, 0] = layer.pages + 5  # position -3 -> 0, on page pages - 1
    tables[1, -1] = -7  # position capacity + 100 -> capacity - 1, on page 0
    tables[1, 2] = 1 << 30  # a page it reads: pages - 1
    tables[2, 1] = -1  # position 5 -> page 0
    positions = np.array([[-3, layer.capacity + 100, 5]], np.int32)
    # the tokens write distinct rows (two writes to one row would race)
    rows = token_positions(positions, layer.table_pages, layer.page_size)
    pages = token_pages(tables, rows, layer.page_size, layer.pages)
    assert len({(page, row % layer.page_size) for page, row in zip(pages, rows)}) == 3
    query, keys, values = tokens(layer, 1, 3, rng)
    run_step(device, layer, layer.empty_pools(rng), query, keys, values, tables[None], positions)


def test_the_kernels_follow_the_shader_contract() -> None:
    """Both have ragged forms (their workgroup numbered once as the contract says), and the
    attention's workgroup memory stays within WebGPU's 16 KiB."""
    layer = LAYERS["pages_of_16"]
    for kernel in (layer.write_kernel(layer.head), layer.attention_kernel()):
        assert ragged_problem(library_kernel_wgsl(kernel)) is None, kernel.name
    wide = paged_attention_kernel("wide", 1, 1, 1, LENGTH, 4096, 64, 4, 16, 4, 1.0, "float32")
    with pytest.raises(ValueError, match="workgroup memory"):
        library_kernel_wgsl(wide)
