"""Symbolic integer expressions, the language of shapes: the nodes, building them, their text,
evaluating and walking them.

A shape dimension is a :class:`PrimExpr`: an integer constant (:class:`IntImm`), a named size
variable (:class:`SizeVar`: ``batch``, ``seq``), or arithmetic over them (``+ - *``, floor
division, modulo, ``min``, ``max``).  Python operators build expressions and fold constants
and identities as they go (``n * 1`` is ``n``); the canonical form and the proofs are the
analyzer's (``canonical_form.py``, ``analyzer.py``; ``symbolic.py`` gathers them all).

Size variables are integers >= 0.  Division and modulo are floor division and floor modulo
(Python's ``//`` and ``%``); a divisor is assumed non-zero wherever it is evaluated.
:class:`PrimExprFunctor` dispatches on the kinds, for code that handles each kind its own way.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Mapping, Union

import numpy as np

from .hash_once import hash_once
from .syntax import format_string, is_plain_name

IntLike = Union["PrimExpr", int]

class PrimExpr:
    """Base of symbolic integer expressions. Subclasses are small frozen dataclasses."""

    def __add__(self, other: IntLike) -> PrimExpr:
        return fold(Add(self, as_expr(other)))

    def __radd__(self, other: IntLike) -> PrimExpr:
        return fold(Add(as_expr(other), self))

    def __sub__(self, other: IntLike) -> PrimExpr:
        return fold(Sub(self, as_expr(other)))

    def __rsub__(self, other: IntLike) -> PrimExpr:
        return fold(Sub(as_expr(other), self))

    def __mul__(self, other: IntLike) -> PrimExpr:
        return fold(Mul(self, as_expr(other)))

    def __rmul__(self, other: IntLike) -> PrimExpr:
        return fold(Mul(as_expr(other), self))

    def __floordiv__(self, other: IntLike) -> PrimExpr:
        return fold(FloorDiv(self, as_expr(other)))

    def __rfloordiv__(self, other: IntLike) -> PrimExpr:
        return fold(FloorDiv(as_expr(other), self))

    def __mod__(self, other: IntLike) -> PrimExpr:
        return fold(FloorMod(self, as_expr(other)))

    def __rmod__(self, other: IntLike) -> PrimExpr:
        return fold(FloorMod(as_expr(other), self))

    def __str__(self) -> str:
        return format_expr(self)


@dataclass(frozen=True, repr=False)
class IntImm(PrimExpr):
    """An integer constant."""

    value: int

    def __repr__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, repr=False)
class SizeVar(PrimExpr):
    """A named integer variable, >= 0. Two SizeVars with the same name are the same variable."""

    name: str

    def __repr__(self) -> str:
        return self.name


@hash_once
@dataclass(frozen=True, repr=False)
class Add(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@hash_once
@dataclass(frozen=True, repr=False)
class Sub(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@hash_once
@dataclass(frozen=True, repr=False)
class Mul(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@hash_once
@dataclass(frozen=True, repr=False)
class FloorDiv(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@hash_once
@dataclass(frozen=True, repr=False)
class FloorMod(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@hash_once
@dataclass(frozen=True, repr=False)
class Min(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@hash_once
@dataclass(frozen=True, repr=False)
class Max(PrimExpr):
    a: PrimExpr
    b: PrimExpr


_BINARY_SYMBOLS = {Add: "+", Sub: "-", Mul: "*", FloorDiv: "//", FloorMod: "%"}
_PRECEDENCE = {Add: 1, Sub: 1, Mul: 2, FloorDiv: 2, FloorMod: 2}


def as_expr(value: IntLike) -> PrimExpr:
    """Wrap a Python int (or a numpy integer) as an IntImm; pass expressions through."""
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, np.integer):
        return IntImm(int(value))
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer expression: {value!r}")
    return IntImm(value)


def expr_min(a: IntLike, b: IntLike) -> PrimExpr:
    return fold(Min(as_expr(a), as_expr(b)))


def expr_max(a: IntLike, b: IntLike) -> PrimExpr:
    return fold(Max(as_expr(a), as_expr(b)))


def _floor_divide(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("symbolic division by zero")
    return a // b


def _floor_modulo(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("symbolic modulo by zero")
    return a % b


OPERATIONS: Mapping[type, Callable[[int, int], int]] = {
    Add: operator.add, Sub: operator.sub, Mul: operator.mul, FloorDiv: _floor_divide, FloorMod: _floor_modulo,
    Min: min, Max: max,
}
"""Each binary kind -> its operation on two ints."""


def apply(kind: type, a: int, b: int) -> int:
    """The value of the binary ``kind`` on two ints."""
    operation = OPERATIONS.get(kind)
    if operation is None:
        raise TypeError(kind)
    return operation(a, b)


def _is_const(expr: PrimExpr, value: int) -> bool:
    return isinstance(expr, IntImm) and expr.value == value


def _fold_add(a: PrimExpr, b: PrimExpr) -> PrimExpr | None:
    return b if _is_const(a, 0) else a if _is_const(b, 0) else None


def _fold_sub(a: PrimExpr, b: PrimExpr) -> PrimExpr | None:
    return a if _is_const(b, 0) else None


def _fold_mul(a: PrimExpr, b: PrimExpr) -> PrimExpr | None:
    if _is_const(a, 1):
        return b
    if _is_const(b, 1):
        return a
    return IntImm(0) if _is_const(a, 0) or _is_const(b, 0) else None


def _fold_floor_div(a: PrimExpr, b: PrimExpr) -> PrimExpr | None:
    return a if _is_const(b, 1) else None


def _fold_floor_mod(a: PrimExpr, b: PrimExpr) -> PrimExpr | None:
    return IntImm(0) if _is_const(b, 1) else None


# The identities of each kind (x + 0, x * 1, x * 0, x // 1, x % 1): the expression they
# leave, or None.
_IDENTITIES: Mapping[type, Callable[[PrimExpr, PrimExpr], PrimExpr | None]] = {
    Add: _fold_add, Sub: _fold_sub, Mul: _fold_mul, FloorDiv: _fold_floor_div, FloorMod: _fold_floor_mod,
}


def fold(expr: PrimExpr) -> PrimExpr:
    """Cheap folding done while building: constants and identities (x+0, x*1, x*0)."""
    a, b = expr.a, expr.b  # type: ignore[attr-defined]
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return IntImm(apply(type(expr), a.value, b.value))
    identity = _IDENTITIES.get(type(expr))
    folded = identity(a, b) if identity is not None else None
    return expr if folded is None else folded


# ----------------------------------------------------------------------------------------
# Printing


def format_expr(expr: PrimExpr, as_written: Mapping[str, str] | None = None) -> str:
    """Readable infix form: ``batch * 256``, ``(n + 3) // 4``, ``min(n, m)``.

    It is Python syntax that ``relaxweb/ir/parser.py`` reads back; a variable whose name is
    not an identifier is written ``size_var["the name"]``.  For a message, ``as_written`` maps
    variables to the names users know them by (as the model wrote them: ``p2o.DynamicDimension.0``),
    written as they are.
    """
    if isinstance(expr, IntImm):
        return str(expr.value)
    if isinstance(expr, SizeVar):
        if as_written is not None:
            return as_written.get(expr.name, expr.name)
        return format_size_var(expr.name)
    if isinstance(expr, (Min, Max)):
        name = "min" if isinstance(expr, Min) else "max"
        return f"{name}({format_expr(expr.a, as_written)}, {format_expr(expr.b, as_written)})"
    kind = type(expr)
    precedence = _PRECEDENCE[kind]

    def operand(child: PrimExpr, right: bool) -> str:
        text = format_expr(child, as_written)
        child_precedence = _PRECEDENCE.get(type(child), 3)
        # A right operand of equal precedence needs parentheses unless regrouping keeps the
        # value: a + (b - c) == a + b - c and a * (b * c) == a * b * c, but a * (b // c) is
        # not a * b // c.
        if child_precedence < precedence or (
            right and child_precedence == precedence and kind is not Add and not (kind is Mul and type(child) is Mul)
        ):
            return f"({text})"
        if isinstance(child, IntImm) and child.value < 0 and right:
            return f"({text})"
        return text

    return f"{operand(expr.a, False)} {_BINARY_SYMBOLS[kind]} {operand(expr.b, True)}"


def format_shape(dims: Iterable[PrimExpr]) -> str:
    """A tuple of expressions as a Python tuple: ``()``, ``(n,)``, ``(n, 4)``."""
    items = [format_expr(d) for d in dims]
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def format_size_var(name: str) -> str:
    """A size variable's name in the text: itself, or quoted when it is not an identifier."""
    return name if is_plain_name(name) else f"size_var[{format_string(name)}]"


