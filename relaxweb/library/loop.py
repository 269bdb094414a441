"""write_row: one row of a loop's stacked output, written in place.

A loop stacks a value from each iteration (``relaxweb/ir/expr.py``, ``Loop``); memory
planning gives the stacked tensor ``[rows, *row_shape]`` a storage and makes each iteration
write its row there (``passes/plan_memory.py``).  A tensor program computes every element
of its output, so writing one row of a tensor that earlier iterations filled is this
kernel's job: ``out[row] = value``, the other rows left as they are.  ``row`` is a size
variable the caller binds (the loop's iteration), read from the params block like the
others; one invocation per element of the row.  The backends render it as a copy
(``relaxweb/wgsl/library/copy.py``, ``relaxweb/cpu/library/copy.py``).
"""

from __future__ import annotations

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import WASM, WEBGPU, LibraryKernel, buffer_size_vars
from ..ir.symbolic import PrimExpr, SizeVar, format_shape, product, simplify
from ..ir.tir import Buffer


@library_kernel_builder("write_row")
def write_row_kernel(name: str, rows: PrimExpr, row_shape: tuple, dtype: str, row: str) -> LibraryKernel:
    """``out[row] = value`` for ``out: [rows, *row_shape]`` and ``value: row_shape``; ``row``
    names the size variable that holds the row's index (none of the shapes may use it)."""
    value = Buffer("value", tuple(row_shape), dtype)
    output = Buffer("out", (rows, *row_shape), dtype)
    if row in {var.name for var in buffer_size_vars((value, output))}:
        raise ValueError(f"write_row: the row index {row!r} is also a size variable of the shapes")

    def reference(arrays: list, out, size_vars) -> None:
        out[size_vars[row]] = arrays[0]

    return LibraryKernel(name, (value,), output, simplify(product(row_shape)), reference, "one row written in place",
                         extra_size_vars=(SizeVar(row),), in_place=True, targets=(WEBGPU, WASM))


def write_row_title(kernel: LibraryKernel) -> str:
    """The comment that heads the kernel's code, in every backend."""
    arguments = kernel.arguments
    return (f"library kernel: {arguments['name']} (row {arguments['row']} of a [{format_shape(kernel.output.shape)}] "
            "tensor, the other rows kept)")
