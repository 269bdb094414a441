"""WGSL code generation for tensor programs."""

from .emit import ShaderInfo, emit_wgsl

__all__ = ["ShaderInfo", "emit_wgsl"]
