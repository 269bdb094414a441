"""Polynomials with integer (or, for bounds, fractional) coefficients over atoms: the
arithmetic of the canonical form of symbolic expressions (``canonical_form.py``).

A polynomial maps a monomial (a sorted tuple of (atom key, power)) to its non-zero
coefficient; the constant term's monomial is ``()``.  Atoms are keyed by their text (see
``canonical_form.py``); this module only adds, multiplies and divides.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Mapping, Optional, Union

Monomial = tuple[tuple[str, int], ...]
Polynomial = dict[Monomial, int]
Bound = Optional[Union[int, Fraction]]
Interval = tuple[Optional[int], Optional[int]]


def poly_add(a: Mapping[Monomial, int | Fraction], b: Mapping[Monomial, int | Fraction]) -> dict:
    result = dict(a)
    for monomial, coefficient in b.items():
        total = result.get(monomial, 0) + coefficient
        if total:
            result[monomial] = total
        else:
            result.pop(monomial, None)
    return result


def poly_scale(a: Mapping[Monomial, int | Fraction], factor: int | Fraction) -> dict:
    return {m: c * factor for m, c in a.items() if c * factor}


def monomial_mul(a: Monomial, b: Monomial) -> Monomial:
    powers: dict[str, int] = dict(a)
    for key, power in b:
        powers[key] = powers.get(key, 0) + power
    return tuple(sorted(powers.items()))


def poly_mul(a: Mapping[Monomial, int | Fraction], b: Mapping[Monomial, int | Fraction]) -> dict:
    result: dict = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            result = poly_add(result, {monomial_mul(ma, mb): ca * cb})
    return result


def poly_constant(a: Mapping[Monomial, int | Fraction]) -> int | Fraction | None:
    if not a:
        return 0
    if len(a) == 1 and () in a:
        return a[()]
    return None


def split_multiples(a: Polynomial, divisor: int) -> tuple[Polynomial, Polynomial]:
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


def monomial_order(monomial: Monomial) -> tuple:
    return (sum(power for _, power in monomial), monomial)


def poly_divmod(a: Polynomial, b: Polynomial) -> tuple[Polynomial, Polynomial]:
    """a == b * quotient + rest by division on leading terms (integer coefficients only).

    Each step keeps the identity, so the result is exact whatever the monomial order does;
    the step limit only stops a division that does not terminate.
    """
    lead_monomial, lead_coefficient = max(b.items(), key=lambda item: monomial_order(item[0]))
    quotient: Polynomial = {}
    rest: Polynomial = {}
    pending = dict(a)
    for _ in range(64):
        if not pending:
            return quotient, rest
        monomial, coefficient = max(pending.items(), key=lambda item: monomial_order(item[0]))
        factor = monomial_quotient(monomial, lead_monomial)
        if factor is not None and coefficient % lead_coefficient == 0:
            term = {factor: coefficient // lead_coefficient}
            quotient = poly_add(quotient, term)
            pending = poly_add(pending, poly_scale(poly_mul(term, b), -1))
        else:
            rest = poly_add(rest, {monomial: coefficient})
            del pending[monomial]
    return {}, dict(a)


def common_factor(*polynomials: Polynomial) -> Monomial:
    """The largest monomial dividing every term of every polynomial (``n`` for ``12 n s`` and
    ``8 n``; empty when some term is a constant)."""
    terms = [monomial for polynomial in polynomials for monomial in polynomial]
    powers = dict(terms[0]) if terms else {}
    for monomial in terms[1:]:
        own = dict(monomial)
        powers = {key: min(power, own[key]) for key, power in powers.items() if key in own}
    return tuple(sorted(powers.items()))


def divide_by_monomial(polynomial: Polynomial, monomial: Monomial) -> Polynomial:
    return {monomial_quotient(term, monomial): coefficient for term, coefficient in polynomial.items()}  # type: ignore[misc]


def monomial_quotient(a: Monomial, b: Monomial) -> Monomial | None:
    """a / b when b divides a."""
    powers = dict(a)
    for key, power in b:
        if powers.get(key, 0) < power:
            return None
        powers[key] -= power
    return tuple(sorted((key, power) for key, power in powers.items() if power))
