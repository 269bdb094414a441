"""The ragged form of a kernel: one dispatch serving a batch of instances of different sizes.

A batch (``Session.run_batch``, docs/bundle-format.md "Batches") runs each kernel once for all
its instances, each with its own size variables, packed one after another in every storage
without padding.  The ragged shader differs from the kernel's own in three places only:

- binding 0 is the batch table instead of one params block: a count, then per instance its
  params block (the same struct, written by that instance's host module), the byte offset
  of its slice in each bound buffer (0 for weights, shared by all), and its first workgroup;
- ``main`` starts by finding its instance (a binary search of the first workgroups: the
  dispatch's workgroups are the instances' own grids laid end to end) and sets ``params``,
  the buffers' bases and ``group`` (the workgroup's number within its instance's grid), so
  the rest of the kernel runs as in a single run of that instance;
- every buffer element is read and written at its instance's base.

It is written from the kernel's WGSL, generated or hand-written alike, which follows the
shader contract of ``shader.py``: the params struct at binding 0, one ``array`` per buffer
binding after it, ``main`` taking ``workgroup`` and ``workgroups`` and numbering its workgroup
once as ``let group = i32(workgroup.y * workgroups.x + workgroup.x);``.  A kernel that does not
(or that asks for a buffer's length, which the packed buffer does not give) has no ragged
form: :func:`ragged_source` returns None and says why in :func:`ragged_problem`.  (The one
length it may ask is a weight's first part's, in the load function of a weight bound in parts:
weights are shared by all instances and bound whole.)

Inside ``main`` the instance's params and bases are ``let``s read straight from the uniform
table (uniform values: WGSL allows barriers under them); helper functions (an epilogue's
``store_output``, a split weight's load) read private copies of the same values.
"""

from __future__ import annotations

import re

#: Instances one ragged dispatch serves (the table's fixed length); a larger batch is split.
MAX_INSTANCES = 64

_GROUP_LINE = "  let group = i32(workgroup.y * workgroups.x + workgroup.x);"
_PARAMS_BINDING = "@group(0) @binding(0) var<uniform> params: Params;"
_BUFFER = re.compile(r"^@group\(0\) @binding\((\d+)\) var<storage, (?:read|read_write)> (\w+): array<(.+)>;$", re.M)
_MAIN = re.compile(r"^fn main\([^{]*\) \{$", re.M)
# bytes of one element of each array element type a kernel binds
_ELEMENT_BYTES = {
    "f32": 4, "i32": 4, "u32": 4, "atomic<i32>": 4, "atomic<u32>": 4, "f16": 2,
    "vec2<f32>": 8, "vec2<i32>": 8, "vec2<u32>": 8, "vec4<f32>": 16, "vec4<i32>": 16, "vec4<u32>": 16,
    "vec2<f16>": 4, "vec4<f16>": 8,
}
_RESERVED = ("ragged_", "RaggedInstance", "RaggedBatch")


