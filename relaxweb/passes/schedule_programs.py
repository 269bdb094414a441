"""schedule_programs: choose how each tensor program runs on the GPU, from its pattern.

Code generation can lay a compute definition out on invocations in several ways
(``relaxweb/ir/schedule.py``); this pass records the choice on each program, so that it
is visible in ``--dump-ir`` and the backend only follows it:

- matmul-like programs (``relaxweb.ir.pattern.analyze_matmul``: matmuls, batched matmuls,
  convolutions without groups, with fused prologues and epilogues) get ``tiled_matmul``:
  64x64 tiles with 8x8 outputs per invocation (on SwiftShader, 1.5 to 2 times the GFLOP/s of
  32x32 tiles with 4x4 at 1024^3), or 32x32 tiles with 4x4 where the rows or the columns are
  a constant below 64 (most of a 64 tile would be padding); staged 16 deep.  A symbolic
  extent counts as large: at a sequence of 8, a transformer's matmuls compute twice the
  padding they did with 32x32 tiles;
- other programs with reductions get ``workgroup_reduction`` when a reduction is long
  (a constant extent of at least 128: layer norm statistics over the hidden size) and every
  top-level reduction is computed unconditionally (workgroup barriers need uniform control
  flow).  Reductions over a symbolic extent (softmax over the sequence) keep one invocation
  per output: there are as many outputs as the reduction is long, and a workgroup per
  output wastes most of its invocations at short lengths;
- float elementwise and broadcast programs whose last dimension is a multiple of 4 get
  ``vectorized`` (four elements per invocation, 16-byte loads; ``relaxweb.ir.launch.vectorizable``
  has the exact conditions);
- everything else keeps ``element`` (one invocation per output element).

Library kernels are hand-scheduled and left alone.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.launch import matmul_extents, matmul_info, vectorizable
from ..ir.module import IRModule
from ..ir.pattern import Pattern, program_pattern, top_level_reductions
from ..ir.schedule import (
    ElementSchedule, Schedule, TiledMatmulSchedule, VectorizedSchedule, WorkgroupReductionSchedule,
)
from ..ir.symbolic import as_int
from ..ir.tir import Reduce, Select, TensorProgram, scalar_children

LONG_REDUCTION = 128  # a constant extent from which a workgroup per output element pays off
LARGE_TILES = TiledMatmulSchedule(tile=64, depth=16, block=8)
SMALL_TILES = TiledMatmulSchedule(tile=32, depth=16, block=4)


def schedule_programs(module: IRModule) -> IRModule:
    """Set ``schedule`` on every tensor program of the module."""
    programs = {}
    for name, program in module.programs.items():
        if isinstance(program, TensorProgram):
            program = replace(program, schedule=choose_schedule(program))
        programs[name] = program
    return module.replace(programs=programs)


def choose_schedule(program: TensorProgram) -> Schedule:
    pattern = program_pattern(program)
    if pattern is Pattern.MATMUL:
        return _tiled_matmul(program)
    if pattern is Pattern.REDUCTION and _cooperative_reductions_allowed(program):
        return WorkgroupReductionSchedule()
    vectorized = VectorizedSchedule()
    if pattern in (Pattern.ELEMENTWISE, Pattern.BROADCAST, Pattern.INJECTIVE) and vectorizable(program, vectorized.width):
        return vectorized
    return ElementSchedule()


def _tiled_matmul(program: TensorProgram) -> TiledMatmulSchedule:
    rows, columns, _ = matmul_extents(program, matmul_info(program))
    small = [e for e in (as_int(rows), as_int(columns)) if e is not None and e < LARGE_TILES.tile]
    return SMALL_TILES if small else LARGE_TILES


def _cooperative_reductions_allowed(program: TensorProgram) -> bool:
    reductions = top_level_reductions(program.body)
    if _reduction_under_select(program.body):
        return False
    return any(as_int(r.extent) is not None and as_int(r.extent) >= LONG_REDUCTION for r in reductions)


def _reduction_under_select(expr) -> bool:
    if isinstance(expr, Select):
        return bool(any(top_level_reductions(child) for child in scalar_children(expr)))
    if isinstance(expr, Reduce):  # what is inside a reduction runs serially anyway
        return False
    return any(_reduction_under_select(child) for child in scalar_children(expr))
