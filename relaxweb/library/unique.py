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
from .wat import element, indent, kernel_text, loop, params_field

#: The WAT load, equality and order of a buffer element, by its WGSL storage type.
_WAT_COMPARE = {"f32": ("f32.load", "f32.eq", "f32.lt"), "i32": ("i32.load", "i32.eq", "i32.lt_s"),
                "u32": ("i32.load", "i32.eq", "i32.lt_u")}


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
        "  let group = i32(workgroup.y * workgroups.x + workgroup.x);\n"  # the shader contract's numbering
        "  let index = group * 64 + i32(local);\n"
        "  let length = params.element_count;\n"
    )


def _first_occurrence_wat(load: str, equal: str) -> list[str]:
    """``$main_is_first_occurrence(values, position)``: no earlier value equals it (NaN never does)."""
    return [
        "(func $main_is_first_occurrence (param $values i32) (param $position i32) (result i32)",
        "  (local $earlier i32)",
        *loop("earlier", "(i32.ge_s (local.get $earlier) (local.get $position))", [
            f"(if ({equal} ({load} {element('values', '(local.get $earlier)')}) ({load} {element('values', '(local.get $position)')}))",
            "  (then (return (i32.const 0))))",
            "(local.set $earlier (i32.add (local.get $earlier) (i32.const 1)))",
        ]),
        "  (i32.const 1))",
    ]


def _count_wat(title: str, size_vars: list[str], dtype: str) -> str:
    """One unit (none for no values): out[0] = the number of first occurrences."""
    load, equal, _ = _WAT_COMPARE[storage_type(dtype)]
    length = params_field(ParamsLayout(tuple(size_vars)), "element_count")
    body = [
        f"(local.set $length {length})",
        *loop("position", "(i32.ge_s (local.get $position) (local.get $length))", [
            "(local.set $count (i32.add (local.get $count) (call $main_is_first_occurrence (local.get $values) (local.get $position))))",
            "(local.set $position (i32.add (local.get $position) (i32.const 1)))",
        ]),
        "(i32.store (local.get $out) (local.get $count))",
    ]
    return kernel_text(title, ("values", "out"), [f"(i32.gt_s {length} (i32.const 0))"],
                       [("length", "i32"), ("position", "i32"), ("count", "i32")], body, _first_occurrence_wat(load, equal))


def _values_wat(title: str, size_vars: list[str], dtype: str) -> str:
    """One unit per position: a first occurrence goes to its rank among the distinct values."""
    load, equal, less = _WAT_COMPARE[storage_type(dtype)]
    length = params_field(ParamsLayout(tuple(size_vars)), "element_count")
    body = [
        f"(local.set $length {length})",
        "(local.set $index (local.get $first))",
        *loop("index", "(i32.ge_s (local.get $index) (local.get $end))", [
            "(if (call $main_is_first_occurrence (local.get $values) (local.get $index))",
            "  (then",
            f"    (local.set $value ({load} {element('values', '(local.get $index)')}))",
            "    (local.set $rank (i32.const 0))",
            "    (local.set $other (i32.const 0))",
            *indent(loop("other", "(i32.ge_s (local.get $other) (local.get $length))", [
                f"(if ({less} ({load} {element('values', '(local.get $other)')}) (local.get $value))",
                "  (then (local.set $rank (i32.add (local.get $rank)",
                "          (call $main_is_first_occurrence (local.get $values) (local.get $other))))))",
                "(local.set $other (i32.add (local.get $other) (i32.const 1)))",
            ]), 2),
            f"    ({load.replace('load', 'store')} {element('out', '(local.get $rank)')} (local.get $value))))",
            "(local.set $index (i32.add (local.get $index) (i32.const 1)))",
        ]),
    ]
    kind = "f32" if storage_type(dtype) == "f32" else "i32"
    return kernel_text(title, ("values", "out"), [length],
                       [("length", "i32"), ("index", "i32"), ("other", "i32"), ("rank", "i32"), ("value", kind)], body,
                       _first_occurrence_wat(load, equal))


@library_kernel_builder("unique_count")
def unique_count_kernel(name: str, length: PrimExpr, dtype: str) -> LibraryKernel:
    """out[0] = the number of distinct values among values[0:length] (one invocation works)."""
    inputs = (Buffer("values", (length,), dtype),)
    output = Buffer("out", (1,), "int32")
    size_vars = [v.name for v in buffer_size_vars((*inputs, output))]
    title = f"{name} (number of distinct values of a {format_expr(length)}-element tensor)"
    source = _header(title, size_vars, storage_type(dtype), "i32") + (
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
        "count of distinct values", wasm_source=_count_wat(f"library kernel: {title}", size_vars, dtype),
    )


@library_kernel_builder("unique_values")
def unique_values_kernel(name: str, length: PrimExpr, dtype: str) -> LibraryKernel:
    """out[r] = the r-th smallest distinct value; positions past the count are left as is."""
    inputs = (Buffer("values", (length,), dtype),)
    output = Buffer("out", (length,), dtype)
    size_vars = [v.name for v in buffer_size_vars((*inputs, output))]
    title = f"{name} (sorted distinct values, padded to {format_expr(length)})"
    source = _header(title, size_vars, storage_type(dtype), storage_type(dtype)) + (
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

    return LibraryKernel(name, inputs, output, length, source, reference, "sorted distinct values, padded",
                         wasm_source=_values_wat(f"library kernel: {title}", size_vars, dtype))
