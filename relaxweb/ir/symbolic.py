"""Symbolic integer expressions: the language of shapes.

A shape dimension is a :class:`PrimExpr`: an integer constant, a named size variable
(``batch``, ``seq``), or arithmetic over them (``+ - *``, floor division, modulo, ``min``,
``max``).  Python operators build expressions and fold constants as they go::

    n = SizeVar("n")
    simplify((n * 4) // 4)        # -> n
    prove_equal(n * 12 * 64, 768 * n)   # -> True

:func:`simplify` brings an expression to a canonical form (a polynomial with integer
coefficients over variables and irreducible atoms such as ``n // 3``), so that two
expressions that are equal as polynomials print and compare the same.  Shape equality in the
compiler always goes through :func:`prove_equal`, never through ``==`` on trees.

Size variables are integers >= 0.  Division and modulo are floor division and floor modulo
(Python's ``//`` and ``%``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Union

IntLike = Union["PrimExpr", int]


class PrimExpr:
    """Base of symbolic integer expressions. Subclasses are small frozen dataclasses."""

    def __add__(self, other: IntLike) -> PrimExpr:
        return _fold(Add(self, as_expr(other)))

    def __radd__(self, other: IntLike) -> PrimExpr:
        return _fold(Add(as_expr(other), self))

    def __sub__(self, other: IntLike) -> PrimExpr:
        return _fold(Sub(self, as_expr(other)))

    def __rsub__(self, other: IntLike) -> PrimExpr:
        return _fold(Sub(as_expr(other), self))

    def __mul__(self, other: IntLike) -> PrimExpr:
        return _fold(Mul(self, as_expr(other)))

    def __rmul__(self, other: IntLike) -> PrimExpr:
        return _fold(Mul(as_expr(other), self))

    def __floordiv__(self, other: IntLike) -> PrimExpr:
        return _fold(FloorDiv(self, as_expr(other)))

    def __rfloordiv__(self, other: IntLike) -> PrimExpr:
        return _fold(FloorDiv(as_expr(other), self))

    def __mod__(self, other: IntLike) -> PrimExpr:
        return _fold(FloorMod(self, as_expr(other)))

    def __rmod__(self, other: IntLike) -> PrimExpr:
        return _fold(FloorMod(as_expr(other), self))

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


@dataclass(frozen=True, repr=False)
class Add(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@dataclass(frozen=True, repr=False)
class Sub(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@dataclass(frozen=True, repr=False)
class Mul(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@dataclass(frozen=True, repr=False)
class FloorDiv(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@dataclass(frozen=True, repr=False)
class FloorMod(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@dataclass(frozen=True, repr=False)
class Min(PrimExpr):
    a: PrimExpr
    b: PrimExpr


@dataclass(frozen=True, repr=False)
class Max(PrimExpr):
    a: PrimExpr
    b: PrimExpr


_BINARY_SYMBOLS = {Add: "+", Sub: "-", Mul: "*", FloorDiv: "//", FloorMod: "%"}
_PRECEDENCE = {Add: 1, Sub: 1, Mul: 2, FloorDiv: 2, FloorMod: 2}


def as_expr(value: IntLike) -> PrimExpr:
    """Wrap a Python int as an IntImm; pass expressions through."""
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                return IntImm(int(value))
        except ImportError:  # pragma: no cover - numpy is a dependency
            pass
        raise TypeError(f"not an integer expression: {value!r}")
    return IntImm(value)


def expr_min(a: IntLike, b: IntLike) -> PrimExpr:
    return _fold(Min(as_expr(a), as_expr(b)))


def expr_max(a: IntLike, b: IntLike) -> PrimExpr:
    return _fold(Max(as_expr(a), as_expr(b)))


def _fold(expr: PrimExpr) -> PrimExpr:
    """Cheap folding done while building: constants and identities (x+0, x*1, x*0)."""
    a, b = expr.a, expr.b  # type: ignore[attr-defined]
    if isinstance(a, IntImm) and isinstance(b, IntImm):
        return IntImm(_apply(type(expr), a.value, b.value))
    if isinstance(expr, Add):
        if _is_const(a, 0):
            return b
        if _is_const(b, 0):
            return a
    if isinstance(expr, Sub) and _is_const(b, 0):
        return a
    if isinstance(expr, Mul):
        if _is_const(a, 1):
            return b
        if _is_const(b, 1):
            return a
        if _is_const(a, 0) or _is_const(b, 0):
            return IntImm(0)
    if isinstance(expr, FloorDiv) and _is_const(b, 1):
        return a
    if isinstance(expr, FloorMod) and _is_const(b, 1):
        return IntImm(0)
    return expr


def _is_const(expr: PrimExpr, value: int) -> bool:
    return isinstance(expr, IntImm) and expr.value == value


def _apply(kind: type, a: int, b: int) -> int:
    if kind is Add:
        return a + b
    if kind is Sub:
        return a - b
    if kind is Mul:
        return a * b
    if kind is FloorDiv:
        if b == 0:
            raise ZeroDivisionError("symbolic division by zero")
        return a // b
    if kind is FloorMod:
        if b == 0:
            raise ZeroDivisionError("symbolic modulo by zero")
        return a % b
    if kind is Min:
        return min(a, b)
    if kind is Max:
        return max(a, b)
    raise TypeError(kind)


# ----------------------------------------------------------------------------------------
# Printing


def format_expr(expr: PrimExpr) -> str:
    """Readable infix form: ``batch * 256``, ``(n + 3) // 4``, ``min(n, m)``."""
    if isinstance(expr, IntImm):
        return str(expr.value)
    if isinstance(expr, SizeVar):
        return expr.name
    if isinstance(expr, (Min, Max)):
        name = "min" if isinstance(expr, Min) else "max"
        return f"{name}({format_expr(expr.a)}, {format_expr(expr.b)})"
    kind = type(expr)
    precedence = _PRECEDENCE[kind]

    def operand(child: PrimExpr, right: bool) -> str:
        text = format_expr(child)
        child_precedence = _PRECEDENCE.get(type(child), 3)
        if child_precedence < precedence or (right and child_precedence == precedence and kind is not Add and kind is not Mul):
            return f"({text})"
        if isinstance(child, IntImm) and child.value < 0 and right:
            return f"({text})"
        return text

    return f"{operand(expr.a, False)} {_BINARY_SYMBOLS[kind]} {operand(expr.b, True)}"


