"""WebAssembly schedules: how a tensor program's kernel in ``kernels.wasm`` splits its work
into units and runs the loops of each.

A kernel is two functions (docs/bundle-format.md, "kernels.wasm"): ``$units (params) ->
units`` and ``$main (params, first, end, scratch, buffers...)``, which runs the units
``first <= u < end``; a runtime's threads take ranges of units, each thread with
``scratch`` bytes of its own.  A schedule says what a unit is, how its loops run and what
they need: :attr:`WasmSchedule.scratch_bytes` (the most scratch any kind asks for is the
manifest's ``wasm.scratch_bytes``), :meth:`WasmSchedule.units` (what ``$units`` returns).
Each kind is rendered by its module of ``relaxweb/cpu/schedules/``; the schedule_programs
pass chooses it (``relaxweb/passes/schedule_programs.py``).

- :class:`WasmElementSchedule` (``element``): any program; a unit is
  ``elements_per_unit`` consecutive output elements, each computed on its own.
- :class:`WasmVectorizedSchedule` (``vectorized``): a float elementwise or broadcast program
  whose last dimension is a multiple of 4, four output elements per f32x4.
- :class:`WindowSchedule` (``window``): a reduction sliding along the output's last axis (a
  depthwise convolution, a pool); a unit is an output row, ``lanes`` positions per iteration.
- :class:`BlockMatmulSchedule` (``block_matmul``): a matmul-like program in register blocks of
  ``rows x columns`` outputs, one unit each.
- :class:`PackedMatmulSchedule` (``packed_matmul``): the factors packed into panels and summed
  by micro-kernels, while the reduction has at most ``max_depth`` steps; beyond, its
  ``beyond`` block matmul.
- :class:`MatrixVectorSchedule` (``matrix_vector``): a matmul with few rows (a decoder's step),
  the second factor streamed once, while the rows and the depth are small enough; otherwise
  its ``otherwise`` packed matmul.

The last two choose at run time (a program's sizes may be size variables): the kernel holds
each form and ``$main`` and ``$units`` test the sizes alike, so a schedule names the form
it falls back to.  The three matmul kinds of one kernel share ``swap_factors``: whether the
program's second factor (``relaxweb.ir.pattern.MatmulInfo.b``) gives the rows instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from .schedule import Schedule


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class KernelSizes(NamedTuple):
    """A program's sizes at one call, for :meth:`WasmSchedule.units`: its output elements,
    and for a matmul-like program its rows, columns, reduction depth and batch (the
    products of the output extents of each group of axes, ``relaxweb.ir.pattern.MatmulInfo``;
    rows and columns as the schedule orients the factors)."""

    elements: int
    rows: int = 0
    columns: int = 0
    depth: int = 0
    batch: int = 1


class WasmSchedule(Schedule):
    """A kernel's units and loops in ``kernels.wasm`` (see the module doc)."""

    @property
    def scratch_bytes(self) -> int:
        """The scratch bytes one thread needs for the kernel."""
        return 0

    @property
    def fallback(self) -> WasmSchedule | None:
        """The kind the kernel runs where this one's run-time test fails (None: it has none)."""
        return None

    def units(self, sizes: KernelSizes) -> int:
        """The units the kernel splits a call of these sizes into (what ``$units`` returns)."""
        raise NotImplementedError(f"{self.kind}: no unit count")


@dataclass(frozen=True)
class WasmElementSchedule(WasmSchedule):
    """Units of ``elements_per_unit`` consecutive output elements (threads split the work
    coarsely), a loop over the flat output index that recovers the axes by division;
    reductions are serial loops (four steps at a time as f32x4 where the body reads along
    the reduction contiguously).  An iteration computes ``unroll`` consecutive elements where
    they lie on one row of the last axis (else one): the loop's own work (the flat index, the
    axes moved on, and on a page that is not isolated the deadline's fuel) is paid once for
    them."""

    kind: ClassVar[str] = "element"
    elements_per_unit: int = 64
    unroll: int = 1

    def __post_init__(self) -> None:
        if self.elements_per_unit < 1:
            raise ValueError(f"{self}: elements_per_unit must be positive")
        if self.unroll < 1:
            raise ValueError(f"{self}: unroll must be positive")

    def units(self, sizes: KernelSizes) -> int:
        return _ceil_div(sizes.elements, self.elements_per_unit)


