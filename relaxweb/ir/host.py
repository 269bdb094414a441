"""Host functions: a graph function lowered to what the host module does on each run.

After memory planning, ``lower_shapes_to_host`` turns ``main`` into a :class:`HostFunction`:
the checks on the input shapes that bind the size variables (each with the error message it
reports), the storages with their byte sizes, the weights, and ``steps``: the dispatches in
order, the bindings and run-time checks of ``match_cast``, ``If`` on symbolic conditions,
reads of values back from the GPU, and the output shapes.  Everything symbolic is an
expression of the host's variables, which is exactly what the WebAssembly host module
computes; ``relaxweb/wasm`` emits it and :func:`run_host_function` runs it with numpy, so the
lowering is testable without a GPU.

A :class:`HostRead` (a data-dependent value) ends a *stage*: the host stops, the runtime
reads the value and resumes.  Reads appear only at the top level of ``steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import InputShapeError
from .expr import Constant
from .struct_info import DTYPE_SIZES
from .symbolic import PrimExpr, evaluate, free_vars


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
    storage: int
    shape: tuple[PrimExpr, ...] | None  # the annotated shape (None: only ndim is known)
    ndim: int


@dataclass(frozen=True)
class ShapeCheck:
    """One check of an input's shape, in order.

    ``kind``:
    - ``ndim``: the input has ``expected`` dims;
    - ``bind``: dimension ``dim`` defines size variable ``variable``;
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


# -- steps -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostDispatch:
    """Run ``program`` (a tensor program or library kernel) with ``element_count`` invocations."""

    program: str
    buffers: tuple[BufferRef, ...]
    size_var_values: tuple[tuple[str, PrimExpr], ...]
    element_count: PrimExpr
    note: str


@dataclass(frozen=True)
class HostBind:
    """``variable = value`` (a match_cast binding a new size variable, or an If's result dims)."""

    variable: str
    value: PrimExpr
    note: str


@dataclass(frozen=True)
class HostCheck:
    """A run-time check of a match_cast: ``equal`` (value == expected), ``bound`` (variable
    <= its bound, when it has one; ``value`` is the variable) or ``nonnegative``."""

    kind: str
    value: PrimExpr
    expected: PrimExpr | None
    variable: str | None
    code: int
    message: str


@dataclass(frozen=True)
class HostIf:
    condition: PrimExpr
    then_steps: tuple
    else_steps: tuple


@dataclass(frozen=True)
class HostRead:
    """Stop; the runtime reads the i32 at ``byte_offset`` of ``storage`` into slot ``slot``;
    on resume ``variable`` takes that value."""

    storage: int
    byte_offset: int
    slot: int
    variable: str
    note: str


@dataclass(frozen=True)
class HostOutputShape:
    output: int
    shape: tuple[PrimExpr, ...]


HostStep = HostDispatch | HostBind | HostCheck | HostIf | HostRead | HostOutputShape


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
    steps: tuple[HostStep, ...]
    read_slots: int = 0

    def bound_of(self, variable: str) -> int | None:
        return dict(self.bounds).get(variable)

    @property
    def dispatches(self) -> list[HostDispatch]:
        """Every dispatch, in the order of the steps (both branches of an If)."""
        return [step for step in walk_steps(self.steps) if isinstance(step, HostDispatch)]

    @property
    def error_messages(self) -> list[tuple[int, str]]:
        messages = [(c.code, c.message) for c in self.checks if c.code]
        messages += [(s.code, s.message) for s in walk_steps(self.steps) if isinstance(s, HostCheck)]
        return sorted(messages)


def walk_steps(steps) -> list:
    found = []
    for step in steps:
        found.append(step)
        if isinstance(step, HostIf):
            found += walk_steps(step.then_steps) + walk_steps(step.else_steps)
    return found


def _expr(value) -> PrimExpr:
    from .symbolic import as_expr

    return as_expr(value)


# ----------------------------------------------------------------------------------------
# Running a host function with numpy (the semantics the compiled host + GPU must match)


def fill_message(template: str, value: int, expected: int) -> str:
    return template.replace("{value}", str(value)).replace("{expected}", str(expected))


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
            expected = int(evaluate(_expr(check.expected), values))
            if shape[check.dim] != expected:
                raise InputShapeError(fill_message(check.message, shape[check.dim], expected))
    return values


