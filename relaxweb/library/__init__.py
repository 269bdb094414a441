"""Hand-written WGSL library kernels, reached through ``call_library``; ``readback`` holds the
shared helper that computes data-dependent extents on the GPU and reads them back."""

from .kernel import LibraryKernel, params_struct
from .unique import unique_count_kernel, unique_values_kernel

__all__ = ["LibraryKernel", "params_struct", "unique_count_kernel", "unique_values_kernel"]