# ----------------------------------------------------------------------------------------
# Evaluation and traversal


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
    if isinstance(expr, (Min, Max)) and not (isinstance(a, int) and isinstance(b, int)):
        import numpy as np

        return np.minimum(a, b) if isinstance(expr, Min) else np.maximum(a, b)
    return _apply(type(expr), a, b)  # type: ignore[arg-type]


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


def substitute(expr: PrimExpr, mapping: Mapping[str, PrimExpr]) -> PrimExpr:
    """Replace variables by expressions (by name); the result is simplified."""
    def visit(node: PrimExpr) -> PrimExpr:
        if isinstance(node, SizeVar):
            return mapping.get(node.name, node)
        if isinstance(node, IntImm):
            return node
        return _fold(type(node)(visit(node.a), visit(node.b)))  # type: ignore[attr-defined]

    return simplify(visit(expr))


# ----------------------------------------------------------------------------------------
# Canonical form: polynomials over atoms
#
# A polynomial maps a monomial (a sorted tuple of (atom key, power)) to its integer
# coefficient.  Atoms are SizeVars and the irreducible FloorDiv/FloorMod/Min/Max terms, whose
# operands are themselves in canonical form.  Atoms are keyed by their printed text, which is
# canonical once their operands are.

Monomial = tuple[tuple[str, int], ...]
Polynomial = dict[Monomial, int]


