"""sequence_write: one element of a sequence copied into the sequence's arena.

A sequence lives on the GPU in one storage, its *arena*: its elements' values one after
another, each in its dtype's device form (4 bytes per element); the host module keeps the
table of the elements' shapes (``passes/lower_shapes_to_host.py``, ``docs/bundle-format.md``
"Sequences").  Inserting an element at the end copies its values into the arena at the
arena's current end, ``offset`` (in elements), a size variable the caller binds; the
arena's earlier elements are kept.  One invocation per value of the element.  The backends
render it as a copy (``relaxweb/wgsl/library/copy.py``, ``relaxweb/cpu/library/copy.py``).
"""

from __future__ import annotations

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import WASM, WEBGPU, LibraryKernel
from ..ir.symbolic import SizeVar
from ..ir.tir import Buffer


@library_kernel_builder("sequence_write")
def sequence_write_kernel(dtype: str) -> LibraryKernel:
    """``arena[offset + i] = value[i]`` for the ``count`` values of a (flattened) element."""
    count, arena, offset = SizeVar("count"), SizeVar("arena"), SizeVar("offset")
    value = Buffer("value", (count,), dtype)
    output = Buffer("out", (arena,), dtype)

    def reference(arrays: list, out, size_vars) -> None:
        start = size_vars["offset"]
        out[start:start + arrays[0].size] = arrays[0].reshape(-1)

    return LibraryKernel("sequence_write", (value,), output, count, reference, "one element appended to a sequence's arena",
                         extra_size_vars=(offset,), in_place=True, targets=(WEBGPU, WASM))


def sequence_write_title(kernel: LibraryKernel) -> str:
    """The comment that heads the kernel's code, in every backend."""
    return f"library kernel: sequence_write (one {kernel.arguments['dtype']} element appended to a sequence's arena)"
