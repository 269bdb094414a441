"""Symbolic integer expressions: the language of shapes.

A shape dimension is a :class:`PrimExpr`: an integer constant, a named size variable
(``batch``, ``seq``), or arithmetic over them (``+ - *``, floor division, modulo, ``min``,
``max``).  Python operators build expressions and fold constants as they go::

    n = SizeVar("n")
    simplify((n * 4) // 4)        # -> n
    prove_equal(n * 12 * 64, 768 * n)   # -> True
    Analyzer({"n": (0, 63)}).prove_equal(n // 64, 0)   # -> True

:func:`simplify` brings an expression to a canonical form (a polynomial with integer
coefficients over variables and irreducible atoms such as ``n // 3``), so that two
expressions that are equal as polynomials print and compare the same.  Floor division and
modulo by constants fold what they can (``(n * 4) // 8 -> n // 2``, ``(n // 4) // 2 -> n // 8``,
``(n % 8) % 4 -> n % 4``, ``n // 4 * 4 + n % 4 -> n``), and so do division and modulo by an
expression that divides the numerator (``(n * m + m) // m -> n + 1``).

An :class:`Analyzer` knows a range for each variable (by default ``[0, inf)``) and proves
``a == b``, ``a <= b``, ``a < b`` and bounds expressions by interval reasoning over the
canonical form; its :meth:`~Analyzer.simplify` also uses the ranges.  The module-level
:func:`simplify`, :func:`prove_equal`, :func:`prove_not_equal`, :func:`prove_less_equal`,
:func:`prove_less` and :func:`upper_bound` go through an analyzer, so shape equality in the
compiler always goes through it, never through ``==`` on trees.  A proof that fails means
"not proved": two dims neither provably equal nor provably unequal are a fact the model
may rely on, which the compiler checks at run time.

Size variables are integers >= 0.  Division and modulo are floor division and floor modulo
(Python's ``//`` and ``%``); a divisor is assumed non-zero wherever it is evaluated.

This module gathers the parts, each in its own module, and is the one the rest of the
compiler imports:

- ``prim_expr.py``: the nodes, building and folding them, their text, evaluating and walking
  them, and :class:`PrimExprFunctor` (dispatch by kind);
- ``polynomial.py``: the arithmetic of polynomials over atoms;
- ``canonical_form.py``: expressions to polynomials and back (the simplifier);
- ``analyzer.py``: the :class:`Analyzer`: ranges, proofs and bounds;
- here: the default analyzer behind the module-level functions, and :func:`substitute`,
  :func:`upper_bound`, :func:`product`.
"""


from __future__ import annotations

from typing import Iterable, Mapping

from .analyzer import Analyzer
from .polynomial import Bound, Interval, Monomial, Polynomial
from .prim_expr import (
    Add, FloorDiv, FloorMod, IntImm, IntLike, Max, Min, Mul, PrimExpr, PrimExprFunctor, SizeVar, Sub, as_expr, evaluate,
    expr_max, expr_min, expr_size, fold, format_expr, format_shape, format_size_var, free_var_names, free_vars, map_vars,
)

__all__ = [
    "Add", "Analyzer", "Bound", "FloorDiv", "FloorMod", "IntImm", "IntLike", "Interval", "Max", "Min", "Monomial", "Mul",
    "Polynomial", "PrimExpr", "PrimExprFunctor", "SizeVar", "Sub", "as_expr", "as_int", "default_analyzer", "evaluate",
    "expr_max", "expr_min", "expr_size", "format_expr", "format_shape", "format_size_var", "free_var_names", "free_vars",
    "map_vars", "product", "prove_equal", "prove_less", "prove_less_equal", "prove_nondecreasing", "prove_nonnegative",
    "prove_not_equal", "simplify", "substitute", "upper_bound",
]


def substitute(expr: PrimExpr, mapping: Mapping[str, PrimExpr]) -> PrimExpr:
    """Replace variables by expressions (by name); the result is simplified."""
    def visit(node: PrimExpr) -> PrimExpr:
        if isinstance(node, SizeVar):
            return mapping.get(node.name, node)
        if isinstance(node, IntImm):
            return node
        return fold(type(node)(visit(node.a), visit(node.b)))  # type: ignore[attr-defined]

    return simplify(visit(expr))


# ----------------------------------------------------------------------------------------
# The default analyzer: every variable in [0, inf).  The module-level functions use it, so
# every shape comparison in the compiler goes through one Analyzer.

_DEFAULT = Analyzer()


def default_analyzer() -> Analyzer:
    """The analyzer behind the module-level functions (every variable >= 0, no upper bound)."""
    return _DEFAULT


def simplify(expr: IntLike) -> PrimExpr:
    """The canonical form of an expression (see the module docstring)."""
    return _DEFAULT.simplify(expr)


def as_int(expr: IntLike) -> int | None:
    """The value of an expression if it simplifies to a constant, else None."""
    simplified = simplify(expr)
    return simplified.value if isinstance(simplified, IntImm) else None


# ----------------------------------------------------------------------------------------
# Proofs


def prove_equal(a: IntLike, b: IntLike) -> bool:
    """True only when a == b for every assignment of the variables (each >= 0)."""
    return _DEFAULT.prove_equal(a, b)


def prove_not_equal(a: IntLike, b: IntLike) -> bool:
    """True only when a != b for every assignment of the variables (each >= 0): no input
    can make them equal (``3`` vs ``4``, ``n`` vs ``n + 1``)."""
    return _DEFAULT.prove_not_equal(a, b)


def prove_nonnegative(expr: IntLike) -> bool:
    """True only when expr >= 0 for all size variables >= 0."""
    return _DEFAULT.prove_nonnegative(expr)


def prove_less_equal(a: IntLike, b: IntLike) -> bool:
    """True only when a <= b for all size variables >= 0."""
    return _DEFAULT.prove_less_equal(a, b)


def prove_less(a: IntLike, b: IntLike) -> bool:
    """True only when a < b for all size variables >= 0."""
    return _DEFAULT.prove_less(a, b)


def prove_nondecreasing(expr: IntLike) -> bool:
    """True only when expr never decreases as any size variable grows.

    Sufficient test on the canonical form: every coefficient is >= 0 and every atom is a
    variable, a floor division of a non-decreasing expression by a positive constant, or a
    min / max of non-decreasing expressions.  Modulo and division by a variable fail it.
    """
    return _DEFAULT.prove_nondecreasing(expr)


def upper_bound(expr: IntLike, bounds: Mapping[str, int | None]) -> int | None:
    """The largest value of expr with each variable in [0, bounds[name]], or None if unknown.

    Only for expressions that provably never decrease as a variable grows (the sizes of
    tensors and storages are such), whose largest value is their value at the bounds; None
    when some variable of expr has no bound.  (:meth:`Analyzer.upper_bound` bounds any
    expression, not always tightly.)
    """
    simplified = simplify(expr)
    names = [v.name for v in free_vars(simplified)]
    if any(bounds.get(name) is None for name in names):
        return None
    if not prove_nondecreasing(simplified):
        return None
    return Analyzer.from_bounds({name: bounds[name] for name in names}).upper_bound(simplified)


def product(values: Iterable[IntLike]) -> PrimExpr:
    """The simplified product of a sequence of dimensions (1 for an empty one)."""
    result: PrimExpr = IntImm(1)
    for value in values:
        result = result * as_expr(value)
    return simplify(result)
