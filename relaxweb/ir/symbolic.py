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
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable, Mapping, Optional, Union

from .syntax import format_string, is_plain_name

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


def expr_size(expr: PrimExpr) -> int:
    """How many nodes ``expr`` has (``n`` 1, ``(n + 15) // 16`` 5): the simpler of two
    expressions is the smaller."""
    if isinstance(expr, (IntImm, SizeVar)):
        return 1
    return 1 + expr_size(expr.a) + expr_size(expr.b)  # type: ignore[attr-defined]


def free_var_names(expressions: Iterable[PrimExpr]) -> set[str]:
    """The names of the size variables the expressions use."""
    return {var.name for expr in expressions for var in free_vars(expr)}


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
# canonical once their operands are (and unambiguous: equal texts mean equal values).
#
# Bounds use the same polynomials with Fraction coefficients: an atom in a term is replaced by
# a polynomial that bounds it from the side the term's sign asks for (``a // c`` lies in
# ``[(a - (c - 1)) / c, a / c]``, ``min(a, b) <= a`` ...), which lets terms cancel
# (``(n + 3) // 4 * 4 - n >= 0``), until only variables are left; then each monomial is bounded
# from the variables' ranges (monotone, as variables are >= 0).

Monomial = tuple[tuple[str, int], ...]
Polynomial = dict[Monomial, int]
Bound = Optional[Union[int, Fraction]]
Interval = tuple[Optional[int], Optional[int]]


