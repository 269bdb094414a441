"""Fused attention: ``softmax(q k^T * scale + mask) v`` in one kernel, with its numpy reference.

Unfused, attention is a matmul of ``[..., Sq, D]`` by ``[..., D, Sk]``, a scale, a mask add,
a softmax and a second matmul, and the scores ``[..., Sq, Sk]`` live in GPU memory between
them (``[batch, heads, seq, seq]``: 8 MB per layer at 12 heads and seq 512).  This kernel
never writes them: it walks the keys in tiles and keeps, for its query row, the running
maximum ``m``, the running sum ``l`` of ``exp(score - m)`` and the running value product
``acc`` (the online-softmax recurrence of FlashAttention), four keys at a time: a group
whose maximum is above ``m`` rescales ``l`` and ``acc`` by ``exp(m - m_new)`` first.  The
result is ``acc / l``.

One WebGPU workgroup of 64 invocations serves 64 query rows of one (batch..., head) and
stages tiles of ``TILE`` keys and values through workgroup memory; a tile holds ``TILE *
(D + Dv) * 4`` bytes at most 16 KiB (WebGPU's default workgroup storage), so head sizes D and
Dv must be constants (:func:`key_tile`).  Sequence lengths and batch dims are size
variables of the params block: one kernel serves every length.  The backends render the
kernel: ``relaxweb/wgsl/library/attention.py`` (its WGSL, an f16 form for adapters with
``shader-f16`` and a form for CPU adapters) and ``relaxweb/cpu/library/attention.py`` (its
WebAssembly); both read the kernel's :class:`AttentionPlan`.

Inputs: ``query[*batch, Sq, D]``, ``key[*kv_batch, Sk, D]``, ``value[*kv_batch, Sk, Dv]`` (each
dim of ``kv_batch`` is 1, ``batch``'s, or a constant ``c`` dividing ``batch``'s constant ``g * c``:
grouped-query attention shares a key / value head among query heads without copying it;
with a divisor, query head ``h`` reads key / value head ``h // g``, the order of transformers'
``repeat_kv``), and with
``mask_shape`` an additive float ``mask`` broadcast to ``[*batch, Sq, Sk]`` (each of its dims is
1 or the scores' dim; it may have fewer dims, aligned from the right).  ``causal`` hides key
``j`` from query ``i`` when ``j > i + Sk - Sq`` (the last query sees every key), as an
additive ``-inf`` would.  Semantics at the edges, the unfused graph's: a score of NaN makes
its row NaN, a row whose scores are all ``-inf`` (masked out entirely) is NaN, as
``exp(-inf - (-inf))`` gives; a large negative finite mask (``-3.4e38``, what torch writes)
keeps the row finite.  With ``zero_nan_rows`` (what torch's exporters write for
``scaled_dot_product_attention``: ``where(isnan(weights), 0, weights)`` between the softmax and
the value product) a row whose weights are NaN (every score ``-inf``, or a NaN or ``+inf``
score) is 0 instead: the value product of zero weights.  (Unfused, that product is NaN where
one of the head's values is NaN or infinite, as ``0 * inf`` is; the kernel does not read the
values of such a row: it gives 0.)

With ``key_rows`` (a KV cache: key and value ``[*kv_batch, key_rows, D]`` buffers of which the
first ``Sk`` rows of each head are valid), the kernel reads that prefix in place: rows are
``key_rows`` apart per head and ``Sk`` (any expression of size variables, which the call site
binds) says how many are read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import WASM, WEBGPU, WEBGPU_CPU, WEBGPU_F16, LibraryKernel, buffer_size_vars
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, as_int, evaluate, format_shape, free_vars, product, prove_equal, simplify
from ..ir.tir import Buffer

WORKGROUP = 64
#: Bytes of workgroup memory a kernel may use (WebGPU's default maxComputeWorkgroupStorageSize).
WORKGROUP_STORAGE = 16384
#: Keys per tile at most.
MAX_TILE = 32
#: Keys scored together (one rescale of the accumulators per group); a tile holds whole groups.
GROUP = 4

#: Index variables of the kernel's own, in the index expressions of :class:`AttentionPlan`
#: (a backend names them as its locals, never as params fields): the flat (batch..., head)
#: index of the query rows, and the query row.
QUERY_GROUP, QUERY_ROW = SizeVar("bh_"), SizeVar("row_")


def key_tile(head: int, value_head: int) -> int:
    """Keys per tile for head sizes ``head`` (D) and ``value_head`` (Dv), 0 when one key and
    one value do not fit the workgroup memory."""
    return min(MAX_TILE, WORKGROUP_STORAGE // (4 * (head + value_head))) // GROUP * GROUP


@dataclass(frozen=True)
class AttentionPlan:
    """What one attention kernel computes, from its builder's arguments: its buffers, sizes
    and index expressions.  The builder makes the kernel from it and the backends render it
    (:func:`attention_plan` of ``kernel.arguments``)."""

    name: str
    batch: tuple
    kv_batch: tuple  # the key / value batch dims (see the module doc)
    query_length: PrimExpr
    key_length: PrimExpr  # the keys read
    key_rows: PrimExpr  # rows of each key / value head in their buffers (``key_length`` unless a KV cache)
    head: int
    value_head: int
    mask_shape: tuple | None
    scale: float
    causal: bool
    zero_nan_rows: bool  # a row whose weights are NaN is 0 (see the module doc)
    reads_prefix: bool  # the builder was given ``key_rows``: the first ``key_length`` rows are read
    inputs: tuple[Buffer, ...]
    output: Buffer
    extra_size_vars: tuple[SizeVar, ...]  # size variables of ``key_length`` no buffer shape has

    @property
    def tile(self) -> int:
        """Keys per tile of the WebGPU kernel."""
        return key_tile(self.head, self.value_head)

    @property
    def workgroups(self) -> PrimExpr:
        """WebGPU workgroups: one per 64 query rows of a (batch..., head)."""
        return simplify(product(self.batch) * ((self.query_length + (WORKGROUP - 1)) // WORKGROUP))

    @property
    def size_vars(self) -> list[str]:
        """The params block's size variables, in order."""
        return [v.name for v in (*buffer_size_vars((*self.inputs, self.output)), *self.extra_size_vars)]

    def kv_group(self) -> PrimExpr:
        """The flat key / value batch index that query group :data:`QUERY_GROUP` reads."""
        return flat_index(self.kv_batch, kv_coordinates(self.batch, self.kv_batch))

    def mask_row_start(self) -> tuple[PrimExpr, PrimExpr]:
        """The mask's flat index of (group :data:`QUERY_GROUP`, row :data:`QUERY_ROW`, key 0),
        and its step per key: the mask broadcasts against the scores ``[*batch, Sq, Sk]``."""
        assert self.mask_shape is not None
        start = flat_index(tuple(self.mask_shape), [*batch_coordinates(self.batch), QUERY_ROW, IntImm(0)])
        return start, IntImm(0) if as_int(self.mask_shape[-1]) == 1 else IntImm(1)


