"""The WGSL of the paged KV cache's kernels (``relaxweb/library/paged_kv.py``): the writer of
new keys or values into their pages (``paged_kv_write``) and the attention of each query token
over its own sequence's pages (``paged_attention``).

``paged_kv_write`` is a scatter copy (``copy.scatter_copy_source``), one invocation per
element of the value, into the pool in place.

``paged_attention`` runs one workgroup of 64 invocations per (token, head): the workgroup's
result depends on that token's query, position and page table alone, never on which other
tokens share the dispatch.  The query row is staged in workgroup memory; the keys ``0 ..
position`` go by chunks of :data:`CHUNK`:

1. each invocation scores the keys ``i = local (mod 64)`` of the chunk (looking up each key's
   page: a chunk may span pages) into a workgroup array, and its maximum into another;
2. every invocation reads the 64 maxima, so holds the chunk's maximum and the new running
   maximum, and turns its own scores into weights ``exp(score - maximum)``;
3. each invocation owns the output dimensions ``d = local (mod 64)`` (value rows of more than
   64 take several) and adds ``w_j v_j[d]`` over the chunk's keys, and the weights to the
   running sum (each invocation the same sum), after rescaling both by ``exp(old maximum -
   new maximum)`` (the online softmax).

Three barriers per chunk, all under uniform control flow (the position and the workgroup's
number are uniform).

The form for CPU adapters (``webgpu_cpu``: SwiftShader, lavapipe) has no barriers, which cost a
CPU adapter more than the sharing saves (a decode step's attention took 2.5 ms a layer on
SwiftShader at 41 keys): the same dispatch, but invocation 0 of each workgroup computes its
(token, head) alone, key after key, with the query row and the accumulators in registers
(unrolled into ``vec4`` variables) and the online softmax of every key.
"""

from __future__ import annotations

from ...ir.library_kernel import WEBGPU_CPU, LibraryKernel
from ...ir.params_block import ParamsLayout
from ...ir.symbolic import Analyzer, PrimExpr, simplify
from ...ir.syntax import comment_text
from ...library.paged_kv import PAGED_WORKGROUP, paged_title
from ..emit import literal, storage_type, wgsl_name
from ..lower_index import helper_declarations, helpers_used, lower_index, render_wgsl
from ..shader import params_declaration
from .copy import scatter_copy_source

#: Keys one chunk of paged attention scores at once (see the module doc).
CHUNK = 256
#: The workgroup memory a WebGPU adapter must give a shader (maxComputeWorkgroupStorageSize).
WORKGROUP_STORAGE_LIMIT = 16384
#: The lowest f32: a running maximum below every finite score. Written exactly: the 9-digit
#: -3.40282347e+38 is beyond it, which Tint (Chromium) refuses as not representable in f32.
_LOWEST = "-3.4028234663852886e+38"


def _size_vars(kernel: LibraryKernel) -> tuple[str, ...]:
    return tuple(var.name for var in kernel.size_vars)


def _lowered(expr: PrimExpr) -> tuple[str, list[str]]:
    """A size expression as WGSL of the params fields, and the index helpers it needs."""
    index = lower_index(simplify(expr), Analyzer())
    return render_wgsl(index, lambda name: f"params.{wgsl_name(name)}"), helper_declarations(helpers_used(index))


def _constants(**values: int) -> list[str]:
    return [f"const {name.upper()}: i32 = {value};" for name, value in values.items()]


def _token_lines(indent: str) -> list[str]:
    """``position`` (clamped) of token ``token`` (the shared part of both kernels)."""
    return [
        f"{indent}// its position in its sequence, clamped as the reference clamps it",
        f"{indent}let position = clamp(positions[token], 0, TABLE_PAGES * PAGE_SIZE - 1);",
    ]


def _page_row(indent: str, position: str, heads: str, head: str) -> list[str]:
    """``row``: the pool row (of ``heads`` heads) holding ``position`` of token ``token``'s
    sequence at head ``head``, its page read from the page table and clamped."""
    return [
        f"{indent}let page = clamp(page_table[token * TABLE_PAGES + {position} / PAGE_SIZE], 0, PAGES - 1);",
        f"{indent}let row = (page * {heads} + {head}) * PAGE_SIZE + {position} % PAGE_SIZE;",
    ]


