"""A paged KV cache: ``paged_kv_write`` (new keys or values into their pages, in place) and
``paged_attention`` (each query token over the keys of its own sequence, read through its
page table), for decoders that serve several sequences in one run (continuous batching,
``passes/page_kv_caches.py``).

The **pool** of one layer's keys (or values) is ``[pages, heads, page_size, head]``: page
``p`` holds ``page_size`` consecutive positions of one sequence, head by head.  A run's
tokens are ``[batch, length]`` (the runtimes pack every live sequence's new tokens into one
row: ``batch`` 1); token ``n = b * length + t`` carries

- its **position** ``positions[b, t]`` (int32): its row in its sequence (the rotary position);
- its sequence's **page table** ``page_table[b, t, :]`` (int32, ``table_pages`` entries): the
  page holding positions ``[k * page_size, (k + 1) * page_size)`` is ``page_table[b, t, k]``.

So position ``j`` of token ``n``'s sequence lies at page ``page_table[n, j / page_size]``,
row ``j % page_size``.  Tokens of one sequence carry the same table.

Both kernels clamp what they read from the data, so no table or position reads or writes
outside the pool: a position to ``[0, table_pages * page_size)``, a page id to ``[0,
pages)`` (the runtimes give valid ones: ``runtime/paged_generate.py``).

- ``paged_kv_write``: ``pool[page(n, pos), h, pos % page_size, :] = value[b, h, t, :]`` with
  ``pos = positions[b, t]``, one invocation per element of ``value [batch, heads, length,
  head]``; the other rows of the pool are kept (in place: ``plan_memory`` calls it into the
  pool's storage).
- ``paged_attention``: for query ``[b, h, t, :]`` of ``query [batch, heads, length, head]``,
  ``softmax(q . k_j * scale) v_j`` over positions ``j = 0 .. positions[b, t]`` of its
  sequence (causal: a token sees its own position and those before it), with ``k_j``, ``v_j``
  the rows of key / value head ``h / (heads / kv_heads)`` (grouped-query heads share one).
  One WebGPU workgroup of 64 invocations per (token, head): the keys split among them.
"""

from __future__ import annotations

import numpy as np

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import WASM, WEBGPU, WEBGPU_CPU, LibraryKernel
from ..ir.symbolic import IntImm, PrimExpr, format_shape, simplify
from ..ir.tir import Buffer

#: Invocations of one paged attention workgroup (one per (token, head)).
PAGED_WORKGROUP = 64


def _token_buffers(batch: PrimExpr, length: PrimExpr, table_pages: int) -> tuple[Buffer, Buffer]:
    """The page table ``[batch, length, table_pages]`` and the positions ``[batch, length]``."""
    return (Buffer("page_table", (batch, length, IntImm(table_pages)), "int32"),
            Buffer("positions", (batch, length), "int32"))


def token_positions(positions: np.ndarray, table_pages: int, page_size: int) -> np.ndarray:
    """Each token's position, clamped as the kernels clamp it."""
    return np.clip(positions.reshape(-1).astype(np.int64), 0, table_pages * page_size - 1)


