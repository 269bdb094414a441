"""The canonical form of symbolic expressions: polynomials over atoms.

A polynomial (``polynomial.py``) has integer coefficients over variables and irreducible
atoms, the ``FloorDiv`` / ``FloorMod`` / ``Min`` / ``Max`` terms that do not fold, whose
operands are themselves in canonical form.  Atoms are keyed by their printed text, which is
canonical once their operands are (and unambiguous: equal texts mean equal values), so two
expressions that are equal as polynomials print and compare the same.

Floor division and modulo by constants fold what they can (``(n * 4) // 8 -> n // 2``,
``(n // 4) // 2 -> n // 8``, ``(n % 8) % 4 -> n % 4``, ``n // 4 * 4 + n % 4 -> n``), and so do
division and modulo by an expression that divides the numerator (``(n * m + m) // m -> n + 1``);
what folds also depends on the ranges of the variables: the folding asks the bounds of the
:class:`~relaxweb.ir.analyzer.Analyzer` built on :class:`CanonicalForm`.
"""

from __future__ import annotations

import math
from typing import Callable

from .polynomial import (
    Interval, Monomial, Polynomial, common_factor, divide_by_monomial, poly_add, poly_constant, poly_divmod, poly_mul,
    poly_scale, split_multiples,
)
from .prim_expr import (
    Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, PrimExprFunctor, SizeVar, Sub, format_expr,
)


