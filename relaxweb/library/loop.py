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
        "  let index = i32((workgroup.y * workgroups.x + workgroup.x) * 64u + local);",
        "  if (index >= params.element_count) {",
        "    return;",
        "  }",
        *lets,
        f"  out[{target}] = value[index];",
        "}",
    ]) + "\n"


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

    def reference(arrays: list, out, size_vars) -> None:
        out[size_vars[row]] = arrays[0]

    return LibraryKernel(name, (value,), output, simplify(product(row_shape)), source, reference,
                         "one row written in place", extra_size_vars=(SizeVar(row),), in_place=True)
