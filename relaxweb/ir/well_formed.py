"""The well-formedness check every pass test can call.

A graph function is well formed when:
- every variable is defined before it is used, and used only in its scope (bindings inside
  an ``If`` branch are not visible after it);
- a ``DataflowVar`` is used only inside the dataflow block that defines it;
- every symbolic variable in an annotation is defined before: by a parameter's shape (its
  first appearance there), or by a ``match_cast``;
- each binding's variable is annotated no more specifically than its value (a
  ``match_cast`` may be more specific: it is checked at run time);
- calls of tensor programs and library kernels name programs of the module.
"""

from __future__ import annotations

from .expr import (
    AllocTensor, Call, CallTIR, CallTIRInto, DataflowBlock, DataflowVar, Expr, Function, If, MatchCast,
    SeqExpr, TensorToPrim, Tuple, TupleGetItem, Var,
)
from .module import IRModule
from .struct_info import (
    PrimStructInfo, ShapeStructInfo, StructInfo, TensorStructInfo, TupleStructInfo, is_less_specific,
)
from .symbolic import free_vars


class WellFormedError(AssertionError):
    """A compiler bug: a pass produced an ill-formed module."""


def annotation_vars(info: StructInfo) -> set[str]:
    if isinstance(info, TensorStructInfo) and info.shape is not None:
        return {v.name for d in info.shape for v in free_vars(d)}
    if isinstance(info, ShapeStructInfo) and info.values is not None:
        return {v.name for d in info.values for v in free_vars(d)}
    if isinstance(info, PrimStructInfo) and info.value is not None:
        return {v.name for v in free_vars(info.value)}
    if isinstance(info, TupleStructInfo):
        return set().union(*(annotation_vars(f) for f in info.fields)) if info.fields else set()
    return set()


class _Checker:
    def __init__(self, module: IRModule, function: Function) -> None:
        self.module = module
        self.function = function
        self.problems: list[str] = []

    def fail(self, message: str) -> None:
        self.problems.append(f"{self.function.name}: {message}")

    def check(self) -> list[str]:
        defined: set[int] = set()
        size_vars: set[str] = set()
        for param in self.function.params:
            defined.add(id(param))
            size_vars |= annotation_vars(param.struct_info)
        self.check_seq(self.function.body, defined, size_vars, top_level=True)
        return self.problems

    def check_seq(self, seq: SeqExpr, defined: set[int], size_vars: set[str], top_level: bool = False) -> None:
        defined = set(defined)
        size_vars = set(size_vars)
        for block in seq.blocks:
            block_vars: set[int] = set()
            for binding in block.bindings:
                self.check_uses(binding.value, defined, binding.var.name)
                if isinstance(binding.value, If):
                    self.check_uses(binding.value.condition, defined, binding.var.name)
                    self.check_seq(binding.value.true_branch, defined, size_vars)
                    self.check_seq(binding.value.false_branch, defined, size_vars)
                if isinstance(binding, MatchCast):
                    size_vars |= annotation_vars(binding.struct_info)
                else:
                    if not is_less_specific(binding.var.struct_info, binding.value.struct_info):
                        self.fail(
                            f"binding '{binding.var.name}': annotated {binding.var.struct_info}, "
                            f"but its value is {binding.value.struct_info}"
                        )
                undefined = annotation_vars(binding.var.struct_info) - size_vars
                if undefined:
                    self.fail(f"binding '{binding.var.name}': symbolic variables {sorted(undefined)} are not defined before")
                if isinstance(binding.var, DataflowVar) and not isinstance(block, DataflowBlock):
                    self.fail(f"dataflow variable '{binding.var.name}' is bound outside a dataflow block")
                defined.add(id(binding.var))
                if isinstance(binding.var, DataflowVar):
                    block_vars.add(id(binding.var))
            if isinstance(block, DataflowBlock):
                defined -= block_vars  # dataflow vars do not escape their block
        self.check_uses(seq.body, defined, "the result")

    def check_uses(self, expr: Expr, defined: set[int], where: str) -> None:
        for var in _used_vars(expr):
            if id(var) not in defined:
                kind = "dataflow variable" if isinstance(var, DataflowVar) else "variable"
                self.fail(f"{where}: uses {kind} '{var.name}' outside its scope or before its definition")
        if isinstance(expr, (CallTIR, CallTIRInto)) and expr.program not in self.module.programs:
            self.fail(f"{where}: calls program '{expr.program}', which is not in the module")


def _used_vars(expr: Expr) -> list[Var]:
    if isinstance(expr, Var):
        return [expr]
    if isinstance(expr, Tuple):
        return [v for f in expr.fields for v in _used_vars(f)]
    if isinstance(expr, TupleGetItem):
        return _used_vars(expr.tuple_value)
    if isinstance(expr, TensorToPrim):
        return _used_vars(expr.tensor)
    if isinstance(expr, (Call, CallTIR)):
        return [v for a in expr.args for v in _used_vars(a)]
    if isinstance(expr, CallTIRInto):
        return [v for a in expr.args for v in _used_vars(a)] + [expr.output]
    if isinstance(expr, AllocTensor):
        return [expr.storage]
    return []


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