@dataclass(frozen=True)
class WasmVectorizedSchedule(WasmSchedule):
    """The element form four output elements at a time (consecutive along the last axis,
    whose extent is a multiple of 4): f32x4 loads, arithmetic and math calls, splats of the
    buffers constant along the last axis, one ``v128.store``; units of ``elements_per_unit``
    elements (a multiple of 4).  An iteration computes ``unroll`` such groups of four where
    they lie on one row of the last axis (else one): the loop's own work (the flat index,
    the axes moved on, and on a page that is not isolated the deadline's fuel) is paid once
    for them."""

    kind: ClassVar[str] = "vectorized"
    elements_per_unit: int = 64
    unroll: int = 4

    def __post_init__(self) -> None:
        if self.elements_per_unit < 4 or self.elements_per_unit % 4:
            raise ValueError(f"{self}: elements_per_unit must be a positive multiple of 4")
        if self.unroll < 1:
            raise ValueError(f"{self}: unroll must be positive")

    def units(self, sizes: KernelSizes) -> int:
        return _ceil_div(sizes.elements, self.elements_per_unit)


@dataclass(frozen=True)
class WindowSchedule(WasmSchedule):
    """A sliding-window reduction (``relaxweb.ir.pattern.analyze_window``), one unit per
    output row (every axis but the last).  Along a row, ``lanes`` output positions per
    iteration (``lanes / 4`` f32x4 sums: as many chains of adds), then four at a time.  The
    innermost reduction is unrolled where every address moves by a constant: at a constant
    extent up to ``unroll``, else for the run-time extents of ``unrolled_widths`` (kernel
    widths).  At a border, a masked lane's load may lie at most ``overreach`` bytes from one
    inside the row (the linear memory has 64 KiB of slack around the buffers).
    ``masked_borders``: an iteration at a border computes its lanes' masks once and runs
    the window's innermost steps unrolled and masked (where the guards along the row read
    no other reduction axis), instead of testing its first and last lane at every step."""

    kind: ClassVar[str] = "window"
    lanes: int = 8
    unroll: int = 8
    unrolled_widths: tuple[int, ...] = (3, 5, 7)
    overreach: int = 1024
    masked_borders: bool = True

    def __post_init__(self) -> None:
        if self.lanes < 4 or self.lanes % 4 or self.unroll < 0 or any(w < 1 for w in self.unrolled_widths):
            raise ValueError(f"{self}: lanes must be a positive multiple of 4, the unrolled extents positive")
        if not 0 <= self.overreach <= 65536:
            raise ValueError(f"{self}: overreach must be within the 64 KiB of slack around the buffers")

    def units(self, sizes: KernelSizes) -> int:
        return sizes.rows


@dataclass(frozen=True)
class BlockMatmulSchedule(WasmSchedule):
    """A matmul-like program in blocks of ``rows x columns`` outputs, one unit each (per
    batch index).  A whole block keeps its sums in ``rows x columns / 4`` f32x4 locals: at
    each reduction step the first factor is evaluated once per row and splatted, the second
    read as f32x4 along the columns; the sums are spilled to the scratch and a loop over the
    block applies the epilogue.  A block at the edge of the output computes each of its
    elements on its own."""

    kind: ClassVar[str] = "block_matmul"
    swap_factors: bool = False
    rows: int = 4  # rows of a block (one splat of the first factor each)
    columns: int = 16  # columns of a block (four f32x4 of the second factor)

    def __post_init__(self) -> None:
        if self.rows < 1 or self.columns < 4 or self.columns % 4:
            raise ValueError(f"{self}: rows must be positive and columns a positive multiple of 4")

    @property
    def scratch_bytes(self) -> int:
        return 4 * self.rows * self.columns  # a block's sums, spilled for the epilogue

    def units(self, sizes: KernelSizes) -> int:
        return sizes.batch * _ceil_div(sizes.rows, self.rows) * _ceil_div(sizes.columns, self.columns)


