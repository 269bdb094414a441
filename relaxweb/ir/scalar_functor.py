"""One traversal of the scalar expressions of tensor programs (``relaxweb/ir/tir.py``).

The loop level's counterpart of ``relaxweb/ir/functor.py`` (TVM's ``ExprFunctor`` for
``PrimExpr``): code that looks at scalar expressions by kind subclasses one of these instead
of writing its own chain of ``isinstance`` tests.

- :class:`ScalarFunctor` dispatches on the kind of a node through a table:
  ``visit(e)`` calls ``visit_<kind>(e)`` (``visit_load``, ``visit_binary``, ``visit_reduce``
  ...).  A kind missing from the table is an error, and so is a kind whose method a subclass
  does not define (``visit_default`` says which): a functor that computes a value for every
  kind (a printer, a code generator's expression renderer) defines each method.
- :class:`ScalarVisitor` visits every scalar child by default (a gather's run-time
  indices, a select's three operands, a reduction's body), so an analysis overrides only
  the kinds it cares about.
- :class:`ScalarMutator` rebuilds what its overrides change and returns every unchanged
  node itself (fusion maps every body several times and relies on ``is``).

Index expressions (``PrimExpr``) inside the nodes are not visited: they are symbolic
expressions (``relaxweb.ir.symbolic`` is their traversal).  Bodies are at most 64 levels deep
(fusion caps them), so the traversals recurse.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from .tir import Binary, Cast, Compare, FloatImm, Gather, IndexValue, Load, Reduce, ScalarExpr, Select, Unary

SCALAR_METHODS: Mapping[type, str] = {
    Load: "visit_load",
    Gather: "visit_gather",
    FloatImm: "visit_float_imm",
    IndexValue: "visit_index_value",
    Binary: "visit_binary",
    Unary: "visit_unary",
    Cast: "visit_cast",
    Compare: "visit_compare",
    Select: "visit_select",
    Reduce: "visit_reduce",
}
"""Each scalar expression kind (exactly its class) -> the method that visits it."""


class ScalarFunctor:
    """Dispatch on scalar expression kinds; subclasses define the ``visit_<kind>`` methods."""

    scalar_methods: ClassVar[Mapping[type, str]] = SCALAR_METHODS

    def visit(self, expr: ScalarExpr) -> Any:
        name = self.scalar_methods.get(type(expr))
        if name is None:
            raise TypeError(f"{type(self).__name__}: not a scalar expression kind: {type(expr).__name__}")
        method = getattr(self, name, None)
        return self.visit_default(expr) if method is None else method(expr)

    def visit_default(self, expr: ScalarExpr) -> Any:
        """What a functor does with a kind it has no method for: fail, naming both."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(expr).__name__} expressions")


class ScalarVisitor(ScalarFunctor):
    """Visits every scalar child; override the kinds an analysis needs (call the base
    method, or :meth:`visit_children`, to keep going below them)."""

    def visit_children(self, expr: ScalarExpr) -> None:
        for child in scalar_operands(expr):
            self.visit(child)

    def visit_load(self, expr: Load) -> None:
        pass

    def visit_gather(self, expr: Gather) -> None:
        self.visit_children(expr)

    def visit_float_imm(self, expr: FloatImm) -> None:
        pass

    def visit_index_value(self, expr: IndexValue) -> None:
        pass

    def visit_binary(self, expr: Binary) -> None:
        self.visit_children(expr)

    def visit_unary(self, expr: Unary) -> None:
        self.visit_children(expr)

    def visit_cast(self, expr: Cast) -> None:
        self.visit_children(expr)

    def visit_compare(self, expr: Compare) -> None:
        self.visit_children(expr)

    def visit_select(self, expr: Select) -> None:
        self.visit_children(expr)

    def visit_reduce(self, expr: Reduce) -> None:
        self.visit_children(expr)


class ScalarMutator(ScalarFunctor):
    """Rebuilds bottom-up; each ``visit_<kind>`` returns the node (itself when nothing
    below it changed) or a replacement.  Override a kind and call the base method to get the
    node with its children already rewritten."""

    def visit_load(self, expr: Load) -> ScalarExpr:
        return expr

    def visit_float_imm(self, expr: FloatImm) -> ScalarExpr:
        return expr

    def visit_index_value(self, expr: IndexValue) -> ScalarExpr:
        return expr

    def visit_gather(self, expr: Gather) -> ScalarExpr:
        indices = tuple(self.visit(i) if isinstance(i, ScalarExpr) else i for i in expr.indices)
        return expr if all(i is j for i, j in zip(indices, expr.indices)) else Gather(expr.buffer, indices)

    def visit_binary(self, expr: Binary) -> ScalarExpr:
        a, b = self.visit(expr.a), self.visit(expr.b)
        return expr if a is expr.a and b is expr.b else Binary(expr.op, a, b)

    def visit_compare(self, expr: Compare) -> ScalarExpr:
        a, b = self.visit(expr.a), self.visit(expr.b)
        return expr if a is expr.a and b is expr.b else Compare(expr.op, a, b)

    def visit_unary(self, expr: Unary) -> ScalarExpr:
        a = self.visit(expr.a)
        return expr if a is expr.a else Unary(expr.op, a)

    def visit_cast(self, expr: Cast) -> ScalarExpr:
        a = self.visit(expr.a)
        return expr if a is expr.a else Cast(expr.dtype, a)

    def visit_select(self, expr: Select) -> ScalarExpr:
        condition, a, b = self.visit(expr.condition), self.visit(expr.a), self.visit(expr.b)
        unchanged = condition is expr.condition and a is expr.a and b is expr.b
        return expr if unchanged else Select(condition, a, b)

    def visit_reduce(self, expr: Reduce) -> ScalarExpr:
        body = self.visit(expr.body)
        return expr if body is expr.body else Reduce(expr.combiner, expr.axis, expr.extent, body)


class _Operands(ScalarFunctor):
    """The scalar operands of a node, in order (loads, constants and index values have none)."""

    def visit_load(self, expr: Load) -> tuple[ScalarExpr, ...]:
        return ()

    visit_float_imm = visit_index_value = visit_load

    def visit_gather(self, expr: Gather) -> tuple[ScalarExpr, ...]:
        return tuple(i for i in expr.indices if isinstance(i, ScalarExpr))

    def visit_binary(self, expr: Binary | Compare) -> tuple[ScalarExpr, ...]:
        return (expr.a, expr.b)

    visit_compare = visit_binary

    def visit_unary(self, expr: Unary | Cast) -> tuple[ScalarExpr, ...]:
        return (expr.a,)

    visit_cast = visit_unary

    def visit_select(self, expr: Select) -> tuple[ScalarExpr, ...]:
        return (expr.condition, expr.a, expr.b)

    def visit_reduce(self, expr: Reduce) -> tuple[ScalarExpr, ...]:
        return (expr.body,)


_OPERANDS = _Operands()


def scalar_operands(expr: ScalarExpr) -> tuple[ScalarExpr, ...]:
    """The scalar operands of ``expr`` (its children), in order."""
    return _OPERANDS.visit(expr)
