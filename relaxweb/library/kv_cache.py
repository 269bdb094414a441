"""kv_cache_write: a decoder's new keys (or values) written into its KV cache, in place.

A KV cache ``[*outer, capacity, *inner]`` holds along its cache axis the keys of every
position so far; a decode step appends ``value [*outer, length, *inner]`` at row ``offset``
(the past length) of every outer block, and leaves the rows before it (the past) and after
it as they are: ``out[o, offset + i, r] = value[o, i, r]``.  A tensor program computes all of
its output, so this is an in-place library kernel (``passes/plan_memory.py`` calls it into the
cache's storage), one invocation per element of ``value``; ``offset`` is a size variable
the call site binds.  The backends render it as a copy of runs of ``block`` elements
(:func:`kv_cache_blocks`; ``relaxweb/wgsl/library/copy.py``, ``relaxweb/cpu/library/copy.py``).

Its ``ragged`` form (onnxruntime's GroupQueryAttention, ``ops/kv_cache.py``'s
``ragged_concat``) takes a second input ``lengths [outer[0]]`` (int32, one per batch entry):
entry ``b``'s rows go from row ``clamp(lengths[b], 0, offset)`` instead of ``offset``.
"""

from __future__ import annotations

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import WASM, WEBGPU, LibraryKernel, buffer_size_vars
from ..ir.symbolic import IntImm, PrimExpr, SizeVar, format_shape, product, simplify
from ..ir.tir import Buffer


@library_kernel_builder("kv_cache_write")
def kv_cache_write_kernel(name: str, outer: tuple, length: PrimExpr, inner: tuple, capacity: int, dtype: str,
                          offset: str, ragged: bool = False) -> LibraryKernel:
    """``out[*o, offset + i, *r] = value[*o, i, *r]`` for ``value [*outer, length, *inner]`` and
    ``out [*outer, capacity, *inner]``; ``offset`` names the size variable of the first row
    written (none of the shapes may use it); ``ragged``: entry ``b`` (``o[0]``) starts at
    ``clamp(lengths[b], 0, offset)``, ``lengths`` the second input."""
    value = Buffer("value", (*outer, length, *inner), dtype)
    output = Buffer("out", (*outer, IntImm(capacity), *inner), dtype)
    if offset in {var.name for var in buffer_size_vars((value, output))}:
        raise ValueError(f"kv_cache_write: the offset {offset!r} is also a size variable of the shapes")
    if ragged and not outer:
        raise ValueError("kv_cache_write: a ragged write needs the batch entries as the first outer dim")
    inputs = (value, Buffer("lengths", (outer[0],), "int32")) if ragged else (value,)
    axis = len(outer)

    def reference(arrays: list, out, sizes) -> None:
        new = arrays[0]
        past = int(sizes[offset])
        if not ragged:
            out[(slice(None),) * axis + (slice(past, past + new.shape[axis]),)] = new
            return
        for entry, start in enumerate(min(max(int(n), 0), past) for n in arrays[1]):
            out[(entry, *(slice(None),) * (axis - 1), slice(start, start + new.shape[axis]))] = new[entry]

    summary = "new rows written into a KV cache in place" + (", each entry's after its own past length" if ragged else "")
    return LibraryKernel(name, inputs, output, simplify(product(value.shape)), reference, summary,
                         extra_size_vars=(SizeVar(offset),), in_place=True, targets=(WEBGPU, WASM))


def kv_cache_blocks(kernel: LibraryKernel) -> tuple[PrimExpr, PrimExpr]:
    """The elements of one cache row (``row_size``, the product of ``inner``) and of one
    outer block of the value (``block``: ``length`` rows), which goes to rows ``[offset,
    offset + length)`` of its block of the cache."""
    arguments = kernel.arguments
    row = simplify(product(arguments["inner"])) if arguments["inner"] else IntImm(1)
    return row, simplify(arguments["length"] * row)


def kv_cache_write_title(kernel: LibraryKernel) -> str:
    """The comment that heads the kernel's code, in every backend."""
    arguments, offset = kernel.arguments, kernel.arguments["offset"]
    start = f"clamp(lengths[b], 0, {offset})" if arguments.get("ragged") else offset
    return (f"library kernel: {arguments['name']} (rows {start} .. {start} + {format_shape((arguments['length'],))} "
            f"of each block of a [{format_shape(kernel.output.shape)}] cache, the other rows kept)")


def kv_cache_entry_blocks(kernel: LibraryKernel) -> PrimExpr:
    """The outer blocks of one batch entry (the product of ``outer[1:]``): block ``o`` of a
    ragged write belongs to entry ``o / entry_blocks``."""
    outer = kernel.arguments["outer"]
    return simplify(product(outer[1:])) if len(outer) > 1 else IntImm(1)