@dataclass(frozen=True)
class PackedMatmulSchedule(WasmSchedule):
    """A matmul-like program whose reduction has at most ``max_depth`` steps (tested at run
    time: its extents may be size variables), else its ``beyond`` block matmul.

    A unit is a group of panels of ``panel_rows`` rows of the output (per batch index), for
    every column.  The first factor is evaluated once per element into [K x panel_rows]
    panels, the second copied or packed once per unit and ``panel_columns`` columns into a
    [K x panel_columns] panel; micro-kernels of ``micro_rows x panel_columns`` sums (8 f32x4
    locals: they stay in registers) run from the panels, the reduction ``chunk`` steps at a
    time over all of a panel's strips (8 KB of the second factor's panel and 4 KB of a
    strip at 256, which stay in the L1 cache).  A unit holds up to ``panel_bytes`` of
    first-factor panels (one at 4608 steps, 14 at K = 576: a 3x3 convolution of 64
    channels), so that the second factor (a convolution's weight, packed element by
    element) is packed once per unit for all of them, while the units stay at least
    ``units_wanted`` for the threads to split.  A call of several units runs the consecutive
    ones that share a factor together (row groups of one batch index within ``panel_bytes``,
    column slices of one row group: ``cpu/schedules/matmul_packed.py``), so one thread packs
    each factor once where it can.

    ``split_columns`` (a first factor cheap to pack, a plain load or a layer norm:
    ``relaxweb.ir.matmul_layout.split_columns``): where the rows are few (fewer panels per
    batch index than ``units_wanted``), a unit holds all of them (up to ``split_bytes`` of
    panels, within ``panel_bytes``) and a slice of the columns, so that each unit packs only
    its part of the second factor (a weight's, or a convolution's positions), once for all
    of its rows, and the threads have units to share.  At 512 KiB a 128 x 3072 @ 3072 x 768
    matmul (an FFN's down-projection at 128 tokens) held one panel a unit and copied the weight
    four times: 26-28 GFLOP/s in Chromium; at 1 MiB, two panels and twice: 30-34
    (bench/wasm_peak.py).

    Packing either factor writes out its loops over reduction axes of constant extent
    while the copies of a step stay at most ``unroll_steps`` (``cpu/schedules/common.for_each_step``):
    a 3x3 convolution's window is 9 steps of one f32x4 each; looped (3 x 3 iterations), ResNet-50
    took 1.11x, MobileNetV3 1.09x and YOLOv8n 1.06x their time in V8 on a page that is not
    isolated (kernels.wasm is 1.3x the bytes written out)."""

    kind: ClassVar[str] = "packed_matmul"
    swap_factors: bool = False
    panel_rows: int = 32
    micro_rows: int = 4
    panel_columns: int = 8
    max_depth: int = 4608  # 512 channels x 3 x 3
    chunk: int = 256
    panel_bytes: int = 1 << 20
    units_wanted: int = 8
    split_columns: bool = False
    split_bytes: int = 1 << 20
    unroll_steps: int = 9
    beyond: BlockMatmulSchedule = field(default_factory=BlockMatmulSchedule)

    def __post_init__(self) -> None:
        if self.micro_rows != 4 or self.panel_rows % self.micro_rows:
            raise ValueError(f"{self}: micro_rows must be 4 (a strip of a panel is f32x4 wide) and divide panel_rows")
        if self.panel_columns < 4 or self.panel_columns & (self.panel_columns - 1):  # the kernel shifts by its bytes
            raise ValueError(f"{self}: panel_columns must be a power of 2, at least 4")
        if min(self.max_depth, self.chunk, self.panel_bytes, self.units_wanted, self.split_bytes, self.unroll_steps) < 1:
            raise ValueError(f"{self}: the depth, chunk, panel bytes, units wanted, split bytes and unrolled steps must be "
                             "positive")
        if self.beyond.swap_factors != self.swap_factors:
            raise ValueError(f"{self}: the block matmul beyond it must orient the factors alike")

    @property
    def fallback(self) -> WasmSchedule:
        return self.beyond

    @property
    def panel_b_bytes(self) -> int:
        """The second factor's panel: ``panel_columns`` columns at every step."""
        return 4 * self.panel_columns * self.max_depth

    @property
    def split_panel_bytes(self) -> int:
        """The first-factor panels a unit splitting columns holds: ``split_bytes``, within the
        scratch's ``panel_bytes``."""
        return min(self.split_bytes, self.panel_bytes)

    @property
    def scratch_bytes(self) -> int:
        sums = 4 * self.panel_rows * self.panel_columns
        return max(self.beyond.scratch_bytes, self.panel_bytes + self.panel_b_bytes + sums)

    def panel_group(self, rows: int, depth: int) -> int:
        """Row panels per unit: about ``units_wanted`` units per batch index, as many as
        ``panel_bytes`` holds, at least one."""
        panels = _ceil_div(rows, self.panel_rows)
        fits = self.panel_bytes // (max(depth, 1) * 4 * self.panel_rows)
        return max(min(_ceil_div(panels, self.units_wanted), fits), 1)

    def units(self, sizes: KernelSizes) -> int:
        if sizes.depth > self.max_depth:
            return self.beyond.units(sizes)
        panels = _ceil_div(sizes.rows, self.panel_rows)
        group, slices = self.panel_group(sizes.rows, sizes.depth), 1
        if self.split_columns and panels * sizes.batch < self.units_wanted:
            fits = self.split_panel_bytes // (max(sizes.depth, 1) * 4 * self.panel_rows)
            group = max(min(panels, fits), 1)
            units = max(_ceil_div(sizes.rows, group * self.panel_rows) * sizes.batch, 1)
            slices = max(min(_ceil_div(self.units_wanted, units), _ceil_div(sizes.columns, self.panel_columns)), 1)
        return sizes.batch * _ceil_div(sizes.rows, group * self.panel_rows) * slices


