"""Second shaders: for adapters that run workgroups on a CPU (SwiftShader, lavapipe), and
for adapters with 16-bit floats in shaders (WebGPU's ``shader-f16``).

A workgroup barrier is nearly free on a GPU and expensive where every invocation of a
workgroup runs on one CPU core: there, a matmul that stages its factors through workgroup
memory (``tiled_matmul``) runs at about two thirds of the GFLOP/s of one that keeps its block
of outputs in registers and reads the factors straight from the buffers
(``register_matmul``; ``bench/kernel_ceiling.py speed``: 1.4 against 2.1 GFLOP/s at 1024^3 on
SwiftShader).  On a GPU it is the other way round: the staged tile reads each factor element
once per workgroup instead of 8 times.

So the bundle carries, for each kernel where it pays, a CPU variant: the same program under
another schedule with the same dispatch size, bindings and params block, written next to the
kernel's shader (``cpu_file`` in the manifest).  The runtimes compile it instead of ``file``
when the adapter is a CPU one (wgpu's ``adapter_type``, the browser's ``isFallbackAdapter`` /
``swiftshader`` architecture); nothing else about a run changes.

Matmul-like programs get one when their factors evaluate without branching (no reduction;
selects with cheap branches, which the backend writes as WGSL's ``select``): plain loads, a
fused layer norm or activation of the first factor (which each invocation then evaluates for
its rows), a convolution's im2col gather with its padding test.  YOLOv8n's largest
convolution on SwiftShader: 1.26 GFLOP/s this way against 0.64 staged (and against 0.95 for
the best hand-written direct convolution of ``bench/kernel_ceiling.js``); with the padding
test as an if/else, the same register schedule ran at 0.66, slower than staged.  The
register shaders also compile three to five times faster on SwiftShader (no barriers).

**f16.**  A GPU whose adapter offers ``shader-f16`` multiplies 16-bit floats at twice the rate
of 32-bit ones, and a staged tile of them takes half the workgroup memory and half its
traffic.  So every tiled matmul (matmuls, convolutions as implicit GEMM) also gets an f16
variant (``f16_file``): the same program under :class:`HalfTiledMatmulSchedule`, whose
factors are evaluated in f32 (fused prologues included), rounded to f16 as they are staged,
multiplied in f16, and summed in f32 (an f16 running sum over K = 768 loses about 3 of the
inputs' digits; an f32 sum of f16 products keeps each output within a few f16 roundings of
the exact one: ``tests/wgsl/test_f16_kernels.py`` measures it).  Buffers stay f32, so weights,
bindings, params and the dispatch size do not change and the runtimes may pick either
shader per adapter.  Elementwise kernels do not get one: they are bound by the memory
traffic of their f32 buffers, which f16 arithmetic does not reduce.  f16's range ends at
65504: a factor beyond it (not an activation or weight of the usual models) becomes
infinite, and ``kernels="gpu"`` is the choice for such a model.  The fused attention
library kernel has an f16 form of its own (its ``webgpu_f16`` target, rendered by
``relaxweb/wgsl/library/attention.py``), in the same way: f16 tiles and products, f32 sums.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.launch import matmul_info
from ..ir.schedule import HalfTiledMatmulSchedule, RegisterMatmulSchedule, TiledMatmulSchedule
from ..ir.tir import Reduce, ScalarExpr, Select, TensorProgram, scalar_nodes
from .emit import is_cheap_branch


def cpu_variant(program: TensorProgram) -> TensorProgram | None:
    """The program as a CPU adapter should run it, or None when its own schedule is the best
    known there too."""
    schedule = program.schedule
    if not isinstance(schedule, TiledMatmulSchedule):
        return None
    info = matmul_info(program)
    if not (_branch_free(info.a) and _branch_free(info.b)):
        return None
    variant = RegisterMatmulSchedule(block=schedule.block)
    if variant.tile != schedule.tile:  # the dispatch size must not change
        return None
    return replace(program, schedule=variant)


def f16_variant(program: TensorProgram) -> TensorProgram | None:
    """The program as an adapter with ``shader-f16`` should run it (factors staged and
    multiplied in f16, summed in f32), or None when f16 does not pay for it."""
    schedule = program.schedule
    if type(schedule) is not TiledMatmulSchedule:
        return None
    half = HalfTiledMatmulSchedule(tile=schedule.tile, depth=schedule.depth, block=schedule.block)
    return replace(program, schedule=half)


MAX_CPU_SHADER_BYTES = 32_768
"""A CPU shader evaluates each factor once per block row or column, so a factor with a long
prologue makes it large: above this size it is not written (YOLOv8n's box-decoding
convolution, a softmax and a concatenation in its factor, made a 72 KB shader that
SwiftShader's compiler lost the device on; now 42 KB, still left out)."""


def cpu_shader_fits(source: str) -> bool:
    """Whether a CPU variant's WGSL is small enough to be worth compiling instead."""
    return len(source.encode()) <= MAX_CPU_SHADER_BYTES


def _branch_free(factor: ScalarExpr) -> bool:
    """No reduction, and every select renders as WGSL's ``select`` (a branch per block row or
    column of every invocation is what staging saves)."""
    for node in scalar_nodes(factor):
        if isinstance(node, Reduce):
            return False
        if isinstance(node, Select) and not (is_cheap_branch(node.a) and is_cheap_branch(node.b)):
            return False
    return True
