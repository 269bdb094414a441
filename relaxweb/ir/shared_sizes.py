"""The size variables that sharing gave a tensor program, and the program as a call site runs it.

``share_programs`` (``relaxweb/passes/share_programs.py``) merges the programs that differ
only in integer literals: each literal that differs between the members becomes a size
variable, which each call site binds to its own member's value.  Those variables are not
the model's sizes (a batch, a sequence length): they hold a constant at every call site.
The schedule_programs pass needs to know which they are, because WebGPU's rules read
constant extents (a tile size for a few rows, a long reduction, a multiple of 4) and a
shared program must keep the WebGPU layout its members had; so sharing records them in the
module's attrs under :data:`SHARED_SIZES` (visible in ``--dump-ir``), and
:func:`at_call_site` gives the program back with a call site's values in their place,
literal for literal what that member was.

:func:`map_index_exprs` is the traversal both use: every index expression of a program
(buffer shapes, then the body's load indices, index values, reduction extents and checked
indices' sites and extents, bottom up),
in an order that two programs of one body see alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping

from .symbolic import IntImm, PrimExpr, SizeVar, Sub
from .scalar_functor import ScalarMutator
from .integer_checks import CheckedDivisor, CheckedInteger
from .tir import Buffer, CheckedIndex, Gather, IndexValue, Load, Reduce, ScalarExpr, TensorProgram

SHARED_SIZES = "shared_sizes"
"""The module attrs key: {program name: (the names of the size variables sharing introduced
in it, in order)}."""


def shared_sizes(attrs: Mapping[str, object]) -> dict[str, tuple[str, ...]]:
    """The size variables sharing introduced, by program (none where nothing was shared)."""
    return {name: tuple(names) for name, names in attrs.get(SHARED_SIZES, {}).items()}  # type: ignore[union-attr]


def at_call_site(program: TensorProgram, values: Mapping[str, int]) -> TensorProgram:
    """``program`` with each size variable of ``values`` replaced by its value, undoing what
    sharing wrote for a literal: the variable itself, or ``0 - variable`` for a negative one."""

    def bind(expr: PrimExpr) -> PrimExpr:
        if isinstance(expr, SizeVar):
            return IntImm(values[expr.name]) if expr.name in values else expr
        if isinstance(expr, Sub) and expr.a == IntImm(0) and isinstance(expr.b, SizeVar) and expr.b.name in values:
            return IntImm(-values[expr.b.name])
        if isinstance(expr, IntImm):
            return expr
        return type(expr)(bind(expr.a), bind(expr.b))  # type: ignore[attr-defined]

    return map_index_exprs(program, bind)


def map_index_exprs(program: TensorProgram, index: Callable[[PrimExpr], PrimExpr]) -> TensorProgram:
    """``program`` with ``index(expr)`` in place of each of its index expressions, visited in a
    fixed order (buffer shapes, then the body bottom-up), so two programs of one body see
    theirs in the same positions."""
    buffers = {b.name: Buffer(b.name, tuple(index(d) for d in b.shape), b.dtype)
               for b in (*program.inputs, program.output)}

    return replace(
        program,
        inputs=tuple(buffers[b.name] for b in program.inputs),
        output=buffers[program.output.name],
        body=_IndexExprMapper(buffers, index).visit(program.body),
    )


class _IndexExprMapper(ScalarMutator):
    """:func:`map_index_exprs` of a body: each node rebuilt bottom-up (its children first),
    its index expressions mapped and its buffer replaced by the one of the mapped shapes."""

    def __init__(self, buffers: Mapping[str, Buffer], index: Callable[[PrimExpr], PrimExpr]) -> None:
        self.buffers, self.index = buffers, index

    def visit_load(self, expr: Load) -> ScalarExpr:
        return Load(self.buffers[expr.buffer.name], tuple(self.index(i) for i in expr.indices))

    def visit_gather(self, expr: Gather) -> ScalarExpr:
        expr = super().visit_gather(expr)
        indices = tuple(i if isinstance(i, ScalarExpr) else self.index(i) for i in expr.indices)
        return Gather(self.buffers[expr.buffer.name], indices)

    def visit_index_value(self, expr: IndexValue) -> ScalarExpr:
        return IndexValue(self.index(expr.value))

    def visit_reduce(self, expr: Reduce) -> ScalarExpr:
        expr = super().visit_reduce(expr)
        return Reduce(expr.combiner, expr.axis, self.index(expr.extent), expr.body)

    def visit_checked_index(self, expr: CheckedIndex) -> ScalarExpr:  # the site too: each node keeps its own
        expr = super().visit_checked_index(expr)
        return CheckedIndex(self.index(expr.site), expr.index, self.index(expr.extent))

    def visit_checked_integer(self, expr: CheckedInteger) -> ScalarExpr:
        expr = super().visit_checked_integer(expr)
        return CheckedInteger(self.index(expr.site), expr.value)

    def visit_checked_divisor(self, expr: CheckedDivisor) -> ScalarExpr:
        expr = super().visit_checked_divisor(expr)
        return CheckedDivisor(self.index(expr.site), expr.divisor)
