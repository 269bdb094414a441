"""The IRModule: graph functions and tensor programs side by side.

Passes read and return modules; a module is never mutated after it is built (use
:meth:`IRModule.replace`).  Keeping both levels in one module lets a pass look across them:
legalization adds tensor programs while rewriting the graph, fusion reads a program's
pattern, and shape lowering reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .expr import CallTIR, CallTIRInto, Function
from .functor import post_order_visit
from .printer import format_module
from .tir import TensorProgram


@dataclass(frozen=True)
class IRModule:
    functions: dict[str, Function]
    programs: dict[str, TensorProgram] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    """Module-wide facts about the model: ``source`` (its file name), ``opset``; after
    share_programs, ``shared_sizes`` (the size variables it introduced: ``shared_sizes.py``).
    The user's compile settings (bounds, opt level) are not here: see
    ``relaxweb.passes.PassContext``."""

    @property
    def main(self) -> Function:
        return self.functions["main"]

    def replace(self, **changes: Any) -> IRModule:
        return replace(self, **changes)

    def with_function(self, function: Function) -> IRModule:
        return self.replace(functions={**self.functions, function.name: function})

    def __str__(self) -> str:
        return format_module(self)


def drop_uncalled_programs(module: IRModule) -> IRModule:
    """The module without the tensor programs no graph function calls any more (a pass that
    rewrites call sites leaves them behind); library kernels always stay."""
    called: set[str] = set()

    def note_call(expr) -> None:
        if isinstance(expr, (CallTIR, CallTIRInto)):
            called.add(expr.program)

    for function in module.functions.values():
        if isinstance(function, Function):
            post_order_visit(function, note_call)
    return module.replace(programs={
        name: program for name, program in module.programs.items()
        if name in called or not isinstance(program, TensorProgram)
    })


class ProgramTable:
    """The module's programs while a pass adds to them: :meth:`add` reuses the name of an
    identical program (same body, inputs and schedule) and otherwise picks a free name."""

    def __init__(self, programs: dict[str, Any]) -> None:
        self.programs = dict(programs)
        self._by_body = {replace(p, name=""): n for n, p in self.programs.items()}
        self._next_number: dict[str, int] = {}  # name -> the first number add has not tried

    def add(self, program) -> str:
        key = replace(program, name="")
        name = self._by_body.get(key)
        if name is None:
            # numbered from where the last search for this name stopped (names only get taken)
            name, counter = program.name, self._next_number.get(program.name, 1)
            while name in self.programs:
                name = f"{program.name}{counter}"
                counter += 1
            self._next_number[program.name] = counter
            self.programs[name] = replace(program, name=name)
            self._by_body[key] = name
        return name