class _Canonicalizer:
    def __init__(self) -> None:
        self.atoms: dict[str, PrimExpr] = {}

    def atom(self, expr: PrimExpr) -> Polynomial:
        key = format_expr(expr)
        self.atoms[key] = expr
        return {((key, 1),): 1}

    def to_polynomial(self, expr: PrimExpr) -> Polynomial:
        if isinstance(expr, IntImm):
            return {(): expr.value} if expr.value else {}
        if isinstance(expr, SizeVar):
            return self.atom(expr)
        if isinstance(expr, Add):
            return _poly_add(self.to_polynomial(expr.a), self.to_polynomial(expr.b))
        if isinstance(expr, Sub):
            return _poly_add(self.to_polynomial(expr.a), _poly_scale(self.to_polynomial(expr.b), -1))
        if isinstance(expr, Mul):
            return _poly_mul(self.to_polynomial(expr.a), self.to_polynomial(expr.b))
        if isinstance(expr, FloorDiv):
            return self.floor_div(self.to_polynomial(expr.a), self.to_polynomial(expr.b))
        if isinstance(expr, FloorMod):
            return self.floor_mod(self.to_polynomial(expr.a), self.to_polynomial(expr.b))
        if isinstance(expr, (Min, Max)):
            return self.min_max(expr, self.to_polynomial(expr.a), self.to_polynomial(expr.b))
        raise TypeError(f"not a symbolic expression: {expr!r}")

    def floor_div(self, a: Polynomial, b: Polynomial) -> Polynomial:
        divisor = _poly_constant(b)
        if divisor is not None:
            if divisor == 0:
                raise ZeroDivisionError("symbolic division by zero")
            if divisor == 1:
                return a
            quotient, remainder = _split_divisible(a, divisor)
            if remainder is not None and 0 <= remainder < abs(divisor) and divisor > 0:
                # a = divisor * q + r with 0 <= r < divisor: floor(a / divisor) = q
                return quotient
        exact = _divide_by_monomial(a, b)
        if exact is not None:
            return exact
        # Cancel constant factors common to numerator and divisor: (4*n) // (4*m) = n // m.
        return self.atom(FloorDiv(self.from_polynomial(a), self.from_polynomial(b)))

    def floor_mod(self, a: Polynomial, b: Polynomial) -> Polynomial:
        divisor = _poly_constant(b)
        if divisor is not None:
            if divisor == 0:
                raise ZeroDivisionError("symbolic modulo by zero")
            if divisor in (1, -1):
                return {}
            quotient, remainder = _split_divisible(a, divisor)
            if remainder is not None and 0 <= remainder < divisor:
                return {(): remainder} if remainder else {}
        if _divide_by_monomial(a, b) is not None:
            return {}
        return self.atom(FloorMod(self.from_polynomial(a), self.from_polynomial(b)))

    def min_max(self, expr: PrimExpr, a: Polynomial, b: Polynomial) -> Polynomial:
        difference = _poly_constant(_poly_add(a, _poly_scale(b, -1)))
        if difference is not None:
            a_is_smaller = difference <= 0
            if isinstance(expr, Min):
                return a if a_is_smaller else b
            return b if a_is_smaller else a
        left, right = self.from_polynomial(a), self.from_polynomial(b)
        if format_expr(right) < format_expr(left):  # min and max commute: order operands
            left, right = right, left
        return self.atom(type(expr)(left, right))

    def from_polynomial(self, polynomial: Polynomial) -> PrimExpr:
        """Build an expression: positive terms first, then by descending degree and name; constant last."""
        def sort_key(item: tuple[Monomial, int]) -> tuple:
            monomial, coefficient = item
            return (coefficient < 0, -sum(power for _, power in monomial), monomial)

        result: PrimExpr | None = None
        constant = polynomial.get((), 0)
        for monomial, coefficient in sorted(polynomial.items(), key=sort_key):
            if not monomial:
                continue
            term: PrimExpr | None = None
            for key, power in monomial:
                for _ in range(power):
                    factor = self.atoms[key]
                    term = factor if term is None else Mul(term, factor)
            assert term is not None
            if result is None:
                result = term if coefficient == 1 else Mul(term, IntImm(coefficient))
            else:
                magnitude = abs(coefficient)
                if magnitude != 1:
                    term = Mul(term, IntImm(magnitude))
                result = Add(result, term) if coefficient > 0 else Sub(result, term)
        if result is None:
            return IntImm(constant)
        if constant > 0:
            result = Add(result, IntImm(constant))
        elif constant < 0:
            result = Sub(result, IntImm(-constant))
        return result


def _poly_add(a: Polynomial, b: Polynomial) -> Polynomial:
    result = dict(a)
    for monomial, coefficient in b.items():
        total = result.get(monomial, 0) + coefficient
        if total:
            result[monomial] = total
        else:
            result.pop(monomial, None)
    return result


def _poly_scale(a: Polynomial, factor: int) -> Polynomial:
    return {m: c * factor for m, c in a.items() if c * factor}


def _monomial_mul(a: Monomial, b: Monomial) -> Monomial:
    powers: dict[str, int] = dict(a)
    for key, power in b:
        powers[key] = powers.get(key, 0) + power
    return tuple(sorted(powers.items()))


def _poly_mul(a: Polynomial, b: Polynomial) -> Polynomial:
    result: Polynomial = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            result = _poly_add(result, {_monomial_mul(ma, mb): ca * cb})
    return result


def _poly_constant(a: Polynomial) -> int | None:
    if not a:
        return 0
    if len(a) == 1 and () in a:
        return a[()]
    return None


def _split_divisible(a: Polynomial, divisor: int) -> tuple[Polynomial, int | None]:
    """Write a = divisor * quotient + remainder when every non-constant coefficient divides.

    Returns (quotient, remainder) with the remainder a constant in [0, divisor), folding the
    constant term's whole multiples into the quotient; remainder is None when some
    non-constant coefficient is not a multiple of the divisor.
    """
    quotient: Polynomial = {}
    for monomial, coefficient in a.items():
        if not monomial:
            continue
        if coefficient % divisor:
            return {}, None
        quotient[monomial] = coefficient // divisor
    constant = a.get((), 0)
    whole, remainder = divmod(constant, divisor)
    if whole:
        quotient[()] = whole
    return quotient, remainder


