"""WGSL code generation for tensor programs: ``shader.py`` writes a program's shader,
``schedules.py`` renders each schedule kind, ``emit.py`` writes expressions."""

from .shader import ShaderInfo, emit_wgsl

__all__ = ["ShaderInfo", "emit_wgsl"]
