"""The IRModule: graph functions and tensor programs side by side.

Passes read and return modules; a module is never mutated after it is built (use
:meth:`IRModule.replace`).  Keeping both levels in one module lets a pass look across them:
legalization adds tensor programs while rewriting the graph, fusion reads a program's
pattern, and shape lowering reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .expr import Function
from .tir import TensorProgram


@dataclass(frozen=True)
class IRModule:
    functions: dict[str, Function]
    programs: dict[str, TensorProgram] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    """Module-wide facts: ``bounds`` (symbolic var -> upper bound), ``source``, …"""

    @property
    def main(self) -> Function:
        return self.functions["main"]

    def replace(self, **changes: Any) -> IRModule:
        return replace(self, **changes)

    def with_function(self, function: Function) -> IRModule:
        return self.replace(functions={**self.functions, function.name: function})

    def __str__(self) -> str:
        from .printer import format_module

        return format_module(self)
