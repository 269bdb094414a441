"""Hand-written WGSL library kernels (reached through ``call_library``), each with its
WebAssembly text for ``kernels.wasm`` (``wasm_source``: the same bindings and params block,
``wat.py`` holds the shared WAT helpers) and its numpy reference.  The IR's type for them is
:class:`relaxweb.ir.library_kernel.LibraryKernel`; they declare the params block and name their
buffer types as the WGSL backend does."""

from .attention import attention_kernel
from .kv_cache import kv_cache_write_kernel
from .loop import write_row_kernel
from .recurrent import recurrence_kernel
from .sequence import sequence_write_kernel
from .unique import unique_count_kernel, unique_values_kernel

__all__ = ["attention_kernel", "kv_cache_write_kernel", "recurrence_kernel", "sequence_write_kernel", "unique_count_kernel", "unique_values_kernel", "write_row_kernel"]
