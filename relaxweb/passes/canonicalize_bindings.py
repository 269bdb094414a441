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
    Binding, CallLibrary, CallTIR, DataflowBlock, DataflowVar, Expr, Function, SeqExpr, Tuple, TupleGetItem, Var,
    VarBinding,
)
from ..ir.functor import Aliases, ExprMutator, use_counts
from ..ir.module import IRModule, drop_uncalled_programs


def canonicalize_bindings(module: IRModule) -> IRModule:
    """Rewrite uses of aliases to their sources and drop unused pure dataflow bindings."""
    functions = {name: _canonicalize(f) if isinstance(f, Function) else f for name, f in module.functions.items()}
    return drop_uncalled_programs(module.replace(functions=functions))


def _canonicalize(function: Function) -> Function:
    body = _AliasRewriter(function).visit_seq_expr(function.body)
    return replace(function, body=_drop_dead(body))


class _AliasRewriter(ExprMutator):
    """Rewrites each use of an alias bound in a dataflow block to what it names.

    An alias is followed when its binding is in a dataflow block and, for ``a = b`` and
    ``a = t[i]``, names a variable visible wherever ``a`` is (a variable visible after its
    block never becomes one local to it); the fields of a tuple bound in a dataflow block
    are always followed.  ``match_cast`` is never looked through: it checks and defines.
    """

    def __init__(self, function: Function) -> None:
        super().__init__()
        self.aliases = Aliases(function)
        self.followed: set[Var] = set()

    def follows(self, var: Var) -> bool:
        return var in self.followed

    def visit_var(self, var: Var) -> Expr:
        return self.aliases.resolve(var, self.follows)

    def visit_tuple_get_item(self, item: TupleGetItem) -> Expr:
        resolved = self.aliases.resolve(item, self.follows)
        return super().visit_tuple_get_item(item) if resolved is item else self.visit_expr(resolved)

    def visit_var_binding(self, binding: VarBinding) -> None:
        value = self.visit_expr(binding.value)
        if self.in_dataflow_block and (isinstance(value, Tuple) or _visible_wherever(value, binding.var)):
            self.followed.add(binding.var)
        self.emit_binding(binding if value is binding.value else VarBinding(binding.var, value))


def _visible_wherever(value: Expr, var: Var) -> bool:
    """Whether ``value`` is a variable that can replace ``var`` at each of its uses."""
    return isinstance(value, Var) and (isinstance(var, DataflowVar) or not isinstance(value, DataflowVar))


def _drop_dead(seq: SeqExpr) -> SeqExpr:
    """Remove pure dataflow bindings whose variable nothing reads, until none is left."""
    while True:
        pruned = _DeadBindingRemover(use_counts(seq)).visit_seq_expr(seq)
        if pruned is seq:
            return seq
        seq = pruned


class _DeadBindingRemover(ExprMutator):
    """Drops the pure bindings of dataflow blocks whose variable is never read."""

    def __init__(self, uses: dict[Var, int]) -> None:
        super().__init__()
        self.uses = uses

    def visit_dataflow_block(self, block: DataflowBlock) -> DataflowBlock:
        kept = tuple(b for b in block.bindings if self.uses.get(b.var, 0) > 0 or not _is_pure(b))
        return block if len(kept) == len(block.bindings) else DataflowBlock(kept)


def _is_pure(binding: Binding) -> bool:
    """Whether a dataflow binding only names or computes a value (no check, no library call)."""
    value = binding.value
    return isinstance(binding, VarBinding) and (
        isinstance(value, (Var, Tuple, TupleGetItem)) or (isinstance(value, CallTIR) and not isinstance(value, CallLibrary)))