class _HostRun:
    """One run of a host function on numpy byte buffers."""

    def __init__(self, function: HostFunction, programs: Mapping) -> None:
        self.function = function
        self.programs = programs
        self.values: dict[str, int] = {}
        self.storages = [np.zeros(0, dtype=np.uint8) for _ in function.storages]
        self.output_shapes: dict[int, tuple[int, ...]] = {}

    def value(self, expr: PrimExpr) -> int:
        # Variables not known yet (bound by a later stage) count as 0, as in the host module.
        names = {v.name for v in free_vars(expr)}
        return int(evaluate(expr, {**{n: 0 for n in names}, **self.values}))

    def grow_storages(self) -> None:
        for index, storage in enumerate(self.function.storages):
            needed = self.value(storage.size)
            if needed > self.storages[index].size:
                grown = np.zeros(needed, dtype=np.uint8)
                grown[: self.storages[index].size] = self.storages[index]
                self.storages[index] = grown

    def view(self, storage: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return self.storages[storage][: count * DTYPE_SIZES[dtype]].view(dtype).reshape(shape)

    def run_steps(self, steps) -> None:
        for step in steps:
            if isinstance(step, HostDispatch):
                self.dispatch(step)
            elif isinstance(step, HostBind):
                self.values[step.variable] = self.value(step.value)
                self.grow_storages()
            elif isinstance(step, HostCheck):
                self.check(step)
            elif isinstance(step, HostIf):
                self.run_steps(step.then_steps if self.value(step.condition) != 0 else step.else_steps)
            elif isinstance(step, HostRead):
                raw = self.storages[step.storage][step.byte_offset: step.byte_offset + 4]
                self.values[step.variable] = int(raw.view(np.int32)[0])
                self.grow_storages()
            elif isinstance(step, HostOutputShape):
                self.output_shapes[step.output] = tuple(self.value(d) for d in step.shape)

    def check(self, step: HostCheck) -> None:
        value = self.value(step.value)
        if step.kind == "equal":
            expected = self.value(step.expected)  # type: ignore[arg-type]
            failed = value != expected
        elif step.kind == "bound":
            bound = self.function.bound_of(step.variable)  # type: ignore[arg-type]
            expected = bound if bound is not None else -1
            failed = bound is not None and value > bound
        else:
            expected = 0
            failed = value < 0
        if failed:
            raise InputShapeError(fill_message(step.message, value, expected))

    def dispatch(self, step: HostDispatch) -> None:
        from .interpreter import run_kernel

        kernel = self.programs[step.program]
        kernel_vars = {name: self.value(value) for name, value in step.size_var_values}
        buffers = []
        for ref, buffer in zip(step.buffers, (*kernel.inputs, kernel.output)):
            if ref.kind == "weight":
                buffers.append(self.function.weights[ref.index].data)
            else:
                shape = tuple(int(evaluate(d, kernel_vars)) for d in buffer.shape)
                buffers.append(self.view(ref.index, buffer.dtype, shape))
        buffers[-1][...] = run_kernel(kernel, buffers[:-1], kernel_vars)


def run_host_function(function: HostFunction, programs: Mapping, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    for host_input in function.inputs:
        if host_input.name not in inputs:
            raise InputShapeError(f"missing input '{host_input.name}'")
        given = np.asarray(inputs[host_input.name]).dtype
        if str(given) != host_input.dtype:
            raise InputShapeError(f"input '{host_input.name}': dtype is {given}, expected {host_input.dtype}")
    arrays = [np.asarray(inputs[i.name]) for i in function.inputs]
    run = _HostRun(function, programs)
    run.values = run_shape_checks(function, [a.shape for a in arrays])
    run.grow_storages()
    for host_input, array in zip(function.inputs, arrays):
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        run.storages[host_input.storage][: raw.size] = raw
    run.run_steps(function.steps)
    return [
        run.view(output.storage, output.dtype, run.output_shapes[index]).copy()
        for index, output in enumerate(function.outputs)
    ]


def used_vars(expressions) -> set[str]:
    return {v.name for e in expressions for v in free_vars(e)}
