"""One traversal of the steps of host functions (``relaxweb/ir/host.py``).

The host level's counterpart of ``relaxweb/ir/functor.py``: the interpreter that runs the
steps with numpy, the WebAssembly emitter of the host module and the printer each
subclass :class:`HostStepFunctor` instead of writing a chain of ``isinstance`` tests.

- :class:`HostStepFunctor` dispatches on the kind of a step through a table: ``visit(step,
  *args)`` calls ``visit_<kind>(step, *args)`` (``visit_dispatch``, ``visit_if``,
  ``visit_sequence_append`` ...), extra arguments passed through (an emitter's indentation).
  A kind missing from the table is an error, and so is a kind whose method a subclass does
  not define (``visit_default`` says which; a backend that cannot handle a kind in some
  place overrides it with its own message).
- :class:`HostStepVisitor` visits every step, into both branches of an ``If`` and a loop's
  body, doing nothing else: an analysis overrides the kinds it cares about.
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Mapping

from .host import (
    HostBind, HostCheck, HostDispatch, HostIf, HostLoop, HostOutputShape, HostRead, HostSequenceAppend,
    HostSequenceClear, HostSequenceInput, HostSequencePresence, HostStep,
)

HOST_STEP_METHODS: Mapping[type, str] = {
    HostDispatch: "visit_dispatch",
    HostBind: "visit_bind",
    HostCheck: "visit_check",
    HostIf: "visit_if",
    HostLoop: "visit_loop",
    HostRead: "visit_read",
    HostOutputShape: "visit_output_shape",
    HostSequenceInput: "visit_sequence_input",
    HostSequencePresence: "visit_sequence_presence",
    HostSequenceClear: "visit_sequence_clear",
    HostSequenceAppend: "visit_sequence_append",
}
"""Each host step kind (exactly its class) -> the method that visits it."""


class HostStepFunctor:
    """Dispatch on host step kinds; subclasses define the ``visit_<kind>`` methods."""

    step_methods: ClassVar[Mapping[type, str]] = HOST_STEP_METHODS

    def visit(self, step: HostStep, *args: Any) -> Any:
        name = self.step_methods.get(type(step))
        if name is None:
            raise TypeError(f"{type(self).__name__}: not a host step kind: {type(step).__name__}")
        method = getattr(self, name, None)
        return self.visit_default(step, *args) if method is None else method(step, *args)

    def visit_steps(self, steps: Iterable[HostStep], *args: Any) -> list:
        """Each step visited in order; their results."""
        return [self.visit(step, *args) for step in steps]

    def visit_default(self, step: HostStep, *args: Any) -> Any:
        """What a functor does with a kind it has no method for: fail, naming both."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(step).__name__} steps")


class HostStepVisitor(HostStepFunctor):
    """Visits every step (both branches of an ``If``, a loop's body), doing nothing else."""

    def visit_dispatch(self, step: HostDispatch) -> None:
        pass

    def visit_bind(self, step: HostBind) -> None:
        pass

    def visit_check(self, step: HostCheck) -> None:
        pass

    def visit_if(self, step: HostIf) -> None:
        self.visit_steps(step.then_steps)
        self.visit_steps(step.else_steps)

    def visit_loop(self, step: HostLoop) -> None:
        self.visit_steps(step.steps)

    def visit_read(self, step: HostRead) -> None:
        pass

    def visit_output_shape(self, step: HostOutputShape) -> None:
        pass

    def visit_sequence_input(self, step: HostSequenceInput) -> None:
        pass

    def visit_sequence_presence(self, step: HostSequencePresence) -> None:
        pass

    def visit_sequence_clear(self, step: HostSequenceClear) -> None:
        pass

    def visit_sequence_append(self, step: HostSequenceAppend) -> None:
        pass
