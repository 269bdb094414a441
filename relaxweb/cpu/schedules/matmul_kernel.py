"""What the tiers of a matmul kernel share (``matmul.py``): the kernel being written, its
sizes as ``$units`` sees them, and how a matmul kind renders as a tier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...ir.pattern import MatmulInfo
from ...ir.symbolic import PrimExpr, SizeVar, product, simplify
from ...ir.tir import TensorProgram
from ...ir.wasm_schedule import WasmSchedule
from ..emit import Emitter
from ..wat_builder import Body


@dataclass(frozen=True)
class MatmulKernel:
    """What the tiers of one kernel's ``$main`` share: the program, its matmul split as the
    schedule orients it, the emitter and body, and each group of output axes with its
    extents.  The locals ``$rows``, ``$columns``, ``$depth`` (the reduction's steps) and
    ``$unit`` (the unit running) hold their values; ``$row0``, ``$column0`` and ``$batch``
    are the tiers' to set."""

    program: TensorProgram
    info: MatmulInfo
    emitter: Emitter
    body: Body
    row_axes: tuple[SizeVar, ...]
    row_extents: tuple[PrimExpr, ...]
    column_axes: tuple[SizeVar, ...]
    column_extents: tuple[PrimExpr, ...]
    batch_axes: tuple[SizeVar, ...]
    batch_extents: tuple[PrimExpr, ...]
    #: the second factor a call site may hold prepacked (``matmul_packed.PrepackedFactor``): then
    #: ``$main`` takes its region's address last
    prepacked: Any = None

    @property
    def rows(self) -> PrimExpr:
        return simplify(product(self.row_extents))

    @property
    def columns(self) -> PrimExpr:
        return simplify(product(self.column_extents))

    @property
    def batch(self) -> PrimExpr:
        return simplify(product(self.batch_extents))

    @property
    def depth(self) -> PrimExpr:
        return simplify(product(self.info.reduce_extents))


@dataclass(frozen=True)
class UnitSizes:
    """``$units``'s view of a kernel: ``value`` renders an expression over the size
    variables; the row, column, depth and batch counts as i32 WAT values."""

    kernel: MatmulKernel
    value: Callable[[PrimExpr], str]

    @property
    def rows(self) -> str:
        return self.value(self.kernel.rows)

    @property
    def columns(self) -> str:
        return self.value(self.kernel.columns)

    @property
    def depth(self) -> str:
        return self.value(self.kernel.depth)

    @property
    def batch(self) -> str:
        return self.value(self.kernel.batch)


@dataclass(frozen=True)
class Tier:
    """How a matmul kind is rendered as a tier: ``main(kernel, schedule)`` writes its part of
    ``$main`` (returning after its units, unless it is the last), ``units(sizes, schedule,
    then)`` its unit count (``then``: the count of the tiers after it, for those it falls
    back to)."""

    main: Callable[[MatmulKernel, WasmSchedule], None]
    units: Callable[[UnitSizes, WasmSchedule, str | None], str]
