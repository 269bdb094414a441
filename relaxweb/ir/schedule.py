"""Schedules: how a tensor program's compute definition is laid out on a target.

A schedule is a small immutable object: its kind (the class) and its parameters (the
fields), validated when it is built.  ``TensorProgram.schedule`` holds one per target the
bundle serves (:class:`~relaxweb.ir.target_schedules.TargetSchedules`); the
schedule_programs pass chooses them all (``relaxweb/passes/schedule_programs.py``), the host
module evaluates the dispatch size the WebGPU one implies (``relaxweb/ir/launch.py``), and
each backend renders the kinds of its target (``relaxweb/wgsl/schedules.py`` these,
``relaxweb/cpu/schedules/`` the WebAssembly kinds of ``wasm_schedule.py``).  Nothing here is
specific to WGSL.

The WebGPU kinds (:class:`WebGpuSchedule`) run workgroups of :data:`WORKGROUP_SIZE`
invocations, so the bundle format and the runtimes never depend on the schedule.

- :class:`ElementSchedule`: one invocation per output element; reductions are serial loops.
- :class:`VectorizedSchedule`: one invocation per ``width`` consecutive output elements of a
  float elementwise or broadcast program (vector loads and arithmetic).
- :class:`WorkgroupReductionSchedule`: one workgroup per output element; each top-level
  reduction is split across the workgroup and combined by a tree in workgroup memory.
- :class:`TiledMatmulSchedule`: one workgroup per ``tile x tile`` block of a matmul-like
  program's output; both factors are staged ``depth`` deep through workgroup memory and each
  invocation keeps a ``block x block`` set of accumulators.
- :class:`RegisterMatmulSchedule`: the same tiles of a matmul-like program's output, without
  workgroup memory: each invocation evaluates the factors for its own rows and columns
  straight from the buffers and keeps its ``block x block`` accumulators in registers (only
  as a kernel's second shader, for CPU adapters: ``TargetSchedules.webgpu_cpu``).
- :class:`HalfTiledMatmulSchedule`: :class:`TiledMatmulSchedule` with the factors staged as
  16-bit floats and multiplied in them, summed in 32-bit floats (adapters with WebGPU's
  ``shader-f16``; only as a kernel's second shader: ``TargetSchedules.webgpu_f16``).

The text form (what ``--dump-ir`` shows) is the kind, with the parameters when it has any:
``tiled_matmul(tile=32, depth=16, block=4)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

WORKGROUP_SIZE = 64  # invocations per workgroup, for every schedule (the bundle's contract)
VECTOR_WIDTH = 4  # elements of the vectors a tiled matmul keeps its staged factors and accumulators in


class Schedule:
    """Base of the schedule kinds of every target; each kind is a frozen dataclass whose
    fields are its parameters (integers, booleans, tuples of integers, or the schedule of
    another kind it falls back to), written as keywords in its text form."""

    kind: ClassVar[str]

    def __str__(self) -> str:
        parameters = ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
        return f"{self.kind}({parameters})" if parameters else self.kind


class WebGpuSchedule(Schedule):
    """A layout of a program on WebGPU invocations, in workgroups of :data:`WORKGROUP_SIZE`."""


@dataclass(frozen=True)
class ElementSchedule(WebGpuSchedule):
    """One invocation per output element (any program)."""

    kind: ClassVar[str] = "element"


@dataclass(frozen=True)
class VectorizedSchedule(WebGpuSchedule):
    """One invocation per ``width`` consecutive output elements along the last axis."""

    kind: ClassVar[str] = "vectorized"
    width: int = 4

    def __post_init__(self) -> None:
        # vectors of 3 are padded to 4 in storage arrays, so they cannot tile a buffer
        if self.width not in (2, 4):
            raise ValueError(f"vectorized: width must be 2 or 4, got {self.width}")


@dataclass(frozen=True)
class WorkgroupReductionSchedule(WebGpuSchedule):
    """One workgroup per output element, its reductions split across the workgroup."""

    kind: ClassVar[str] = "workgroup_reduction"


@dataclass(frozen=True)
class TiledMatmulSchedule(WebGpuSchedule):
    """One workgroup per ``tile x tile`` output tile (per batch index); ``depth`` reduction
    elements of both factors are staged per step; each invocation computes ``block x block``
    outputs, so the workgroup's invocations form a square of ``tile / block`` per side.

    ``block`` is a multiple of :data:`VECTOR_WIDTH` (a row of an invocation's block is whole
    vectors), and ``tile`` divides the workgroup size (each invocation stages the same row of
    the tile at every depth, so it recovers that row's indices once)."""

    kind: ClassVar[str] = "tiled_matmul"
    tile: int = 32
    depth: int = 16
    block: int = 4

    def __post_init__(self) -> None:
        if self.depth < 1 or self.block < 1 or self.tile % self.block != 0:
            raise ValueError(f"{self}: depth and block must be positive, and block must divide tile")
        if self.threads_per_side ** 2 != WORKGROUP_SIZE:
            raise ValueError(f"{self}: (tile / block)^2 must be the workgroup size {WORKGROUP_SIZE}")
        if self.block % VECTOR_WIDTH != 0 or WORKGROUP_SIZE % self.tile != 0:
            raise ValueError(f"{self}: block must be a multiple of {VECTOR_WIDTH}, and tile must divide {WORKGROUP_SIZE}")

    @property
    def threads_per_side(self) -> int:
        return self.tile // self.block


@dataclass(frozen=True)
class RegisterMatmulSchedule(WebGpuSchedule):
    """One workgroup per ``tile x tile`` output tile (per batch index) like
    :class:`TiledMatmulSchedule`, with ``tile = 8 * block``: the workgroup's 64 invocations
    form an 8 x 8 square, each computing ``block x block`` outputs.  Nothing is staged: an
    invocation reads the first factor at its ``block`` rows and the second at its ``block``
    columns for every reduction element, so the factors are evaluated ``tile / block`` times
    as often as when staged, and no workgroup barrier is needed (on an adapter that runs a
    workgroup's invocations on one CPU core, a barrier costs more than the loads it saves)."""

    kind: ClassVar[str] = "register_matmul"
    block: int = 8

    def __post_init__(self) -> None:
        if self.block < VECTOR_WIDTH or self.block % VECTOR_WIDTH != 0:
            raise ValueError(f"{self}: block must be a positive multiple of {VECTOR_WIDTH}")

    @property
    def threads_per_side(self) -> int:
        return 8  # the square root of the workgroup size

    @property
    def tile(self) -> int:
        return self.threads_per_side * self.block


@dataclass(frozen=True)
class HalfTiledMatmulSchedule(TiledMatmulSchedule):
    """:class:`TiledMatmulSchedule` (the same tiles, steps and dispatch size) whose staged
    factors are 16-bit floats: half the workgroup memory and its traffic, and products in
    f16 (twice the rate of f32 on most GPUs).  The sums over the reduction stay f32 (an f16
    sum of K = 768 products keeps about 3 significant digits fewer than the inputs have), and
    so do the buffers: only what is staged and multiplied changes."""

    kind: ClassVar[str] = "tiled_matmul_f16"


MATMUL_SCHEDULES = (TiledMatmulSchedule, RegisterMatmulSchedule)  # (with subclasses) the kinds that lay a matmul out by output tiles

WEBGPU_SCHEDULE_KINDS: dict[str, type[WebGpuSchedule]] = {
    kind.kind: kind for kind in (ElementSchedule, VectorizedSchedule, WorkgroupReductionSchedule, TiledMatmulSchedule,
                                 RegisterMatmulSchedule, HalfTiledMatmulSchedule)
}