def token_pages(page_table: np.ndarray, rows: np.ndarray, page_size: int, pages: int) -> np.ndarray:
    """The page of row ``rows[n]`` (already clamped) of each token ``n``, clamped as the kernels clamp it."""
    table = page_table.reshape(len(rows), -1).astype(np.int64)
    return np.clip(table[np.arange(len(rows)), rows // page_size], 0, pages - 1)


@library_kernel_builder("paged_kv_write")
def paged_kv_write_kernel(name: str, batch: PrimExpr, heads: int, length: PrimExpr, head: int, pages: int,
                          page_size: int, table_pages: int, dtype: str) -> LibraryKernel:
    """``value [batch, heads, length, head]`` into its tokens' pages of ``out [pages, heads,
    page_size, head]`` (see the module doc); inputs value, page_table, positions."""
    value = Buffer("value", (batch, IntImm(heads), length, IntImm(head)), dtype)
    page_table, positions = _token_buffers(batch, length, table_pages)
    output = Buffer("out", (IntImm(pages), IntImm(heads), IntImm(page_size), IntImm(head)), dtype)

    def reference(arrays: list, out, sizes) -> None:
        new, table, where = arrays
        tokens = new.shape[0] * new.shape[2]
        rows = token_positions(where, table_pages, page_size)
        page = token_pages(table, rows, page_size, pages)
        new_rows = np.moveaxis(new, 1, 2).reshape(tokens, heads, head)  # [token, head, :]
        for n in range(tokens):
            out[page[n], :, rows[n] % page_size, :] = new_rows[n]

    summary = f"new keys or values into their pages of a [{format_shape(output.shape)}] pool"
    return LibraryKernel(name, (value, page_table, positions), output, simplify(batch * heads * length * head),
                         reference, summary, in_place=True, targets=(WEBGPU, WASM))


@library_kernel_builder("paged_attention")
def paged_attention_kernel(name: str, batch: PrimExpr, heads: int, kv_heads: int, length: PrimExpr, head: int,
                           value_head: int, pages: int, page_size: int, table_pages: int, scale: float,
                           dtype: str) -> LibraryKernel:
    """Causal attention of ``query [batch, heads, length, head]`` over each token's own
    sequence in the pools ``key [pages, kv_heads, page_size, head]`` and ``value [pages,
    kv_heads, page_size, value_head]`` (see the module doc); inputs query, key, value,
    page_table, positions; output ``[batch, heads, length, value_head]``."""
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"paged_attention: {heads} query heads do not share {kv_heads} key / value heads evenly")
    query = Buffer("query", (batch, IntImm(heads), length, IntImm(head)), dtype)
    key = Buffer("key", (IntImm(pages), IntImm(kv_heads), IntImm(page_size), IntImm(head)), dtype)
    value = Buffer("value", (IntImm(pages), IntImm(kv_heads), IntImm(page_size), IntImm(value_head)), dtype)
    page_table, positions = _token_buffers(batch, length, table_pages)
    output = Buffer("out", (batch, IntImm(heads), length, IntImm(value_head)), dtype)
    group = heads // kv_heads

    def reference(arrays: list) -> np.ndarray:
        q, k, v, table, where = arrays
        compute = np.float64 if q.dtype == np.float64 else np.float32
        tokens = q.shape[0] * q.shape[2]
        rows = token_positions(where, table_pages, page_size)
        out = np.zeros((q.shape[0], q.shape[2], heads, value_head), compute)  # [b, t, h, :]
        flat_out = out.reshape(tokens, heads, value_head)
        flat_q = np.moveaxis(q, 1, 2).reshape(tokens, heads, head).astype(compute)
        table_rows = table.reshape(tokens, -1).astype(np.int64)
        for n in range(tokens):
            seen = np.arange(rows[n] + 1)
            page = np.clip(table_rows[n, seen // page_size], 0, pages - 1)
            keys = k[page, :, seen % page_size, :].astype(compute)  # [j, kv_heads, head]
            values = v[page, :, seen % page_size, :].astype(compute)
            for h in range(heads):
                scores = keys[:, h // group, :] @ flat_q[n, h] * compute(scale)
                weights = np.exp(scores - scores.max())
                flat_out[n, h] = (weights / weights.sum()) @ values[:, h // group, :]
        return np.ascontiguousarray(np.moveaxis(out, 2, 1)).astype(q.dtype)

    summary = (f"causal attention [{format_shape(output.shape)}] over each token's sequence in "
               f"[{format_shape(key.shape)}] pools")
    workgroups = simplify(batch * heads * length)
    return LibraryKernel(name, (query, key, value, page_table, positions), output,
                         simplify(workgroups * PAGED_WORKGROUP), reference, summary, targets=(WEBGPU, WEBGPU_CPU, WASM))


def paged_title(kernel: LibraryKernel) -> str:
    """The comment that heads the kernel's code, in every backend."""
    arguments = kernel.arguments
    return (f"library kernel: {arguments['name']} ({kernel.summary}; pages of {arguments['page_size']} positions, "
            f"{arguments['table_pages']} per sequence)")
