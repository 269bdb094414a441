"""Hand-written WGSL library kernels (reached through ``call_library``), with their numpy
references.  The IR's type for them is :class:`relaxweb.ir.library_kernel.LibraryKernel`."""

from .params import params_struct
from .unique import unique_count_kernel, unique_values_kernel

__all__ = ["params_struct", "unique_count_kernel", "unique_values_kernel"]
