"""Building graph functions binding by binding.

Each emitted value already carries its deduced annotation (ops deduce when the call is
built, see ``relaxweb.ops.call_op``), so the builder only names and records bindings.
"""

from __future__ import annotations

import re

from .expr import DataflowBlock, DataflowVar, Expr, Function, MatchCast, SeqExpr, Tuple, Var, VarBinding
from .struct_info import StructInfo


class FunctionBuilder:
    """Collects the parameters and dataflow bindings of one function."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.params: list[Var] = []
        self.input_names: list[str] = []
        self.bindings: list[VarBinding | MatchCast] = []
        self._used_names: set[str] = set()

    def unique_name(self, hint: str) -> str:
        """A readable, unique name derived from ``hint`` (ONNX names may hold any character)."""
        base = re.sub(r"[^0-9A-Za-z_]", "_", hint) or "v"
        if base[0].isdigit():
            base = "v" + base
        name, counter = base, 1
        while name in self._used_names:
            name = f"{base}_{counter}"
            counter += 1
        self._used_names.add(name)
        return name

    def add_param(self, name: str, struct_info: StructInfo) -> Var:
        var = Var(self.unique_name(name), struct_info)
        self.params.append(var)
        self.input_names.append(name)
        return var

    def emit(self, value: Expr, name_hint: str = "lv", output: bool = False) -> Var:
        """Bind ``value`` to a new variable; ``output`` vars may be used after the block."""
        kind = Var if output else DataflowVar
        var = kind(self.unique_name(name_hint), value.struct_info)
        self.bindings.append(VarBinding(var, value))
        return var

    def emit_match_cast(self, value: Expr, struct_info: StructInfo, name_hint: str = "lv", output: bool = False) -> Var:
        kind = Var if output else DataflowVar
        var = kind(self.unique_name(name_hint), struct_info)
        self.bindings.append(MatchCast(var, value, struct_info))
        return var

    def finish(self, outputs: list[Expr], output_names: list[str]) -> Function:
        """The function returning ``outputs`` (a tuple when there are several)."""
        body: Expr = outputs[0] if len(outputs) == 1 else Tuple(tuple(outputs))
        return Function(
            self.name,
            tuple(self.params),
            SeqExpr((DataflowBlock(tuple(self.bindings)),), body),
            tuple(self.input_names),
            tuple(output_names),
        )
