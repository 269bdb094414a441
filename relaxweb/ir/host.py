"""Host functions: a graph function lowered to what the host module does on each run.

After memory planning, ``lower_shapes_to_host`` turns ``main`` into a :class:`HostFunction`:
the checks on the input shapes that bind the size variables (each with the error message it
reports), the storages with their byte sizes, the weights, and ``steps``: the dispatches in
order, the bindings and run-time checks of ``match_cast``, ``If`` on symbolic conditions,
loops, reads of values back from the GPU, and the output shapes.  Everything symbolic is an
expression of the host's variables, which is exactly what the WebAssembly host module
computes; ``relaxweb/wasm`` emits it and ``interpreter.run_host_function`` runs it with numpy, so the
lowering is testable without a GPU.

A :class:`HostRead` (a data-dependent value) ends a *stage*: the host stops, the runtime
reads the value and resumes.  Each iteration of a :class:`HostLoop` is a stage too (its
dispatches read the iteration's params, which the host writes again for the next one): the
host stops after it and the runtime resumes it at once, without reading anything.  Reads
and loops appear only at the top level of ``steps``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .expr import Constant
from .symbolic import PrimExpr


@dataclass(frozen=True)
class HostInput:
    name: str
    dtype: str
    shape: tuple[PrimExpr, ...]
    storage: int
    sequence: int | None = None  # a sequence input: its table (its elements are in ``storage``)
    optional: bool = False  # an optional sequence input (none: length -1)


@dataclass(frozen=True)
class HostOutput:
    name: str
    dtype: str
    storage: int
    shape: tuple[PrimExpr, ...] | None  # the annotated shape (None: only ndim is known)
    ndim: int
    sequence: int | None = None  # a sequence output: its table (its elements are in ``storage``)
    optional: bool = False  # an optional sequence output (none: length -1)


SEQUENCE_CAPACITY = 1024  # elements in a sequence's table; an insert past it is a run-time error


@dataclass(frozen=True)
class HostSequence:
    """A sequence at run time: a table in the host's memory (its length, and each element's
    ``[ndim, dims...]``) and an arena storage holding the elements' values one after
    another; ``size_var`` is the host variable holding the arena's byte size (the storage's
    size), which grows as elements are appended, ``element_bytes`` per value (as storages
    count them: at least 4, 8 for int64, though the device holds 4)."""

    storage: int
    size_var: str
    dtype: str
    ndim: int  # every element's rank (-1: any)
    element_bytes: int


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
    role: str  # input | intermediate | output | cache


@dataclass(frozen=True)
class HostCache:
    """A KV cache (``passes/place_kv_caches.py``): input ``input`` and output ``output`` live in
    ``storage`` with ``capacity`` rows along ``axis`` (each outer block's rows ``capacity``
    apart), the output's first rows being the input's followed by the run's new ones."""

    input: int
    output: int
    axis: int
    capacity: int
    storage: int


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
class HostLoop:
    """``for variable in range(count): steps`` (no reads or loops among the steps)."""

    variable: str
    count: PrimExpr
    steps: tuple
    note: str


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
class HostSequenceInput:
    """At the start of a run: check sequence input ``sequence``'s table (written by the
    runtime: its length and each element's shape) and compute its arena's size."""

    sequence: int
    input: str
    optional: bool  # an optional sequence input: the runtime writes length -1 for none
    ndim_code: int
    ndim_message: str
    capacity_code: int
    capacity_message: str


@dataclass(frozen=True)
class HostSequencePresence:
    """``variable`` = 1 when optional sequence ``sequence`` holds one (its length is not -1), else 0."""

    sequence: int
    variable: str


@dataclass(frozen=True)
class HostSequenceClear:
    """Sequence ``sequence`` becomes empty (length 0, arena size 0), whatever it held (a
    sequence built in an If branch into the table of the one the other branch keeps)."""

    sequence: int


@dataclass(frozen=True)
class HostSequenceAppend:
    """Append an element of ``shape`` to sequence ``sequence``'s table (its values were just
    copied to the arena's end by the dispatch before this step); fails with ``code`` when
    the table is full."""

    sequence: int
    shape: tuple[PrimExpr, ...]
    code: int
    message: str


@dataclass(frozen=True)
class HostOutputShape:
    output: int
    shape: tuple[PrimExpr, ...]


HostStep = (HostDispatch | HostBind | HostCheck | HostIf | HostLoop | HostRead | HostOutputShape | HostSequenceInput
            | HostSequenceClear | HostSequenceAppend | HostSequencePresence)


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
    sequences: tuple[HostSequence, ...] = ()
    caches: tuple[HostCache, ...] = ()

    def bound_of(self, variable: str) -> int | None:
        return dict(self.bounds).get(variable)

    @property
    def dispatches(self) -> list[HostDispatch]:
        """Every dispatch, in the order of the steps (both branches of an If, a loop's body once)."""
        return [step for step in walk_steps(self.steps) if isinstance(step, HostDispatch)]

    @property
    def error_messages(self) -> list[tuple[int, str]]:
        messages = [(c.code, c.message) for c in self.checks if c.code]
        for step in walk_steps(self.steps):
            if isinstance(step, (HostCheck, HostSequenceAppend)):
                messages.append((step.code, step.message))
            elif isinstance(step, HostSequenceInput):
                messages += [(step.ndim_code, step.ndim_message), (step.capacity_code, step.capacity_message)]
        return sorted(messages)


def walk_steps(steps) -> list:
    found = []
    for step in steps:
        found.append(step)
        if isinstance(step, HostIf):
            found += walk_steps(step.then_steps) + walk_steps(step.else_steps)
        elif isinstance(step, HostLoop):
            found += walk_steps(step.steps)
    return found
