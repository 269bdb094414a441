"""unique: the sorted distinct values of a 1-D tensor (numpy.unique), on the GPU.

Its output length is data-dependent, so it is legalized (``relaxweb/ops/reduction.py``)
into the two library kernels of this file and a read-back:

    count = call_library(unique_count, (x,))      # Tensor((1,), int32): how many distinct
    values = call_library(unique_values, (x,))    # Tensor((n,), dtype): sorted distinct first
    k = match_cast(tensor_to_prim(count), Prim(unique_k))   # the host reads count back
    result = call_tir(take_prefix, (values,))     # Tensor((unique_k,), dtype)

Both kernels are simple O(n^2)-per-invocation loops: fine for the small tensors that
data-dependent shapes usually have (indices, masks), not for large sorts.
"""

from __future__ import annotations

import numpy as np

from ..ir.library_kernel import LibraryKernel, buffer_size_vars
from ..ir.kernel_builders import library_kernel_builder
from ..ir.symbolic import PrimExpr, format_expr
from ..ir.syntax import comment_text
from ..ir.tir import Buffer
from ..ir.params_block import ParamsLayout
from ..wgsl.emit import storage_type
from ..wgsl.shader import params_declaration


def _header(title: str, size_vars: list[str], input_type: str, output_type: str) -> str:
    return (
        "// " + comment_text(f"library kernel: {title}") + "\n\n"
        + "\n".join(params_declaration(ParamsLayout(tuple(size_vars)))) + "\n"
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
        "  let index = i32((workgroup.y * workgroups.x + workgroup.x) * 64u + local);\n"
        "  let length = params.element_count;\n"
    )


@library_kernel_builder("unique_count")
def unique_count_kernel(name: str, length: PrimExpr, dtype: str) -> LibraryKernel:
    """out[0] = the number of distinct values among values[0:length] (one invocation works)."""
    inputs = (Buffer("values", (length,), dtype),)
    output = Buffer("out", (1,), "int32")
    size_vars = [v.name for v in buffer_size_vars((*inputs, output))]
    source = _header(f"{name} (number of distinct values of a {format_expr(length)}-element tensor)", size_vars, storage_type(dtype), "i32") + (
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
    return LibraryKernel(
        name, inputs, output, length, source,
        lambda arrays: np.array([np.unique(arrays[0]).size], dtype=np.int32),
        "count of distinct values",
    )


@library_kernel_builder("unique_values")
def unique_values_kernel(name: str, length: PrimExpr, dtype: str) -> LibraryKernel:
    """out[r] = the r-th smallest distinct value; positions past the count are left as is."""
    inputs = (Buffer("values", (length,), dtype),)
    output = Buffer("out", (length,), dtype)
    size_vars = [v.name for v in buffer_size_vars((*inputs, output))]
    source = _header(f"{name} (sorted distinct values, padded to {format_expr(length)})", size_vars, storage_type(dtype), storage_type(dtype)) + (
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

    def reference(arrays: list[np.ndarray]) -> np.ndarray:
        distinct = np.unique(arrays[0])
        out = np.zeros(arrays[0].shape, dtype=arrays[0].dtype)
        out[: distinct.size] = distinct
        return out

    return LibraryKernel(name, inputs, output, length, source, reference, "sorted distinct values, padded")
