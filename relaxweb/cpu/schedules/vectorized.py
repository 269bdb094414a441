"""The ``vectorized`` kind (``WasmVectorizedSchedule``): the element form four output
elements at a time, for a float32 elementwise or broadcast program whose last dimension is
a multiple of 4 and whose float ops all have f32x4 forms (``relaxweb.ir.schedule_fit.wasm_vectorizable``).

Consecutive along the last axis: f32x4 loads of the buffers read along it (at any address),
splats of those constant along it, four f32 loads into the lanes of those read elsewhere for
each (``relaxweb.ir.launch.vector_access``), f32x4 arithmetic and math calls, one
``v128.store``.  A select whose condition does not depend on the last
axis (a concatenation's pieces) is an ``if`` on that condition, computed once for the four
lanes, around the chosen branch's f32x4 value.
"""

from __future__ import annotations

from typing import Mapping

from ...ir.launch import vector_access
from ...ir.schedule_fit import wasm_vectorizable
from ...ir.tir import TensorProgram
from ...ir.wasm_schedule import WasmVectorizedSchedule
from ..emit import Emitter, Function, VectorEmitter
from .element import render_output_loop

WIDTH = 4  # f32x4


def render_vectorized(program: TensorProgram, schedule: WasmVectorizedSchedule, parts: Mapping[str, int]) -> str:
    """``$main`` and ``$units`` of the vectorized kind (see the module doc)."""
    access = vector_access(program, WIDTH, wasm=True)
    if access is None or not wasm_vectorizable(program):
        raise ValueError(f"{program.name} is scheduled as {schedule} but does not fit it "
                         f"(relaxweb.ir.schedule_fit.wasm_vectorizable)")

    def make_emitter(function: Function, addresses: Mapping[str, str], variables: Mapping[str, str]) -> Emitter:
        return VectorEmitter(program, function, addresses, variables, access)

    def store_vector(emitter: Emitter, index: str, value: str) -> str:
        return f"(v128.store {emitter.address(program.output.name, index)} {value})"

    return render_output_loop(program, parts, make_emitter, store_vector, step=WIDTH,
                              per_unit=schedule.elements_per_unit, label="$vector", unroll=schedule.unroll)
