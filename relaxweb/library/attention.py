"""Fused attention: ``softmax(q k^T * scale + mask) v`` in one kernel, with its numpy reference.

Unfused, attention is a matmul of ``[..., Sq, D]`` by ``[..., D, Sk]``, a scale, a mask add,
a softmax and a second matmul, and the scores ``[..., Sq, Sk]`` live in GPU memory between
them (``[batch, heads, seq, seq]``: 8 MB per layer at 12 heads and seq 512).  This kernel
never writes them: it walks the keys in tiles and keeps, for its query row, the running
maximum ``m``, the running sum ``l`` of ``exp(score - m)`` and the running value product
``acc`` (the online-softmax recurrence of FlashAttention), four keys at a time: a group
whose maximum is above ``m`` rescales ``l`` and ``acc`` by ``exp(m - m_new)`` first.  The
result is ``acc / l``.

One workgroup of 64 invocations serves 64 query rows of one (batch..., head): invocation
``r`` owns row ``r``, holds the query row and its ``Dv`` accumulators in registers (unrolled
into ``vec4`` variables: a private array indexed at run time was 1.5x slower on lavapipe), and the
workgroup stages each tile of ``TILE`` keys and values through workgroup memory (read once
from global memory for 64 rows).  Tiles hold ``TILE`` keys with ``TILE * (D + Dv) * 4``
bytes at most 16 KiB (WebGPU's default workgroup storage), so head sizes D and Dv must be
constants.  Sequence lengths and batch dims are size variables of the params block: one
kernel serves every length.

The kernel's f16 source (``LibraryKernel.f16_source``, for adapters with ``shader-f16``)
stages the key and value tiles as f16 (half the workgroup memory and its traffic) and holds
the query row in f16: each product of a score and each weight times a value is an f16
product, summed in f32 (the scores, the online softmax and the accumulators stay f32, as in
the tiled matmuls' f16 shaders, ``relaxweb/wgsl/variants.py``).

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
keeps the row finite.

The kernel's source for CPU adapters (``LibraryKernel.cpu_source``, the manifest's
``cpu_file``: SwiftShader and lavapipe) stages nothing: each invocation reads its keys and
values from the buffers, so there are no workgroup barriers, which cost a CPU adapter more
than the shared loads save (the tiled matmuls' ``register_matmul`` form, for the same reason).

The kernel's WebAssembly (``wasm_source``, for kernels.wasm) computes the same recurrence
for ``WASM_ROWS`` query rows per unit, which share each key word's load.  The keys every row
of a unit sees go in blocks of ``WASM_KEY_BLOCK``: the block's scores of every row in scratch,
one rescale of a row's accumulators per block, and the weights times the values for two rows
at once, their accumulators in registers (the rescale per key group of the WGSL ran 1.9x
slower at Whisper's 1500 keys).  A row's remaining keys (a causal row's last ones, a partial
last unit's) follow the WGSL: four keys' scores at once in an f32x4, their weights from one
``$exp_f32x4``, the ``Dv`` accumulators in the thread's scratch memory (see ``_wasm_source``).

With ``key_rows`` (a KV cache: key and value ``[*kv_batch, key_rows, D]`` buffers of which the
first ``Sk`` rows of each head are valid), the kernel reads that prefix in place: rows are
``key_rows`` apart per head and ``Sk`` (any expression of size variables, which the call site
binds) says how many are read.
"""

from __future__ import annotations

import numpy as np

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import LibraryKernel, buffer_size_vars
from ..ir.params_block import ParamsLayout
from ..ir.symbolic import (
    Analyzer, IntImm, PrimExpr, SizeVar, as_int, evaluate, format_shape, free_vars, product, prove_equal, simplify,
)
from ..ir.syntax import comment_text
from ..ir.tir import Buffer
from ..wgsl.emit import literal, storage_type, wgsl_name
from ..wgsl.lower_index import helper_declarations, helpers_used, lower_index, render_wgsl
from ..wgsl.shader import params_declaration
from .wat import IndexText, broadcast_lane, element, fold, index_helpers, indent, kernel_text, loop, params_field, shuffle

WORKGROUP = 64
#: Bytes of workgroup memory a kernel may use (WebGPU's default maxComputeWorkgroupStorageSize).
WORKGROUP_STORAGE = 16384
#: Keys per tile at most.
MAX_TILE = 32
#: Keys scored together (one rescale of the accumulators per group); a tile holds whole groups.
GROUP = 4

# Index variables of the kernel's own (local WGSL names, never params fields).
_GROUP, _ROW = SizeVar("bh_"), SizeVar("row_")


