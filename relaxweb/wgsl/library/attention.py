"""The WGSL of the fused attention kernel (``relaxweb/library/attention.py``): its shader, its
f16 form and its form for CPU adapters.

One workgroup of 64 invocations serves 64 query rows of one (batch..., head): invocation
``r`` owns row ``r``, holds the query row and its ``Dv`` accumulators in registers (unrolled
into ``vec4`` variables: a private array indexed at run time was 1.5x slower on lavapipe), and the
workgroup stages each tile of ``TILE`` keys and values through workgroup memory (read once
from global memory for 64 rows).

The f16 form (``webgpu_f16``, for adapters with ``shader-f16``) stages the key and value
tiles as f16 (half the workgroup memory and its traffic) and holds the query row in f16: each
product of a score and each weight times a value is an f16 product, summed in f32 (the
scores, the online softmax and the accumulators stay f32, as in the tiled matmuls' f16
shaders, ``relaxweb/passes/schedule_programs.py``).

The form for CPU adapters (``webgpu_cpu``, the manifest's ``cpu_file``: SwiftShader and
lavapipe) stages nothing: each invocation reads its keys and values from the buffers, so
there are no workgroup barriers, which cost a CPU adapter more than the shared loads save
(the tiled matmuls' ``register_matmul`` form, for the same reason).
"""

from __future__ import annotations

from ...ir.library_kernel import WEBGPU_CPU, WEBGPU_F16, LibraryKernel
from ...ir.params_block import ParamsLayout
from ...ir.symbolic import Analyzer, simplify
from ...ir.syntax import comment_text
from ...library.attention import GROUP, QUERY_GROUP, QUERY_ROW, AttentionPlan, attention_plan
from ..emit import literal, storage_type, wgsl_name
from ..lower_index import helper_declarations, helpers_used, lower_index, render_wgsl
from ..shader import params_declaration


#: How a row whose weights are NaN ends: ``nan``, as the unfused softmax gives.
_NAN_ROWS = [
    "  // a row with no score above -inf is NaN, as the unfused softmax gives (a run-time NaN:",
    "  // WGSL compilers may fold a constant one)",
    "  let nan = bitcast<f32>(0x7fc00000u | (local & 0u));",
]
#: With ``zero_nan_rows``: 0, as ``where(isnan(weights), 0, weights)`` makes it; ``weighted``:
#: the row has weights that are numbers (a NaN or +inf score makes the sum NaN; a NaN test on
#: the bits, as compilers may fold ``x != x``).
_ZERO_NAN_ROWS = [
    "  // a row whose weights are NaN (no score above -inf, or a NaN or +inf one: a NaN sum) is 0,",
    "  // as where(isnan(weights), 0, weights) makes it",
    "  let weighted = started && (bitcast<u32>(running_sum) & 0x7fffffffu) <= 0x7f800000u;",
]


def render_attention(kernel: LibraryKernel, target: str) -> str:
    """The attention kernel's WGSL for ``target`` (webgpu, webgpu_f16 or webgpu_cpu)."""
    plan = attention_plan(**kernel.arguments)
    return _source(plan, half=target == WEBGPU_F16, direct=target == WEBGPU_CPU)


def _source(plan: AttentionPlan, half: bool = False, direct: bool = False) -> str:
    """The kernel's WGSL; with ``half``, its f16 source; with ``direct``, its source for CPU
    adapters (see the module doc)."""
    name, inputs, output, head, value_head, tile = (plan.name, plan.inputs, plan.output, plan.head, plan.value_head,
                                                    plan.tile)
    mask_shape, scale, causal = plan.mask_shape, plan.scale, plan.causal
    local_names = {QUERY_GROUP.name: "bh", QUERY_ROW.name: "row"}

    def variable(name: str) -> str:
        return local_names.get(name) or f"params.{wgsl_name(name)}"

    analyzer = Analyzer()
    lowered = {"seq_q": plan.query_length, "seq_k": plan.key_length, "key_rows": plan.key_rows,
               "groups": plan.workgroups, "kv_group": plan.kv_group()}
    if mask_shape is not None:
        mask_start, key_step = plan.mask_row_start()
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
             *params_declaration(ParamsLayout(tuple(plan.size_vars)))]
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
        *(_ZERO_NAN_ROWS if plan.zero_nan_rows else _NAN_ROWS),
        "  let out_start = (bh * seq_q + row) * VALUE_HEAD;",
        "  // no keys at all: an empty sum, 0 (as the value product of an empty softmax)",
        "  let empty = seq_k == 0;",
        *(f"  out[out_start + {i * width + c}] = select(select({'0.0' if plan.zero_nan_rows else 'nan'}, "
          f"acc{i}{f'[{c}]' if width > 1 else ''} / running_sum, {'weighted' if plan.zero_nan_rows else 'started'}), "
          "0.0, empty);"
          for i in range(value_words) for c in range(width)),
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

