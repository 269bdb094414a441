"""What the backends' expression renderers share: the WGSL emitter (``relaxweb/wgsl/emit.py``)
and the WebAssembly one (``relaxweb/cpu/emit.py``) each turn the scalar expressions of one
tensor program into values of their language, the same way:

- dispatch by kind (a :class:`~relaxweb.ir.scalar_functor.ScalarFunctor`: ``visit_<kind>(expr,
  indent)`` returns the value's text, statements it needs emitted at ``indent``);
- a memo of the values rendered so far, by scope: a value computed inside a loop body or a
  branch exists only there (:meth:`~ScalarRenderer.open_scope`, :meth:`~ScalarRenderer.close_scope`);
  a schedule may name a value up front (:meth:`~ScalarRenderer.known`: an accumulated reduction);
- a subexpression that occurs more than once in the body (fusion inlines a producer at every
  load of it) computed once into a local of the language (:meth:`~ScalarRenderer.bind_repeated`);
- index expressions lowered (``relaxweb/ir/lower_index.py``) with the ranges of the axes in
  scope (:meth:`~ScalarRenderer.declare_axis`), and the element offset of a load.

A backend specialises it by its op tables (``binary_renderings``, ``unary_renderings``, each
op -> its rendering from the operands' text; :meth:`~ScalarRenderer.operation` picks the entry,
by the operands' dtype where the language needs it) and by the kinds it writes its own way
(loads, gathers, casts, selects, reductions).  This module writes no text of any language.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping

from .access import flat_offset
from .lower_index import AxisBound, Constant, IndexLowering, TargetIndex, bounds_from_relation
from .scalar_functor import ScalarFunctor
from .symbolic import PrimExpr, SizeVar
from .tir import (
    Binary, Buffer, Compare, CompareOp, FloatImm, IndexValue, ScalarExpr, TensorProgram, Unary, repeated_subexpressions,
)

# The comparison that holds where one does not (the else branch of a Select).
_NEGATED = {CompareOp.LT: CompareOp.GE, CompareOp.LE: CompareOp.GT, CompareOp.GT: CompareOp.LE,
            CompareOp.GE: CompareOp.LT, CompareOp.EQ: CompareOp.NE, CompareOp.NE: CompareOp.EQ}


class ScalarRenderer(ScalarFunctor):
    """The values of one tensor program's scalar expressions in a target language.

    A subclass defines :meth:`literal`, :meth:`operation`, :meth:`bind_repeated`,
    :meth:`render_index` and the ``visit_<kind>`` methods of the kinds this base does not
    render (loads, gathers, casts, selects, reductions: each backend's own).
    """

    binary_renderings: ClassVar[Mapping[Any, Any]]
    unary_renderings: ClassVar[Mapping[Any, Any]]
    compare_renderings: ClassVar[Mapping[Any, Any]]

    def __init__(self, program: TensorProgram) -> None:
        self.program = program
        self.repeated = repeated_subexpressions(program.body)
        self.scopes: list[dict[ScalarExpr, str]] = [{}]
        self.index_lowering = IndexLowering()

    # -- scopes and axes

    def open_scope(self) -> None:
        self.scopes.append({})
        self.index_lowering.enter()

    def close_scope(self) -> None:
        self.scopes.pop()
        self.index_lowering.leave()

    def declare_axis(self, axis: SizeVar, extent: PrimExpr) -> None:
        """``axis`` lies in ``[0, extent - 1]`` in the current scope (for the index lowering)."""
        self.index_lowering.declare_axis(axis, extent)

    def branch_bounds(self, condition: ScalarExpr, holds: bool) -> list[AxisBound]:
        """The bounds on the axes in scope where ``condition`` (a Select's) is ``holds``: a
        comparison of two index values (a concatenation's ``i < n``, a padded window's ``h + k
        >= 1``) bounds each axis it reads with coefficient 1; anything else, nothing."""
        if not (isinstance(condition, Compare) and isinstance(condition.a, IndexValue)
                and isinstance(condition.b, IndexValue)):
            return []
        op = condition.op if holds else _NEGATED[condition.op]
        a, b, axes = condition.a.value, condition.b.value, self.index_lowering.axes()
        if op is CompareOp.LT:
            return bounds_from_relation(a + 1, b, axes)
        if op is CompareOp.LE:
            return bounds_from_relation(a, b, axes)
        if op is CompareOp.GT:
            return bounds_from_relation(b + 1, a, axes)
        if op is CompareOp.GE:
            return bounds_from_relation(b, a, axes)
        if op is CompareOp.EQ:
            return bounds_from_relation(a, b, axes) + bounds_from_relation(b, a, axes)
        return []

    def open_branch(self, condition: ScalarExpr, holds: bool) -> None:
        """Opens the scope of a Select's branch (``holds``: the one taken where ``condition``
        holds), with the bounds the condition puts on the axes there."""
        self.open_scope()
        self.index_lowering.assume(self.branch_bounds(condition, holds))

    def branch_value(self, condition: ScalarExpr, holds: bool, render: Callable[[], str]) -> str:
        """``render()``'s value for a Select's branch that the language evaluates whatever the
        condition (a backend's branch-free select): in a scope of its own with the bounds the
        condition puts on the axes where it has any, else in the current scope.  The value is
        used only where the bounds hold; the caller's branches are ones that compute anything
        else harmlessly."""
        bounds = self.branch_bounds(condition, holds)
        if not bounds:
            return render()
        self.open_scope()
        self.index_lowering.assume(bounds)
        value = render()
        self.close_scope()
        return value

    def known(self, expr: ScalarExpr, value: str) -> None:
        """``expr``'s value is ``value`` in the current scope."""
        self.scopes[-1][expr] = value

    def lookup(self, expr: ScalarExpr) -> str | None:
        """``expr``'s value in scope, or None when it has none yet."""
        for scope in reversed(self.scopes):
            if expr in scope:
                return scope[expr]
        return None

    # -- values

    def scalar(self, expr: ScalarExpr, indent: str) -> str:
        """The value of ``expr`` (statements it needs are emitted at ``indent``): the one in
        scope, else rendered, a repeated subexpression bound to a local first."""
        known = self.lookup(expr)
        if known is not None:
            return known
        value = self.visit(expr, indent)
        if expr in self.repeated:
            value = self.bind_repeated(expr, value, indent)
        self.known(expr, value)
        return value

    def bind_repeated(self, expr: ScalarExpr, value: str, indent: str) -> str:
        """The value of a subexpression the body uses more than once, computed into a local
        (or left as it is, where that costs nothing): the name that reads it."""
        raise NotImplementedError

    def literal(self, value: float, dtype: str) -> str:
        """A constant of ``dtype``."""
        raise NotImplementedError

    def operation(self, table: Mapping[Any, Any], op: Any, dtype: str) -> Callable[..., str]:
        """The rendering of ``op`` in ``table`` (one of the op tables) for operands of ``dtype``."""
        raise NotImplementedError

    def visit_float_imm(self, expr: FloatImm, indent: str) -> str:
        return self.literal(expr.value, expr.dtype)

    def visit_index_value(self, expr: IndexValue, indent: str) -> str:
        return self.index(expr.value)

    def visit_binary(self, expr: Binary, indent: str) -> str:
        a, b = self.scalar(expr.a, indent), self.scalar(expr.b, indent)
        return self.operation(self.binary_renderings, expr.op, expr.a.dtype)(a, b)

    def visit_unary(self, expr: Unary, indent: str) -> str:
        return self.operation(self.unary_renderings, expr.op, expr.a.dtype)(self.scalar(expr.a, indent))

    def visit_compare(self, expr: Compare, indent: str) -> str:
        a, b = self.scalar(expr.a, indent), self.scalar(expr.b, indent)
        return self.operation(self.compare_renderings, expr.op, expr.a.dtype)(a, b)

    # -- indices

    def render_index(self, target: TargetIndex) -> str:
        """The text of a lowered index expression (i32)."""
        raise NotImplementedError

    def index(self, expr: PrimExpr) -> str:
        """An i32 value of an index expression: simplified with the ranges of the axes in
        scope, the IR's floor division and modulo lowered (``relaxweb/ir/lower_index.py``)."""
        return self.render_index(self.index_lowering.lower(expr))

    def lowered_offset(self, buffer: Buffer, indices: tuple[PrimExpr, ...]) -> TargetIndex:
        """The element offset of ``buffer[indices]`` (row-major), lowered.

        A load is in bounds wherever it is evaluated, so an offset that is a negative
        constant belongs to a Select branch never taken (``A[(i - 3) // 4]`` is ``A[-1]``
        for an axis of extent 2): such a load reads element 0 instead (WGSL rejects a
        negative constant index when the shader is created)."""
        target = self.index_lowering.lower(flat_offset(buffer, indices))
        if isinstance(target, Constant) and target.value < 0:
            target = Constant(0)
        return target
