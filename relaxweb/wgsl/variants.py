"""Second shaders for adapters that run workgroups on a CPU (SwiftShader, lavapipe).

A workgroup barrier is nearly free on a GPU and expensive where every invocation of a
workgroup runs on one CPU core: there, a matmul that stages its factors through workgroup
memory (``tiled_matmul``) runs at about a third of the GFLOP/s of one that keeps its block
of outputs in registers and reads the factors straight from the buffers
(``register_matmul``; ``bench/kernel_ceiling.py speed``: 1.4 against 2.1 GFLOP/s at 1024^3 on
SwiftShader).  On a GPU it is the other way round: the staged tile reads each factor element
once per workgroup instead of 8 times.

So the bundle carries, for each kernel where it pays, a CPU variant: the same program under
another schedule with the same dispatch size, bindings and params block, written next to the
kernel's shader (``cpu_file`` in the manifest).  The runtimes compile it instead of ``file``
when the adapter is a CPU one (wgpu's ``adapter_type``, the browser's ``isFallbackAdapter`` /
``swiftshader`` architecture); nothing else about a run changes.

Only matmul-like programs whose factors are elementwise arithmetic on buffer elements get one
(plain loads; a fused layer norm or activation of the first factor, which each invocation
then evaluates for its rows): a convolution's staged factor is an im2col gather (padding
checks, index division) that staging evaluates once per tile, and evaluated per invocation it
costs more than the barriers save (0.66 against 0.76 GFLOP/s for YOLOv8n's largest
convolution on SwiftShader).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.launch import matmul_info
from ..ir.schedule import RegisterMatmulSchedule, TiledMatmulSchedule
from ..ir.tir import Binary, Cast, FloatImm, Load, ScalarExpr, TensorProgram, Unary, scalar_nodes


def cpu_variant(program: TensorProgram) -> TensorProgram | None:
    """The program as a CPU adapter should run it, or None when its own schedule is the best
    known there too."""
    schedule = program.schedule
    if not isinstance(schedule, TiledMatmulSchedule):
        return None
    info = matmul_info(program)
    if not (_elementwise_of_loads(info.a) and _elementwise_of_loads(info.b)):
        return None
    variant = RegisterMatmulSchedule(block=schedule.block)
    if variant.tile != schedule.tile:  # the dispatch size must not change
        return None
    return replace(program, schedule=variant)


def _elementwise_of_loads(factor: ScalarExpr) -> bool:
    """Arithmetic on buffer elements and constants: no reduction, gather or selection (whose
    cost staging pays once per tile and an invocation would pay per block row or column)."""
    return all(isinstance(node, (Load, FloatImm, Binary, Unary, Cast)) for node in scalar_nodes(factor))
