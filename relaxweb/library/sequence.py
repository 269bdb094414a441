"""sequence_write: one element of a sequence copied into the sequence's arena.

A sequence lives on the GPU in one storage, its *arena*: its elements' values one after
another, each in its dtype's device form (4 bytes per element); the host module keeps the
table of the elements' shapes (``passes/lower_shapes_to_host.py``, ``docs/bundle-format.md``
"Sequences").  Inserting an element at the end copies its values into the arena at the
arena's current end, ``offset`` (in elements), a size variable the caller binds; the
arena's earlier elements are kept.  One invocation per value of the element.
"""

from __future__ import annotations

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import LibraryKernel
from ..ir.params_block import ParamsLayout
from ..ir.symbolic import SizeVar
from ..ir.syntax import comment_text
from ..ir.tir import Buffer
from ..wgsl.emit import storage_type
from ..wgsl.shader import params_declaration


@library_kernel_builder("sequence_write")
def sequence_write_kernel(dtype: str) -> LibraryKernel:
    """``arena[offset + i] = value[i]`` for the ``count`` values of a (flattened) element."""
    count, arena, offset = SizeVar("count"), SizeVar("arena"), SizeVar("offset")
    value = Buffer("value", (count,), dtype)
    output = Buffer("out", (arena,), dtype)
    element = storage_type(dtype)
    source = "\n".join([
        "// " + comment_text(f"library kernel: sequence_write (one {dtype} element appended to a sequence's arena)"),
        "",
        *params_declaration(ParamsLayout(("count", "arena", "offset"))),
        f"@group(0) @binding(1) var<storage, read> value: array<{element}>;",
        f"@group(0) @binding(2) var<storage, read_write> out: array<{element}>;",
        "",
        "@compute @workgroup_size(64)",
        "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,",
        "        @builtin(num_workgroups) workgroups: vec3<u32>,",
        "        @builtin(local_invocation_index) local: u32) {",
        "  let index = i32((workgroup.y * workgroups.x + workgroup.x) * 64u + local);",
        "  if (index >= params.element_count) {",
        "    return;",
        "  }",
        "  out[params.offset + index] = value[index];",
        "}",
    ]) + "\n"

    def reference(arrays: list, out, size_vars) -> None:
        start = size_vars["offset"]
        out[start:start + arrays[0].size] = arrays[0].reshape(-1)

    return LibraryKernel("sequence_write", (value,), output, count, source, reference,
                         "one element appended to a sequence's arena", extra_size_vars=(offset,), in_place=True)