def attention_plan(name: str, batch: tuple, query_length: PrimExpr, key_length: PrimExpr, head: int, value_head: int,
                   mask_shape: tuple | None = None, scale: float = 1.0, causal: bool = False, dtype: str = "float32",
                   kv_batch: tuple | None = None, key_rows: PrimExpr | None = None,
                   zero_nan_rows: bool = False) -> AttentionPlan:
    """The plan of :func:`attention_kernel` with these arguments; ValueError when the head
    sizes do not fit a tile or the key / value batch dims are not the query's, 1 or divisors."""
    if key_tile(head, value_head) < 1:
        raise ValueError(f"attention: head sizes {head} and {value_head} do not fit {WORKGROUP_STORAGE} bytes of workgroup memory")
    batch = tuple(batch)
    kv_batch = batch if kv_batch is None else tuple(kv_batch)
    if len(kv_batch) != len(batch) or any(kv_group_size(k, b) is None for k, b in zip(kv_batch, batch)):
        raise ValueError(f"attention: key/value batch dims {kv_batch} are not 1, the query's {batch} or divisors of them")
    rows = key_length if key_rows is None else key_rows
    inputs = [Buffer("query", (*batch, query_length, head), dtype), Buffer("key", (*kv_batch, rows, head), dtype),
              Buffer("value", (*kv_batch, rows, value_head), dtype)]
    if mask_shape is not None:
        inputs.append(Buffer("mask", tuple(mask_shape), dtype))
    output = Buffer("out", (*batch, query_length, value_head), dtype)
    shape_vars = {var.name for var in buffer_size_vars((*inputs, output))}
    extra = tuple(var for var in free_vars(key_length) if var.name not in shape_vars)
    return AttentionPlan(name, batch, kv_batch, query_length, key_length, rows, head, value_head, mask_shape, scale,
                         causal, zero_nan_rows, key_rows is not None, tuple(inputs), output, extra)


