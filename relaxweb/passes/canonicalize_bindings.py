"""canonicalize_bindings: read values where they are computed, and drop dead bindings.

Importers leave aliases between a value and its readers: ``b = a``, and a tuple built only
to be taken apart again (ONNX ``Split`` gives ``parts = (s0, s1, s2)`` then
``out0 = parts[0]`` ...).  A reader of ``out0`` then reads a variable no kernel computes,
and fusion, which merges a kernel into the kernels that read its result, cannot see that
``out0`` *is* ``s0``.  This pass rewrites every use of an alias to the value it names (a
variable, or a tuple's field), then removes dataflow bindings nothing reads any more
(aliases, tuples and tensor-program calls, which are pure inside a dataflow block).
Bindings outside dataflow blocks, ``match_cast`` (it checks and defines size variables)
and library calls are kept.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.expr import (
    Call, CallLibrary, CallTIR, DataflowBlock, DataflowVar, Expr, Function, If, SeqExpr, TensorToPrim, Tuple,
    TupleGetItem, Var, VarBinding, use_counts,
)
from ..ir.module import IRModule, drop_uncalled_programs


def canonicalize_bindings(module: IRModule) -> IRModule:
    """Rewrite uses of aliases to their sources and drop unused pure dataflow bindings."""
    functions = {name: _canonicalize(f) if isinstance(f, Function) else f for name, f in module.functions.items()}
    return drop_uncalled_programs(module.replace(functions=functions))


def _canonicalize(function: Function) -> Function:
    aliases: dict[Var, Expr] = {}
    tuples: dict[Var, Tuple] = {}

    def resolve(expr: Expr) -> Expr:
        if isinstance(expr, Var):
            return aliases.get(expr, expr)
        if isinstance(expr, Tuple):
            return Tuple(tuple(resolve(f) for f in expr.fields))
        if isinstance(expr, TupleGetItem):
            source = resolve(expr.tuple_value)
            if isinstance(source, Var) and source in tuples:
                return tuples[source].fields[expr.index]
            return TupleGetItem(source, expr.index)
        if isinstance(expr, TensorToPrim):
            return TensorToPrim(resolve(expr.tensor))
        if isinstance(expr, (Call, CallTIR)):
            return replace(expr, args=tuple(resolve(a) for a in expr.args))
        if isinstance(expr, If):
            return If(resolve(expr.condition), visit(expr.true_branch), visit(expr.false_branch))
        return expr

    def visit(seq: SeqExpr) -> SeqExpr:
        blocks = []
        for block in seq.blocks:
            bindings = []
            for binding in block.bindings:
                value = resolve(binding.value)
                if isinstance(binding, VarBinding) and isinstance(block, DataflowBlock):
                    # (a variable visible after the block never becomes one local to it)
                    if isinstance(value, Var) and (isinstance(binding.var, DataflowVar) or not isinstance(value, DataflowVar)):
                        aliases[binding.var] = value
                    if isinstance(value, Tuple):
                        tuples[binding.var] = value
                bindings.append(replace(binding, value=value) if value is not binding.value else binding)
            blocks.append(type(block)(tuple(bindings)))
        return SeqExpr(tuple(blocks), resolve(seq.body))

    body = _drop_dead(visit(function.body))
    return replace(function, body=body)


def _drop_dead(seq: SeqExpr) -> SeqExpr:
    """Remove pure dataflow bindings whose variable nothing reads, until none is left."""
    while True:
        uses = use_counts(seq)
        removed = False
        blocks = []
        for block in seq.blocks:
            kept = []
            for binding in block.bindings:
                pure = isinstance(binding, VarBinding) and isinstance(block, DataflowBlock) and (
                    isinstance(binding.value, (Var, Tuple, TupleGetItem))
                    or (isinstance(binding.value, CallTIR) and not isinstance(binding.value, CallLibrary)))
                if pure and uses.get(binding.var, 0) == 0:
                    removed = True
                    continue
                kept.append(binding)
            blocks.append(type(block)(tuple(kept)))
        seq = SeqExpr(tuple(blocks), seq.body)
        if not removed:
            return seq
