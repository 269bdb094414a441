"""Host functions: a graph function lowered to what the host module does on each run.

After memory planning, ``lower_shapes_to_host`` turns ``main`` into a :class:`HostFunction`:
an explicit list of shape checks on the inputs (each with the error message it reports),
the storages with their byte sizes, the weights, and the dispatches in order (which tensor
program, which buffers, the values of its size variables, its element count).  Everything
symbolic is an expression of the size variables bound by the checks, which is exactly what
the WebAssembly host module computes; ``relaxweb/wasm`` emits it and the interpreter below
runs it with numpy, so the lowering is testable without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import InputShapeError
from .expr import Constant
from .struct_info import DTYPE_SIZES
from .symbolic import PrimExpr, evaluate, format_expr, free_vars


@dataclass(frozen=True)
class HostInput:
    name: str
    dtype: str
    shape: tuple[PrimExpr, ...]
    storage: int


@dataclass(frozen=True)
class HostOutput:
    name: str
    dtype: str
    shape: tuple[PrimExpr, ...]
    storage: int


@dataclass(frozen=True)
class ShapeCheck:
    """One check of an input's shape, in order.

    ``kind``:
    - ``ndim``: the input has ``len(expected)`` dims (``expected`` is that number);
    - ``bind``: dimension ``dim`` defines size variable ``variable`` (and must be >= 0);
    - ``bound``: size variable ``variable`` is at most its bound (when it has one);
    - ``equal``: dimension ``dim`` equals ``expected``.
    ``code`` is the error code (1-based) whose message is ``message``, with ``{value}`` and
    ``{expected}`` filled in at run time.
    """

    kind: str
    input: int
    dim: int
    expected: PrimExpr | int | None
    variable: str | None
    code: int
    message: str


@dataclass(frozen=True)
class HostStorage:
    size: PrimExpr
    role: str  # input | intermediate | output


@dataclass(frozen=True)
class BufferRef:
    kind: str  # storage | weight
    index: int


@dataclass(frozen=True)
class HostDispatch:
    """Run ``program`` once over its ``element_count`` output elements."""

    program: str
    buffers: tuple[BufferRef, ...]
    size_var_values: tuple[tuple[str, PrimExpr], ...]
    element_count: PrimExpr
    note: str


@dataclass(frozen=True)
class HostFunction:
    name: str
    inputs: tuple[HostInput, ...]
    outputs: tuple[HostOutput, ...]
    symbolic_vars: tuple[str, ...]
    bounds: tuple[tuple[str, int | None], ...]
    checks: tuple[ShapeCheck, ...]
    storages: tuple[HostStorage, ...]
    weights: tuple[Constant, ...]
    dispatches: tuple[HostDispatch, ...]

    def bound_of(self, variable: str) -> int | None:
        return dict(self.bounds).get(variable)


def format_host_function(function: HostFunction) -> str:
    lines = [f"@host_function\ndef {function.name}():"]
    for check in function.checks:
        detail = check.variable if check.kind in ("bind", "bound") else format_expr(check.expected) if isinstance(check.expected, PrimExpr) else check.expected
        lines.append(f"    check {check.kind} input {function.inputs[check.input].name} dim {check.dim}: {detail}  # error {check.code}")
    for index, storage in enumerate(function.storages):
        lines.append(f"    storage{index} = alloc({format_expr(storage.size)} bytes)  # {storage.role}")
    for dispatch in function.dispatches:
        buffers = ", ".join(f"{b.kind}{b.index}" for b in dispatch.buffers)
        lines.append(f"    dispatch {dispatch.program}({buffers}) over {format_expr(dispatch.element_count)} elements  # {dispatch.note}")
    for output in function.outputs:
        shape = ", ".join(format_expr(d) for d in output.shape)
        lines.append(f"    output {output.name} = storage{output.storage}[{shape}]")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Running a host function with numpy (the semantics the compiled host + GPU must match)


def run_shape_checks(function: HostFunction, shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Bind the size variables from input shapes, raising the check's message on failure."""
    values: dict[str, int] = {}
    for check in function.checks:
        shape = shapes[check.input]
        if check.kind == "ndim":
            if len(shape) != check.expected:
                raise InputShapeError(fill_message(check.message, len(shape), int(check.expected)))  # type: ignore[arg-type]
        elif check.kind == "bind":
            values[check.variable] = shape[check.dim]  # type: ignore[index]
        elif check.kind == "bound":
            bound = function.bound_of(check.variable)  # type: ignore[arg-type]
            if bound is not None and values[check.variable] > bound:  # type: ignore[index]
                raise InputShapeError(fill_message(check.message, values[check.variable], bound))  # type: ignore[index]
        elif check.kind == "equal":
            expected = int(evaluate(check.expected, values))  # type: ignore[arg-type]
            if shape[check.dim] != expected:
                raise InputShapeError(fill_message(check.message, shape[check.dim], expected))
    return values


def fill_message(template: str, value: int, expected: int) -> str:
    return template.replace("{value}", str(value)).replace("{expected}", str(expected))


def run_host_function(function: HostFunction, programs: Mapping, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    from .interpreter import run_program

    for host_input in function.inputs:
        if host_input.name not in inputs:
            raise InputShapeError(f"missing input '{host_input.name}'")
        if str(np.asarray(inputs[host_input.name]).dtype) != host_input.dtype:
            raise InputShapeError(f"input '{host_input.name}': dtype is {np.asarray(inputs[host_input.name]).dtype}, expected {host_input.dtype}")
    arrays = [np.asarray(inputs[i.name]) for i in function.inputs]
    values = run_shape_checks(function, [a.shape for a in arrays])
    storages = [np.zeros(int(evaluate(s.size, values)), dtype=np.uint8) for s in function.storages]
    for host_input, array in zip(function.inputs, arrays):
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        storages[host_input.storage][: raw.size] = raw

    def view(storage: int, dtype: str, shape: tuple[PrimExpr, ...], variables: Mapping[str, int]) -> np.ndarray:
        dims = tuple(int(evaluate(d, variables)) for d in shape)
        count = int(np.prod(dims, dtype=np.int64))
        return storages[storage][: count * DTYPE_SIZES[dtype]].view(dtype).reshape(dims)

    for dispatch in function.dispatches:
        program = programs[dispatch.program]
        program_vars = {name: int(evaluate(value, values)) for name, value in dispatch.size_var_values}
        buffers = []
        for ref, buffer in zip(dispatch.buffers, (*program.inputs, program.output)):
            if ref.kind == "weight":
                buffers.append(function.weights[ref.index].data)
            else:
                buffers.append(view(ref.index, buffer.dtype, buffer.shape, program_vars))
        buffers[-1][...] = run_program(program, buffers[:-1], program_vars)
    return [view(o.storage, o.dtype, o.shape, values).copy() for o in function.outputs]


def used_vars(expressions) -> set[str]:
    return {v.name for e in expressions for v in free_vars(e)}
