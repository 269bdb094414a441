"""The WebAssembly of library kernels (``relaxweb/library``) for ``kernels.wasm``, rendered
from the builder that made each kernel and its arguments.

:data:`RENDERERS` maps a builder name to its renderer, ``render(kernel) -> LibraryWat``: the
kernel's text, defining ``$main`` (params, first, end, scratch, then one address per binding)
and ``$units`` (params -> units) with helpers named ``$main_...`` (it may call the math
functions of ``relaxweb/cpu/math.py``; docs/bundle-format.md, "kernels.wasm"), and the private
scratch memory ``$main`` needs per thread.  ``wat.py`` holds what the renderers share.
"""

from __future__ import annotations

from typing import Callable

from ...ir.library_kernel import WASM, LibraryKernel
from .attention import render_attention
from .copy import render_kv_cache_write, render_sequence_write, render_write_row
from .paged_kv import render_paged_attention, render_paged_kv_write
from .recurrent import render_recurrence
from .unique import render_unique_count, render_unique_values
from .wat import LibraryWat

#: builder name -> the WebAssembly of its kernel.
RENDERERS: dict[str, Callable[[LibraryKernel], LibraryWat]] = {
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


def library_kernel_wat(kernel: LibraryKernel) -> LibraryWat | None:
    """The kernel's WebAssembly text and scratch bytes, None when it has none (its
    ``targets`` do not list ``wasm``)."""
    if WASM not in kernel.targets:
        return None
    renderer = RENDERERS.get(kernel.builder)
    if renderer is None:
        raise NotImplementedError(f"{kernel.name}: the WebAssembly backend has no renderer for the library kernel "
                                  f"builder {kernel.builder!r}")
    return renderer(kernel)


__all__ = ["RENDERERS", "LibraryWat", "library_kernel_wat"]
