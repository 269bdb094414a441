"""The WebAssembly rendering of each wasm schedule kind (``relaxweb/ir/wasm_schedule.py``): a
kernel's ``$units`` and ``$main`` (``common.py`` has the signature, the contract's).

:func:`render_program` looks the kind of the schedule it is given (by default the program's
``schedule.wasm``, which the schedule_programs pass chose) up in :data:`RENDERERS` and renders
exactly that schedule; a kind without a renderer is an error, never a fallback.  One module
per kind: ``element.py``, ``vectorized.py``, ``window.py``, and the matmul kinds, which a
kernel chains at run time (``matmul.py``: ``matvec.py``, ``matmul_packed.py``,
``matmul_block.py``, packing their factors with ``packing.py`` in the forms of
``factor_forms.py``).  Every function body is written with ``relaxweb/cpu/wat_builder.py``.
"""

from __future__ import annotations

from typing import Callable, Mapping

from ...ir.target_schedules import schedules_of
from ...ir.tir import TensorProgram
from ...ir.wasm_schedule import (
    BlockMatmulSchedule, MatrixVectorSchedule, PackedMatmulSchedule, WasmElementSchedule, WasmSchedule,
    WasmVectorizedSchedule, WindowSchedule,
)
from .element import render_element
from .matmul import prepacked_factor_of, render_matmul
from .vectorized import render_vectorized
from .window import render_window

RENDERERS: dict[type[WasmSchedule], Callable[[TensorProgram, WasmSchedule, Mapping[str, int]], str]] = {
    WasmElementSchedule: render_element,  # type: ignore[dict-item]
    WasmVectorizedSchedule: render_vectorized,  # type: ignore[dict-item]
    WindowSchedule: render_window,  # type: ignore[dict-item]
    MatrixVectorSchedule: render_matmul,
    PackedMatmulSchedule: render_matmul,
    BlockMatmulSchedule: render_matmul,
}
"""The renderer of each wasm schedule kind: (program, schedule, parts) -> the WAT of the
kernel's ``$main`` and ``$units`` (and its comment)."""


def render_program(program: TensorProgram, parts: Mapping[str, int] | None = None,
                   schedule: WasmSchedule | None = None) -> str:
    """The WAT of a tensor program's ``$main`` and ``$units`` under ``schedule`` (by default
    its wasm schedule: ``schedules_of``); ``parts``: its inputs bound as several parts (the first part's
    address holds the whole buffer)."""
    schedule = schedules_of(program).wasm if schedule is None else schedule
    renderer = RENDERERS.get(type(schedule))
    if renderer is None:
        raise NotImplementedError(f"{program.name}: the WebAssembly backend has no renderer for the schedule "
                                  f"{schedule}")
    return renderer(program, schedule, dict(parts or {}))


__all__ = ["RENDERERS", "prepacked_factor_of", "render_program"]
