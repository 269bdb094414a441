"""The WebAssembly backend of tensor programs: every kernel of a bundle as functions of one
``kernels.wasm`` with SIMD128, which the host module drives as it drives the WGSL shaders
(docs/bundle-format.md, "kernels.wasm").  ``module.py`` assembles the module."""

from .module import KernelFunctions, assemble_kernels_module, shared_memory_variant, wat_to_wasm

__all__ = ["KernelFunctions", "assemble_kernels_module", "shared_memory_variant", "wat_to_wasm"]
