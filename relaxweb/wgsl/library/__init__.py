"""The WGSL of library kernels (``relaxweb/library``), rendered from the builder that made
each kernel and its arguments.

:data:`RENDERERS` maps a builder name to its renderer, ``render(kernel, target) -> WGSL``,
for each WebGPU target the kernel lists (``webgpu``, and where it has them ``webgpu_f16``
and ``webgpu_cpu``: ``relaxweb/ir/library_kernel.py``).  A library kernel follows the binding
contract of every kernel: binding 0 the params block (``element_count`` and the kernel's size
variables), then its inputs (read-only storage), then its output.
"""

from __future__ import annotations

from typing import Callable

from ...ir.library_kernel import WEBGPU, LibraryKernel
from ...ir.params_block import ParamsLayout
from ..shader import ShaderInfo
from .attention import render_attention
from .copy import render_kv_cache_write, render_sequence_write, render_write_row
from .paged_kv import render_paged_attention, render_paged_kv_write
from .recurrent import render_recurrence
from .unique import render_unique_count, render_unique_values

#: builder name -> the WGSL of its kernel for a WebGPU target.
RENDERERS: dict[str, Callable[[LibraryKernel, str], str]] = {
    "attention": render_attention,
    "recurrence": render_recurrence,
    "write_row": render_write_row,
    "sequence_write": render_sequence_write,
    "kv_cache_write": render_kv_cache_write,
    "unique_count": render_unique_count,
    "unique_values": render_unique_values,
    "paged_kv_write": render_paged_kv_write,
    "paged_attention": render_paged_attention,
}


def library_kernel_wgsl(kernel: LibraryKernel, target: str = WEBGPU) -> str | None:
    """The kernel's WGSL for ``target``, None when the kernel has no code for it (its
    ``targets`` do not list it)."""
    if target not in kernel.targets:
        return None
    renderer = RENDERERS.get(kernel.builder)
    if renderer is None:
        raise NotImplementedError(f"{kernel.name}: the WGSL backend has no renderer for the library kernel builder "
                                  f"{kernel.builder!r}")
    return renderer(kernel, target)


def emit_library_kernel(kernel: LibraryKernel) -> ShaderInfo:
    """The kernel's shader (``webgpu``) with its params block and bindings."""
    params = ParamsLayout(tuple(v.name for v in kernel.size_vars))
    bindings = ("uniform", *("read-only-storage" for _ in kernel.inputs), "storage")
    return ShaderInfo(library_kernel_wgsl(kernel), params, bindings)