def render_paged_kv_write(kernel: LibraryKernel, target: str) -> str:
    """``out[page, h, position % page_size, e] = value[b, h, t, e]`` for each element of the
    value (the pool's other rows kept: the kernel runs in place)."""
    args = kernel.arguments
    tokens, helpers = _lowered(kernel.inputs[0].shape[2])
    declarations = ["", *_constants(heads=args["heads"], head=args["head"], pages=args["pages"],
                                    page_size=args["page_size"], table_pages=args["table_pages"]), *helpers]
    lets = [
        "  // element e of head h of token t of batch entry b of value [batch, heads, length, head]",
        f"  let tokens = {tokens};  // length: tokens per batch entry",
        "  let e = index % HEAD;",
        "  let t = index / HEAD % tokens;",
        "  let h = index / (HEAD * tokens) % HEADS;",
        "  let b = index / (HEAD * tokens * HEADS);",
        "  let token = b * tokens + t;",
        *_token_lines("  "),
        "  // the pool row of that position at head h: row position % PAGE_SIZE of its page",
        *_page_row("  ", "position", "HEADS", "h"),
    ]
    return scatter_copy_source(paged_title(kernel), kernel.output.dtype, _size_vars(kernel), "row * HEAD + e",
                               tuple(declarations), tuple(lets), ("page_table", "positions"))


def paged_attention_workgroup_bytes(head: int, width: int) -> int:
    """The workgroup memory of paged attention: the query row, a chunk's weights and pool
    rows, the 64 partial maxima."""
    return 4 * (head + (-head) % width) + 8 * CHUNK + 4 * PAGED_WORKGROUP


def render_paged_attention(kernel: LibraryKernel, target: str) -> str:
    """The paged attention kernel's WGSL for ``target`` (see the module doc; ``webgpu_cpu``:
    :func:`_cpu_source`)."""
    if target == WEBGPU_CPU:
        return _cpu_source(kernel)
    args = kernel.arguments
    head, value_head = args["head"], args["value_head"]
    width = 4 if head % 4 == 0 else 1
    if paged_attention_workgroup_bytes(head, width) > WORKGROUP_STORAGE_LIMIT:
        raise ValueError(f"{kernel.name}: a head of {head} does not fit paged attention's workgroup memory "
                         f"({WORKGROUP_STORAGE_LIMIT} bytes)")
    float_inputs = kernel.inputs[:3]  # query, key, value; then page_table, positions
    tokens, helpers = _lowered(float_inputs[0].shape[2])
    lines = [
        *_attention_declarations(kernel, "one workgroup per (token, head); keys by chunks of CHUNK, an online "
                                 "softmax between chunks", helpers, chunk=CHUNK),
        *_workgroup_arrays(head, width),
        "",
        *_main_opening("  // one workgroup per (b, h, t) of query [batch, heads, length, head]; the grid's last ones idle",
                       f"group >= params.element_count / {PAGED_WORKGROUP}"),
        "  let lane = i32(local);",
        *_row_of_group(tokens),
        "  let key_count = position + 1;  // causal: keys 0 .. position",
        "",
        "  // the query row into workgroup memory: row group = (b * HEADS + h) * tokens + t of the query",
        "  let query_start = group * HEAD;",
        *_load_query(width),
        "",
        *_accumulator_lines(value_head),
        "  for (var start = 0; start < key_count; start = start + CHUNK) {",
        "    let count = min(CHUNK, key_count - start);",
        "    workgroupBarrier();  // the query row written, the last chunk's weights read",
        *_score_phase(width),
        "    workgroupBarrier();",
        *_weight_phase(),
        "    workgroupBarrier();",
        *_value_phase(value_head),
        "  }",
        "",
        "  // out [batch, heads, length, value_head]: this invocation's dimensions of the row",
        "  let out_start = group * VALUE_HEAD;",
        *_store_lines(value_head),
        "}",
    ]
    return "\n".join(lines) + "\n"