class _Budget:
    """How many more substitution choices one bound query may try."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


class Analyzer:
    """Simplifies and proves facts about symbolic expressions, given variable ranges.

    ``ranges`` maps a variable name to ``(lo, hi)`` (``hi`` None: unbounded); a variable not
    named is in ``[0, inf)``: size variables are integers >= 0, so a lower bound below 0 is
    raised to 0.  An Analyzer is immutable (:meth:`with_range` returns a new one); it caches
    what it derives.  Every answer holds for every assignment of the variables within their
    ranges for which no divisor is 0 (a divisor is assumed non-zero where it is evaluated, so
    a divisor known to be >= 0 counts as >= 1).

    - :meth:`simplify` gives the canonical form, using the ranges (``n // 8`` is 0 when
      ``n <= 7``, ``min(n, 64)`` is ``n`` when ``n <= 64``);
    - :meth:`prove_equal`, :meth:`prove_less_equal`, :meth:`prove_less` return True only when
      the relation holds (False means "not proved", not "false");
    - :meth:`lower_bound`, :meth:`upper_bound` give an int bound or None (unbounded / unknown).
    """

    SEARCH_BUDGET = 256  # substitution choices tried per bound query
    CACHE_LIMIT = 100_000  # cached entries before the caches are dropped

    def __init__(
        self, ranges: Mapping[str, tuple[int, int | None]] | None = None,
        symbolic_upper: Mapping[str, PrimExpr] | None = None,
    ) -> None:
        self._ranges: dict[str, tuple[int, int | None]] = {
            name: _intersect((0, None), bounds, name) for name, bounds in (ranges or {}).items()
        }
        # name -> an expression the variable never exceeds (``i <= n - 1`` for a loop index)
        self._symbolic_upper: dict[str, PrimExpr] = dict(symbolic_upper or {})
        self._atoms: dict[str, PrimExpr] = {}
        self._polys: dict[str, Polynomial] = {}
        self._intervals: dict[str, Interval] = {}
        self._candidate_cache: dict[tuple[str, bool], list[dict[Monomial, Fraction]]] = {}
        self._bounds: dict[tuple, Bound] = {}

    # -- ranges ------------------------------------------------------------------------

    @classmethod
    def from_bounds(cls, bounds: Mapping[str, int | None]) -> Analyzer:
        """An analyzer with each variable in ``[0, bound]`` (None: unbounded)."""
        return cls({name: (0, bound) for name, bound in bounds.items()})

    @property
    def ranges(self) -> dict[str, tuple[int, int | None]]:
        return dict(self._ranges)

    def range_of(self, name: str) -> tuple[int, int | None]:
        return self._ranges.get(name, (0, None))

    def with_range(self, name: str, lo: int = 0, hi: int | None = None) -> Analyzer:
        """A new analyzer that also knows ``lo <= name <= hi`` (intersected with what it knew)."""
        ranges = dict(self._ranges)
        ranges[name] = _intersect(self.range_of(name), (lo, hi), name)
        return Analyzer(ranges, self._symbolic_upper)

    def with_symbolic_upper(self, name: str, upper: IntLike) -> Analyzer:
        """A new analyzer that also knows ``name <= upper`` for an expression ``upper`` (of
        other variables): an index below a symbolic extent, ``i <= n - 1``.  Proofs use it
        where a polynomial decreases in ``name`` (it is then smallest at ``name = upper``)."""
        return Analyzer(self._ranges, {**self._symbolic_upper, name: as_expr(upper)})

    def __repr__(self) -> str:
        return f"Analyzer({self._ranges!r})"

    # -- public queries ----------------------------------------------------------------

    def simplify(self, expr: IntLike) -> PrimExpr:
        """The canonical form of ``expr`` under this analyzer's ranges."""
        self._trim_caches()
        return self._from_polynomial(self._to_polynomial(as_expr(expr)))

    def prove_equal(self, a: IntLike, b: IntLike) -> bool:
        """True only when a == b for every assignment within the ranges."""
        self._trim_caches()
        difference = self._to_polynomial(Sub(as_expr(a), as_expr(b)))
        constant = _poly_constant(difference)
        if constant is not None:
            return constant == 0
        return self._nonnegative(difference) and self._nonnegative(_poly_scale(difference, -1))

    def prove_less_equal(self, a: IntLike, b: IntLike) -> bool:
        """True only when a <= b for every assignment within the ranges."""
        self._trim_caches()
        return self._nonnegative(self._to_polynomial(Sub(as_expr(b), as_expr(a))))

    def prove_less(self, a: IntLike, b: IntLike) -> bool:
        """True only when a < b (that is a + 1 <= b: the values are integers)."""
        self._trim_caches()
        return self._nonnegative(_poly_add(self._to_polynomial(Sub(as_expr(b), as_expr(a))), {(): -1}))

    def prove_not_equal(self, a: IntLike, b: IntLike) -> bool:
        """True only when a != b for every assignment within the ranges (``3`` vs ``4``,
        ``n`` vs ``n + 1``): one is provably less than the other."""
        return self.prove_less(a, b) or self.prove_less(b, a)

    def prove_nonnegative(self, expr: IntLike) -> bool:
        """True only when expr >= 0 for every assignment within the ranges."""
        self._trim_caches()
        return self._nonnegative(self._to_polynomial(as_expr(expr)))

    def lower_bound(self, expr: IntLike) -> int | None:
        """An int <= expr for every assignment within the ranges, or None."""
        return self._int_bound(expr, lower=True)

    def upper_bound(self, expr: IntLike) -> int | None:
        """An int >= expr for every assignment within the ranges, or None."""
        return self._int_bound(expr, lower=False)

    def _int_bound(self, expr: IntLike, lower: bool) -> int | None:
        self._trim_caches()
        polynomial = self._to_polynomial(as_expr(expr))
        bound = self._poly_bound(polynomial, lower)
        result = None if bound is None else (math.ceil(bound) if lower else math.floor(bound))
        # A non-decreasing expression takes its extreme values at the corners of the ranges.
        if self._nondecreasing(polynomial):
            canonical = self._from_polynomial(polynomial)
            corner = {var.name: self.range_of(var.name)[0 if lower else 1] for var in free_vars(canonical)}
            if all(value is not None for value in corner.values()):
                value = int(evaluate(canonical, corner))  # type: ignore[arg-type]
                result = value if result is None else (max(result, value) if lower else min(result, value))
        return result

    def _trim_caches(self) -> None:
        if len(self._polys) + len(self._bounds) + len(self._intervals) > self.CACHE_LIMIT:
            self._atoms.clear()
            self._polys.clear()
            self._intervals.clear()
            self._candidate_cache.clear()
            self._bounds.clear()

    # -- canonical form ----------------------------------------------------------------

    def _atom(self, expr: PrimExpr) -> Polynomial:
        key = format_expr(expr)
        self._atoms[key] = expr
        return {((key, 1),): 1}

    def _to_polynomial(self, expr: PrimExpr) -> Polynomial:
        if isinstance(expr, IntImm):
            return {(): expr.value} if expr.value else {}
        if isinstance(expr, SizeVar):
            return self._atom(expr)
        if isinstance(expr, Add):
            return self._recombine(_poly_add(self._to_polynomial(expr.a), self._to_polynomial(expr.b)))
        if isinstance(expr, Sub):
            return self._recombine(_poly_add(self._to_polynomial(expr.a), _poly_scale(self._to_polynomial(expr.b), -1)))
        if isinstance(expr, Mul):
            return _poly_mul(self._to_polynomial(expr.a), self._to_polynomial(expr.b))
        # division, modulo, min and max consult the bounds: cache them
        key = format_expr(expr)
        cached = self._polys.get(key)
        if cached is not None:
            return cached
        if isinstance(expr, FloorDiv):
            result = self._floor_div(self._to_polynomial(expr.a), self._to_polynomial(expr.b))
        elif isinstance(expr, FloorMod):
            result = self._floor_mod(self._to_polynomial(expr.a), self._to_polynomial(expr.b))
        elif isinstance(expr, (Min, Max)):
            result = self._min_max(type(expr), self._to_polynomial(expr.a), self._to_polynomial(expr.b))
        else:
            raise TypeError(f"not a symbolic expression: {expr!r}")
        self._polys[key] = result
        return result

    def _pull_out_ok(self, whole: Polynomial, rest: Polynomial) -> bool:
        """Whether ``whole // d`` may become ``quotient + rest // d``: keep a numerator that is
        provably >= 0 so (a backend may then divide with its plain truncating division,
        which agrees with floor division on non-negative numerators: wgsl/lower_index.py)."""
        return self._nonnegative(rest) or not self._nonnegative(whole)

    def _floor_div(self, a: Polynomial, b: Polynomial) -> Polynomial:
        divisor = _poly_constant(b)
        if divisor is not None:
            if divisor == 0:
                raise ZeroDivisionError("symbolic division by zero")
            if divisor < 0:  # a // -c == (-a) // c
                return self._floor_div(_poly_scale(a, -1), {(): -divisor})
            return self._div_by_constant(a, divisor)
        if not a:
            return {}
        common = _common_factor(a, b)
        if common:  # (g * a) // (g * b) == a // b: g is not 0, since the divisor is not
            return self._floor_div(_divide_by_monomial(a, common), _divide_by_monomial(b, common))
        # a == b * quotient + rest, so a // b == quotient + rest // b.
        quotient, rest = _poly_divmod(a, b)
        if quotient and (not rest or self._pull_out_ok(a, rest)):
            return _poly_add(quotient, self._div_remainder(rest, b))
        return self._div_remainder(a, b)

    def _div_remainder(self, a: Polynomial, b: Polynomial) -> Polynomial:
        if not a:
            return {}
        if self._nonnegative(a) and self._nonnegative(_poly_add(_poly_add(b, _poly_scale(a, -1)), {(): -1})):
            return {}  # 0 <= a < b
        return self._atom(FloorDiv(self._from_polynomial(a), self._from_polynomial(b)))

    def _div_by_constant(self, a: Polynomial, divisor: int) -> Polynomial:
        if divisor == 1:
            return a
        quotient, rest = _split_multiples(a, divisor)
        if quotient and rest and not self._pull_out_ok(a, rest):
            quotient, rest = {}, a
        if not rest:
            return quotient
        # (g * x) // (g * d) == x // d
        common = math.gcd(divisor, *rest.values())
        if common > 1:
            rest = {monomial: coefficient // common for monomial, coefficient in rest.items()}
            divisor //= common
            if divisor == 1:
                return _poly_add(quotient, rest)
        whole = self._constant_quotient(rest, divisor)
        if whole is not None:
            return _poly_add(quotient, {(): whole} if whole else {})
        # (x // c1 + k) // c == (x + k * c1) // (c1 * c)
        inner = self._single_atom(rest, FloorDiv)
        if inner is not None:
            operand, inner_divisor, constant = inner
            numerator = _poly_add(self._to_polynomial(operand), {(): constant * inner_divisor})
            return _poly_add(quotient, self._div_by_constant(numerator, inner_divisor * divisor))
        return _poly_add(quotient, self._atom(FloorDiv(self._from_polynomial(rest), IntImm(divisor))))

    def _floor_mod(self, a: Polynomial, b: Polynomial) -> Polynomial:
        divisor = _poly_constant(b)
        if divisor is not None:
            if divisor == 0:
                raise ZeroDivisionError("symbolic modulo by zero")
            if divisor < 0:  # a % -c == -((-a) % c)
                return _poly_scale(self._floor_mod(_poly_scale(a, -1), {(): -divisor}), -1)
            return self._mod_by_constant(a, divisor)
        if not a:
            return {}
        quotient, rest = _poly_divmod(a, b)
        if quotient and rest and not self._pull_out_ok(a, rest):
            rest = a
        if not rest:
            return {}
        if self._nonnegative(rest) and self._nonnegative(_poly_add(_poly_add(b, _poly_scale(rest, -1)), {(): -1})):
            return rest  # 0 <= rest < b
        return self._atom(FloorMod(self._from_polynomial(rest), self._from_polynomial(b)))

    def _mod_by_constant(self, a: Polynomial, divisor: int) -> Polynomial:
        if divisor == 1:
            return {}
        # (c * q + r) % c == r % c: reduce every coefficient into [0, c)
        rest = {monomial: coefficient % divisor for monomial, coefficient in a.items() if coefficient % divisor}
        if rest != a and rest and not self._pull_out_ok(a, rest):
            rest = a
        if not rest:
            return {}
        # (g * x) % (g * d) == g * (x % d)
        common = math.gcd(divisor, *rest.values())
        if common > 1:
            reduced = {monomial: coefficient // common for monomial, coefficient in rest.items()}
            return _poly_scale(self._mod_by_constant(reduced, divisor // common), common)
        whole = self._constant_quotient(rest, divisor)
        if whole is not None:
            return _poly_add(rest, {(): -whole * divisor} if whole else {})
        # (x % c1) % c == x % c when c divides c1
        inner = self._single_atom(rest, FloorMod)
        if inner is not None and inner[2] == 0 and inner[1] % divisor == 0:
            return self._mod_by_constant(self._to_polynomial(inner[0]), divisor)
        return self._atom(FloorMod(self._from_polynomial(rest), IntImm(divisor)))

    def _single_atom(self, polynomial: Polynomial, kind: type) -> tuple[PrimExpr, int, int] | None:
        """(x, c, k) when polynomial is ``kind(x, c) + k`` with c a positive constant."""
        terms = [(monomial, coefficient) for monomial, coefficient in polynomial.items() if monomial]
        if len(terms) != 1:
            return None
        (monomial, coefficient), = terms
        if coefficient != 1 or len(monomial) != 1 or monomial[0][1] != 1:
            return None
        atom = self._atoms[monomial[0][0]]
        if not isinstance(atom, kind):
            return None
        operand, divisor = atom.a, atom.b  # type: ignore[attr-defined]
        if not isinstance(divisor, IntImm) or divisor.value <= 0:
            return None
        return operand, divisor.value, polynomial.get((), 0)

    def _constant_quotient(self, a: Polynomial, divisor: int) -> int | None:
        """k when k * divisor <= a < (k + 1) * divisor within the ranges."""
        lo, hi = self._interval(a)
        if lo is not None and hi is not None and lo // divisor == hi // divisor:
            return lo // divisor
        return None

    def _min_max(self, kind: type, a: Polynomial, b: Polynomial) -> Polynomial:
        difference = _poly_add(a, _poly_scale(b, -1))
        constant = _poly_constant(difference)
        if constant is not None:
            a_is_smaller: bool | None = constant <= 0
        elif self._nonnegative(_poly_scale(difference, -1)):
            a_is_smaller = True
        elif self._nonnegative(difference):
            a_is_smaller = False
        else:
            a_is_smaller = None
        if a_is_smaller is not None:
            if kind is Min:
                return a if a_is_smaller else b
            return b if a_is_smaller else a
        left, right = self._from_polynomial(a), self._from_polynomial(b)
        if format_expr(right) < format_expr(left):  # min and max commute: order operands
            left, right = right, left
        return self._atom(kind(left, right))

    def _recombine(self, polynomial: Polynomial) -> Polynomial:
        """Rewrite t * r * (x % d) + t * r * d * (x // d) as t * r * x."""
        changed = True
        while changed:
            changed = False
            for monomial, coefficient in polynomial.items():
                for key, power in monomial:
                    atom = self._atoms[key]
                    if power != 1 or not isinstance(atom, FloorMod):
                        continue
                    rest = {tuple(item for item in monomial if item[0] != key): coefficient}
                    x, divisor = self._to_polynomial(atom.a), self._to_polynomial(atom.b)
                    multiple = _poly_mul(rest, _poly_mul(divisor, self._floor_div(x, divisor)))
                    if not any(monomial for monomial in multiple) or any(
                        polynomial.get(term) != value for term, value in multiple.items() if term
                    ):
                        continue
                    replaced = _poly_add(polynomial, _poly_scale(multiple, -1))
                    replaced = _poly_add(replaced, {monomial: -coefficient})
                    polynomial = _poly_add(replaced, _poly_mul(rest, x))
                    changed = True
                    break
                if changed:
                    break
        return polynomial

    def _from_polynomial(self, polynomial: Polynomial) -> PrimExpr:
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
                    factor = self._atoms[key]
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

    def _nondecreasing(self, polynomial: Polynomial) -> bool:
        """Sufficient test: every coefficient >= 0 and every atom a variable, a floor division
        of a non-decreasing expression by a positive constant, or a min / max of
        non-decreasing expressions."""
        def atom_ok(atom: PrimExpr) -> bool:
            if isinstance(atom, SizeVar):
                return True
            if isinstance(atom, FloorDiv):
                positive = isinstance(atom.b, IntImm) and atom.b.value > 0
                return positive and self._nondecreasing(self._to_polynomial(atom.a))
            if isinstance(atom, (Min, Max)):
                return all(self._nondecreasing(self._to_polynomial(operand)) for operand in (atom.a, atom.b))
            return False

        return all(
            coefficient >= 0 and all(atom_ok(self._atoms[key]) for key, _ in monomial)
            for monomial, coefficient in polynomial.items()
        )

    # -- bounds ------------------------------------------------------------------------

    def _nonnegative(self, polynomial: Polynomial, depth: int = 0) -> bool:
        """Whether the (integer-valued) polynomial is >= 0: its lower bound is > -1."""
        constant = _poly_constant(polynomial)
        if constant is not None:
            return constant >= 0
        bound = self._poly_bound(polynomial, lower=True, goal=Fraction(-1))
        if bound is not None and bound > -1:
            return True
        return depth < 4 and self._nonnegative_at_symbolic_upper(polynomial, depth)

    def _nonnegative_at_symbolic_upper(self, polynomial: Polynomial, depth: int) -> bool:
        """P = c * v + R with c <= 0 and v <= U gives P >= c * U + R: prove that instead."""
        for name, upper in self._symbolic_upper.items():
            with_v = {m: c for m, c in polynomial.items() if any(key == name for key, _ in m)}
            if not with_v or any(power != 1 for m in with_v for key, power in m if key == name):
                continue
            slope = {tuple(f for f in m if f[0] != name): c for m, c in with_v.items()}
            if not self._nonnegative(_poly_scale(slope, -1), depth + 1):
                continue
            rest = {m: c for m, c in polynomial.items() if m not in with_v}
            if self._nonnegative(_poly_add(rest, _poly_mul(slope, self._to_polynomial(upper))), depth + 1):
                return True
        return False

    def _interval(self, polynomial: Polynomial) -> Interval:
        """Integer bounds (None: unbounded) of an integer-valued polynomial."""
        constant = _poly_constant(polynomial)
        if constant is not None:
            return constant, constant
        lo, hi = self._poly_bound(polynomial, lower=True), self._poly_bound(polynomial, lower=False)
        return (None if lo is None else math.ceil(lo)), (None if hi is None else math.floor(hi))

    def _poly_bound(
        self, polynomial: Mapping[Monomial, int | Fraction], lower: bool, goal: Fraction | None = None,
        budget: _Budget | None = None,
    ) -> Bound:
        """A lower (or upper) bound of the polynomial within the ranges; None: unbounded.

        With a goal, the search for better bounds stops once the bound passes it.
        """
        if budget is None:
            cache_key = (frozenset(polynomial.items()), lower, goal)
            if cache_key in self._bounds:
                return self._bounds[cache_key]
            result = self._poly_bound(polynomial, lower, goal, _Budget(self.SEARCH_BUDGET))
            self._bounds[cache_key] = result
            return result

        kept: dict[Monomial, int | Fraction] = {}  # terms of variables only, bounded once no atom is left
        units: dict[tuple[str, bool], list[tuple[Fraction, Monomial]]] = {}
        for monomial, coefficient in polynomial.items():
            variables = tuple(item for item in monomial if isinstance(self._atoms[item[0]], SizeVar))
            others = tuple(item for item in monomial if not isinstance(self._atoms[item[0]], SizeVar))
            want_low = lower == (coefficient > 0)  # which bound of the monomial this term needs
            if not others:
                kept = _poly_add(kept, {monomial: coefficient})
            elif len(others) == 1 and others[0][1] == 1:
                # coefficient * variables * atom: replace the atom by a polynomial bound
                units.setdefault((others[0][0], want_low), []).append((coefficient, variables))
            else:
                lo, hi = self._monomial_interval(monomial)
                value = lo if want_low else hi
                if value is None:
                    return None
                kept = _poly_add(kept, {(): coefficient * value})
        if not units:
            total = 0
            for monomial, coefficient in kept.items():
                value = self._variables_bound(monomial, lower == (coefficient > 0)) if monomial else 1
                if value is None:
                    return None
                total += coefficient * value
            return total

        unit_keys = list(units)
        candidate_lists = []
        for key, want_low in unit_keys:
            candidates = self._candidates(key, want_low)
            if not candidates:
                return None
            candidate_lists.append(candidates)
        best: Bound = None
        for choice in _choices(candidate_lists, budget):
            substituted = kept
            for unit, candidate in zip(unit_keys, choice):
                for coefficient, variables in units[unit]:
                    for monomial, value in candidate.items():
                        substituted = _poly_add(substituted, {_monomial_mul(monomial, variables): coefficient * value})
            bound = self._poly_bound(substituted, lower, goal, budget)
            if bound is not None and (best is None or (bound > best if lower else bound < best)):
                best = bound
                if goal is not None and (best > goal if lower else best < goal):
                    break
        return best

    def _variables_bound(self, variables: Monomial, want_low: bool) -> Bound:
        """Bound of a product of variables (each >= 0, so the product is monotone)."""
        result = 1
        unbounded = False
        for key, power in variables:
            lo, hi = self.range_of(key)
            value = lo if want_low else hi
            if value is None:
                unbounded = True
                continue
            result *= value ** power
        if result == 0:
            return result
        return None if unbounded else result

    def _monomial_interval(self, monomial: Monomial) -> tuple[Bound, Bound]:
        """Interval of a product of atoms, by interval arithmetic."""
        lo: float | Fraction = Fraction(1)
        hi: float | Fraction = Fraction(1)
        for key, power in monomial:
            factor_lo, factor_hi = self._atom_interval(key)
            f_lo = -math.inf if factor_lo is None else Fraction(factor_lo)
            f_hi = math.inf if factor_hi is None else Fraction(factor_hi)
            for _ in range(power):
                products = [_extended_mul(x, y) for x in (lo, hi) for y in (f_lo, f_hi)]
                lo, hi = min(products), max(products)
        return (None if lo == -math.inf else Fraction(lo)), (None if hi == math.inf else Fraction(hi))

    def _atom_interval(self, key: str) -> Interval:
        """Integer bounds of one atom from its operands' bounds."""
        cached = self._intervals.get(key)
        if cached is not None:
            return cached
        atom = self._atoms[key]
        result: Interval = (None, None)
        if isinstance(atom, SizeVar):
            result = self.range_of(atom.name)
        elif isinstance(atom, (Min, Max)):
            alo, ahi = self._interval(self._to_polynomial(atom.a))
            blo, bhi = self._interval(self._to_polynomial(atom.b))
            if isinstance(atom, Min):
                result = (_min_or_none(alo, blo, unbounded_wins=True), _min_or_none(ahi, bhi, unbounded_wins=False))
            else:
                result = (_max_or_none(alo, blo, unbounded_wins=False), _max_or_none(ahi, bhi, unbounded_wins=True))
        elif isinstance(atom, (FloorDiv, FloorMod)):
            alo, ahi = self._interval(self._to_polynomial(atom.a))
            divisor = atom.b.value if isinstance(atom.b, IntImm) else None
            if divisor is None:
                positive = self._positive_divisor(self._to_polynomial(atom.b))
                if positive is not None:
                    result = (_div_interval if isinstance(atom, FloorDiv) else _mod_interval)(alo, ahi, *positive)
            elif isinstance(atom, FloorDiv):
                if divisor > 0:
                    result = (None if alo is None else alo // divisor), (None if ahi is None else ahi // divisor)
                else:
                    result = (None if ahi is None else ahi // divisor), (None if alo is None else alo // divisor)
            elif divisor > 0:
                result = _mod_interval(alo, ahi, divisor, divisor)
            else:
                result = (divisor + 1, 0)
        self._intervals[key] = result
        return result

    def _positive_divisor(self, divisor: Polynomial) -> tuple[int, int | None] | None:
        """The range of a divisor known to be >= 0, so >= 1 as it is not 0; else None."""
        lo, hi = self._interval(divisor)
        if lo is None or lo < 0 or (hi is not None and hi < 1):
            return None
        return max(lo, 1), hi

    def _candidates(self, key: str, want_low: bool) -> list[dict[Monomial, Fraction]]:
        """Polynomials known to be <= the atom (want_low) or >= it, best first; the atom's
        numeric bound last."""
        cached = self._candidate_cache.get((key, want_low))
        if cached is not None:
            return cached
        atom = self._atoms[key]
        candidates: list[dict[Monomial, Fraction]] = []
        if isinstance(atom, (FloorDiv, FloorMod)):
            a = self._to_polynomial(atom.a)
            a_nonnegative = self._nonnegative(a)
            divisor = atom.b.value if isinstance(atom.b, IntImm) else None
            if isinstance(atom, FloorDiv) and divisor is not None and divisor > 0:
                # (a - (c - 1)) / c <= a // c <= a / c
                shifted = a if not want_low else _poly_add(a, {(): 1 - divisor})
                candidates.append(_poly_scale(shifted, Fraction(1, divisor)))
            elif isinstance(atom, FloorMod) and divisor is not None and divisor > 0:
                # a % c == a - c * (a // c), and a % c <= a when a >= 0
                candidates.append(_poly_add(a, _poly_scale(self._floor_div(a, {(): divisor}), -divisor)))
                if not want_low and a_nonnegative:
                    candidates.append(dict(a))
            elif divisor is None:
                b = self._to_polynomial(atom.b)
                positive = self._positive_divisor(b)
                if positive is not None and a_nonnegative:
                    blo, bhi = positive
                    if isinstance(atom, FloorDiv):
                        if want_low and bhi is not None:  # a // b >= a // bhi >= (a - (bhi - 1)) / bhi
                            candidates.append(_poly_scale(_poly_add(a, {(): 1 - bhi}), Fraction(1, bhi)))
                        elif not want_low:  # a // b <= a / blo
                            candidates.append(_poly_scale(a, Fraction(1, blo)))
                    elif not want_low:  # a % b <= b - 1 and a % b <= a
                        candidates.append(_poly_add(b, {(): -1}))
                        candidates.append(dict(a))
        elif (isinstance(atom, Min) and not want_low) or (isinstance(atom, Max) and want_low):
            # min(a, b) <= a, b, (a + b) / 2 and max(a, b) >= a, b, (a + b) / 2
            a, b = self._to_polynomial(atom.a), self._to_polynomial(atom.b)
            candidates += [dict(a), dict(b), _poly_scale(_poly_add(a, b), Fraction(1, 2))]
        lo, hi = self._atom_interval(key)
        numeric = lo if want_low else hi
        if numeric is not None:
            candidates.append({(): numeric} if numeric else {})
        self._candidate_cache[(key, want_low)] = candidates
        return candidates


def _intersect(known: tuple[int, int | None], new: tuple[int, int | None], name: str) -> tuple[int, int | None]:
    lo, hi = new
    if isinstance(lo, bool) or (hi is not None and isinstance(hi, bool)):
        raise TypeError(f"range of '{name}' must be integers, got {new!r}")
    lo = max(known[0], int(lo))
    if hi is None:
        hi = known[1]
    elif known[1] is not None:
        hi = min(known[1], int(hi))
    else:
        hi = int(hi)
    if hi is not None and hi < lo:
        raise ValueError(f"empty range for '{name}': {lo} <= {name} <= {hi}")
    return lo, hi


def _extended_mul(x: float | Fraction, y: float | Fraction) -> float | Fraction:
    """Product on the extended line, with 0 * inf == 0 (the infinite end is never reached)."""
    if x == 0 or y == 0:
        return Fraction(0)
    return x * y


def _min_or_none(a: int | None, b: int | None, unbounded_wins: bool) -> int | None:
    """min of two bounds where None is -inf (lower bounds: unbounded_wins) or +inf."""
    if a is None or b is None:
        return None if unbounded_wins else (b if a is None else a)
    return min(a, b)


def _max_or_none(a: int | None, b: int | None, unbounded_wins: bool) -> int | None:
    if a is None or b is None:
        return None if unbounded_wins else (b if a is None else a)
    return max(a, b)


def _div_interval(alo: int | None, ahi: int | None, blo: int, bhi: int | None) -> Interval:
    """Bounds of a // b for a in [alo, ahi] and b in [blo, bhi], blo >= 1."""
    if alo is None:
        lo = None
    elif alo >= 0:
        lo = 0 if bhi is None else alo // bhi
    else:
        lo = alo // blo
    if ahi is None:
        hi = None
    elif ahi >= 0:
        hi = ahi // blo
    else:
        hi = -1 if bhi is None else ahi // bhi
    return lo, hi


def _mod_interval(alo: int | None, ahi: int | None, blo: int, bhi: int | None) -> Interval:
    """Bounds of a % b for a in [alo, ahi] and b in [blo, bhi], blo >= 1."""
    if alo is not None and ahi is not None and blo == bhi and alo // blo == ahi // blo:
        return alo - alo // blo * blo, ahi - alo // blo * blo
    if alo is not None and alo >= 0 and ahi is not None and ahi < blo:
        return alo, ahi
    hi = None if bhi is None else bhi - 1
    if alo is not None and alo >= 0 and ahi is not None:
        hi = ahi if hi is None else min(hi, ahi)
    return 0, hi


def _choices(candidate_lists: list[list], budget: _Budget) -> Iterable[tuple]:
    """The combinations of candidates, first choices first; past the budget, only the first."""
    for index, choice in enumerate(itertools.product(*candidate_lists)):
        if index and budget.left <= 0:
            return
        budget.left -= 1
        yield choice


def _poly_add(a: Mapping[Monomial, int | Fraction], b: Mapping[Monomial, int | Fraction]) -> dict:
    result = dict(a)
    for monomial, coefficient in b.items():
        total = result.get(monomial, 0) + coefficient
        if total:
            result[monomial] = total
        else:
            result.pop(monomial, None)
    return result


def _poly_scale(a: Mapping[Monomial, int | Fraction], factor: int | Fraction) -> dict:
    return {m: c * factor for m, c in a.items() if c * factor}


def _monomial_mul(a: Monomial, b: Monomial) -> Monomial:
    powers: dict[str, int] = dict(a)
    for key, power in b:
        powers[key] = powers.get(key, 0) + power
    return tuple(sorted(powers.items()))


def _poly_mul(a: Mapping[Monomial, int | Fraction], b: Mapping[Monomial, int | Fraction]) -> dict:
    result: dict = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            result = _poly_add(result, {_monomial_mul(ma, mb): ca * cb})
    return result


def _poly_constant(a: Mapping[Monomial, int | Fraction]) -> int | Fraction | None:
    if not a:
        return 0
    if len(a) == 1 and () in a:
        return a[()]
    return None


def _split_multiples(a: Polynomial, divisor: int) -> tuple[Polynomial, Polynomial]:
    """a == divisor * quotient + rest: quotient takes the terms whose coefficient is a multiple
    of the divisor and the constant's whole multiples; rest keeps the others and the
    constant's remainder in [0, divisor)."""
    quotient: Polynomial = {}
    rest: Polynomial = {}
    for monomial, coefficient in a.items():
        if not monomial:
            whole, remainder = divmod(coefficient, divisor)
            if whole:
                quotient[()] = whole
            if remainder:
                rest[()] = remainder
        elif coefficient % divisor == 0:
            quotient[monomial] = coefficient // divisor
        else:
            rest[monomial] = coefficient
    return quotient, rest


def _monomial_order(monomial: Monomial) -> tuple:
    return (sum(power for _, power in monomial), monomial)


def _poly_divmod(a: Polynomial, b: Polynomial) -> tuple[Polynomial, Polynomial]:
    """a == b * quotient + rest by division on leading terms (integer coefficients only).

    Each step keeps the identity, so the result is exact whatever the monomial order does;
    the step limit only stops a division that does not terminate.
    """
    lead_monomial, lead_coefficient = max(b.items(), key=lambda item: _monomial_order(item[0]))
    quotient: Polynomial = {}
    rest: Polynomial = {}
    pending = dict(a)
    for _ in range(64):
        if not pending:
            return quotient, rest
        monomial, coefficient = max(pending.items(), key=lambda item: _monomial_order(item[0]))
        factor = _monomial_quotient(monomial, lead_monomial)
        if factor is not None and coefficient % lead_coefficient == 0:
            term = {factor: coefficient // lead_coefficient}
            quotient = _poly_add(quotient, term)
            pending = _poly_add(pending, _poly_scale(_poly_mul(term, b), -1))
        else:
            rest = _poly_add(rest, {monomial: coefficient})
            del pending[monomial]
    return {}, dict(a)


def _common_factor(*polynomials: Polynomial) -> Monomial:
    """The largest monomial dividing every term of every polynomial (``n`` for ``12 n s`` and
    ``8 n``; empty when some term is a constant)."""
    terms = [monomial for polynomial in polynomials for monomial in polynomial]
    powers = dict(terms[0]) if terms else {}
    for monomial in terms[1:]:
        own = dict(monomial)
        powers = {key: min(power, own[key]) for key, power in powers.items() if key in own}
    return tuple(sorted(powers.items()))


def _divide_by_monomial(polynomial: Polynomial, monomial: Monomial) -> Polynomial:
    return {_monomial_quotient(term, monomial): coefficient for term, coefficient in polynomial.items()}  # type: ignore[misc]


def _monomial_quotient(a: Monomial, b: Monomial) -> Monomial | None:
    """a / b when b divides a."""
    powers = dict(a)
    for key, power in b:
        if powers.get(key, 0) < power:
            return None
        powers[key] -= power
    return tuple(sorted((key, power) for key, power in powers.items() if power))


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
    return _DEFAULT._nondecreasing(_DEFAULT._to_polynomial(as_expr(expr)))


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


def map_vars(expr: PrimExpr, function: Callable[[SizeVar], PrimExpr]) -> PrimExpr:
    """Rebuild an expression with every variable replaced by function(var), unsimplified."""
    if isinstance(expr, SizeVar):
        return function(expr)
    if isinstance(expr, IntImm):
        return expr
    return _fold(type(expr)(map_vars(expr.a, function), map_vars(expr.b, function)))  # type: ignore[attr-defined]
