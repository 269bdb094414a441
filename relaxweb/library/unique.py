"""unique: the sorted distinct values of a 1-D tensor (numpy.unique), on the GPU.

Its output length is data-dependent, so it is legalized (``relaxweb/ops/reduction.py``)
into the two library kernels of this file and a read-back:

    count = call_library(unique_count, (x,))      # Tensor((1,), int32): how many distinct
    values = call_library(unique_values, (x,))    # Tensor((n,), dtype): sorted distinct first
    k = match_cast(tensor_to_prim(count), Prim(unique_k))   # the host reads count back
    result = call_tir(take_prefix, (values,))     # Tensor((unique_k,), dtype)

Both kernels are simple O(n^2)-per-invocation loops: fine for the small tensors that
data-dependent shapes usually have (indices, masks), not for large sorts.  The backends
render them (``relaxweb/wgsl/library/unique.py``, ``relaxweb/cpu/library/unique.py``).
"""

from __future__ import annotations

import numpy as np

from ..ir.kernel_builders import library_kernel_builder
from ..ir.library_kernel import WASM, WEBGPU, LibraryKernel
from ..ir.symbolic import PrimExpr, format_expr
from ..ir.tir import Buffer


@library_kernel_builder("unique_count")
def unique_count_kernel(name: str, length: PrimExpr, dtype: str) -> LibraryKernel:
    """out[0] = the number of distinct values among values[0:length] (one invocation works)."""
    return LibraryKernel(
        name, (Buffer("values", (length,), dtype),), Buffer("out", (1,), "int32"), length,
        lambda arrays: np.array([np.unique(arrays[0]).size], dtype=np.int32),
        "count of distinct values", targets=(WEBGPU, WASM),
    )


@library_kernel_builder("unique_values")
def unique_values_kernel(name: str, length: PrimExpr, dtype: str) -> LibraryKernel:
    """out[r] = the r-th smallest distinct value; positions past the count are left as is."""

    def reference(arrays: list[np.ndarray]) -> np.ndarray:
        distinct = np.unique(arrays[0])
        out = np.zeros(arrays[0].shape, dtype=arrays[0].dtype)
        out[: distinct.size] = distinct
        return out

    return LibraryKernel(name, (Buffer("values", (length,), dtype),), Buffer("out", (length,), dtype), length, reference,
                         "sorted distinct values, padded", targets=(WEBGPU, WASM))


def unique_title(kernel: LibraryKernel) -> str:
    """The comment that heads either kernel's code, in every backend."""
    name, length = kernel.arguments["name"], format_expr(kernel.arguments["length"])
    if kernel.builder == "unique_count":
        return f"library kernel: {name} (number of distinct values of a {length}-element tensor)"
    return f"library kernel: {name} (sorted distinct values, padded to {length})"