def _divide_by_monomial(a: Polynomial, b: Polynomial) -> Polynomial | None:
    """a / b when b is a single term c * m and every term of a is a multiple of it."""
    if len(b) != 1:
        return None
    (divisor_monomial, divisor_coefficient), = b.items()
    if not divisor_monomial or divisor_coefficient <= 0:
        return None
    divisor_powers = dict(divisor_monomial)
    result: Polynomial = {}
    for monomial, coefficient in a.items():
        powers = dict(monomial)
        if coefficient % divisor_coefficient:
            return None
        for key, power in divisor_powers.items():
            if powers.get(key, 0) < power:
                return None
            powers[key] -= power
        remaining = tuple(sorted((k, p) for k, p in powers.items() if p))
        result[remaining] = coefficient // divisor_coefficient
    return result


def simplify(expr: IntLike) -> PrimExpr:
    """The canonical form of an expression (see the module docstring)."""
    canonicalizer = _Canonicalizer()
    return canonicalizer.from_polynomial(canonicalizer.to_polynomial(as_expr(expr)))


def as_int(expr: IntLike) -> int | None:
    """The value of an expression if it simplifies to a constant, else None."""
    simplified = simplify(expr)
    return simplified.value if isinstance(simplified, IntImm) else None


# ----------------------------------------------------------------------------------------
# Proofs


def prove_equal(a: IntLike, b: IntLike) -> bool:
    """True only when a == b for every assignment of the variables (a - b simplifies to 0)."""
    return as_int(as_expr(a) - as_expr(b)) == 0


def _terms_satisfy(expr: IntLike, atom_ok: Callable[[PrimExpr], bool]) -> bool:
    """In canonical form, every coefficient is >= 0 and every atom passes ``atom_ok``."""
    canonicalizer = _Canonicalizer()
    polynomial = canonicalizer.to_polynomial(as_expr(expr))
    return all(
        coefficient >= 0 and all(atom_ok(canonicalizer.atoms[key]) for key, _ in monomial)
        for monomial, coefficient in polynomial.items()
    )


def prove_nonnegative(expr: IntLike) -> bool:
    """True only when expr >= 0 for all size variables >= 0.

    Sufficient test: in canonical form every coefficient is >= 0 and every atom is a
    variable or a floor division / min / max / modulo of provably non-negative operands.
    """
    def atom_ok(atom: PrimExpr) -> bool:
        return isinstance(atom, SizeVar) or (prove_nonnegative(atom.a) and prove_nonnegative(atom.b))  # type: ignore[attr-defined]

    return _terms_satisfy(expr, atom_ok)


def prove_less_equal(a: IntLike, b: IntLike) -> bool:
    """True only when a <= b for all size variables >= 0."""
    return prove_nonnegative(as_expr(b) - as_expr(a))


def prove_nondecreasing(expr: IntLike) -> bool:
    """True only when expr never decreases as any size variable grows.

    Sufficient test on the canonical form: every coefficient is >= 0 and every atom is a
    variable, a floor division of a non-decreasing expression by a positive constant, or a
    min / max of non-decreasing expressions.  Modulo and division by a variable fail it.
    """
    def atom_ok(atom: PrimExpr) -> bool:
        if isinstance(atom, SizeVar):
            return True
        if isinstance(atom, FloorDiv):
            divisor = as_int(atom.b)
            return divisor is not None and divisor > 0 and prove_nondecreasing(atom.a)
        if isinstance(atom, (Min, Max)):
            return prove_nondecreasing(atom.a) and prove_nondecreasing(atom.b)
        return False

    return _terms_satisfy(expr, atom_ok)


def upper_bound(expr: IntLike, bounds: Mapping[str, int | None]) -> int | None:
    """An upper bound of expr given an upper bound for each variable, or None if unknown.

    Only for expressions that provably never decrease as a variable grows (the sizes of
    tensors and storages are such): their value at the bounds is then the largest.
    """
    simplified = simplify(expr)
    names = [v.name for v in free_vars(simplified)]
    if any(bounds.get(name) is None for name in names):
        return None
    if not prove_nondecreasing(simplified):
        return None
    return int(evaluate(simplified, {name: bounds[name] for name in names}))  # type: ignore[arg-type]


def product(values: Iterable[IntLike]) -> PrimExpr:
    """The simplified product of a sequence of dimensions (1 for an empty one)."""
    result: PrimExpr = IntImm(1)
    for value in values:
        result = result * as_expr(value)
    return simplify(result)


def map_vars(expr: PrimExpr, function: Callable[[SizeVar], PrimExpr]) -> PrimExpr:
    """Rebuild an expression with every variable replaced by function(var), unsimplified."""
    if isinstance(expr, SizeVar):
        return function(expr)
    if isinstance(expr, IntImm):
        return expr
    return _fold(type(expr)(map_vars(expr.a, function), map_vars(expr.b, function)))  # type: ignore[attr-defined]