def key_tile(head: int, value_head: int) -> int:
    """Keys per tile for head sizes ``head`` (D) and ``value_head`` (Dv), 0 when one key and
    one value do not fit the workgroup memory."""
    return min(MAX_TILE, WORKGROUP_STORAGE // (4 * (head + value_head))) // GROUP * GROUP


@library_kernel_builder("attention")
def attention_kernel(name: str, batch: tuple, query_length: PrimExpr, key_length: PrimExpr, head: int,
                     value_head: int, mask_shape: tuple | None = None, scale: float = 1.0, causal: bool = False,
                     dtype: str = "float32", kv_batch: tuple | None = None, key_rows: PrimExpr | None = None
                     ) -> LibraryKernel:
    """``softmax(query key^T * scale + mask) value`` over ``batch`` dims (see the module doc);
    ``mask_shape`` None: no mask; ``kv_batch``: the batch dims of key and value, each 1
    (shared by every query group along it: grouped-query attention) or ``batch``'s (None: all
    ``batch``'s); ``key_rows``: the rows of each key / value head in their buffers, of which
    the first ``key_length`` are read (None: ``key_length``)."""
    tile = key_tile(head, value_head)
    if tile < 1:
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
    groups = simplify(product(batch) * ((query_length + (WORKGROUP - 1)) // WORKGROUP))
    shape_vars = {var.name for var in buffer_size_vars((*inputs, output))}
    extra = tuple(var for var in free_vars(key_length) if var.name not in shape_vars)
    source = _source(name, tuple(inputs), output, batch, kv_batch, query_length, key_length, rows, head, value_head,
                     tile, mask_shape, scale, causal, groups, extra)
    f16_source = _source(name, tuple(inputs), output, batch, kv_batch, query_length, key_length, rows, head, value_head,
                         tile, mask_shape, scale, causal, groups, extra, half=True)
    cpu_source = _source(name, tuple(inputs), output, batch, kv_batch, query_length, key_length, rows, head, value_head,
                         tile, mask_shape, scale, causal, groups, extra, direct=True)
    wasm_source, wasm_scratch = _wasm_source(name, tuple(inputs), output, batch, kv_batch, query_length, key_length,
                                             rows, head, value_head, mask_shape, scale, causal, extra)
    summary = (f"fused attention [{format_shape(output.shape)}] over {format_shape((key_length,))} keys"
               f"{f' of {format_shape((rows,))} rows' if key_rows is not None else ''}"
               f"{', causal' if causal else ''}{', masked' if mask_shape is not None else ''}")
    if key_rows is None:
        def reference(arrays):
            return attention_reference(arrays, scale=scale, causal=causal)
    else:
        def reference(arrays, size_vars):
            length = int(evaluate(key_length, size_vars))
            query, key, value, *mask = arrays
            return attention_reference([query, key[..., :length, :], value[..., :length, :], *mask], scale=scale,
                                       causal=causal)
    return LibraryKernel(name, tuple(inputs), output, simplify(groups * WORKGROUP), source, reference, summary,
                         extra_size_vars=extra, sized_reference=key_rows is not None, f16_source=f16_source,
                         cpu_source=cpu_source, wasm_source=wasm_source, wasm_scratch_bytes=wasm_scratch)


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


def _kv_coordinates(batch: tuple, kv_batch: tuple) -> list[PrimExpr]:
    """The key / value batch coordinates of the flat query batch index ``bh_``: a grouped dim
    divides the query's coordinate by its group size (a dim of 1 is skipped by ``_flat_index``)."""
    return [coordinate // size if size and size > 1 else coordinate
            for coordinate, size in zip(_batch_coordinates(batch), (kv_group_size(k, b) for k, b in zip(kv_batch, batch)))]


def _batch_coordinates(batch: tuple) -> list[PrimExpr]:
    """The coordinates of the flat batch index ``bh_`` in the batch dims."""
    coordinates: list[PrimExpr] = []
    inner: PrimExpr = IntImm(1)
    for extent in reversed(batch):
        coordinates.insert(0, (_GROUP // inner) % extent)
        inner = inner * extent
    return coordinates


def _flat_index(shape: tuple, coordinates: list[PrimExpr]) -> PrimExpr:
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


def _mask_row_start(mask_shape: tuple, batch: tuple) -> tuple[PrimExpr, PrimExpr]:
    """The mask's flat index of (group ``bh_``, row ``row_``, key 0), and its step per key:
    the mask broadcasts against the scores ``[*batch, Sq, Sk]``."""
    start = _flat_index(tuple(mask_shape), [*_batch_coordinates(batch), _ROW, IntImm(0)])
    return start, IntImm(0) if as_int(mask_shape[-1]) == 1 else IntImm(1)


def _source(name, inputs, output, batch, kv_batch, query_length, key_length, key_rows, head, value_head, tile,
            mask_shape, scale, causal, groups, extra_size_vars, half: bool = False, direct: bool = False) -> str:
    """The kernel's WGSL; with ``half``, its f16 source; with ``direct``, its source for CPU
    adapters (see the module doc)."""
    size_vars = [v.name for v in (*buffer_size_vars((*inputs, output)), *extra_size_vars)]
    local_names = {_GROUP.name: "bh", _ROW.name: "row"}

    def variable(name: str) -> str:
        return local_names.get(name) or f"params.{wgsl_name(name)}"

    analyzer = Analyzer()
    lowered = {"seq_q": query_length, "seq_k": key_length, "key_rows": key_rows, "groups": groups,
               "kv_group": _flat_index(kv_batch, _kv_coordinates(batch, kv_batch))}
    if mask_shape is not None:
        mask_start, key_step = _mask_row_start(mask_shape, batch)
        lowered.update(mask_start=mask_start, mask_step=key_step)
    targets = {key: lower_index(simplify(value), analyzer) for key, value in lowered.items()}
    helpers = set().union(*(helpers_used(target) for target in targets.values()))
    value_type = storage_type(output.dtype)
    width = 4 if head % 4 == 0 and value_head % 4 == 0 else 1
    vector = "vec4<f32>" if width == 4 else "f32"
    staged = vector.replace("f32", "f16") if half else vector  # the tiles' and the query row's element type

    def let(key: str) -> str:
        return f"  let {key} = {render_wgsl(targets[key], variable)};"

    title = (f"library kernel: {name} (fused attention: scores, scale, mask, online softmax and the value product, "
             f"{tile} keys per tile{', read in place: the form for CPU adapters' if direct else ''})")
    lines = [*(["enable f16;"] if half else []), "// " + comment_text(title), "",
             *params_declaration(ParamsLayout(tuple(size_vars)))]
    for binding, buffer in enumerate(inputs, start=1):
        lines.append(f"@group(0) @binding({binding}) var<storage, read> {buffer.name}: array<{storage_type(buffer.dtype)}>;")
    lines.append(f"@group(0) @binding({len(inputs) + 1}) var<storage, read_write> out: array<{value_type}>;")
    lines += helper_declarations(helpers)
    lines += [
        "",
        f"const HEAD: i32 = {head};",
        f"const VALUE_HEAD: i32 = {value_head};",
        f"const TILE: i32 = {tile};",
        *([] if direct else [
            f"// the tiles in {staged}s of consecutive elements of a key / value row",
            f"var<workgroup> key_tile: array<{staged}, {tile * head // width}>;",
            f"var<workgroup> value_tile: array<{staged}, {tile * value_head // width}>;"]),
        "",
        "fn is_negative_infinity(x: f32) -> bool {",
        "  return bitcast<u32>(x) == 0xff800000u;",
        "}",
        "",
        "@compute @workgroup_size(64)",
        "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
        "        @builtin(num_workgroups) workgroups: vec3<u32>,",
        "        @builtin(local_invocation_index) local: u32) {",
        let("seq_q"), let("seq_k"), let("key_rows"), let("groups"),
        "  let group = i32(workgroup.y * workgroups.x + workgroup.x);",
        "  if (group >= groups) {",
        "    return;",
        "  }",
        "  let blocks = (seq_q + 63) / 64;",
        "  let bh = group / blocks;",
        "  let first_row = (group % blocks) * 64;",
        "  // rows past the end stand in as row seq_q - 1: they load tiles, score nothing, store nothing",
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
    lines.append(let("kv_group") + "  // the key / value rows of this group")
    if mask_shape is not None:
        lines += [let("mask_start"), let("mask_step")]
    key_words, value_words = head // width, value_head // width
    lines += [
        "  // the query row and the accumulators in registers (unrolled: no indexing at run time)",
        "  let query_start = (bh * seq_q + row) * HEAD;",
        *(f"  let q{i} = {_staged(_gather('query', f'query_start + {i * width}', width), staged, half)};"
          for i in range(key_words)),
        *(f"  var acc{i} = {vector}(0.0);" for i in range(value_words)),
        "  var running_max = 0.0;",
        "  var running_sum = 0.0;",
        "  var started = false;  // a score above -inf seen: running_max holds one",
        "  for (var start = 0; start < key_end; start = start + TILE) {",
        *([] if direct else [
            "    workgroupBarrier();",
            *_load_tile("key_tile", "key", "HEAD", key_words, width, staged, half),
            *_load_tile("value_tile", "value", "VALUE_HEAD", value_words, width, staged, half),
            "    workgroupBarrier();"]),
        "    // keys [start, start + count) of this tile are visible to this row (a branch without",
        "    // barriers: rows differ under a causal mask); rows past the end score none (a decode",
        "    // step's one row leaves 63 invocations idle: on CPU adapters whole SIMD batches skip)",
        "    let count = select(0, clamp(min(key_end, visible_end) - start, 0, TILE), in_range);",
        f"    for (var j = 0; j < count; j = j + {GROUP}) {{",
        f"      // keys j .. j + {GROUP - 1} at once: one rescale per group; keys past count weigh 0 and",
        "      // stand in as key j for the group's maximum",
        *(line for u in range(GROUP) for line in _key_score(u, key_words, width, scale, mask_shape is not None, half,
                                                                direct)),
        f"      let group_max = {_maximum([f's{u}' for u in range(GROUP)])};",
        "      let new_max = select(group_max, max(running_max, group_max), started);",
        "      // every score so far -inf: nothing to add yet (a NaN score makes p, so the row, NaN)",
        "      if (!is_negative_infinity(new_max)) {",
        "        let correction = select(0.0, exp(running_max - new_max), started);",
        *(f"        let p{u} = {_weight(u)};" for u in range(GROUP)),
        f"        running_sum = running_sum * correction + {' + '.join(f'p{u}' for u in range(GROUP))};",
        *([f"        let value_at{u} = (kv_group * key_rows + min(start + j + {u}, seq_k - 1)) * VALUE_HEAD;"
           for u in range(GROUP)] if direct else [f"        let value_at = j * {value_words};"]),
        *(f"        acc{i} = acc{i} * correction + "
          + " + ".join(_weighted(f"p{u}", _gather("value", f"value_at{u} + {i * width}", width) if direct
                                 else f"value_tile[value_at + {u * value_words + i}]", vector, half)
                       for u in range(GROUP)) + ";"
          for i in range(value_words)),
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
        "  // no keys at all: an empty sum, 0 (as the value product of an empty softmax)",
        "  let empty = seq_k == 0;",
        *(f"  out[out_start + {i * width + c}] = select(select(nan, acc{i}{f'[{c}]' if width > 1 else ''} / running_sum, "
          "started), 0.0, empty);" for i in range(value_words) for c in range(width)),
        "}",
    ]
    return "\n".join(lines) + "\n"


def _gather(buffer: str, at: str, width: int) -> str:
    """``width`` consecutive elements of ``buffer`` from ``at`` as one f32 / vec4<f32>."""
    if width == 1:
        return f"f32({buffer}[{at}])"
    return f"vec4<f32>({', '.join(f'f32({buffer}[{at} + {c}])' for c in range(width))})"


def _product(a: str, b: str, width: int, half: bool = False) -> str:
    """The dot product of two words of a query and a key row, in f32; of f16 words, the f16
    products summed in f32."""
    if not half:
        return f"dot({a}, {b})" if width > 1 else f"{a} * {b}"
    return f"dot(vec4<f32>({a} * {b}), vec4<f32>(1.0))" if width > 1 else f"f32({a} * {b})"


def _weighted(weight: str, value: str, vector: str, half: bool) -> str:
    """A softmax weight (f32) times a word of a value row, as the f32 ``vector``; with f16
    words, an f16 product."""
    return f"{vector}(f16({weight}) * {value})" if half else f"{weight} * {value}"


def _staged(value: str, staged: str, half: bool) -> str:
    """An f32 word as the tiles hold it: converted to f16 in the f16 source."""
    return f"{staged}({value})" if half else value


def _load_tile(tile: str, buffer: str, row_size: str, words: int, width: int, staged: str, half: bool) -> list[str]:
    """The workgroup's cooperative copy of keys (values) [start, start + TILE) into ``tile``."""
    return [
        f"    for (var e = i32(local); e < TILE * {words}; e = e + 64) {{",
        f"      let j = start + e / {words};",
        "      // rows past the keys are zeros: a group's keys past count read them (with weight 0)",
        f"      var word = {'vec4<f32>' if width > 1 else 'f32'}(0.0);",
        "      if (j < seq_k) {",
        f"        let at = (kv_group * key_rows + j) * {row_size} + e % {words} * {width};",
        f"        word = {_gather(buffer, 'at', width)};",
        "      }",
        f"      {tile}[e] = {_staged('word', staged, half)};",
        "    }",
    ]


def _key_score(u: int, key_words: int, width: int, scale: float, masked: bool, half: bool,
               direct: bool = False) -> list[str]:
    """``s{u}``: the score of key ``j + u`` of the tile (key j's when that is past ``count``);
    ``direct``: the key row read from the key buffer (the last key standing in past the end)."""
    if direct:
        lines = [f"      let key_at{u} = (kv_group * key_rows + min(start + j + {u}, seq_k - 1)) * HEAD;"]
        word = [_gather("key", f"key_at{u} + {i * width}", width) for i in range(key_words)]
    else:
        lines = [f"      let key_at{u} = {f'(j + {u}) * {key_words}' if u else f'j * {key_words}'};"]
        word = [f"key_tile[key_at{u}{f' + {i}' if i else ''}]" for i in range(key_words)]
    lines += [f"      var s{u} = {_product('q0', word[0], width, half)};",
              *(f"      s{u} = s{u} + {_product(f'q{i}', word[i], width, half)};" for i in range(1, key_words))]
    if scale != 1.0:
        lines.append(f"      s{u} = s{u} * {literal(scale, 'float32')};")
    if masked:
        lines.append(f"      s{u} = s{u} + f32(mask[mask_start + min(start + j + {u}, seq_k - 1) * mask_step]);")
    if u:
        lines.append(f"      s{u} = select(s0, s{u}, j + {u} < count);")
    return lines


def _maximum(values: list[str]) -> str:
    while len(values) > 1:
        values = [f"max({a}, {b})" for a, b in zip(values[::2], values[1::2])] + values[len(values) // 2 * 2:]
    return values[0]


def _weight(u: int) -> str:
    weight = f"exp(s{u} - new_max)"
    return weight if u == 0 else f"select(0.0, {weight}, j + {u} < count)"


# -- WebAssembly ----------------------------------------------------------------------------------


#: Query rows per unit of the kernel's WebAssembly: they share each key word's load (4 were no faster:
#: 16 dot-product accumulators spill x86's 16 vector registers).
WASM_ROWS = 2
#: Keys per block of the shared phase: their scores (then weights) for every row of the unit in
#: scratch, one rescale of the accumulators per block; a block's keys and values (32 KiB at
#: D = Dv = 64) stay in L1 while the rows read them (Whisper-tiny's attention, 1500 keys: 64
#: and 128 alike, 32 4% slower).
WASM_KEY_BLOCK = 64
#: Key words per step of a key block's dot products (Whisper-tiny's attention under wasmtime with
#: epoch interruption, a check per loop iteration: 1: 32.6 ms a head, 2: 27.2, 4: 26.7, 16: 30.9).
PAIR_DOT_STEP = 4


def repeat(label: str, condition_to_continue: str, body: list[str]) -> list[str]:
    """``do { body } while (condition_to_continue)``: a loop labelled ``label`` whose body runs
    at least once, one branch per iteration (where :func:`~relaxweb.library.wat.loop` takes two)."""
    return [f"(loop ${label}", *indent(body), f"  (br_if ${label} {condition_to_continue}))"]


def _splat(value: str) -> str:
    return f"(v128.const f32x4 {value} {value} {value} {value})"


def exp_nonpositive(x: str) -> list[str]:
    """``$x`` (an f32x4 local of values <= 0, -inf or NaN) replaced by its ``exp``, inline:
    ``$exp_f32x4``'s computation (relaxweb/cpu/math.py) without its upper clamp, in the
    locals ``$en``, ``$er``, ``$ek``, ``$eh``.  Inline because a call in a loop makes
    Cranelift store and reload the loop's vector values around it (every vector register is
    the caller's to save)."""
    get = lambda name: f"(local.get ${name})"  # noqa: E731
    return [
        f";; {x} = exp({x}), {x} <= 0: exp(-104) is 0 already; pmax keeps a NaN",
        f"(local.set ${x} (f32x4.pmax {get(x)} {_splat('-104.0')}))",
        ";; n = x log2(e) rounded to an integer (to even, as f32x4.nearest) by adding 1.5 * 2^23, whose"
        " low bits then hold n",
        f"(local.set $ek (f32x4.add (f32x4.mul {get(x)} {_splat('1.44269504088896341')}) {_splat('12582912.0')}))",
        f"(local.set $en (f32x4.sub {get('ek')} {_splat('12582912.0')}))",
        "(local.set $ek (i32x4.sub (local.get $ek) (v128.const i32x4 0x4b400000 0x4b400000 0x4b400000 0x4b400000)))",
        f"(local.set $er (f32x4.sub (f32x4.sub {get(x)} (f32x4.mul {get('en')} {_splat('0.693359375')})) "
        f"(f32x4.mul {get('en')} {_splat('-2.12194440e-4')})))",
        f"(local.set ${x} (f32x4.add (f32x4.mul {get('er')} {_splat('1.9875691500e-4')}) {_splat('1.3981999507e-3')}))",
        *(f"(local.set ${x} (f32x4.add (f32x4.mul {get(x)} {get('er')}) {_splat(c)}))"
          for c in ("8.3334519073e-3", "4.1665795894e-2", "1.6666665459e-1", "5.0000001201e-1")),
        f"(local.set ${x} (f32x4.add (f32x4.add (f32x4.mul {get(x)} (f32x4.mul {get('er')} {get('er')})) {get('er')}) "
        f"{_splat('1.0')}))",
        ";; times 2^n, n in [-150, 0], as 2^(n >> 1) * 2^(n - (n >> 1))",
        f"(local.set $eh (i32x4.shr_s {get('ek')} (i32.const 1)))",
        f"(local.set ${x} (f32x4.mul (f32x4.mul {get(x)} (i32x4.shl (i32x4.add {get('eh')} "
        "(v128.const i32x4 127 127 127 127)) (i32.const 23)))",
        f"  (i32x4.shl (i32x4.add (i32x4.sub {get('ek')} {get('eh')}) (v128.const i32x4 127 127 127 127)) "
        "(i32.const 23))))",
    ]


def _wasm_source(name, inputs, output, batch, kv_batch, query_length, key_length, key_rows, head, value_head,
                 mask_shape, scale, causal, extra_size_vars) -> tuple[str, int]:
    """The kernel's WAT and its scratch bytes.  One unit per block of ``WASM_ROWS`` query rows
    of one (batch..., head): the WGSL's recurrence over groups of 4 keys, the 4 scores of a
    row in one f32x4 (dot products along D in f32x4 words, a transposing sum), their weights
    from one ``$exp_f32x4``, and the ``Dv`` accumulators in scratch updated in f32x4 words
    (unrolled along the constant Dv: constant offsets).  The dot products are a loop along D,
    two words per step (one when D / 4 is odd): unrolled, Cranelift loaded every key word of
    the group before the first product and spilled them.

    Two phases.  The shared phase walks the keys every row of a full block sees (up to its
    first row's count rounded down to a group: all keys for a non-causal block), the rows
    together: each key word is loaded once for the block's dot products, and no key is past a
    row's count (no selects, no validity masks).  With ``Dv`` a multiple of 4 (``blocked``) it
    goes in key blocks (``key_blocks``): per block, each pair of rows' scores into scratch, each
    row's weights in their place with one correction of its accumulators and sum, then each
    pair's accumulators (4 value words of both rows in 8 registers at a time) times their
    corrections plus the weights times the values; otherwise it goes a group of 4 keys at a
    time as the second phase does.  Then each row finishes alone from there (a causal row's
    last keys, the remainder of ``Sk`` % 4, every key of a partial last block), where a
    group's keys past ``count`` stand in as key j for the scores (and are then replaced by its
    score, as the WGSL's select does) and read a zero row of scratch for the values (weight
    0).  Scratch: per row its accumulators then its running maximum, running sum and whether
    it started (``block`` bytes), then the zero row, then (blocked) each row's
    ``WASM_KEY_BLOCK`` scores."""
    layout = ParamsLayout(tuple(v.name for v in (*buffer_size_vars((*inputs, output)), *extra_size_vars)))
    local_names = {_GROUP.name: "(local.get $bh)", _ROW.name: "(local.get $row)"}
    index = IndexText(lambda var: local_names.get(var) or params_field(layout, var))
    words, value_words = head // 4, value_head // 4  # whole f32x4 words of a key / value row
    row_bytes = 16 * (-(-value_head // 4))  # the accumulators (and the zero row) rounded up to words
    block = row_bytes + 16  # a row's accumulators, running maximum, running sum, started
    rows = WASM_ROWS
    bindings = [buffer.name for buffer in inputs] + ["out"]
    masked = mask_shape is not None
    mask_step = as_int(_mask_row_start(mask_shape, batch)[1]) if masked else 0
    # the shared keys in blocks (value products in f32x4 words: Dv a multiple of 4; rows in pairs)
    blocked = value_head % 4 == 0 and value_head > 0 and rows % 2 == 0

    def scores_at(r: int) -> int:
        """The scratch offset of row r's scores (then weights) of a key block."""
        return rows * block + row_bytes + 4 * WASM_KEY_BLOCK * r

    def key_at(u: int) -> str:
        """The address of key j + u, or key j's past ``count``."""
        if u == 0:
            return f"(i32.add (local.get $keys) (i32.mul (local.get $j) (i32.const {4 * head})))"
        return (f"(select (i32.add (local.get $k0) (i32.const {4 * head * u})) (local.get $k0) "
                f"(i32.lt_s (i32.add (local.get $j) (i32.const {u})) (local.get $count)))")

    def value_at(u: int) -> str:
        """The address of value j + u, or the zero row past ``count``."""
        return (f"(select (i32.add (local.get $values) (i32.mul (i32.add (local.get $j) (i32.const {u})) "
                f"(i32.const {4 * value_head}))) (local.get $zero) (i32.lt_s (i32.add (local.get $j) (i32.const {u})) "
                f"(local.get $count)))")

    def lanes(values: list[str]) -> str:
        """An f32x4 of ``values[u]`` in each lane u."""
        vector = f"(f32x4.splat {values[0]})"
        for u in range(1, 4):
            vector = f"(f32x4.replace_lane {u} {vector} {values[u]})"
        return vector

    def pair_dot() -> list[str]:
        """The dot products ``$d{r}{u}`` of rows r = 0, 1 from ``$q`` with keys u = 0 .. 3 from
        ``$k0`` (D >= 4): a word of each row, then each key's word used by both rows at once
        (13 vector registers live: Cranelift keeps them all, where loading the four key words
        first spilled), ``PAIR_DOT_STEP`` words per step with pointers stepping (no address
        arithmetic), the remaining words after the loop."""
        def word_step(w: int) -> list[str]:
            return [
                *(f"(local.set $key{r} (v128.load offset={4 * head * r + 16 * w} (local.get $qp)))" for r in range(2)),
                *(line for u in range(4) for line in [
                    f"(local.set $word (v128.load offset={4 * head * u + 16 * w} (local.get $kp)))",
                    *(f"(local.set $d{r}{u} (f32x4.add (local.get $d{r}{u}) (f32x4.mul (local.get $key{r}) "
                      "(local.get $word))))" for r in range(2))])]
        step = min(PAIR_DOT_STEP, words)
        return [
            "(local.set $qp (local.get $q))",
            "(local.set $kp (local.get $k0))",
            f"(local.set $dot_end (i32.add (local.get $q) (i32.const {16 * (words - words % step)})))",
            *repeat("dot", "(i32.lt_u (local.get $qp) (local.get $dot_end))", [
                *(line for w in range(step) for line in word_step(w)),
                f"(local.set $qp (i32.add (local.get $qp) (i32.const {16 * step})))",
                f"(local.set $kp (i32.add (local.get $kp) (i32.const {16 * step})))"]),
            *(line for w in range(words % step) for line in word_step(w)),
        ]

    def scores(count: int, keys: list[tuple[str, int]], masks: list[str], rows_first: bool = False) -> list[str]:
        """The scores of keys j .. j + 3 (key u at address ``keys[u]``: a local and a constant
        offset) for the ``count`` query rows from ``$q`` on, into ``$s0``, ``$s1``, ...: dot
        products in f32x4 words (each key word loaded once for all rows), a transposing sum,
        a scalar tail for D % 4, the scale, and row r's mask (``masks[r]``: an f32x4 of it)."""
        def key_element(u: int, byte: int) -> str:
            return f"(f32.load offset={keys[u][1] + byte} (local.get ${keys[u][0]}))"
        step = 2 if words % 2 == 0 else 1  # words per step of the loop along D (4 spilled: 1.3x slower)
        lines = [*(f"(local.set $d{r}{u} (v128.const i32x4 0 0 0 0))" for r in range(count) for u in range(4))]
        if rows_first:  # the key blocks' pairs of rows: keys at $k0, 4 * head bytes apart
            lines += pair_dot() if words else []
        else:
            lines += [
                "(local.set $at (i32.const 0))",
                *loop("dot", f"(i32.ge_u (local.get $at) (i32.const {16 * words}))", [
                    *(line for w in range(step) for line in [
                        *(f"(local.set $key{u} (v128.load offset={keys[u][1] + 16 * w} (i32.add (local.get ${keys[u][0]}) "
                          f"(local.get $at))))" for u in range(4)),
                        *(line for r in range(count) for line in [
                            f"(local.set $word (v128.load offset={4 * head * r + 16 * w} (i32.add (local.get $q) "
                            "(local.get $at))))",
                            *(f"(local.set $d{r}{u} (f32x4.add (local.get $d{r}{u}) (f32x4.mul (local.get $word) "
                              f"(local.get $key{u}))))" for u in range(4))])]),
                    f"(local.set $at (i32.add (local.get $at) (i32.const {16 * step})))"])]
        for r in range(count):
            d = [f"(local.get $d{r}{u})" for u in range(4)]
            lines += [
                f";; row {r}: (d0, d1, d2, d3) summed across lanes: lane u is key j + u's dot product",
                f"(local.set $d{r}0 (f32x4.add {shuffle(d[0], d[1], (0, 1, 4, 5))} {shuffle(d[0], d[1], (2, 3, 6, 7))}))",
                f"(local.set $d{r}2 (f32x4.add {shuffle(d[2], d[3], (0, 1, 4, 5))} {shuffle(d[2], d[3], (2, 3, 6, 7))}))",
                f"(local.set $s{r} (f32x4.add {shuffle(d[0], d[2], (0, 2, 4, 6))} {shuffle(d[0], d[2], (1, 3, 5, 7))}))",
                *(f"(local.set $s{r} (f32x4.add (local.get $s{r}) (f32x4.mul (f32x4.splat (f32.load "
                  f"offset={4 * head * r + 4 * e} (local.get $q))) {lanes([key_element(u, 4 * e) for u in range(4)])})))"
                  for e in range(4 * words, head)),  # the scalar tail of D % 4
            ]
            if scale != 1.0:
                lines.append(f"(local.set $s{r} (f32x4.mul (local.get $s{r}) "
                             f"(f32x4.splat (f32.const {float(np.float32(scale))!r}))))")
            if masked:
                lines.append(f"(local.set $s{r} (f32x4.add (local.get $s{r}) {masks[r]}))")
        return lines

    def update(r: int, acc: str, offset: int, values: list[tuple[str, int]], valid: bool) -> list[str]:
        """The online softmax step of row r's group (scores ``$s{r}``; ``valid``: lanes past
        ``count`` weigh 0) and its value product, with the row's block in scratch at
        ``$acc`` + ``offset`` (the accumulators, then its state) and value u at ``values[u]``."""
        state = offset + row_bytes  # running maximum, running sum, started
        s = f"(local.get $s{r})"

        def value_word(u: int, byte: int, kind: str = "v128") -> str:
            return f"({kind}.load offset={values[u][1] + byte} (local.get ${values[u][0]}))"

        def acc_word(byte: int, kind: str = "v128") -> str:
            return f"({kind}.load offset={offset + byte} (local.get ${acc}))"
        return [
            f"(local.set $running_max (f32.load offset={state} (local.get ${acc})))",
            f"(local.set $started (i32.load offset={state + 8} (local.get ${acc})))",
            f"(local.set $word (f32x4.max {s} {shuffle(s, s, (2, 3, 0, 1))}))",
            f"(local.set $group_max (f32x4.extract_lane 0 (f32x4.max (local.get $word) "
            f"{shuffle('(local.get $word)', '(local.get $word)', (1, 0, 3, 2))})))",
            "(local.set $new_max (select (f32.max (local.get $running_max) (local.get $group_max)) (local.get $group_max) "
            "(local.get $started)))",
            ";; every score so far -inf: nothing to add yet (a NaN score makes the weights, so the row, NaN)",
            "(if (i32.ne (i32.reinterpret_f32 (local.get $new_max)) (i32.const 0xff800000))",
            "  (then",
            "    ;; the maximum unchanged (most groups): exp(0) is 1, without the call",
            "    (local.set $correction (if (result f32) (i32.and (local.get $started) "
            "(f32.eq (local.get $running_max) (local.get $new_max)))",
            "      (then (f32.const 1))",
            "      (else (select (call $exp_f32 (f32.sub (local.get $running_max) (local.get $new_max))) "
            "(f32.const 0) (local.get $started)))))",
            f"    (local.set $p (call $exp_f32x4 (f32x4.sub {s} (f32x4.splat (local.get $new_max)))))",
            *(["    (local.set $p (v128.and (local.get $p) (local.get $valid)))"] if valid else []),
            f"    (local.set $word (f32x4.add (local.get $p) {shuffle('(local.get $p)', '(local.get $p)', (2, 3, 0, 1))}))",
            f"    (f32.store offset={state + 4} (local.get ${acc}) (f32.add (f32.mul (f32.load offset={state + 4} "
            f"(local.get ${acc})) (local.get $correction)) (f32x4.extract_lane 0 (f32x4.add (local.get $word) "
            f"{shuffle('(local.get $word)', '(local.get $word)', (1, 0, 3, 2))}))))",
            *indent([
                *(f"(local.set $p{u} {broadcast_lane('(local.get $p)', u)})" for u in range(4)),
                "(local.set $c (f32x4.splat (local.get $correction)))",
                ";; acc = acc * correction + p0 v0 + p1 v1 + p2 v2 + p3 v3, a word at a time",
                *(line for w in range(value_words) for line in [
                    f"(v128.store offset={offset + 16 * w} (local.get ${acc}) (f32x4.add (f32x4.add",
                    f"  (f32x4.mul {acc_word(16 * w)} (local.get $c))",
                    f"  (f32x4.mul (local.get $p0) {value_word(0, 16 * w)}))",
                    "  (f32x4.add",
                    f"    (f32x4.add (f32x4.mul (local.get $p1) {value_word(1, 16 * w)})",
                    f"               (f32x4.mul (local.get $p2) {value_word(2, 16 * w)}))",
                    f"    (f32x4.mul (local.get $p3) {value_word(3, 16 * w)}))))"]),
                *(f"(f32.store offset={offset + 4 * d} (local.get ${acc}) " + fold("f32.add", [
                    f"(f32.mul {acc_word(4 * d, 'f32')} (local.get $correction))",
                    *(f"(f32.mul (f32x4.extract_lane {u} (local.get $p)) {value_word(u, 4 * d, 'f32')})"
                      for u in range(4))]) + ")"
                  for d in range(4 * value_words, value_head)),
                f"(f32.store offset={state} (local.get ${acc}) (local.get $new_max))",
                f"(i32.store offset={state + 8} (local.get ${acc}) (i32.const 1))))",
            ], 2),
        ]

    if causal:  # key j is visible to row i when j <= i + Sk - Sq
        count = ("(call $main_max (i32.const 0) (call $main_min (local.get $seq_k) (i32.add (local.get $row) "
                 "(i32.add (i32.sub (local.get $seq_k) (local.get $seq_q)) (i32.const 1)))))")
    else:
        count = "(local.get $seq_k)"
    mask_start = index(_mask_row_start(mask_shape, batch)[0]) if masked else ""
    # row r of the block's mask over keys j .. j + 3 (none past count), and the one row's (some may be)
    shared_masks = [f"(f32x4.splat (f32.load {element('mask', f'(local.get $mask_start{r})')}))" if mask_step == 0 else
                    f"(v128.load {element('mask', f'(i32.add (local.get $mask_start{r}) (local.get $j))')})"
                    for r in range(rows)]
    mask_key = ["(local.get $mask_start)" if mask_step == 0 else
                f"(i32.add (local.get $mask_start) (call $main_min (i32.add (local.get $j) (i32.const {u})) "
                f"(i32.sub (local.get $count) (i32.const 1))))" for u in range(4)]
    row_masks = [lanes([f"(f32.load {element('mask', key)})" for key in mask_key])]
    row_start = "(i32.add (i32.mul (local.get $bh) (local.get $seq_q)) (local.get $row))"

    def horizontal(instruction: str, vector: str, target: str) -> list[str]:
        """``$target`` set to the ``instruction`` (``f32x4.max``, ``f32x4.add``) of the four
        lanes of the f32x4 local ``$vector`` (which it overwrites)."""
        v = f"(local.get ${vector})"
        return [f"(local.set ${vector} ({instruction} {v} {shuffle(v, v, (2, 3, 0, 1))}))",
                f"(local.set ${target} (f32x4.extract_lane 0 ({instruction} {v} {shuffle(v, v, (1, 0, 3, 2))})))"]

    def block_weights(r: int) -> list[str]:
        """Row r's online softmax step over the block's scores (in scratch at ``scores_at(r)``,
        their maximum's lanes in ``$m{r}``): the correction ``$corr{r}`` of its accumulators,
        and the scores replaced by their weights ``exp(score - maximum)``, whose sum joins the
        running sum.

        Without branches on the scores: the maximum is taken with ``pmax`` (one instruction on
        x86 where ``max`` takes seven), which passes over NaN scores: their weights are NaN, so
        the row is.  A row whose scores so far are all -inf subtracts 0 (weights exp(-inf) = 0,
        a NaN score's NaN) and stays not started: its accumulators, 0, get 0 added."""
        state = r * block + row_bytes
        at = scores_at(r)
        word = f"(v128.load offset={at} (local.get $at))"
        return [
            f";; row {r}: the block's maximum, then its weights in place of its scores",
            *horizontal("f32x4.pmax", f"m{r}", "group_max"),
            f"(local.set $running_max (f32.load offset={state} (local.get $scratch)))",
            f"(local.set $started (i32.load offset={state + 8} (local.get $scratch)))",
            "(local.set $new_max (select (f32.max (local.get $running_max) (local.get $group_max)) (local.get $group_max) "
            "(local.get $started)))",
            ";; the maximum unchanged (most blocks): exp(0) is 1, without the call; not started: 0",
            f"(local.set $corr{r} (if (result f32) (i32.and (local.get $started) "
            "(f32.eq (local.get $running_max) (local.get $new_max)))",
            "  (then (f32.const 1))",
            "  (else (select (call $exp_f32 (f32.sub (local.get $running_max) (local.get $new_max))) "
            "(f32.const 0) (local.get $started)))))",
            ";; subtracted from the scores: the maximum, or 0 while every score is -inf",
            "(local.set $c (f32x4.splat (select (f32.const 0) (local.get $new_max) (i32.eq (i32.reinterpret_f32 "
            "(local.get $new_max)) (i32.const 0xff800000)))))",
            "(local.set $word (v128.const i32x4 0 0 0 0))",
            "(local.set $at (local.get $scratch))",
            *repeat(f"weights{r}", "(i32.lt_u (local.get $at) (local.get $stop))", [
                f"(local.set $p (f32x4.sub {word} (local.get $c)))",
                *exp_nonpositive("p"),
                f"(v128.store offset={at} (local.get $at) (local.get $p))",
                "(local.set $word (f32x4.add (local.get $word) (local.get $p)))",
                "(local.set $at (i32.add (local.get $at) (i32.const 16)))"]),
            *horizontal("f32x4.add", "word", "running_sum"),
            f"(f32.store offset={state + 4} (local.get $scratch) (f32.add (f32.mul (f32.load offset={state + 4} "
            f"(local.get $scratch)) (local.get $corr{r})) (local.get $running_sum)))",
            f"(f32.store offset={state} (local.get $scratch) (local.get $new_max))",
            f"(i32.store offset={state + 8} (local.get $scratch) (i32.or (local.get $started) "
            "(i32.ne (i32.reinterpret_f32 (local.get $new_max)) (i32.const 0xff800000))))",
        ]

    def block_scores(pair: int) -> list[str]:
        """The scores of rows 2 pair, 2 pair + 1 for the block's keys, a group of 4 at a time
        (each key word loaded once for both rows), into scratch at ``scores_at``, and their
        lanes' maxima (``pmax``: NaN passed over, see ``block_weights``) in ``$m{r}``."""
        return [
            f";; rows {2 * pair} and {2 * pair + 1}: their scores of the block's keys",
            f"(local.set $q (i32.add (local.get $q_row0) (i32.const {2 * pair * 4 * head})))",
            "(local.set $j (local.get $j0))",
            "(local.set $sp (local.get $scratch))",
            *(f"(local.set $m{2 * pair + r} (v128.const f32x4 -inf -inf -inf -inf))" for r in range(2)),
            *loop(f"scores{pair}", "(i32.ge_s (local.get $j) (local.get $block_end))", [
                f"(local.set $k0 (i32.add (local.get $keys) (i32.mul (local.get $j) (i32.const {4 * head}))))",
                *scores(2, [("k0", 4 * head * u) for u in range(4)], shared_masks[2 * pair:2 * pair + 2], True),
                *(line for r in range(2) for line in [
                    f"(v128.store offset={scores_at(2 * pair + r)} (local.get $sp) (local.get $s{r}))",
                    f"(local.set $m{2 * pair + r} (f32x4.pmax (local.get $m{2 * pair + r}) (local.get $s{r})))"]),
                "(local.set $sp (i32.add (local.get $sp) (i32.const 16)))",
                "(local.set $j (i32.add (local.get $j) (i32.const 4)))"]),
        ]

    def block_values(pair: int) -> list[str]:
        """Rows 2 pair and 2 pair + 1's accumulators times their corrections plus the block's
        weights times its values: up to 4 value words of both rows in registers at a time
        (each value word loaded once for both rows, each weight once per chunk)."""
        lines = []
        for first in range(0, value_words, 4):
            chunk = range(first, min(first + 4, value_words))
            lines += [
                f";; rows {2 * pair} and {2 * pair + 1}, value words {first} .. {chunk[-1]}: acc * correction "
                "+ weights . values",
                *(f"(local.set $a{r}{w - first} (f32x4.mul (v128.load offset={(2 * pair + r) * block + 16 * w} "
                  f"(local.get $scratch)) (f32x4.splat (local.get $corr{2 * pair + r}))))" for r in range(2) for w in chunk),
                f"(local.set $vp (i32.add (local.get $values) (i32.add (i32.mul (local.get $j0) (i32.const {4 * value_head})) "
                f"(i32.const {16 * first}))))",
                "(local.set $at (local.get $scratch))",
                ";; the block's keys (at least 4, a multiple of 4) 4 at a time: a word of weights per row, each"
                " weight broadcast",
                *repeat(f"values{pair}_{first}", "(i32.lt_u (local.get $at) (local.get $stop))", [
                    *(f"(local.set $p{2 + r} (v128.load offset={scores_at(2 * pair + r)} (local.get $at)))"
                      for r in range(2)),
                    *(line for u in range(4) for line in [
                        *(f"(local.set $p{r} {broadcast_lane(f'(local.get $p{2 + r})', u)})" for r in range(2)),
                        *(line for w in chunk for line in [
                            f"(local.set $key0 (v128.load offset={4 * value_head * u + 16 * (w - first)} (local.get $vp)))",
                            *(f"(local.set $a{r}{w - first} (f32x4.add (local.get $a{r}{w - first}) "
                              f"(f32x4.mul (local.get $p{r}) (local.get $key0))))" for r in range(2))])]),
                    f"(local.set $vp (i32.add (local.get $vp) (i32.const {16 * value_head})))",
                    "(local.set $at (i32.add (local.get $at) (i32.const 16)))"]),
                *(f"(v128.store offset={(2 * pair + r) * block + 16 * w} (local.get $scratch) (local.get $a{r}{w - first}))"
                  for r in range(2) for w in chunk),
            ]
        return lines

    def key_blocks() -> list[str]:
        """The shared keys in blocks of up to ``WASM_KEY_BLOCK`` (the last one shorter): each
        block's scores for every row, each row's weights with one rescale per block, then the
        value products (see ``_wasm_source``)."""
        return [
            "(local.set $q_row0 (local.get $q))",
            *loop("blocks", "(i32.ge_s (local.get $j) (local.get $shared))", [
                ";; keys j .. block_end, seen by every row: scores, weights, value products",
                "(local.set $j0 (local.get $j))",
                f"(local.set $block_end (call $main_min (local.get $shared) (i32.add (local.get $j) "
                f"(i32.const {WASM_KEY_BLOCK}))))",
                "(local.set $stop (i32.add (local.get $scratch) (i32.shl (i32.sub (local.get $block_end) "
                "(local.get $j0)) (i32.const 2))))",
                *(line for pair in range(rows // 2) for line in block_scores(pair)),
                *(line for r in range(rows) for line in block_weights(r)),
                *(line for pair in range(rows // 2) for line in block_values(pair)),
                "(local.set $j (local.get $block_end))"]),
            "(local.set $q (local.get $q_row0))",
        ]

    shared_phase = [
        "(local.set $row (local.get $row0))",
        f"(local.set $count {count})",
        ";; the key groups every row of a full block sees",
        f"(local.set $shared (select (i32.and (local.get $count) (i32.const -4)) (i32.const 0) "
        f"(i32.le_s (i32.add (local.get $row0) (i32.const {rows})) (local.get $seq_q))))",
        *(line for r in range(rows) if masked for line in [
            f"(local.set $row (i32.add (local.get $row0) (i32.const {r})))",
            f"(local.set $mask_start{r} {mask_start})"]),
        "(local.set $row (local.get $row0))",
        f"(local.set $q (i32.add (local.get $query) (i32.mul {row_start} (i32.const {4 * head}))))",
        "(local.set $j (i32.const 0))",
        *(key_blocks() if blocked else loop("shared", "(i32.ge_s (local.get $j) (local.get $shared))", [
            ";; keys j .. j + 3 for every row of the block: their scores, then each row's rescale",
            f"(local.set $k0 (i32.add (local.get $keys) (i32.mul (local.get $j) (i32.const {4 * head}))))",
            f"(local.set $v0 (i32.add (local.get $values) (i32.mul (local.get $j) (i32.const {4 * value_head}))))",
            *scores(rows, [("k0", 4 * head * u) for u in range(4)], shared_masks),
            *(line for r in range(rows)
              for line in update(r, "scratch", r * block, [("v0", 4 * value_head * u) for u in range(4)], False)),
            "(local.set $j (i32.add (local.get $j) (i32.const 4)))",
        ])),
    ]

    one_row = [
        "(local.set $row (i32.add (local.get $row0) (local.get $r)))",
        f"(local.set $q (i32.add (local.get $query) (i32.mul {row_start} (i32.const {4 * head}))))",
        *([f"(local.set $mask_start {mask_start})"] if masked else []),
        f"(local.set $count {count})",
        f"(local.set $acc (i32.add (local.get $scratch) (i32.mul (local.get $r) (i32.const {block}))))",
        "(local.set $j (local.get $shared))",
        *loop("keys", "(i32.ge_s (local.get $j) (local.get $count))", [
            ";; keys j .. j + 3 of this row, some maybe past count: their scores, then one rescale",
            *(f"(local.set $k{u} {key_at(u)})" for u in range(4)),
            *(f"(local.set $v{u} {value_at(u)})" for u in range(4)),
            *scores(1, [(f"k{u}", 0) for u in range(4)], row_masks),
            ";; keys past count: key j's score (their weights are 0 below)",
            "(local.set $valid (i32x4.lt_s (i32x4.add (i32x4.splat (local.get $j)) (v128.const i32x4 0 1 2 3)) "
            "(i32x4.splat (local.get $count))))",
            f"(local.set $s0 (v128.bitselect (local.get $s0) {broadcast_lane('(local.get $s0)', 0)} (local.get $valid)))",
            *update(0, "acc", 0, [(f"v{u}", 0) for u in range(4)], True),
            "(local.set $j (i32.add (local.get $j) (i32.const 4)))",
        ]),
        ";; acc / sum; a row with no score above -inf is NaN (the unfused softmax's); no keys: 0",
        f"(local.set $o (i32.add (local.get $out) (i32.mul {row_start} (i32.const {4 * value_head}))))",
        "(local.set $c (f32x4.splat (select (f32.const nan) (f32.const 0) (local.get $seq_k))))  ;; the row without weights",
        f"(local.set $running_sum (f32.load offset={row_bytes + 4} (local.get $acc)))",
        f"(local.set $started (i32.load offset={row_bytes + 8} (local.get $acc)))",
        "(local.set $p (f32x4.splat (local.get $running_sum)))",
        "(local.set $at (i32.const 0))",
        *loop("store", f"(i32.ge_u (local.get $at) (i32.const {16 * value_words}))", [
            "(v128.store (i32.add (local.get $o) (local.get $at)) (select (result v128)",
            "  (f32x4.div (v128.load (i32.add (local.get $acc) (local.get $at))) (local.get $p))",
            "  (local.get $c) (local.get $started)))",
            "(local.set $at (i32.add (local.get $at) (i32.const 16)))",
        ]),
        *(f"(f32.store offset={4 * d} (local.get $o) (select (f32.div (f32.load offset={4 * d} (local.get $acc)) "
          "(local.get $running_sum)) (f32x4.extract_lane 0 (local.get $c)) (local.get $started)))"
          for d in range(4 * value_words, value_head)),
        "(local.set $r (i32.add (local.get $r) (i32.const 1)))",
    ]
    body = [
        f"(local.set $seq_q {index(query_length)})",
        f"(local.set $seq_k {index(key_length)})",
        f"(local.set $blocks (i32.div_u (i32.add (local.get $seq_q) (i32.const {rows - 1})) (i32.const {rows})))",
        f"(local.set $zero (i32.add (local.get $scratch) (i32.const {rows * block})))",
        f"(memory.fill (local.get $zero) (i32.const 0) (i32.const {row_bytes}))",
        "(local.set $unit (local.get $first))",
        *loop("unit", "(i32.ge_s (local.get $unit) (local.get $end))", [
            "(local.set $bh (i32.div_u (local.get $unit) (local.get $blocks)))",
            f"(local.set $row0 (i32.mul (i32.rem_u (local.get $unit) (local.get $blocks)) (i32.const {rows})))",
            f"(local.set $kv (i32.mul {index(_flat_index(kv_batch, _kv_coordinates(batch, kv_batch)))} {index(key_rows)}))",
            f"(local.set $keys (i32.add (local.get $key) (i32.mul (local.get $kv) (i32.const {4 * head}))))",
            f"(local.set $values (i32.add (local.get $value) (i32.mul (local.get $kv) (i32.const {4 * value_head}))))",
            ";; every row's accumulators 0 and state (maximum 0, sum 0, not started)",
            f"(memory.fill (local.get $scratch) (i32.const 0) (i32.const {rows * block}))",
            *shared_phase,
            ";; then each row alone: its remaining keys, and its output",
            f"(local.set $rows_here (call $main_min (i32.const {rows}) (i32.sub (local.get $seq_q) (local.get $row0))))",
            "(local.set $r (i32.const 0))",
            *loop("row", "(i32.ge_s (local.get $r) (local.get $rows_here))", one_row),
            "(local.set $unit (i32.add (local.get $unit) (i32.const 1)))",
        ]),
    ]
    int_locals = ["seq_q", "seq_k", "blocks", "unit", "bh", "row0", "row", "r", "rows_here", "shared", "kv", "keys",
                  "values", "q", "o", "acc", "zero", "count", "j", "at", "started",
                  *(["q_row0", "j0", "block_end", "stop", "sp", "vp", "qp", "kp", "dot_end"] if blocked else []),
                  *(["mask_start", *(f"mask_start{r}" for r in range(rows))] if masked else []),
                  *(f"k{u}" for u in range(4)), *(f"v{u}" for u in range(4))]
    float_locals = ["running_max", "running_sum", "new_max", "group_max", "correction",
                    *((f"corr{r}" for r in range(rows)) if blocked else ())]
    vector_locals = ["word", "p", "c", "valid", *(f"s{r}" for r in range(rows)),
                     *(f"d{r}{u}" for r in range(rows) for u in range(4)), *(f"key{u}" for u in range(4)),
                     *(f"p{u}" for u in range(4)), *((f"a{r}{w}" for r in range(2) for w in range(4)) if blocked else ()),
                     *(["en", "er", "ek", "eh", *(f"m{r}" for r in range(rows))] if blocked else [])]
    units = [index(simplify(product(batch) * ((query_length + (rows - 1)) // rows)))]
    title = (f"library kernel: {name} (fused attention, {rows} query rows per unit, online softmax over "
             + (f"blocks of {WASM_KEY_BLOCK} keys shared by the rows, then groups of 4 keys)" if blocked else
                "groups of 4 keys)"))
    text = kernel_text(title, bindings, units,
                       [*((n, "i32") for n in int_locals), *((n, "f32") for n in float_locals),
                        *((n, "v128") for n in vector_locals)],
                       body, index_helpers("\n".join([*units, *body])))
    return text, scores_at(rows) if blocked else rows * block + row_bytes


# -- numpy reference -------------------------------------------------------------------------------


def attention_reference(arrays: list[np.ndarray], *, scale: float, causal: bool) -> np.ndarray:
    """``softmax(q k^T * scale + mask) v`` with numpy, as the unfused ops compute it (a row
    whose scores are all -inf is NaN); float32 arithmetic for narrower floats."""
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
    return np.matmul(weights, value).astype(dtype)
