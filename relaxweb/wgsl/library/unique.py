"""The WGSL of unique's two kernels (``relaxweb/library/unique.py``): one invocation counts
the distinct values; one invocation per position puts a first occurrence at its rank."""

from __future__ import annotations

from ...ir.library_kernel import LibraryKernel
from ...ir.params_block import ParamsLayout
from ...ir.syntax import comment_text
from ...library.unique import unique_title
from ..emit import storage_type
from ..shader import params_declaration


def _header(kernel: LibraryKernel) -> str:
    """Everything up to the kernel's own statements: the bindings, the first-occurrence test,
    ``main``'s index and the length."""
    size_vars = tuple(var.name for var in kernel.size_vars)
    input_type, output_type = storage_type(kernel.inputs[0].dtype), storage_type(kernel.output.dtype)
    return (
        "// " + comment_text(unique_title(kernel)) + "\n\n"
        + "\n".join(params_declaration(ParamsLayout(size_vars))) + "\n"
        f"@group(0) @binding(1) var<storage, read> values: array<{input_type}>;\n"
        f"@group(0) @binding(2) var<storage, read_write> out: array<{output_type}>;\n\n"
        "fn is_first_occurrence(position: i32) -> bool {\n"
        "  for (var earlier: i32 = 0; earlier < position; earlier = earlier + 1) {\n"
        "    if (values[earlier] == values[position]) {\n"
        "      return false;\n"
        "    }\n"
        "  }\n"
        "  return true;\n"
        "}\n\n"
        "@compute @workgroup_size(64)\n"
        "fn main(@builtin(workgroup_id) workgroup: vec3<u32>,\n"
        "        @builtin(num_workgroups) workgroups: vec3<u32>,\n"
        "        @builtin(local_invocation_index) local: u32) {\n"
        "  let group = i32(workgroup.y * workgroups.x + workgroup.x);\n"
        "  let index = group * 64 + i32(local);\n"
        "  let length = params.element_count;\n"
    )


def render_unique_count(kernel: LibraryKernel, target: str) -> str:
    """out[0] = the number of first occurrences, counted by invocation 0."""
    return _header(kernel) + (
        "  if (index != 0) {\n"
        "    return;\n"
        "  }\n"
        "  var count: i32 = 0;\n"
        "  for (var position: i32 = 0; position < length; position = position + 1) {\n"
        "    if (is_first_occurrence(position)) {\n"
        "      count = count + 1;\n"
        "    }\n"
        "  }\n"
        "  out[0] = count;\n"
        "}\n"
    )


def render_unique_values(kernel: LibraryKernel, target: str) -> str:
    """out[rank] = values[index] for each first occurrence, ranked among the distinct values."""
    return _header(kernel) + (
        "  if (index >= length || !is_first_occurrence(index)) {\n"
        "    return;\n"
        "  }\n"
        "  let value = values[index];\n"
        "  var rank: i32 = 0;\n"
        "  for (var other: i32 = 0; other < length; other = other + 1) {\n"
        "    if (values[other] < value && is_first_occurrence(other)) {\n"
        "      rank = rank + 1;\n"
        "    }\n"
        "  }\n"
        "  out[rank] = value;\n"
        "}\n"
    )