# ----------------------------------------------------------------------------------------
# Evaluation and traversal


def _minimum(a: Any, b: Any) -> Any:
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else np.minimum(a, b)


def _maximum(a: Any, b: Any) -> Any:
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else np.maximum(a, b)


# The operations on values that may be numpy integer arrays (a grid of indices).
_EVALUATIONS: Mapping[type, Callable[[Any, Any], Any]] = {**OPERATIONS, Min: _minimum, Max: _maximum}


def evaluate(expr: PrimExpr, values: Mapping[str, object]) -> object:
    """Evaluate with variables bound by name. Values may be ints or numpy integer arrays."""
    if isinstance(expr, IntImm):
        return expr.value
    if isinstance(expr, SizeVar):
        try:
            return values[expr.name]
        except KeyError:
            raise KeyError(f"symbolic variable '{expr.name}' has no value") from None
    a = evaluate(expr.a, values)  # type: ignore[attr-defined]
    b = evaluate(expr.b, values)  # type: ignore[attr-defined]
    operation = _EVALUATIONS.get(type(expr))
    if operation is None:
        raise TypeError(type(expr))
    return operation(a, b)


def free_vars(expr: PrimExpr) -> list[SizeVar]:
    """The distinct size variables of an expression, in order of first appearance."""
    found: dict[str, SizeVar] = {}

    def visit(node: PrimExpr) -> None:
        if isinstance(node, SizeVar):
            found.setdefault(node.name, node)
        elif not isinstance(node, IntImm):
            visit(node.a)  # type: ignore[attr-defined]
            visit(node.b)  # type: ignore[attr-defined]

    visit(expr)
    return list(found.values())