def _workgroup_arrays(head: int, width: int) -> list[str]:
    query = f"array<vec4<f32>, {head // 4}>" if width == 4 else "array<f32, HEAD>"
    return [
        f"// the query row{' in vec4s' if width == 4 else ''}; the chunk's scores, then weights, and the pool rows of",
        "// its keys; each invocation's maximum of the chunk's scores",
        f"var<workgroup> query_row: {query};",
        "var<workgroup> weights: array<f32, CHUNK>;",
        "var<workgroup> key_rows: array<i32, CHUNK>;",
        f"var<workgroup> partial_max: array<f32, {PAGED_WORKGROUP}>;",
    ]


def _load_query(width: int) -> list[str]:
    if width == 1:
        return ["  for (var e = lane; e < HEAD; e = e + 64) {",
                "    query_row[e] = f32(query[query_start + e]);",
                "  }"]
    return ["  for (var w = lane; w < HEAD / 4; w = w + 64) {",
            "    let at = query_start + w * 4;",
            "    query_row[w] = vec4<f32>(f32(query[at]), f32(query[at + 1]), f32(query[at + 2]), f32(query[at + 3]));",
            "  }"]


def _slots(value_head: int) -> int:
    """Output dimensions each invocation owns: ``lane + 64 k`` for ``k`` below this."""
    return -(-value_head // PAGED_WORKGROUP)


def _accumulator_lines(value_head: int) -> list[str]:
    slots = _slots(value_head)
    dims = ", ".join(f"lane + {64 * k}" if k else "lane" for k in range(slots))
    lines = [
        f"  // the online softmax: running maximum and sum, and acc_k for dimension lane + 64 k ({dims})",
        f"  var running_max = {_LOWEST};",
        "  var running_sum = 0.0;",
    ]
    lines += [f"  var acc{k} = 0.0;" for k in range(slots)]
    if value_head % PAGED_WORKGROUP:
        lines.append("  // a dimension past the row stands in as its last one (read, never stored)")
    for k in range(slots):
        dim = f"lane + {64 * k}" if k else "lane"
        if 64 * (k + 1) > value_head:
            dim = f"min({dim}, VALUE_HEAD - 1)"
        lines.append(f"  let dim{k} = {dim};")
    return lines


def _score_phase(width: int) -> list[str]:
    if width == 4:
        dot = ["      for (var w = 0; w < HEAD / 4; w = w + 1) {",
               "        let at = key_start + w * 4;",
               "        let word = vec4<f32>(f32(key[at]), f32(key[at + 1]), f32(key[at + 2]), f32(key[at + 3]));",
               "        score = score + dot(query_row[w], word);",
               "      }"]
    else:
        dot = ["      for (var e = 0; e < HEAD; e = e + 1) {",
               "        score = score + query_row[e] * f32(key[key_start + e]);",
               "      }"]
    return [
        "    // 1. the scores of keys start + i, i = lane (mod 64), each from its own page",
        f"    var lane_max = {_LOWEST};",
        "    for (var i = lane; i < count; i = i + 64) {",
        "      let j = start + i;",
        *_page_row("      ", "j", "KV_HEADS", "kv_head"),
        "      key_rows[i] = row;",
        "      let key_start = row * HEAD;",
        "      var score = 0.0;",
        *dot,
        "      score = score * SCALE;",
        "      weights[i] = score;",
        "      lane_max = max(lane_max, score);",
        "    }",
        "    partial_max[lane] = lane_max;",
    ]


def _weight_phase() -> list[str]:
    return [
        "    // 2. the chunk's maximum, the new running maximum, and this invocation's weights",
        "    var chunk_max = partial_max[0];",
        f"    for (var k = 1; k < {PAGED_WORKGROUP}; k = k + 1) {{",
        "      chunk_max = max(chunk_max, partial_max[k]);",
        "    }",
        "    let first_chunk = start == 0;",
        "    let new_max = select(max(running_max, chunk_max), chunk_max, first_chunk);",
        "    let correction = select(exp(running_max - new_max), 0.0, first_chunk);",
        "    running_max = new_max;",
        "    for (var i = lane; i < count; i = i + 64) {",
        "      weights[i] = exp(weights[i] - new_max);",
        "    }",
    ]


def _value_phase(value_head: int) -> list[str]:
    slots = _slots(value_head)
    return [
        "    // 3. the weights (each invocation sums them all) and the weighted value rows, dimension by",
        "    // dimension, after rescaling what the earlier chunks gave",
        "    running_sum = running_sum * correction;",
        *(f"    acc{k} = acc{k} * correction;" for k in range(slots)),
        "    for (var i = 0; i < count; i = i + 1) {",
        "      let weight = weights[i];",
        "      let value_start = key_rows[i] * VALUE_HEAD;",
        "      running_sum = running_sum + weight;",
        *(f"      acc{k} = acc{k} + weight * f32(value[value_start + dim{k}]);" for k in range(slots)),
        "    }",
    ]


def _store_lines(value_head: int) -> list[str]:
    lines = []
    for k in range(_slots(value_head)):
        store = f"out[out_start + dim{k}] = acc{k} / running_sum;"
        if 64 * (k + 1) > value_head:
            lines.append(f"  if (lane + {64 * k} < VALUE_HEAD) {{" if k else "  if (lane < VALUE_HEAD) {")
            lines += [f"    {store}", "  }"]
        else:
            lines.append(f"  {store}")
    return lines


def _cpu_source(kernel: LibraryKernel) -> str:
    """Paged attention for CPU adapters: invocation 0 of each workgroup walks its (token, head)'s
    keys one by one (see the module doc); the others return at once."""
    args = kernel.arguments
    head, value_head = args["head"], args["value_head"]
    float_inputs = kernel.inputs[:3]
    tokens, helpers = _lowered(float_inputs[0].shape[2])

    def read(buffer: str, start: str, offset: int, width: int) -> str:
        """Elements ``start + offset ..`` of ``buffer``: one f32, or a vec4 of four."""
        at = [f"{start} + {offset + k}" if offset + k else start for k in range(width)]
        loads = [f"f32({buffer}[{index}])" for index in at]
        return loads[0] if width == 1 else f"vec4<f32>({', '.join(loads)})"

    def term(k: int, width: int, offset: int) -> str:
        """Register k of the query times the key's elements there."""
        key = read("key", "key_start", offset, width)
        return f"dot(q{k}, {key})" if width == 4 else f"q{k} * {key}"

    lines = [
        *_attention_declarations(kernel, "for CPU adapters: invocation 0 of each workgroup computes one (token, "
                                 "head) alone, key by key", helpers),
        *_main_opening("  // one (b, h, t) of query [batch, heads, length, head] per workgroup, computed by its "
                       "invocation 0", f"local != 0u || group >= params.element_count / {PAGED_WORKGROUP}"),
        *_row_of_group(tokens),
        "",
        "  // the query row (its start: row group of the query), in registers",
        "  let query_start = group * HEAD;",
        *(f"  let q{k} = {read('query', 'query_start', start, w)};" for k, (w, start) in enumerate(_word_starts(head))),
        "  // the online softmax over keys 0 .. position: running maximum and sum, accumulators",
        f"  var running_max = {_LOWEST};",
        "  var running_sum = 0.0;",
        *(f"  var acc{k} = {'vec4<f32>(0.0)' if w == 4 else '0.0'};" for k, w in enumerate(_words(value_head))),
        "  // page by page: one look-up of the page table per page, then its rows in order",
        "  for (var page_start = 0; page_start <= position; page_start = page_start + PAGE_SIZE) {",
        "    let page = clamp(page_table[token * TABLE_PAGES + page_start / PAGE_SIZE], 0, PAGES - 1);",
        "    let first_row = (page * KV_HEADS + kv_head) * PAGE_SIZE;",
        "    let rows = min(PAGE_SIZE, position + 1 - page_start);",
        "    for (var r = 0; r < rows; r = r + 1) {",
        "      let row = first_row + r;",
        "      let key_start = row * HEAD;",
        "      var score = 0.0;",
        *(f"      score = score + {term(k, w, start)};" for k, (w, start) in enumerate(_word_starts(head))),
        "      score = score * SCALE;",
        "      // the online softmax: a larger score rescales what came before",
        "      var correction = 1.0;",
        "      if (score > running_max) {",
        "        correction = exp(running_max - score);",
        "        running_max = score;",
        "      }",
        "      let weight = exp(score - running_max);",
        "      running_sum = running_sum * correction + weight;",
        "      let value_start = row * VALUE_HEAD;",
        *(f"      acc{k} = acc{k} * correction + weight * {read('value', 'value_start', start, w)};"
          for k, (w, start) in enumerate(_word_starts(value_head))),
        "    }",
        "  }",
        "",
        "  // out [batch, heads, length, value_head]: row group",
        "  let out_start = group * VALUE_HEAD;",
        *_cpu_stores(value_head),
        "}",
    ]
    return "\n".join(lines) + "\n"


def _words(size: int) -> list[int]:
    """The widths of the registers holding ``size`` floats: vec4s, then single floats."""
    return [4] * (size // 4) + [1] * (size % 4)


def _word_starts(size: int) -> list[tuple[int, int]]:
    """(width, first element) of each register of :func:`_words`."""
    starts, at = [], 0
    for width in _words(size):
        starts.append((width, at))
        at += width
    return starts


def _cpu_stores(value_head: int) -> list[str]:
    lines = []
    for k, (width, start) in enumerate(_word_starts(value_head)):
        at = f"out_start + {start}" if start else "out_start"
        if width == 1:
            lines.append(f"  out[{at}] = acc{k} / running_sum;")
            continue
        lines.append(f"  let result{k} = acc{k} / running_sum;")
        lines += [f"  out[{at}{f' + {e}' if e else ''}] = result{k}[{e}];" for e in range(4)]
    return lines


def _attention_declarations(kernel: LibraryKernel, what: str, helpers: list[str], **more: int) -> list[str]:
    """A paged attention shader's head: its title and ``what`` it does, the params block, the
    bindings (query, key, value, page_table, positions, out), index helpers and constants."""
    args = kernel.arguments
    return [
        "// " + comment_text(paged_title(kernel)),
        "// " + what,
        "",
        *params_declaration(ParamsLayout(_size_vars(kernel))),
        *(f"@group(0) @binding({1 + k}) var<storage, read> {buffer.name}: array<{storage_type(buffer.dtype)}>;"
          for k, buffer in enumerate(kernel.inputs[:3])),
        "@group(0) @binding(4) var<storage, read> page_table: array<i32>;",
        "@group(0) @binding(5) var<storage, read> positions: array<i32>;",
        f"@group(0) @binding(6) var<storage, read_write> out: array<{storage_type(kernel.output.dtype)}>;",
        *helpers,
        "",
        *_constants(heads=args["heads"], kv_heads=args["kv_heads"], head=args["head"], value_head=args["value_head"],
                    pages=args["pages"], page_size=args["page_size"], table_pages=args["table_pages"], **more),
        f"const SCALE: f32 = {literal(args['scale'], 'float32')};",
        "",
    ]


def _main_opening(comment: str, idle: str) -> list[str]:
    """``main``'s signature, its workgroup's number ``group``, and the return of the
    invocations ``idle`` (a WGSL condition) names."""
    return [
        "@compute @workgroup_size(64)",
        "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
        "        @builtin(num_workgroups) workgroups: vec3<u32>,",
        "        @builtin(local_invocation_index) local: u32) {",
        "  let group = i32(workgroup.y * workgroups.x + workgroup.x);",
        comment,
        f"  if ({idle}) {{",
        "    return;",
        "  }",
    ]


def _row_of_group(tokens: str) -> list[str]:
    """The (b, h, t) of workgroup ``group``, its token, key / value head and position."""
    return [
        f"  let tokens = {tokens};  // length: tokens per batch entry",
        "  let b = group / (HEADS * tokens);",
        "  let h = group / tokens % HEADS;",
        "  let t = group % tokens;",
        "  let token = b * tokens + t;",
        "  let kv_head = h / (HEADS / KV_HEADS);  // grouped-query heads share a key / value head",
        *_token_lines("  "),
    ]
