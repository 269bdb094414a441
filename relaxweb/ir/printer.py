"""The readable text form of a module (what ``relaxweb inspect`` and ``--dump-ir`` show)."""

from __future__ import annotations

from .expr import (
    AllocStorage, AllocTensor, Call, CallLibrary, CallTIR, CallTIRInto, Constant, DataflowBlock,
    Expr, Function, If, MatchCast, PrimValue, SeqExpr, ShapeExpr, TensorToPrim, Tuple, TupleGetItem, Var,
)
from .symbolic import format_expr
from .tir import format_program


def format_value(expr: Expr) -> str:
    """One expression as text (variables by name, constants by name and shape)."""
    if isinstance(expr, Var):
        return expr.name
    if isinstance(expr, Constant):
        return f"const({expr.name})"
    if isinstance(expr, PrimValue):
        return f"prim({format_expr(expr.value)})"
    if isinstance(expr, TupleGetItem):
        return f"{format_value(expr.tuple_value)}[{expr.index}]"
    if isinstance(expr, TensorToPrim):
        return f"tensor_to_prim({format_value(expr.tensor)})"
    if isinstance(expr, If):
        raise TypeError("If is printed as a statement (format_function)")
    if isinstance(expr, ShapeExpr):
        return "shape([" + ", ".join(format_expr(v) for v in expr.values) + "])"
    if isinstance(expr, Tuple):
        return "(" + ", ".join(format_value(f) for f in expr.fields) + ("," if len(expr.fields) == 1 else "") + ")"
    if isinstance(expr, Call):
        args = [format_value(a) for a in expr.args]
        args += [f"{k}={_format_attr(v)}" for k, v in expr.attrs.items()]
        return f"{expr.op}({', '.join(args)})"
    if isinstance(expr, CallTIR):
        args = ", ".join(format_value(a) for a in expr.args)
        kind = "call_library" if isinstance(expr, CallLibrary) else "call_tir"
        return f"{kind}({expr.program}, ({args}){_format_size_vars(expr.size_var_values)})"
    if isinstance(expr, CallTIRInto):
        args = ", ".join(format_value(a) for a in expr.args)
        return f"call_tir_into({expr.program}, ({args}), out={expr.output.name}{_format_size_vars(expr.size_var_values)})"
    if isinstance(expr, AllocStorage):
        return f"alloc_storage({format_expr(expr.size)} bytes)"
    if isinstance(expr, AllocTensor):
        return f"alloc_tensor({expr.storage.name})"
    raise TypeError(f"cannot print {type(expr).__name__}")


def _format_attr(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_format_attr(v) for v in value) + "]"
    return str(value)


def _format_size_vars(values: tuple) -> str:
    bound = [(name, value) for name, value in values if format_expr(value) != name]
    if not bound:
        return ""
    return ", " + ", ".join(f"{name}={format_expr(value)}" for name, value in bound)


def format_function(function: Function) -> str:
    params = ", ".join(f"{p.name}: {p.struct_info}" for p in function.params)
    lines = [f"@function\ndef {function.name}({params}) -> {function.ret_struct_info}:"]
    _format_seq(function.body, "    ", lines)
    lines[-1] = lines[-1].replace("    yield ", "    return ", 1) if lines[-1].startswith("    yield ") else lines[-1]
    return "\n".join(lines)


def _format_seq(seq: SeqExpr, indent: str, lines: list[str]) -> None:
    """Blocks then ``yield value`` (the function's own sequence says ``return``)."""
    for block in seq.blocks:
        inner = indent
        if isinstance(block, DataflowBlock):
            lines.append(f"{indent}with dataflow():")
            inner = indent + "    "
        for binding in block.bindings:
            head = f"{inner}{binding.var.name}: {binding.var.struct_info} = "
            value = binding.value
            if isinstance(value, If):
                lines.append(f"{head}if {format_value(value.condition)}:")
                _format_seq(value.true_branch, inner + "    ", lines)
                lines.append(f"{inner}else:")
                _format_seq(value.false_branch, inner + "    ", lines)
                continue
            text = format_value(value)
            if isinstance(binding, MatchCast):
                text = f"match_cast({text}, {binding.struct_info})"
            lines.append(head + text)
    lines.append(f"{indent}yield {format_value(seq.body)}")


def format_module(module) -> str:
    """An :class:`~relaxweb.ir.module.IRModule` as text: its programs, then its functions.
    (``module.py`` imports this printer for ``IRModule.__str__``, so the type is not imported
    here.)"""
    parts = [format_program(p) for p in module.programs.values()]
    parts += [format_function(f) for f in module.functions.values()]
    return "\n\n".join(parts) + "\n"


__all__ = ["format_function", "format_module", "format_value"]
