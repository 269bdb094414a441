"""write_row: one row of a loop's stacked output, written in place.

A loop stacks a value from each iteration (``relaxweb/ir/expr.py``, ``Loop``); memory
planning gives the stacked tensor ``[rows, *row_shape]`` a storage and makes each iteration
write its row there (``passes/plan_memory.py``).  A tensor program computes every element
of its output, so writing one row of a tensor that earlier iterations filled is this
kernel's job: ``out[row] = value``, the other rows left as they are.  ``row`` is a size
variable the caller binds (the loop's iteration), read from the params block like the
others; one invocation per element of the row.
"""

from __future__ import annotations

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import LibraryKernel, buffer_size_vars
from ..ir.params_block import ParamsLayout
from ..ir.symbolic import PrimExpr, SizeVar, format_shape, product, simplify
from ..ir.syntax import comment_text
from ..ir.tir import Buffer
from ..wgsl.emit import storage_type, wgsl_name
from ..wgsl.shader import params_declaration
from .wat import element, index_helpers, kernel_text, loop, params_field

#: Elements per unit of the copy kernels' WebAssembly: threads split whole 4 KiB runs.
COPY_UNIT = 1024


def copy_at_offset_source(title: str, dtype: str, size_vars: tuple[str, ...], offset: str) -> str:
    """The WGSL of ``out[offset + i] = value[i]`` for the ``element_count`` values of
    ``value``, the rest of ``out`` kept (a loop's row, a sequence's element); ``offset`` is a
    WGSL expression over the params fields ``size_vars``."""
    return scatter_copy_source(title, dtype, size_vars, f"{offset} + index")


def scatter_copy_source(title: str, dtype: str, size_vars: tuple[str, ...], target: str,
                        declarations: tuple[str, ...] = (), lets: tuple[str, ...] = ()) -> str:
    """The WGSL of ``out[target] = value[index]`` for each of the ``element_count`` values of
    ``value``, the rest of ``out`` kept; ``target`` is a WGSL expression of ``index`` and the
    params fields ``size_vars``, after the statements ``lets`` (with the module-scope
    ``declarations`` they need, e.g. index helpers)."""
    element = storage_type(dtype)
    return "\n".join([
        "// " + comment_text(title),
        "",
        *params_declaration(ParamsLayout(size_vars)),
        f"@group(0) @binding(1) var<storage, read> value: array<{element}>;",
        f"@group(0) @binding(2) var<storage, read_write> out: array<{element}>;",
        *declarations,
        "",
        "@compute @workgroup_size(64)",
        "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
        "        @builtin(num_workgroups) workgroups: vec3<u32>,",
        "        @builtin(local_invocation_index) local: u32) {",
        "  let group = i32(workgroup.y * workgroups.x + workgroup.x);",  # numbered as shader.py's contract says (the ragged form needs it)
        "  let index = group * 64 + i32(local);",
        "  if (index >= params.element_count) {",
        "    return;",
        "  }",
        *lets,
        f"  out[{target}] = value[index];",
        "}",
    ]) + "\n"


def scatter_copy_wat(title: str, count: str, block: str, stride: str, base: str) -> str:
    """The WAT of ``out[i // block * stride + base + i % block] = value[i]`` for the ``count``
    values of ``value`` (WAT i32 expressions of the params block; ``block`` > 0 when ``count``
    is): each unit copies up to :data:`COPY_UNIT` values, a contiguous run per block at a time
    (``memory.copy``: the elements are 4 bytes of any dtype)."""
    units = [f"(i32.div_u (i32.add {count} (i32.const {COPY_UNIT - 1})) (i32.const {COPY_UNIT}))"]
    body = [
        f"(local.set $i (i32.mul (local.get $first) (i32.const {COPY_UNIT})))",
        f"(local.set $stop (call $main_min (i32.mul (local.get $end) (i32.const {COPY_UNIT})) {count}))",
        f"(local.set $block {block})",
        *loop("copy", "(i32.ge_s (local.get $i) (local.get $stop))", [
            ";; the values i .. i + run - 1 lie in one block: one run of the output",
            "(local.set $within (i32.rem_u (local.get $i) (local.get $block)))",
            "(local.set $run (call $main_min (i32.sub (local.get $stop) (local.get $i))"
            " (i32.sub (local.get $block) (local.get $within))))",
            "(memory.copy",
            f"  {element('out', f'(i32.add (i32.add (i32.mul (i32.div_u (local.get $i) (local.get $block)) {stride}) {base}) (local.get $within))')}",
            f"  {element('value', '(local.get $i)')}",
            "  (i32.shl (local.get $run) (i32.const 2)))",
            "(local.set $i (i32.add (local.get $i) (local.get $run)))",
        ]),
    ]
    return kernel_text(title, ("value", "out"), units, [(name, "i32") for name in ("i", "stop", "block", "within", "run")],
                       body, index_helpers("\n".join(body)))


@library_kernel_builder("write_row")
def write_row_kernel(name: str, rows: PrimExpr, row_shape: tuple, dtype: str, row: str) -> LibraryKernel:
    """``out[row] = value`` for ``out: [rows, *row_shape]`` and ``value: row_shape``; ``row``
    names the size variable that holds the row's index (none of the shapes may use it)."""
    value = Buffer("value", tuple(row_shape), dtype)
    output = Buffer("out", (rows, *row_shape), dtype)
    shape_vars = buffer_size_vars((value, output))
    if row in {var.name for var in shape_vars}:
        raise ValueError(f"write_row: the row index {row!r} is also a size variable of the shapes")
    title = f"library kernel: {name} (row {row} of a [{format_shape(output.shape)}] tensor, the other rows kept)"
    source = copy_at_offset_source(title, dtype, (*(v.name for v in shape_vars), row),
                                   f"params.{wgsl_name(row)} * params.element_count")

    layout = ParamsLayout((*(v.name for v in shape_vars), row))
    count = params_field(layout, "element_count")
    wasm_source = scatter_copy_wat(title, count, count, "(i32.const 0)", f"(i32.mul {params_field(layout, row)} {count})")

    def reference(arrays: list, out, size_vars) -> None:
        out[size_vars[row]] = arrays[0]

    return LibraryKernel(name, (value,), output, simplify(product(row_shape)), source, reference,
                         "one row written in place", extra_size_vars=(SizeVar(row),), in_place=True,
                         wasm_source=wasm_source)
