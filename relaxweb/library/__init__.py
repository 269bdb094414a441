"""Library kernels (reached through ``call_library``): what a compute definition expresses
badly, each built by a registered builder as what it computes: its buffers, its dispatch
count, its numpy reference and the targets its hand-written code exists for.  The IR's type
for them is :class:`relaxweb.ir.library_kernel.LibraryKernel`; the backends render their code
from the builder's name and arguments (``relaxweb/wgsl/library``: WGSL,
``relaxweb/cpu/library``: WebAssembly text).  This package imports no backend."""

from .attention import attention_kernel
from .kv_cache import kv_cache_write_kernel
from .loop import write_row_kernel
from .paged_kv import paged_attention_kernel, paged_kv_write_kernel
from .recurrent import recurrence_kernel
from .sequence import sequence_write_kernel
from .unique import unique_count_kernel, unique_values_kernel

__all__ = ["attention_kernel", "kv_cache_write_kernel", "paged_attention_kernel", "paged_kv_write_kernel", "recurrence_kernel", "sequence_write_kernel", "unique_count_kernel", "unique_values_kernel", "write_row_kernel"]
