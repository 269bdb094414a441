"""The WebAssembly of unique's two kernels (``relaxweb/library/unique.py``), as their WGSL
computes them: one unit counts the distinct values; one unit per position puts a first
occurrence at its rank."""

from __future__ import annotations

from ...ir.dtype import dtype_info
from ...ir.library_kernel import LibraryKernel
from ..emit import element_shift
from ...ir.params_block import ParamsLayout
from ...library.unique import unique_title
from .wat import LibraryWat, element, indent, kernel_text, loop, params_field

#: The WAT load, equality and order of a buffer element, by its wasm dtype.
_WAT_COMPARE = {"float32": ("f32.load", "f32.eq", "f32.lt"), "int32": ("i32.load", "i32.eq", "i32.lt_s"),
                "uint32": ("i32.load", "i32.eq", "i32.lt_u"), "int64": ("i64.load", "i64.eq", "i64.lt_s")}


def _first_occurrence_wat(load: str, equal: str, shift: int) -> list[str]:
    """``$main_is_first_occurrence(values, position)``: no earlier value equals it (NaN never does)."""
    return [
        "(func $main_is_first_occurrence (param $values i32) (param $position i32) (result i32)",
        "  (local $earlier i32)",
        *loop("earlier", "(i32.ge_s (local.get $earlier) (local.get $position))", [
            f"(if ({equal} ({load} {element('values', '(local.get $earlier)', shift)}) "
            f"({load} {element('values', '(local.get $position)', shift)}))",
            "  (then (return (i32.const 0))))",
            "(local.set $earlier (i32.add (local.get $earlier) (i32.const 1)))",
        ]),
        "  (i32.const 1))",
    ]


def _count_wat(title: str, size_vars: list[str], dtype: str) -> str:
    """One unit (none for no values): out[0] = the number of first occurrences."""
    load, equal, _ = _WAT_COMPARE[dtype_info(dtype).wasm_dtype]
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
                       [("length", "i32"), ("position", "i32"), ("count", "i32")], body,
                       _first_occurrence_wat(load, equal, element_shift(dtype)))


def _values_wat(title: str, size_vars: list[str], dtype: str) -> str:
    """One unit per position: a first occurrence goes to its rank among the distinct values."""
    load, equal, less = _WAT_COMPARE[dtype_info(dtype).wasm_dtype]
    shift = element_shift(dtype)
    length = params_field(ParamsLayout(tuple(size_vars)), "element_count")
    body = [
        f"(local.set $length {length})",
        "(local.set $index (local.get $first))",
        *loop("index", "(i32.ge_s (local.get $index) (local.get $end))", [
            "(if (call $main_is_first_occurrence (local.get $values) (local.get $index))",
            "  (then",
            f"    (local.set $value ({load} {element('values', '(local.get $index)', shift)}))",
            "    (local.set $rank (i32.const 0))",
            "    (local.set $other (i32.const 0))",
            *indent(loop("other", "(i32.ge_s (local.get $other) (local.get $length))", [
                f"(if ({less} ({load} {element('values', '(local.get $other)', shift)}) (local.get $value))",
                "  (then (local.set $rank (i32.add (local.get $rank)",
                "          (call $main_is_first_occurrence (local.get $values) (local.get $other))))))",
                "(local.set $other (i32.add (local.get $other) (i32.const 1)))",
            ]), 2),
            f"    ({load.replace('load', 'store')} {element('out', '(local.get $rank)', shift)} (local.get $value))))",
            "(local.set $index (i32.add (local.get $index) (i32.const 1)))",
        ]),
    ]
    kind = load.split(".")[0]
    return kernel_text(title, ("values", "out"), [length],
                       [("length", "i32"), ("index", "i32"), ("other", "i32"), ("rank", "i32"), ("value", kind)], body,
                       _first_occurrence_wat(load, equal, shift))


def _size_vars(kernel: LibraryKernel) -> list[str]:
    return [var.name for var in kernel.size_vars]


def render_unique_count(kernel: LibraryKernel) -> LibraryWat:
    return LibraryWat(_count_wat(unique_title(kernel), _size_vars(kernel), kernel.inputs[0].dtype))


def render_unique_values(kernel: LibraryKernel) -> LibraryWat:
    return LibraryWat(_values_wat(unique_title(kernel), _size_vars(kernel), kernel.inputs[0].dtype))