def expr_size(expr: PrimExpr) -> int:
    """How many nodes ``expr`` has (``n`` 1, ``(n + 15) // 16`` 5): the simpler of two
    expressions is the smaller."""
    if isinstance(expr, (IntImm, SizeVar)):
        return 1
    return 1 + expr_size(expr.a) + expr_size(expr.b)  # type: ignore[attr-defined]


def free_var_names(expressions: Iterable[PrimExpr]) -> set[str]:
    """The names of the size variables the expressions use."""
    return {var.name for expr in expressions for var in free_vars(expr)}


def map_vars(expr: PrimExpr, function: Callable[[SizeVar], PrimExpr]) -> PrimExpr:
    """Rebuild an expression with every variable replaced by function(var), unsimplified."""
    if isinstance(expr, SizeVar):
        return function(expr)
    if isinstance(expr, IntImm):
        return expr
    return fold(type(expr)(map_vars(expr.a, function), map_vars(expr.b, function)))  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------------
# Dispatch by kind

PRIM_EXPR_METHODS: Mapping[type, str] = {
    IntImm: "visit_int_imm",
    SizeVar: "visit_size_var",
    Add: "visit_add",
    Sub: "visit_sub",
    Mul: "visit_mul",
    FloorDiv: "visit_floor_div",
    FloorMod: "visit_floor_mod",
    Min: "visit_min",
    Max: "visit_max",
}
"""Each symbolic expression kind (exactly its class) -> the method that visits it."""


class PrimExprFunctor:
    """Dispatch on symbolic expression kinds: ``visit(e, *args)`` calls ``visit_<kind>(e,
    *args)`` (``visit_size_var``, ``visit_floor_div`` ...), extra arguments passed through.
    A kind without a method goes to :meth:`visit_default`, which fails unless a subclass
    gives it a meaning (an analysis of atoms that knows only some kinds)."""

    prim_expr_methods: ClassVar[Mapping[type, str]] = PRIM_EXPR_METHODS
    _dispatch: ClassVar[dict[type, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._build_dispatch()

    @classmethod
    def _build_dispatch(cls) -> None:
        """Each kind's function, looked up once per class (a visit is among the hottest
        calls of the compiler); a kind without a method goes to visit_default."""
        cls._dispatch = {kind: getattr(cls, name, None) or _visit_default for kind, name in cls.prim_expr_methods.items()}

    def visit(self, expr: PrimExpr, *args: Any) -> Any:
        function = self._dispatch.get(type(expr))
        if function is None:
            raise TypeError(f"{type(self).__name__}: not a symbolic expression kind: {type(expr).__name__}")
        return function(self, expr, *args)

    def visit_default(self, expr: PrimExpr, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(expr).__name__} expressions")


def _visit_default(functor: PrimExprFunctor, expr: PrimExpr, *args: Any) -> Any:
    return functor.visit_default(expr, *args)


PrimExprFunctor._build_dispatch()