@library_kernel_builder("attention")
def attention_kernel(name: str, batch: tuple, query_length: PrimExpr, key_length: PrimExpr, head: int,
                     value_head: int, mask_shape: tuple | None = None, scale: float = 1.0, causal: bool = False,
                     dtype: str = "float32", kv_batch: tuple | None = None, key_rows: PrimExpr | None = None,
                     zero_nan_rows: bool = False) -> LibraryKernel:
    """``softmax(query key^T * scale + mask) value`` over ``batch`` dims (see the module doc);
    ``mask_shape`` None: no mask; ``kv_batch``: the batch dims of key and value, each 1
    (shared by every query group along it: grouped-query attention) or ``batch``'s (None: all
    ``batch``'s); ``key_rows``: the rows of each key / value head in their buffers, of which
    the first ``key_length`` are read (None: ``key_length``); ``zero_nan_rows``: a row whose
    weights are NaN is 0."""
    plan = attention_plan(name, batch, query_length, key_length, head, value_head, mask_shape, scale, causal, dtype,
                          kv_batch, key_rows, zero_nan_rows)
    summary = (f"fused attention [{format_shape(plan.output.shape)}] over {format_shape((key_length,))} keys"
               f"{f' of {format_shape((plan.key_rows,))} rows' if plan.reads_prefix else ''}"
               f"{', causal' if causal else ''}{', masked' if mask_shape is not None else ''}"
               f"{', NaN rows 0' if zero_nan_rows else ''}")
    if not plan.reads_prefix:
        def reference(arrays):
            return attention_reference(arrays, scale=scale, causal=causal, zero_nan_rows=zero_nan_rows)
    else:
        def reference(arrays, size_vars):
            length = int(evaluate(key_length, size_vars))
            query, key, value, *mask = arrays
            return attention_reference([query, key[..., :length, :], value[..., :length, :], *mask], scale=scale,
                                       causal=causal, zero_nan_rows=zero_nan_rows)
    return LibraryKernel(name, plan.inputs, plan.output, simplify(plan.workgroups * WORKGROUP), reference, summary,
                         extra_size_vars=plan.extra_size_vars, sized_reference=plan.reads_prefix,
                         targets=(WEBGPU, WEBGPU_F16, WEBGPU_CPU, WASM))


def kv_group_size(kv_extent: PrimExpr, extent: PrimExpr) -> int | None:
    """How many query coordinates along a batch dim of ``extent`` read one key / value
    coordinate along that dim of ``kv_extent``: 1 when they are equal, the ratio when
    ``kv_extent`` is a constant dividing the constant ``extent`` (grouped-query heads), 0 for
    a ``kv_extent`` of 1 that is not the query's (every query reads coordinate 0); None when
    none of these holds."""
    if prove_equal(kv_extent, extent):
        return 1
    if as_int(kv_extent) == 1:
        return 0
    kv, query = as_int(kv_extent), as_int(extent)
    if kv is not None and query is not None and kv > 0 and query % kv == 0:
        return query // kv
    return None


def kv_coordinates(batch: tuple, kv_batch: tuple) -> list[PrimExpr]:
    """The key / value batch coordinates of the flat query batch index ``bh_``: a grouped dim
    divides the query's coordinate by its group size (a dim of 1 is skipped by :func:`flat_index`)."""
    return [coordinate // size if size and size > 1 else coordinate
            for coordinate, size in zip(batch_coordinates(batch), (kv_group_size(k, b) for k, b in zip(kv_batch, batch)))]


def batch_coordinates(batch: tuple) -> list[PrimExpr]:
    """The coordinates of the flat batch index ``bh_`` in the batch dims."""
    coordinates: list[PrimExpr] = []
    inner: PrimExpr = IntImm(1)
    for extent in reversed(batch):
        coordinates.insert(0, (QUERY_GROUP // inner) % extent)
        inner = inner * extent
    return coordinates


def flat_index(shape: tuple, coordinates: list[PrimExpr]) -> PrimExpr:
    """The row-major index into a tensor of ``shape`` broadcast against ``coordinates``
    (aligned from the right; a dim of extent 1 repeats: index 0)."""
    offset = len(coordinates) - len(shape)
    index: PrimExpr = IntImm(0)
    stride: PrimExpr = IntImm(1)
    for position in range(len(shape) - 1, -1, -1):
        if as_int(shape[position]) != 1:
            index = index + coordinates[offset + position] * stride
        stride = stride * shape[position]
    return simplify(index)


# -- numpy reference -------------------------------------------------------------------------------


def attention_reference(arrays: list[np.ndarray], *, scale: float, causal: bool, zero_nan_rows: bool = False
                        ) -> np.ndarray:
    """``softmax(q k^T * scale + mask) v`` with numpy, as the unfused ops compute it (a row
    whose scores are all -inf is NaN; with ``zero_nan_rows``, NaN weights are 0); float32
    arithmetic for narrower floats."""
    dtype = arrays[0].dtype
    compute = np.float64 if dtype == np.float64 else np.float32
    query, key, value = (a.astype(compute) for a in arrays[:3])
    for dim, (kv, extent) in enumerate(zip(key.shape[:-2], query.shape[:-2])):
        if kv not in (1, extent):  # grouped-query heads: each key / value head serves extent // kv
            key, value = (np.repeat(t, extent // kv, axis=dim) for t in (key, value))
    scores = np.matmul(query, np.swapaxes(key, -1, -2))
    if scale != 1.0:
        scores = scores * compute(scale)
    if len(arrays) > 3:
        scores = scores + arrays[3].astype(compute)
    if causal:
        rows, keys = scores.shape[-2:]
        hidden = np.arange(keys)[None, :] > np.arange(rows)[:, None] + (keys - rows)
        scores = np.where(hidden, compute(-np.inf), scores)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = np.exp(scores - scores.max(axis=-1, keepdims=True)) if scores.shape[-1] else scores
        weights = shifted / shifted.sum(axis=-1, keepdims=True)
    if zero_nan_rows:
        weights = np.where(np.isnan(weights), compute(0.0), weights)
    return np.matmul(weights, value).astype(dtype)
