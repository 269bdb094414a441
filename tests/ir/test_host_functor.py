"""The host-step functor (relaxweb/ir/host_functor.py): its table covers every step kind, the
visitor reaches every step (into If branches and loop bodies), extra arguments pass through,
and the compiler's functors over steps (the interpreter, the host module's WAT, the printer)
handle the kinds they are given."""

from __future__ import annotations

from typing import get_args

import pytest

from relaxweb.ir import interpreter, printer
from relaxweb.ir.host import (
    BufferRef, HostBind, HostCheck, HostDispatch, HostFunction, HostIf, HostLoop, HostOutputShape, HostRead, HostSequenceAppend,
    HostSequenceClear, HostSequenceInput, HostSequencePresence, HostStep, walk_steps,
)
from relaxweb.ir.host_functor import HOST_STEP_METHODS, HostStepFunctor, HostStepVisitor
from relaxweb.ir.symbolic import IntImm, SizeVar
from relaxweb.wasm import emit as wasm_emit

n = SizeVar("n")
DISPATCH = HostDispatch("add", (BufferRef("storage", 0), BufferRef("storage", 1)), (("n", n),), n, "add")
BIND = HostBind("k", n + 1, "k")
CHECK = HostCheck("nonnegative", n, None, None, 1, "n is {value}")
READ = HostRead(0, 0, 0, "r", "read")
SHAPE = HostOutputShape(0, (n,))
SEQUENCE_STEPS = (
    HostSequenceInput(0, "s", False, 2, "rank", 3, "capacity"), HostSequencePresence(0, "present"),
    HostSequenceClear(0), HostSequenceAppend(0, (n,), 4, "full"),
)
STEPS = (
    DISPATCH, READ, HostIf(n, (BIND, HostIf(IntImm(0), (), (CHECK,))), (SHAPE,)),
    HostLoop("i", n, (DISPATCH, BIND), "loop"), *SEQUENCE_STEPS,
)


def test_the_table_names_every_step_kind() -> None:
    assert set(HOST_STEP_METHODS) == set(get_args(HostStep))
    assert len(set(HOST_STEP_METHODS.values())) == len(HOST_STEP_METHODS)
    for method in HOST_STEP_METHODS.values():
        assert callable(getattr(HostStepVisitor, method))


def test_the_visitor_reaches_every_step_in_order() -> None:
    seen = []

    class Collect(HostStepVisitor):
        def visit(self, step):
            seen.append(step)
            return super().visit(step)

    Collect().visit_steps(STEPS)
    assert seen == walk_steps(STEPS)
    assert {type(step) for step in seen} == set(HOST_STEP_METHODS)


def test_extra_arguments_pass_through_and_a_missing_method_names_the_kind() -> None:
    class Indented(HostStepFunctor):
        def visit_bind(self, step, indent):
            return f"{indent}{step.variable}"

    assert Indented().visit_steps([BIND, BIND], "  ") == ["  k", "  k"]
    with pytest.raises(NotImplementedError, match="Indented does not handle HostRead steps"):
        Indented().visit(READ, "")
    with pytest.raises(TypeError, match="not a host step kind: int"):
        Indented().visit(3)


def test_the_interpreter_runs_every_step_kind() -> None:
    defined = {name for name in HOST_STEP_METHODS.values() if name in vars(interpreter._HostRun)}
    assert defined == set(HOST_STEP_METHODS.values())


def empty_function(steps=()) -> HostFunction:
    return HostFunction("host", (), (), ("n", "k", "i", "last"), (), (), (), (), tuple(steps))


def test_the_wasm_emitter_refuses_reads_and_loops_below_the_top_level() -> None:
    function = empty_function()
    emitter = wasm_emit._StepEmitter(function, [], wasm_emit.plan_layout(function, 0), {}, {})
    for step in (READ, HostLoop("i", n, (), "loop")):
        with pytest.raises(ValueError, match=f"cannot emit {type(step).__name__} here"):
            emitter.visit(step, "")


def test_the_printer_writes_the_steps_the_parser_reads() -> None:
    lines: list[str] = []
    printer._format_steps((DISPATCH, HostIf(n, (BIND,), ()), HostLoop("i", n, (CHECK,), "loop"), READ, SHAPE), "", lines)
    assert lines == [
        'dispatch("add", (storage(0), storage(1)), sizes={"n": n}, count=n, note="add")',
        "if n:", '    bind("k", n + 1, note="k")', "else:", "    pass",
        'for i in loop(n, note="loop"):', '    check("nonnegative", n, code=1, message="n is {value}")',
        'read("r", storage=0, offset=0, slot=0, note="read")', "output_shape(0, (n,))",
    ]
    sequence_lines: list[str] = []
    printer._format_steps((HostSequenceClear(0),), "", sequence_lines)
    assert sequence_lines == ["sequence_clear(0)"]  # every step kind prints (tests/ir/test_parser.py reads them back)


def test_a_host_run_follows_the_branch_and_the_loop() -> None:
    run = interpreter._HostRun(empty_function(), {})
    run.values = {"n": 3}
    run.run_steps((HostIf(n, (HostBind("k", n + 1, ""),), (HostBind("k", IntImm(0), ""),)),
                   HostLoop("i", n, (HostBind("last", SizeVar("i") * 2, ""),), ""), HostOutputShape(0, (n, SizeVar("k")))))
    assert run.values == {"n": 3, "k": 4, "i": 2, "last": 4} and run.output_shapes == {0: (3, 4)}
