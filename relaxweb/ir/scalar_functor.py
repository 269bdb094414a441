"""One traversal of the scalar expressions of tensor programs (``relaxweb/ir/tir.py``).

The loop level's counterpart of ``relaxweb/ir/functor.py`` (TVM's ``ExprFunctor`` for
``PrimExpr``): code that looks at scalar expressions by kind subclasses one of these instead
of writing its own chain of ``isinstance`` tests.

- :class:`ScalarFunctor` dispatches on the kind of a node through a table:
  ``visit(e, *args)`` calls ``visit_<kind>(e, *args)`` (``visit_load``, ``visit_binary``,
  ``visit_reduce`` ...); extra arguments are passed through (a renderer's indentation).  A
  kind missing from the table is an error, and so is a kind whose method a subclass does not
  define (``visit_default`` says which): a functor that computes a value for every kind (a
  printer, a code generator's expression renderer) defines each method.
- :class:`ScalarVisitor` visits every scalar child by default (a gather's run-time
  indices, a select's three operands, a reduction's body), so an analysis overrides only
  the kinds it cares about.
- :class:`ScalarMutator` rebuilds what its overrides change and returns every unchanged
  node itself (fusion maps every body several times and relies on ``is``).

Each node class names its kind (``Load.scalar_kind == "load"``, as TVM's type keys): the
node classes are defined in ``tir.py``, which builds its printer and rewrites on this module,
so this module does not import them.

Index expressions (``PrimExpr``) inside the nodes are not visited: they are symbolic
expressions (``relaxweb.ir.symbolic`` is their traversal).  Bodies are at most 64 levels deep
(fusion caps them), so the traversals recurse.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping

from .symbolic import PrimExpr

ScalarNode = Any
"""A ``relaxweb.ir.tir.ScalarExpr`` (not imported here: ``tir`` imports this module)."""

SCALAR_METHODS: Mapping[str, str] = {
    "load": "visit_load",
    "gather": "visit_gather",
    "float_imm": "visit_float_imm",
    "index_value": "visit_index_value",
    "binary": "visit_binary",
    "unary": "visit_unary",
    "cast": "visit_cast",
    "compare": "visit_compare",
    "select": "visit_select",
    "reduce": "visit_reduce",
    "checked_index": "visit_checked_index",
    "checked_integer": "visit_checked_integer",
    "checked_divisor": "visit_checked_divisor",
}
"""Each scalar expression kind (its class's ``scalar_kind``) -> the method that visits it."""


class ScalarFunctor:
    """Dispatch on scalar expression kinds; subclasses define the ``visit_<kind>`` methods."""

    scalar_methods: ClassVar[Mapping[str, str]] = SCALAR_METHODS
    _dispatch: ClassVar[dict[str, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._build_dispatch()

    @classmethod
    def _build_dispatch(cls) -> None:
        """Each kind's function, looked up once per class (a visit is among the hottest
        calls of the compiler); a kind without a method goes to visit_default."""
        cls._dispatch = {kind: getattr(cls, name, None) or _visit_default for kind, name in cls.scalar_methods.items()}

    def visit(self, expr: ScalarNode, *args: Any) -> Any:
        try:
            function = self._dispatch[expr.scalar_kind]
        except (AttributeError, KeyError):
            raise TypeError(f"{type(self).__name__}: not a scalar expression kind: {type(expr).__name__}") from None
        return function(self, expr, *args)

    # ``visit`` itself, for a subclass that overrides ``visit`` to act around every node
    # (``super().visit`` would be one more call per node).
    visit_kind = visit

    def visit_default(self, expr: ScalarNode, *args: Any) -> Any:
        """What a functor does with a kind it has no method for: fail, naming both."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(expr).__name__} expressions")


def _visit_default(functor: ScalarFunctor, expr: ScalarNode, *args: Any) -> Any:
    return functor.visit_default(expr, *args)


ScalarFunctor._build_dispatch()


def is_index_expr(index: Any) -> bool:
    """Whether an index of a gather is an index expression (else a scalar computed at run time)."""
    return isinstance(index, PrimExpr)


class ScalarVisitor(ScalarFunctor):
    """Visits every scalar child; override the kinds an analysis needs (call the base
    method, or :meth:`visit_children`, to keep going below them)."""

    def visit_children(self, expr: ScalarNode) -> None:
        for child in scalar_operands(expr):
            self.visit(child)

    def visit_load(self, expr: ScalarNode) -> None:
        pass

    def visit_gather(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_float_imm(self, expr: ScalarNode) -> None:
        pass

    def visit_index_value(self, expr: ScalarNode) -> None:
        pass

    def visit_binary(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_unary(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_cast(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_compare(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_select(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_reduce(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_checked_index(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_checked_integer(self, expr: ScalarNode) -> None:
        self.visit_children(expr)

    def visit_checked_divisor(self, expr: ScalarNode) -> None:
        self.visit_children(expr)


class ScalarMutator(ScalarFunctor):
    """Rebuilds bottom-up; each ``visit_<kind>`` returns the node (itself when nothing
    below it changed) or a replacement.  Override a kind and call the base method to get the
    node with its children already rewritten."""

    def visit_load(self, expr: ScalarNode) -> ScalarNode:
        return expr

    def visit_float_imm(self, expr: ScalarNode) -> ScalarNode:
        return expr

    def visit_index_value(self, expr: ScalarNode) -> ScalarNode:
        return expr

    # A changed node is built again from its fields in their order (Gather(buffer, indices),
    # Binary(op, a, b), Cast(dtype, a) ...): its class is the node's own.

    def visit_gather(self, expr: ScalarNode) -> ScalarNode:
        indices = tuple(i if is_index_expr(i) else self.visit(i) for i in expr.indices)
        return expr if all(i is j for i, j in zip(indices, expr.indices)) else type(expr)(expr.buffer, indices)

    def visit_binary(self, expr: ScalarNode) -> ScalarNode:
        a, b = self.visit(expr.a), self.visit(expr.b)
        return expr if a is expr.a and b is expr.b else type(expr)(expr.op, a, b)

    visit_compare = visit_binary

    def visit_unary(self, expr: ScalarNode) -> ScalarNode:
        a = self.visit(expr.a)
        return expr if a is expr.a else type(expr)(expr.op, a)

    def visit_cast(self, expr: ScalarNode) -> ScalarNode:
        a = self.visit(expr.a)
        return expr if a is expr.a else type(expr)(expr.dtype, a)

    def visit_select(self, expr: ScalarNode) -> ScalarNode:
        condition, a, b = self.visit(expr.condition), self.visit(expr.a), self.visit(expr.b)
        unchanged = condition is expr.condition and a is expr.a and b is expr.b
        return expr if unchanged else type(expr)(condition, a, b)

    def visit_reduce(self, expr: ScalarNode) -> ScalarNode:
        body = self.visit(expr.body)
        return expr if body is expr.body else type(expr)(expr.combiner, expr.axis, expr.extent, body)

    def visit_checked_index(self, expr: ScalarNode) -> ScalarNode:
        index = self.visit(expr.index)
        return expr if index is expr.index else type(expr)(expr.site, index, expr.extent)

    def visit_checked_integer(self, expr: ScalarNode) -> ScalarNode:
        value = self.visit(expr.value)
        return expr if value is expr.value else type(expr)(expr.site, value)

    def visit_checked_divisor(self, expr: ScalarNode) -> ScalarNode:
        divisor = self.visit(expr.divisor)
        return expr if divisor is expr.divisor else type(expr)(expr.site, divisor)


# The scalar operands of each kind, in order (loads, constants and index values have none): a
# table, as scalar_operands is the hottest traversal of all (every walk of a body).
_OPERANDS: Mapping[str, Callable[[Any], tuple]] = {
    "load": lambda expr: (),
    "float_imm": lambda expr: (),
    "index_value": lambda expr: (),
    "gather": lambda expr: tuple(i for i in expr.indices if not isinstance(i, PrimExpr)),
    "binary": lambda expr: (expr.a, expr.b),
    "compare": lambda expr: (expr.a, expr.b),
    "unary": lambda expr: (expr.a,),
    "cast": lambda expr: (expr.a,),
    "select": lambda expr: (expr.condition, expr.a, expr.b),
    "reduce": lambda expr: (expr.body,),
    "checked_index": lambda expr: (expr.index,),
    "checked_integer": lambda expr: (expr.value,),
    "checked_divisor": lambda expr: (expr.divisor,),
}


def scalar_operands(expr: ScalarNode) -> tuple:
    """The scalar operands of ``expr`` (its children), in order."""
    return _OPERANDS[expr.scalar_kind](expr)
