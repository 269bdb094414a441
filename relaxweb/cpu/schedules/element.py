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
from ..wat_builder import Body, add, call, const, get, mul, op
from .common import advance, element_count, kernel_signature, kernel_text, load_size_vars, unflatten, units_of_elements

MakeEmitter = Callable[[Function, Mapping[str, str], Mapping[str, str]], Emitter]


def render_element(program: TensorProgram, schedule: WasmElementSchedule, parts: Mapping[str, int]) -> str:
    """``$main`` and ``$units`` of the element kind (see the module doc)."""
    def make_emitter(function: Function, addresses: Mapping[str, str], variables: Mapping[str, str]) -> Emitter:
        return Emitter(program, function, addresses, variables)

    def store_element(emitter: Emitter, index: str, value: str) -> str:
        return store(program.output.dtype, emitter.address(program.output.name, index),
                     emitter.stored(program.output, program.body, value))

    return render_output_loop(program, parts, make_emitter, store_element, step=1, per_unit=schedule.elements_per_unit,
                              label="$element", unroll=schedule.unroll)


def render_output_loop(program: TensorProgram, parts: Mapping[str, int], make_emitter: MakeEmitter,
                       store_value: Callable[[Emitter, str, str], str], *, step: int, per_unit: int, label: str,
                       unroll: int = 1) -> str:
    """``$main`` and ``$units`` of a loop over the flat output index, ``step`` elements per
    iteration, in units of ``per_unit`` elements: each iteration asks the emitter for the
    body's value at the axes' current values and stores it (``store_value(emitter, flat index
    (i32 WAT), value)``), then moves the axes on (recovered from the flat index once, before
    the loop).  With ``unroll`` above 1, an iteration whose ``unroll * step`` elements lie on
    one row of the last axis (and before the call's end) computes them all, the last axis
    ``step`` further for each, and moves on once."""
    signature, addresses = kernel_signature(program, parts)
    function = Function()
    body = Body(function)
    variables = load_size_vars(program, body)
    emitter = make_emitter(function, addresses, variables)
    index, stop = body.named("i"), body.named("stop")
    body.set(index, mul(get("$first"), const(per_unit)))
    body.set(stop, call("$min_s_i32", mul(get("$end"), const(per_unit)), element_count(program, variables)))

    def steps(count: int) -> None:
        """``count`` groups of ``step`` elements from the current axes (the last axis moved
        ``step`` further for each after the first), then the axes moved on once."""
        moved = body.named("moved") if count > 1 else ""
        for copy in range(count):
            emitter.open_scope()
            if copy:
                body.set(moved, add(get(coordinates[-1]), const(copy * step)))
                emitter.declare_axis(program.axes[-1], program.output.shape[-1], moved)
            flat = add(get(index), const(copy * step)) if copy else get(index)
            body.line(store_value(emitter, flat, emitter.scalar(program.body, body.indent)))
            emitter.close_scope()
        body.increment(index, count * step)
        advance(emitter, body, program.output.shape, coordinates, count * step)

    with body.block("$done"):
        body.br_if("$done", op("i32.ge_s", get(index), get(stop)))
        emitter.open_scope()
        coordinates = unflatten(emitter, body, program.axes, program.output.shape, index)  # once, then advanced
        with body.loop(label):
            if unroll > 1 and program.axes:
                whole = op("i32.and", op("i32.le_s", add(get(index), const(unroll * step)), get(stop)),
                           op("i32.le_u", add(get(coordinates[-1]), const(unroll * step)),
                              emitter.index(program.output.shape[-1])))
                with body.if_(whole):
                    with body.then():
                        steps(unroll)
                    with body.else_():
                        steps(1)
            else:
                steps(1)
            body.br_if(label, op("i32.lt_s", get(index), get(stop)))
        emitter.close_scope()
    return kernel_text(program, function, signature, units_of_elements(program, per_unit))
