"""Fused attention: ``softmax(q k^T * scale + mask) v`` in one kernel, with its numpy reference.

Unfused, attention is a matmul of ``[..., Sq, D]`` by ``[..., D, Sk]``, a scale, a mask add,
a softmax and a second matmul, and the scores ``[..., Sq, Sk]`` live in GPU memory between
them (``[batch, heads, seq, seq]``: 8 MB per layer at 12 heads and seq 512).  This kernel
never writes them: it walks the keys in tiles and keeps, for its query row, the running
maximum ``m``, the running sum ``l`` of ``exp(score - m)`` and the running value product
``acc`` (the online-softmax recurrence of FlashAttention): a tile whose maximum is above
``m`` rescales ``l`` and ``acc`` by ``exp(m - m_new)`` first.  The result is ``acc / l``.

One workgroup of 64 invocations serves 64 query rows of one (batch..., head): invocation
``r`` owns row ``r``, holds the query row and its ``Dv`` accumulators in registers, and the
workgroup stages each tile of ``TILE`` keys and values through workgroup memory (read once
from global memory for 64 rows).  Tiles hold ``TILE`` keys with ``TILE * (D + Dv) * 4``
bytes at most 16 KiB (WebGPU's default workgroup storage), so head sizes D and Dv must be
constants.  Sequence lengths and batch dims are size variables of the params block: one
kernel serves every length.

Inputs: ``query[*batch, Sq, D]``, ``key[*batch, Sk, D]``, ``value[*batch, Sk, Dv]``, and with
``has_mask`` an additive float ``mask`` broadcast to ``[*batch, Sq, Sk]`` (each of its dims is
1 or the scores' dim; it may have fewer dims, aligned from the right).  ``causal`` hides key
``j`` from query ``i`` when ``j > i + Sk - Sq`` (the last query sees every key), as an
additive ``-inf`` would.  Semantics at the edges, the unfused graph's: a score of NaN makes
its row NaN, a row whose scores are all ``-inf`` (masked out entirely) is NaN, as
``exp(-inf - (-inf))`` gives; a large negative finite mask (``-3.4e38``, what torch writes)
keeps the row finite.
"""

from __future__ import annotations

import numpy as np

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import LibraryKernel, buffer_size_vars
from ..ir.params_block import ParamsLayout
from ..ir.symbolic import Analyzer, IntImm, PrimExpr, SizeVar, as_int, format_shape, product, simplify
from ..ir.tir import Buffer, ReduceCombiner
from ..wgsl.emit import float_extremum, literal, storage_type, wgsl_name
from ..wgsl.lower_index import helper_declarations, helpers_used, lower_index, render_wgsl
from ..wgsl.shader import params_declaration

WORKGROUP = 64
#: Bytes of workgroup memory a kernel may use (WebGPU's default maxComputeWorkgroupStorageSize).
WORKGROUP_STORAGE = 16384
#: Keys per tile at most (more only lengthens the per-tile score array in registers).
MAX_TILE = 32

# Index variables of the kernel's own (local WGSL names, never params fields).
_GROUP, _ROW = SizeVar("bh_"), SizeVar("row_")


