"""The WebAssembly host module: shape checks, shape arithmetic and the command list."""

from .emit import MAX_RANK, CallSiteParams, assemble, emit_host_wat

__all__ = ["MAX_RANK", "CallSiteParams", "assemble", "emit_host_wat"]