@dataclass(frozen=True)
class MatrixVectorSchedule(WasmSchedule):
    """A matmul with at most ``max_rows`` rows and ``max_depth`` reduction steps (tested at
    run time), else its ``otherwise`` packed matmul.  Such a matmul (a decoder's step: one
    token, or one per sequence stepped together) gains nothing from panels: its time is the
    second factor's bytes, read once.

    A unit is four columns of one batch index; a call takes its units of a batch index as
    one run of columns, in blocks of at most ``columns`` columns (``columns x max_rows``
    where there is one row), as even as multiples of 4 allow.  The first factor is packed
    once per block, then the block's sums of every row (in the scratch) take ``steps`` rows
    of the second factor at a time, each read in order along its columns, the rows in
    groups (all of them, then halves) that share each load of it; or, with
    ``dot_products`` (each column of the second factor contiguous along the reduction: a
    ``Gemm`` with ``transB``), each row of the first factor is packed and each sum is a dot
    product of two contiguous runs, ``dot_columns`` columns sharing each load of a row and
    ``dot_rows`` rows each load of a column.  Either
    way a row's sums add their products in the same order whatever the rows and groups: a
    row's outputs do not depend on the other rows.  ``max_depth``: the deepest reduction
    whose packed first factor fits the scratch after the sums."""

    kind: ClassVar[str] = "matrix_vector"
    swap_factors: bool = False
    max_rows: int = 8
    columns: int = 512
    steps: int = 8
    max_depth: int = -1  # -1: the most the scratch of ``otherwise`` holds (computed when built)
    dot_products: bool = False
    dot_columns: int = 4
    dot_rows: int = 4
    otherwise: PackedMatmulSchedule = field(default_factory=PackedMatmulSchedule)

    def __post_init__(self) -> None:
        if self.max_depth == -1:
            object.__setattr__(self, "max_depth", self.deepest(self.max_rows, self.columns, self.otherwise))
        if min(self.max_rows, self.steps, self.dot_columns, self.dot_rows) < 1 or self.columns < 4 or self.columns % 4:
            raise ValueError(f"{self}: rows, steps, dot columns and dot rows must be positive, columns a multiple of 4")
        if self.max_depth < 0 or self.max_depth % 4 or self.own_scratch_bytes > self.otherwise.scratch_bytes:
            raise ValueError(f"{self}: max_depth must be a multiple of 4 whose packed first factor fits the scratch "
                             f"of {self.otherwise.kind} ({self.otherwise.scratch_bytes} bytes)")
        if self.otherwise.swap_factors != self.swap_factors:
            raise ValueError(f"{self}: the packed matmul it falls back to must orient the factors alike")

    @staticmethod
    def deepest(max_rows: int, columns: int, otherwise: PackedMatmulSchedule) -> int:
        """The deepest reduction (a multiple of 4) whose packed first factor of ``max_rows``
        rows fits the scratch of ``otherwise`` after the sums of ``columns`` columns of each
        row."""
        return (otherwise.scratch_bytes - 4 * columns * max_rows) // (4 * max_rows) // 4 * 4

    @property
    def fallback(self) -> WasmSchedule:
        return self.otherwise

    @property
    def own_scratch_bytes(self) -> int:
        """The sums of a unit's columns for every row, then the first factor packed at every
        step."""
        return 4 * self.columns * self.max_rows + 4 * self.max_rows * self.max_depth

    @property
    def scratch_bytes(self) -> int:
        return max(self.own_scratch_bytes, self.otherwise.scratch_bytes)

    def units(self, sizes: KernelSizes) -> int:
        if sizes.rows <= self.max_rows and sizes.depth <= self.max_depth:
            return sizes.batch * _ceil_div(sizes.columns, 4)
        return self.otherwise.units(sizes)


MATMUL_KINDS = (BlockMatmulSchedule, PackedMatmulSchedule, MatrixVectorSchedule)  # a matmul-like program's kinds

WASM_SCHEDULE_KINDS: dict[str, type[WasmSchedule]] = {
    kind.kind: kind for kind in (WasmElementSchedule, WasmVectorizedSchedule, WindowSchedule, *MATMUL_KINDS)
}