def key_tile(head: int, value_head: int) -> int:
    """Keys per tile for head sizes ``head`` (D) and ``value_head`` (Dv), 0 when one key and
    one value do not fit the workgroup memory."""
    return min(MAX_TILE, WORKGROUP_STORAGE // (4 * (head + value_head)))


@library_kernel_builder("attention")
def attention_kernel(name: str, batch: tuple, query_length: PrimExpr, key_length: PrimExpr, head: int,
                     value_head: int, mask_shape: tuple | None = None, scale: float = 1.0, causal: bool = False,
                     dtype: str = "float32") -> LibraryKernel:
    """``softmax(query key^T * scale + mask) value`` over ``batch`` dims (see the module doc);
    ``mask_shape`` None: no mask."""
    tile = key_tile(head, value_head)
    if tile < 1:
        raise ValueError(f"attention: head sizes {head} and {value_head} do not fit {WORKGROUP_STORAGE} bytes of workgroup memory")
    batch = tuple(batch)
    inputs = [Buffer("query", (*batch, query_length, head), dtype), Buffer("key", (*batch, key_length, head), dtype),
              Buffer("value", (*batch, key_length, value_head), dtype)]
    if mask_shape is not None:
        inputs.append(Buffer("mask", tuple(mask_shape), dtype))
    output = Buffer("out", (*batch, query_length, value_head), dtype)
    groups = simplify(product(batch) * ((query_length + (WORKGROUP - 1)) // WORKGROUP))
    source = _source(name, tuple(inputs), output, batch, query_length, key_length, head, value_head, tile,
                     mask_shape, scale, causal, groups)
    summary = (f"fused attention [{format_shape(output.shape)}] over {format_shape((key_length,))} keys"
               f"{', causal' if causal else ''}{', masked' if mask_shape is not None else ''}")
    return LibraryKernel(name, tuple(inputs), output, simplify(groups * WORKGROUP), source,
                         lambda arrays: attention_reference(arrays, scale=scale, causal=causal), summary)


def _mask_row_start(mask_shape: tuple, batch: tuple, query_length: PrimExpr) -> tuple[PrimExpr, PrimExpr]:
    """The mask's flat index of (group ``bh_``, row ``row_``, key 0), and its step per key.

    The scores are ``[*batch, Sq, Sk]``; the mask's dims align with them from the right, a
    dim of extent 1 repeating (index 0)."""
    scores = (*batch, query_length)
    coordinates: list[PrimExpr] = []
    inner: PrimExpr = IntImm(1)
    for extent in reversed(batch):  # the group index split into the batch coordinates
        coordinates.insert(0, (_GROUP // inner) % extent)
        inner = inner * extent
    coordinates.append(_ROW)
    offset = len(scores) + 1 - len(mask_shape)
    index: PrimExpr = IntImm(0)
    stride: PrimExpr = IntImm(1)
    key_step: PrimExpr = IntImm(0)
    for position in range(len(mask_shape) - 1, -1, -1):
        extent = mask_shape[position]
        repeated = as_int(extent) == 1
        if position == len(mask_shape) - 1:
            key_step = IntImm(0) if repeated else stride
        elif not repeated:
            index = index + coordinates[offset + position] * stride
        stride = stride * extent
    return simplify(index), simplify(key_step)


def _source(name, inputs, output, batch, query_length, key_length, head, value_head, tile, mask_shape, scale,
            causal, groups) -> str:
    size_vars = [v.name for v in buffer_size_vars((*inputs, output))]
    local_names = {_GROUP.name: "bh", _ROW.name: "row"}

    def variable(name: str) -> str:
        return local_names.get(name) or f"params.{wgsl_name(name)}"

    analyzer = Analyzer()
    lowered = {"seq_q": query_length, "seq_k": key_length, "groups": groups}
    if mask_shape is not None:
        mask_start, key_step = _mask_row_start(mask_shape, batch, query_length)
        lowered.update(mask_start=mask_start, mask_step=key_step)
    targets = {key: lower_index(simplify(value), analyzer) for key, value in lowered.items()}
    helpers = set().union(*(helpers_used(target) for target in targets.values()))
    value_type = storage_type(output.dtype)
    maximum = lambda a, b: float_extremum(ReduceCombiner.MAX, a, b)  # noqa: E731  NaN-propagating max

    def let(key: str) -> str:
        return f"  let {key} = {render_wgsl(targets[key], variable)};"

    lines = [f"// library kernel: {name} (fused attention: scores, scale, mask, online softmax and the value "
             f"product, {tile} keys per tile)", "", *params_declaration(ParamsLayout(tuple(size_vars)))]
    for binding, buffer in enumerate(inputs, start=1):
        lines.append(f"@group(0) @binding({binding}) var<storage, read> {buffer.name}: array<{storage_type(buffer.dtype)}>;")
    lines.append(f"@group(0) @binding({len(inputs) + 1}) var<storage, read_write> out: array<{value_type}>;")
    lines += helper_declarations(helpers)
    lines += [
        "",
        f"const HEAD: i32 = {head};",
        f"const VALUE_HEAD: i32 = {value_head};",
        f"const TILE: i32 = {tile};",
        f"var<workgroup> key_tile: array<{value_type}, {tile * head}>;",
        f"var<workgroup> value_tile: array<{value_type}, {tile * value_head}>;",
        "",
        "fn is_negative_infinity(x: f32) -> bool {",
        "  return bitcast<u32>(x) == 0xff800000u;",
        "}",
        "",
        "@compute @workgroup_size(64)",
        "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
        "        @builtin(num_workgroups) workgroups: vec3<u32>,",
        "        @builtin(local_invocation_index) local: u32) {",
        let("seq_q"), let("seq_k"), let("groups"),
        "  let group = i32(workgroup.y * workgroups.x + workgroup.x);",
        "  if (group >= groups) {",
        "    return;",
        "  }",
        "  let blocks = (seq_q + 63) / 64;",
        "  let bh = group / blocks;",
        "  let first_row = (group % blocks) * 64;",
        "  // rows past the end compute row seq_q - 1 and store nothing (they still load tiles)",
        "  let in_range = first_row + i32(local) < seq_q;",
        "  let row = min(first_row + i32(local), seq_q - 1);",
    ]
    if causal:
        lines += [
            "  // key j is visible to row i when j <= i + seq_k - seq_q",
            "  let visible_end = row + seq_k - seq_q + 1;",
            "  let key_end = clamp(min(first_row + 63, seq_q - 1) + seq_k - seq_q + 1, 0, seq_k);",
        ]
    else:
        lines += ["  let visible_end = seq_k;", "  let key_end = seq_k;"]
    if mask_shape is not None:
        lines += [let("mask_start"), let("mask_step")]
    lines += [
        "  var query_row: array<f32, HEAD>;",
        "  let query_start = (bh * seq_q + row) * HEAD;",
        "  for (var d = 0; d < HEAD; d = d + 1) {",
        "    query_row[d] = f32(query[query_start + d]);",
        "  }",
        "  var acc: array<f32, VALUE_HEAD>;",
        "  var scores: array<f32, TILE>;",
        "  var running_max = 0.0;",
        "  var running_sum = 0.0;",
        "  var started = false;  // a score above -inf seen: running_max holds a value",
        "  for (var start = 0; start < key_end; start = start + TILE) {",
        "    workgroupBarrier();",
        "    for (var e = i32(local); e < TILE * HEAD; e = e + 64) {",
        "      let j = start + e / HEAD;",
        "      if (j < seq_k) {",
        "        key_tile[e] = key[(bh * seq_k + j) * HEAD + e % HEAD];",
        "      }",
        "    }",
        "    for (var e = i32(local); e < TILE * VALUE_HEAD; e = e + 64) {",
        "      let j = start + e / VALUE_HEAD;",
        "      if (j < seq_k) {",
        "        value_tile[e] = value[(bh * seq_k + j) * VALUE_HEAD + e % VALUE_HEAD];",
        "      }",
        "    }",
        "    workgroupBarrier();",
        "    // keys [start, start + count) of this tile are visible to this row (a branch without",
        "    // barriers: rows differ under a causal mask)",
        "    let count = clamp(min(key_end, visible_end) - start, 0, TILE);",
        "    if (count > 0) {",
        "      for (var j = 0; j < count; j = j + 1) {",
        "        var dot = 0.0;",
        "        for (var d = 0; d < HEAD; d = d + 1) {",
        "          dot = dot + query_row[d] * f32(key_tile[j * HEAD + d]);",
        "        }",
        f"        scores[j] = {_score('dot', scale, mask_shape is not None)};",
        "      }",
        "      var tile_max = scores[0];",
        "      for (var j = 1; j < count; j = j + 1) {",
        f"        tile_max = {maximum('tile_max', 'scores[j]')};",
        "      }",
        f"      let new_max = select(tile_max, {maximum('running_max', 'tile_max')}, started);",
        "      // every score so far -inf: nothing to add yet",
        "      if (!is_negative_infinity(new_max)) {",
        "        let correction = select(0.0, exp(running_max - new_max), started);",
        "        running_sum = running_sum * correction;",
        "        for (var d = 0; d < VALUE_HEAD; d = d + 1) {",
        "          acc[d] = acc[d] * correction;",
        "        }",
        "        for (var j = 0; j < count; j = j + 1) {",
        "          let p = exp(scores[j] - new_max);",
        "          running_sum = running_sum + p;",
        "          for (var d = 0; d < VALUE_HEAD; d = d + 1) {",
        "            acc[d] = acc[d] + p * f32(value_tile[j * VALUE_HEAD + d]);",
        "          }",
        "        }",
        "        running_max = new_max;",
        "        started = true;",
        "      }",
        "    }",
        "  }",
        "  if (!in_range) {",
        "    return;",
        "  }",
        "  // a row with no score above -inf is NaN, as the unfused softmax gives (a run-time NaN:",
        "  // WGSL compilers may fold a constant one)",
        "  let nan = bitcast<f32>(0x7fc00000u | (local & 0u));",
        "  let out_start = (bh * seq_q + row) * VALUE_HEAD;",
        "  for (var d = 0; d < VALUE_HEAD; d = d + 1) {",
        "    out[out_start + d] = select(nan, acc[d] / running_sum, started);",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _score(dot: str, scale: float, masked: bool) -> str:
    score = dot if scale == 1.0 else f"{dot} * {literal(scale, 'float32')}"
    if masked:
        score = f"{score} + f32(mask[mask_start + (start + j) * mask_step])"
    return score


# -- numpy reference -------------------------------------------------------------------------------


def attention_reference(arrays: list[np.ndarray], *, scale: float, causal: bool) -> np.ndarray:
    """``softmax(q k^T * scale + mask) v`` with numpy, as the unfused ops compute it (a row
    whose scores are all -inf is NaN); float32 arithmetic for narrower floats."""
    dtype = arrays[0].dtype
    compute = np.float64 if dtype == np.float64 else np.float32
    query, key, value = (a.astype(compute) for a in arrays[:3])
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
    return np.matmul(weights, value).astype(dtype)