class CanonicalForm:
    """Expressions to polynomials and back, with the atoms met so far and the polynomials of
    the division, modulo, min and max terms (they consult the bounds: cached).

    The bounds are the subclass's (:class:`~relaxweb.ir.analyzer.Analyzer`):
    ``_nonnegative(polynomial)`` (provably >= 0) and ``_interval(polynomial)`` (integer
    bounds, None where unbounded).
    """

    def __init__(self) -> None:
        self._atoms: dict[str, PrimExpr] = {}
        self._polys: dict[str, Polynomial] = {}

    def _nonnegative(self, polynomial: Polynomial, depth: int = 0) -> bool:
        raise NotImplementedError

    def _interval(self, polynomial: Polynomial) -> Interval:
        raise NotImplementedError

    def _to_polynomial(self, expr: PrimExpr) -> Polynomial:
        return _POLYNOMIALS.visit(expr, self)

    def _atom(self, expr: PrimExpr) -> Polynomial:
        key = format_expr(expr)
        self._atoms[key] = expr
        return {((key, 1),): 1}

    def _pull_out_ok(self, whole: Polynomial, rest: Polynomial) -> bool:
        """Whether ``whole // d`` may become ``quotient + rest // d``: keep a numerator that is
        provably >= 0 so (a backend may then divide with its plain truncating division,
        which agrees with floor division on non-negative numerators: wgsl/lower_index.py)."""
        return self._nonnegative(rest) or not self._nonnegative(whole)

    def _floor_div(self, a: Polynomial, b: Polynomial) -> Polynomial:
        divisor = poly_constant(b)
        if divisor is not None:
            if divisor == 0:
                raise ZeroDivisionError("symbolic division by zero")
            if divisor < 0:  # a // -c == (-a) // c
                return self._floor_div(poly_scale(a, -1), {(): -divisor})
            return self._div_by_constant(a, divisor)
        if not a:
            return {}
        common = common_factor(a, b)
        if common:  # (g * a) // (g * b) == a // b: g is not 0, since the divisor is not
            return self._floor_div(divide_by_monomial(a, common), divide_by_monomial(b, common))
        # a == b * quotient + rest, so a // b == quotient + rest // b.
        quotient, rest = poly_divmod(a, b)
        if quotient and (not rest or self._pull_out_ok(a, rest)):
            if rest and self._within(a, b):  # (i - n) // (m + n) is 0 where n <= i < 2n + m
                return {}
            return poly_add(quotient, self._div_remainder(rest, b))
        return self._div_remainder(a, b)

    def _within(self, a: Polynomial, b: Polynomial) -> bool:
        """Whether 0 <= a < b."""
        return self._nonnegative(a) and self._nonnegative(poly_add(poly_add(b, poly_scale(a, -1)), {(): -1}))

    def _div_remainder(self, a: Polynomial, b: Polynomial) -> Polynomial:
        if not a:
            return {}
        if self._within(a, b):
            return {}
        return self._atom(FloorDiv(self._from_polynomial(a), self._from_polynomial(b)))

    def _div_by_constant(self, a: Polynomial, divisor: int) -> Polynomial:
        if divisor == 1:
            return a
        quotient, rest = split_multiples(a, divisor)
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
                return poly_add(quotient, rest)
        whole = self._constant_quotient(rest, divisor)
        if whole is not None:
            return poly_add(quotient, {(): whole} if whole else {})
        # (x // c1 + k) // c == (x + k * c1) // (c1 * c)
        inner = self._single_atom(rest, FloorDiv)
        if inner is not None:
            operand, inner_divisor, constant = inner
            numerator = poly_add(self._to_polynomial(operand), {(): constant * inner_divisor})
            return poly_add(quotient, self._div_by_constant(numerator, inner_divisor * divisor))
        return poly_add(quotient, self._atom(FloorDiv(self._from_polynomial(rest), IntImm(divisor))))

    def _floor_mod(self, a: Polynomial, b: Polynomial) -> Polynomial:
        divisor = poly_constant(b)
        if divisor is not None:
            if divisor == 0:
                raise ZeroDivisionError("symbolic modulo by zero")
            if divisor < 0:  # a % -c == -((-a) % c)
                return poly_scale(self._floor_mod(poly_scale(a, -1), {(): -divisor}), -1)
            return self._mod_by_constant(a, divisor)
        if not a:
            return {}
        quotient, rest = poly_divmod(a, b)
        if quotient and rest and not self._pull_out_ok(a, rest):
            rest = a
        if not rest:
            return {}
        if quotient and rest is not a and self._within(a, b):  # (i - n) % (m + n) is i - n where n <= i < 2n + m
            return a
        if self._within(rest, b):
            return rest
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
            return poly_scale(self._mod_by_constant(reduced, divisor // common), common)
        whole = self._constant_quotient(rest, divisor)
        if whole is not None:
            return poly_add(rest, {(): -whole * divisor} if whole else {})
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

    def _min(self, a: Polynomial, b: Polynomial) -> Polynomial:
        return self._min_max(Min, a, b)

    def _max(self, a: Polynomial, b: Polynomial) -> Polynomial:
        return self._min_max(Max, a, b)

    def _min_max(self, kind: type, a: Polynomial, b: Polynomial) -> Polynomial:
        difference = poly_add(a, poly_scale(b, -1))
        constant = poly_constant(difference)
        if constant is not None:
            a_is_smaller: bool | None = constant <= 0
        elif self._nonnegative(poly_scale(difference, -1)):
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
                    multiple = poly_mul(rest, poly_mul(divisor, self._floor_div(x, divisor)))
                    if not any(monomial for monomial in multiple) or any(
                        polynomial.get(term) != value for term, value in multiple.items() if term
                    ):
                        continue
                    replaced = poly_add(polynomial, poly_scale(multiple, -1))
                    replaced = poly_add(replaced, {monomial: -coefficient})
                    polynomial = poly_add(replaced, poly_mul(rest, x))
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


class _Polynomials(PrimExprFunctor):
    """The polynomial of each kind of expression in a :class:`CanonicalForm` (its atoms, its
    cache; given to each visit, so that the functor holds no form and makes no cycle)."""

    def visit_int_imm(self, expr: IntImm, form: CanonicalForm) -> Polynomial:
        return {(): expr.value} if expr.value else {}

    def visit_size_var(self, expr: SizeVar, form: CanonicalForm) -> Polynomial:
        return form._atom(expr)

    def visit_add(self, expr: Add, form: CanonicalForm) -> Polynomial:
        return form._recombine(poly_add(self.visit(expr.a, form), self.visit(expr.b, form)))

    def visit_sub(self, expr: Sub, form: CanonicalForm) -> Polynomial:
        return form._recombine(poly_add(self.visit(expr.a, form), poly_scale(self.visit(expr.b, form), -1)))

    def visit_mul(self, expr: Mul, form: CanonicalForm) -> Polynomial:
        return poly_mul(self.visit(expr.a, form), self.visit(expr.b, form))

    def visit_floor_div(self, expr: FloorDiv, form: CanonicalForm) -> Polynomial:
        return self.cached(expr, form, form._floor_div)

    def visit_floor_mod(self, expr: FloorMod, form: CanonicalForm) -> Polynomial:
        return self.cached(expr, form, form._floor_mod)

    def visit_min(self, expr: Min, form: CanonicalForm) -> Polynomial:
        return self.cached(expr, form, form._min)

    def visit_max(self, expr: Max, form: CanonicalForm) -> Polynomial:
        return self.cached(expr, form, form._max)

    def cached(self, expr: PrimExpr, form: CanonicalForm,
               combine: Callable[[Polynomial, Polynomial], Polynomial]) -> Polynomial:
        """The polynomial of a division, modulo, min or max term: its operands' combined
        (consulting the bounds), cached by the term's text."""
        key = format_expr(expr)
        cached = form._polys.get(key)
        if cached is None:
            a, b = self.visit(expr.a, form), self.visit(expr.b, form)  # type: ignore[attr-defined]
            cached = form._polys[key] = combine(a, b)
        return cached


_POLYNOMIALS = _Polynomials()