def _base_rows(buffer_count: int) -> int:
    return max(1, -(-buffer_count // 4))


def ragged_problem(source: str) -> str | None:
    """Why ``source`` has no ragged form, or None when it has one."""
    if source.count(_PARAMS_BINDING) != 1:
        return "its params block is not the one uniform binding 0"
    if len(_MAIN.findall(source)) != 1 or source.count(_GROUP_LINE) != 1:
        return "its main does not number its workgroup once as the shader contract says"
    if re.search(r"\bworkgroups?\.", source.replace(_GROUP_LINE, "")):
        return "it reads its workgroup's id or the grid's size beyond numbering its workgroup"
    # a weight bound in parts is read through a load function that asks its first part's
    # length (``emit.part_load``): a weight is shared, bound whole, so that length stays right
    if re.search(r"arrayLength\((?!&\w+_part0\))", source):
        return "it reads a buffer's length"
    if any(word in source for word in _RESERVED):
        return "it uses a name the ragged form needs"
    for _, name, element in _BUFFER.findall(source):
        if element not in _ELEMENT_BYTES:
            return f"its buffer {name} holds {element}, whose size the ragged form does not know"
    return None


def ragged_source(source: str, title: str = "") -> str | None:
    """The ragged form of a kernel's WGSL ``source`` (see the module doc), or None when it has
    none (:func:`ragged_problem`)."""
    if ragged_problem(source) is not None:
        return None
    buffers = [(int(binding), name, _ELEMENT_BYTES[element]) for binding, name, element in _BUFFER.findall(source)]
    if [binding for binding, _, _ in buffers] != list(range(1, len(buffers) + 1)):
        return None
    names = {name for _, name, _ in buffers}
    # what the functions before main read: only those get private copies (each costs every invocation a store)
    helpers = _code(_outside_main(source))
    helper_reads = {name for name in names if re.search(rf"(?<![\w.]){re.escape(name)}\[", helpers)}
    params_in_helpers = re.search(r"(?<![\w.])params\.", helpers) is not None
    rows = _base_rows(len(buffers))
    table = [
        "struct RaggedInstance {",
        "  params: Params,",
        f"  bases: array<vec4<i32>, {rows}>,  // byte offset of this instance's slice of each buffer",
        "  first_group: vec4<i32>,  // x: this instance's first workgroup in the dispatch",
        "}",
        "",
        "struct RaggedBatch {",
        "  count: vec4<i32>,  // x: instances in this dispatch",
        f"  instances: array<RaggedInstance, {MAX_INSTANCES}>,",
        "}",
        "",
        "@group(0) @binding(0) var<uniform> ragged_batch: RaggedBatch;",
        "// this invocation's instance's params and buffer bases, for the functions main calls (those they read)",
        *(["var<private> params: Params;"] if params_in_helpers else []),
        *(f"var<private> ragged_base_{name}: i32;" for _, name, _ in buffers if name in helper_reads),
    ]
    prologue = [
        "  // the instance whose workgroups hold this one: the last whose first workgroup is at most it",
        "  let ragged_flat = i32(workgroup.y * workgroups.x + workgroup.x);",
        "  var ragged_low = 0;",
        "  var ragged_high = ragged_batch.count.x - 1;",
        "  loop {",
        "    if (ragged_low >= ragged_high) {",
        "      break;",
        "    }",
        "    let ragged_middle = (ragged_low + ragged_high + 1) / 2;",
        "    if (ragged_batch.instances[ragged_middle].first_group.x <= ragged_flat) {",
        "      ragged_low = ragged_middle;",
        "    } else {",
        "      ragged_high = ragged_middle - 1;",
        "    }",
        "  }",
        "  let ragged_instance = ragged_low;",
        *(["  params = ragged_batch.instances[ragged_instance].params;"] if params_in_helpers else []),
        "  let params = ragged_batch.instances[ragged_instance].params;",
    ]
    for position, (_, name, element_bytes) in enumerate(buffers):
        base = f"ragged_batch.instances[ragged_instance].bases[{position // 4}][{position % 4}] / {element_bytes}"
        prologue += [f"  ragged_base_{name} = {base};"] if name in helper_reads else []
        prologue.append(f"  let ragged_base_{name} = {base};")
    group = "  let group = ragged_flat - ragged_batch.instances[ragged_instance].first_group.x;"

    lines = source.split("\n")
    out: list[str] = []
    if title:
        out.append(f"// ragged form ({MAX_INSTANCES} instances per dispatch) of {title}")
    in_signature = False
    for line in lines:
        if line == _PARAMS_BINDING:
            out += table
        elif line == _GROUP_LINE:
            out.append(group)
        elif _BUFFER.match(line) or line.lstrip().startswith("//"):
            out.append(line)
        elif line.startswith("fn main(") or in_signature:
            in_signature = not line.endswith("{")
            out += [line] if in_signature else [line, *prologue]
        else:
            try:
                out.append(_based(line, names))
            except ValueError:
                return None
    return "\n".join(out)


def _outside_main(source: str) -> str:
    """``source`` without ``main``'s signature and body."""
    start = source.index("\nfn main(")
    depth, index = 0, source.index("{", start)
    for index in range(index, len(source)):
        depth += {"{": 1, "}": -1}.get(source[index], 0)
        if depth == 0:
            break
    return source[:start] + source[index + 1:]


def _code(text: str) -> str:
    """``text`` without its comments."""
    return re.sub(r"//[^\n]*", "", text)


def _based(text: str, names: set[str]) -> str:
    """``text`` with every element access ``name[i]`` of a buffer in ``names`` written
    ``name[ragged_base_name + (i)]`` (nested accesses too)."""
    out: list[str] = []
    position = 0
    pattern = re.compile(r"(?<![\w.])(" + "|".join(sorted(map(re.escape, names))) + r")\[") if names else None
    while pattern is not None:
        match = pattern.search(text, position)
        if match is None:
            break
        close = _closing_bracket(text, match.end())
        inner = _based(text[match.end():close], names)
        name = match.group(1)
        out += [text[position:match.start()], f"{name}[ragged_base_{name} + ({inner})]"]
        position = close + 1
    out.append(text[position:])
    return "".join(out)


def _closing_bracket(text: str, start: int) -> int:
    """The index of the ``]`` closing the ``[`` just before ``start``."""
    depth = 1
    for index in range(start, len(text)):
        if text[index] == "[":
            depth += 1
        elif text[index] == "]":
            depth -= 1
            if depth == 0:
                return index
    raise ValueError(f"unbalanced brackets in WGSL line: {text!r}")
