"""kv_cache_write: a decoder's new keys (or values) written into its KV cache, in place.

A KV cache ``[*outer, capacity, *inner]`` holds along its cache axis the keys of every
position so far; a decode step appends ``value [*outer, length, *inner]`` at row ``offset``
(the past length) of every outer block, and leaves the rows before it (the past) and after
it as they are: ``out[o, offset + i, r] = value[o, i, r]``.  A tensor program computes all of
its output, so this is an in-place library kernel (``passes/plan_memory.py`` calls it into the
cache's storage), one invocation per element of ``value``; ``offset`` is a size variable
the call site binds.
"""

from __future__ import annotations

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import LibraryKernel, buffer_size_vars
from ..ir.params_block import ParamsLayout
from ..ir.symbolic import Analyzer, IntImm, PrimExpr, SizeVar, format_shape, product, simplify
from ..ir.tir import Buffer
from ..wgsl.emit import wgsl_name
from ..wgsl.lower_index import helper_declarations, helpers_used, lower_index, render_wgsl
from .loop import scatter_copy_source, scatter_copy_wat
from .wat import IndexText, params_field


@library_kernel_builder("kv_cache_write")
def kv_cache_write_kernel(name: str, outer: tuple, length: PrimExpr, inner: tuple, capacity: int, dtype: str,
                          offset: str) -> LibraryKernel:
    """``out[*o, offset + i, *r] = value[*o, i, *r]`` for ``value [*outer, length, *inner]`` and
    ``out [*outer, capacity, *inner]``; ``offset`` names the size variable of the first row
    written (none of the shapes may use it)."""
    value = Buffer("value", (*outer, length, *inner), dtype)
    output = Buffer("out", (*outer, IntImm(capacity), *inner), dtype)
    shape_vars = buffer_size_vars((value, output))
    if offset in {var.name for var in shape_vars}:
        raise ValueError(f"kv_cache_write: the offset {offset!r} is also a size variable of the shapes")
    size_vars = (*(var.name for var in shape_vars), offset)
    row = simplify(product(inner)) if inner else IntImm(1)
    lowered = {"row_size": row, "block": simplify(length * row)}
    analyzer = Analyzer()
    targets = {key: lower_index(value_, analyzer) for key, value_ in lowered.items()}
    helpers = set().union(*(helpers_used(target) for target in targets.values()))

    def variable(var: str) -> str:
        return f"params.{wgsl_name(var)}"

    title = (f"library kernel: {name} (rows {offset} .. {offset} + {format_shape((length,))} of each block of a "
             f"[{format_shape(output.shape)}] cache, the other rows kept)")
    lets = (*(f"  let {key} = {render_wgsl(target, variable)};" for key, target in targets.items()),
            f"  // block o of the value goes to rows [{offset}, {offset} + length) of block o of the cache")
    source = scatter_copy_source(title, dtype, size_vars,
                                 f"(index / block * {capacity} + {variable(offset)}) * row_size + index % block",
                                 tuple(helper_declarations(helpers)), lets)
    layout = ParamsLayout(size_vars)
    index = IndexText(lambda var: params_field(layout, var))
    row_size = index(row)
    wasm_source = scatter_copy_wat(title, params_field(layout, "element_count"), index(lowered["block"]),
                                   f"(i32.mul (i32.const {capacity}) {row_size})",
                                   f"(i32.mul {params_field(layout, offset)} {row_size})")
    axis = len(outer)

    def reference(arrays: list, out, sizes) -> None:
        start = int(sizes[offset])
        new = arrays[0]
        out[(slice(None),) * axis + (slice(start, start + new.shape[axis]),)] = new

    return LibraryKernel(name, (value,), output, simplify(product(value.shape)), source, reference,
                         "new rows written into a KV cache in place", extra_size_vars=(SizeVar(offset),), in_place=True,
                         wasm_source=wasm_source)
