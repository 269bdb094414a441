"""The ``element`` kind (``WasmElementSchedule``): any program, a unit of
``elements_per_unit`` consecutive output elements, each computed on its own.

A loop over the flat output index (the axes recovered by division at its first element,
then advanced with it: ``common.advance``) asks the emitter for the body's value
(reductions are serial loops) and stores it in the output's device dtype.  The vectorized kind runs the same loop four
elements at a time (:func:`render_output_loop`).
"""

from __future__ import annotations

from typing import Callable, Mapping

from ...ir.tir import TensorProgram
from ...ir.wasm_schedule import WasmElementSchedule
from ..emit import Emitter, Function, store
from ..wat_builder import Body, call, const, get, mul, op
from .common import advance, element_count, kernel_signature, kernel_text, load_size_vars, unflatten, units_of_elements

MakeEmitter = Callable[[Function, Mapping[str, str], Mapping[str, str]], Emitter]


def render_element(program: TensorProgram, schedule: WasmElementSchedule, parts: Mapping[str, int]) -> str:
    """``$main`` and ``$units`` of the element kind (see the module doc)."""
    def make_emitter(function: Function, addresses: Mapping[str, str], variables: Mapping[str, str]) -> Emitter:
        return Emitter(program, function, addresses, variables)

    def store_element(emitter: Emitter, index: str, value: str) -> str:
        return store(program.output.dtype, emitter.address(program.output.name, get(index)),
                     emitter.stored(program.output, program.body, value))

    return render_output_loop(program, parts, make_emitter, store_element, step=1, per_unit=schedule.elements_per_unit,
                              label="$element")


def render_output_loop(program: TensorProgram, parts: Mapping[str, int], make_emitter: MakeEmitter,
                       store_value: Callable[[Emitter, str, str], str], *, step: int, per_unit: int, label: str) -> str:
    """``$main`` and ``$units`` of a loop over the flat output index, ``step`` elements per
    iteration, in units of ``per_unit`` elements: each iteration asks the emitter for the
    body's value at the axes' current values and stores it (``store_value(emitter, index
    local, value)``), then moves the axes on (recovered from the flat index once, before the
    loop)."""
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    body = Body(function)
    variables = load_size_vars(program, body)
    emitter = make_emitter(function, addresses, variables)
    index, stop = body.named("i"), body.named("stop")
    body.set(index, mul(get("$first"), const(per_unit)))
    body.set(stop, call("$min_s_i32", mul(get("$end"), const(per_unit)), element_count(program, variables)))
    with body.block("$done"):
        body.br_if("$done", op("i32.ge_s", get(index), get(stop)))
        emitter.open_scope()
        coordinates = unflatten(emitter, body, program.axes, program.output.shape, index)  # once, then advanced
        with body.loop(label):
            emitter.open_scope()
            value = emitter.scalar(program.body, body.indent)
            body.line(store_value(emitter, index, value))
            emitter.close_scope()
            body.increment(index, step)
            advance(emitter, body, program.output.shape, coordinates, step)
            body.br_if(label, op("i32.lt_s", get(index), get(stop)))
        emitter.close_scope()
    return kernel_text(program, function, signature, units_of_elements(program, per_unit))
