"""The well-formedness check every pass test can call.

A graph function is well formed when:
- every variable is defined before it is used, and used only in its scope (bindings inside
  an ``If`` branch or a ``Loop`` body are not visible after it);
- a ``DataflowVar`` is used only inside the dataflow block that defines it;
- every symbolic variable in an annotation is defined before: by a parameter's shape (its
  first appearance there), or by a ``match_cast`` (a loop's iteration variable is defined
  in its body);
- a loop body's next carried values fit the carried variables' annotations;
- each binding's variable is annotated no more specifically than its value (a
  ``match_cast`` may be more specific: it is checked at run time); a ``match_cast``'s
  reason, which starts the one-line error of its check, holds no line break;
- calls of tensor programs and library kernels name programs of the module.
"""

from __future__ import annotations

from .expr import (
    BindingBlock, CallTIR, CallTIRInto, DataflowBlock, DataflowVar, Function, Loop, MatchCast, SeqExpr, Var, VarBinding,
)
from .functor import ScopedVisitor
from .module import IRModule
from .struct_info import StructInfo, is_less_specific
from .symbolic import free_vars


class WellFormedError(AssertionError):
    """A compiler bug: a pass produced an ill-formed module."""


def annotation_vars(info: StructInfo) -> set[str]:
    """The names of the symbolic variables of an annotation (its dims, values and lengths)."""
    return {var.name for expr in info.symbolic_exprs() for var in free_vars(expr)}


class _Checker(ScopedVisitor):
    """Visits one function, noting each problem; ``where`` names the binding being checked
    (or "the result") in the messages."""

    def __init__(self, module: IRModule, function: Function) -> None:
        super().__init__()
        self.module = module
        self.function = function
        self.problems: list[str] = []
        self.size_vars: set[str] = set()  # symbolic variables defined so far, in scope
        self.block: BindingBlock | None = None
        self.where = ""

    def fail(self, message: str) -> None:
        self.problems.append(f"{self.function.name}: {message}")

    def check(self) -> list[str]:
        for param in self.function.params:
            self.size_vars |= annotation_vars(param.struct_info)
        self.visit_function(self.function)
        return self.problems

    def visit_seq_expr(self, seq: SeqExpr) -> None:
        outer = self.where, set(self.size_vars)  # match_casts in an If branch define only there
        self.where = "the result"  # each binding names itself while it is checked
        super().visit_seq_expr(seq)
        self.where, self.size_vars = outer

    def visit_loop(self, node: Loop) -> None:
        outer = set(self.size_vars)
        self.size_vars.add(node.iteration.name)
        super().visit_loop(node)
        for var, info in zip(node.carried, node.body.body.struct_info.fields):
            if not is_less_specific(var.struct_info, info):
                self.fail(f"{self.where}: the loop's next value of '{var.name}' is {info}, "
                          f"but the carried variable is annotated {var.struct_info}")
        self.size_vars = outer

    def visit_block(self, block: BindingBlock) -> None:
        outer, self.block = self.block, block
        super().visit_block(block)
        self.block = outer

    def visit_var_binding(self, binding: VarBinding) -> None:
        outer, self.where = self.where, binding.var.name
        self.visit_expr(binding.value)
        if not is_less_specific(binding.var.struct_info, binding.value.struct_info):
            self.fail(
                f"binding '{binding.var.name}': annotated {binding.var.struct_info}, "
                f"but its value is {binding.value.struct_info}"
            )
        self.check_definition(binding.var)
        self.where = outer

    def visit_match_cast(self, binding: MatchCast) -> None:
        outer, self.where = self.where, binding.var.name
        if "\n" in binding.reason or "\r" in binding.reason:
            self.fail(f"match_cast '{binding.var.name}': its reason {binding.reason!r} spans several lines")
        self.visit_expr(binding.value)
        self.size_vars |= annotation_vars(binding.struct_info)  # checked at run time: may be more specific
        self.check_definition(binding.var)
        self.where = outer

    def check_definition(self, var: Var) -> None:
        undefined = annotation_vars(var.struct_info) - self.size_vars
        if undefined:
            self.fail(f"binding '{var.name}': symbolic variables {sorted(undefined)} are not defined before")
        if isinstance(var, DataflowVar) and not isinstance(self.block, DataflowBlock):
            self.fail(f"dataflow variable '{var.name}' is bound outside a dataflow block")
        self.visit_var_def(var)

    def visit_var(self, var: Var) -> None:
        if not self.in_scope(var):
            kind = "dataflow variable" if isinstance(var, DataflowVar) else "variable"
            self.fail(f"{self.where}: uses {kind} '{var.name}' outside its scope or before its definition")

    def visit_call_tir(self, call: CallTIR) -> None:
        super().visit_call_tir(call)
        self.check_program(call.program)

    def visit_call_tir_into(self, call: CallTIRInto) -> None:
        super().visit_call_tir_into(call)
        self.check_program(call.program)

    def check_program(self, name: str) -> None:
        if name not in self.module.programs:
            self.fail(f"{self.where}: calls program '{name}', which is not in the module")


def well_formed_problems(module: IRModule) -> list[str]:
    problems: list[str] = []
    for function in module.functions.values():
        if isinstance(function, Function):
            problems += _Checker(module, function).check()
    return problems


def check_well_formed(module: IRModule) -> None:
    """Raise WellFormedError listing every problem, or return None."""
    problems = well_formed_problems(module)
    if problems:
        raise WellFormedError("the module is not well formed:\n  " + "\n  ".join(problems))
