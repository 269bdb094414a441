"""The analyzer of symbolic expressions: ranges of variables, proofs, bounds.

An :class:`Analyzer` knows a range for each variable (by default ``[0, inf)``) and proves
``a == b``, ``a <= b``, ``a < b`` and bounds expressions by interval reasoning over the
canonical form (``canonical_form.py``); its :meth:`~Analyzer.simplify` also uses the ranges.

Bounds use the canonical polynomials with Fraction coefficients: an atom in a term is
replaced by a polynomial that bounds it from the side the term's sign asks for (``a // c``
lies in ``[(a - (c - 1)) / c, a / c]``, ``min(a, b) <= a`` ...), which lets terms cancel
(``(n + 3) // 4 * 4 - n >= 0``), until only variables are left; then each monomial is bounded
from the variables' ranges (monotone, as variables are >= 0).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Iterable, Mapping

from .canonical_form import CanonicalForm
from .polynomial import (
    Bound, Interval, Monomial, Polynomial, monomial_mul, poly_add, poly_constant, poly_mul, poly_scale,
)
from .prim_expr import (
    FloorDiv, FloorMod, IntImm, IntLike, Max, Min, PrimExpr, PrimExprFunctor, SizeVar, Sub, as_expr, evaluate,
    free_vars,
)


class _Budget:
    """How many more substitution choices one bound query may try."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


class Analyzer(CanonicalForm):
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
        symbolic_lower: Mapping[str, PrimExpr] | None = None,
    ) -> None:
        super().__init__()
        self._ranges: dict[str, tuple[int, int | None]] = {
            name: _intersect((0, None), bounds, name) for name, bounds in (ranges or {}).items()
        }
        # name -> an expression the variable never exceeds (``i <= n - 1`` for a loop index)
        self._symbolic_upper: dict[str, PrimExpr] = dict(symbolic_upper or {})
        # name -> an expression the variable is never below (``i >= n`` in the else branch of ``i < n``)
        self._symbolic_lower: dict[str, PrimExpr] = dict(symbolic_lower or {})
        # the constant bounds as expressions, for the proofs that substitute a bound (upper ones,
        # and lower ones above 0: a variable is >= 0 anyway)
        self._constant_upper = {name: IntImm(hi) for name, (_, hi) in self._ranges.items() if hi is not None}
        self._constant_lower = {name: IntImm(lo) for name, (lo, _) in self._ranges.items() if lo > 0}
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
        return Analyzer(ranges, self._symbolic_upper, self._symbolic_lower)

    def with_symbolic_upper(self, name: str, upper: IntLike) -> Analyzer:
        """A new analyzer that also knows ``name <= upper`` for an expression ``upper`` (of
        other variables): an index below a symbolic extent, ``i <= n - 1``.  Proofs use it
        where a polynomial decreases in ``name`` (it is then smallest at ``name = upper``).
        It replaces an earlier symbolic upper bound of ``name``."""
        return Analyzer(self._ranges, {**self._symbolic_upper, name: as_expr(upper)}, self._symbolic_lower)

    def with_symbolic_lower(self, name: str, lower: IntLike) -> Analyzer:
        """A new analyzer that also knows ``name >= lower`` for an expression ``lower`` (of
        other variables): an index past the first pieces of a concatenation, ``i >= n``.
        Proofs use it where a polynomial increases in ``name`` (it is then smallest at
        ``name = lower``).  It replaces an earlier symbolic lower bound of ``name``."""
        return Analyzer(self._ranges, self._symbolic_upper, {**self._symbolic_lower, name: as_expr(lower)})

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
        constant = poly_constant(difference)
        if constant is not None:
            return constant == 0
        return self._nonnegative(difference) and self._nonnegative(poly_scale(difference, -1))

    def prove_less_equal(self, a: IntLike, b: IntLike) -> bool:
        """True only when a <= b for every assignment within the ranges."""
        self._trim_caches()
        return self._nonnegative(self._to_polynomial(Sub(as_expr(b), as_expr(a))))

    def prove_less(self, a: IntLike, b: IntLike) -> bool:
        """True only when a < b (that is a + 1 <= b: the values are integers)."""
        self._trim_caches()
        return self._nonnegative(poly_add(self._to_polynomial(Sub(as_expr(b), as_expr(a))), {(): -1}))

    def prove_not_equal(self, a: IntLike, b: IntLike) -> bool:
        """True only when a != b for every assignment within the ranges (``3`` vs ``4``,
        ``n`` vs ``n + 1``): one is provably less than the other."""
        return self.prove_less(a, b) or self.prove_less(b, a)

    def prove_nonnegative(self, expr: IntLike) -> bool:
        """True only when expr >= 0 for every assignment within the ranges."""
        self._trim_caches()
        return self._nonnegative(self._to_polynomial(as_expr(expr)))

    def prove_nondecreasing(self, expr: IntLike) -> bool:
        """True only when expr never decreases as any variable grows (see ``_nondecreasing``)."""
        return self._nondecreasing(self._to_polynomial(as_expr(expr)))

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


    # -- bounds ------------------------------------------------------------------------

    def _nonnegative(self, polynomial: Polynomial, depth: int = 0) -> bool:
        """Whether the (integer-valued) polynomial is >= 0: its lower bound is > -1."""
        constant = poly_constant(polynomial)
        if constant is not None:
            return constant >= 0
        bound = self._poly_bound(polynomial, lower=True, goal=Fraction(-1))
        if bound is not None and bound > -1:
            return True
        return depth < 4 and self._nonnegative_at_symbolic_bound(polynomial, depth)

    def _nonnegative_at_symbolic_bound(self, polynomial: Polynomial, depth: int) -> bool:
        """P = c * v + R with c <= 0 and v <= U gives P >= c * U + R, and with c >= 0 and
        v >= L, P >= c * L + R: prove that instead.  The bounds are the symbolic ones, and the
        constant ones where the slope c is not a constant (``n * i - 4 * n >= 0`` for ``i >=
        4``: intervals bound ``n * i`` and ``4 * n`` apart, and cannot)."""
        for bounds, decreasing, constant in ((self._symbolic_upper, True, False), (self._symbolic_lower, False, False),
                                             (self._constant_upper, True, True), (self._constant_lower, False, True)):
            for name, bound in bounds.items():
                with_v = {m: c for m, c in polynomial.items() if any(key == name for key, _ in m)}
                if not with_v or any(power != 1 for m in with_v for key, power in m if key == name):
                    continue
                slope = {tuple(f for f in m if f[0] != name): c for m, c in with_v.items()}
                if constant and poly_constant(slope) is not None:
                    continue
                if not self._nonnegative(poly_scale(slope, -1) if decreasing else slope, depth + 1):
                    continue
                rest = {m: c for m, c in polynomial.items() if m not in with_v}
                if self._nonnegative(poly_add(rest, poly_mul(slope, self._to_polynomial(bound))), depth + 1):
                    return True
        return False

    def _interval(self, polynomial: Polynomial) -> Interval:
        """Integer bounds (None: unbounded) of an integer-valued polynomial."""
        constant = poly_constant(polynomial)
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
                kept = poly_add(kept, {monomial: coefficient})
            elif len(others) == 1 and others[0][1] == 1:
                # coefficient * variables * atom: replace the atom by a polynomial bound
                units.setdefault((others[0][0], want_low), []).append((coefficient, variables))
            else:
                lo, hi = self._monomial_interval(monomial)
                value = lo if want_low else hi
                if value is None:
                    return None
                kept = poly_add(kept, {(): coefficient * value})
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
                        substituted = poly_add(substituted, {monomial_mul(monomial, variables): coefficient * value})
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
        if cached is None:
            cached = self._intervals[key] = _ATOM_INTERVALS.visit(self._atoms[key], self)
        return cached

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
        candidates = _CANDIDATES.visit(self._atoms[key], self, want_low)
        lo, hi = self._atom_interval(key)
        numeric = lo if want_low else hi
        if numeric is not None:
            candidates.append({(): numeric} if numeric else {})
        self._candidate_cache[(key, want_low)] = candidates
        return candidates


class _AtomIntervals(PrimExprFunctor):
    """Integer bounds of each kind of atom from its operands' bounds (None: unbounded), in an
    analyzer (given to each visit: the functor holds none and makes no cycle)."""

    def operand(self, expr: PrimExpr, analyzer: Analyzer) -> Interval:
        return analyzer._interval(analyzer._to_polynomial(expr))

    def visit_size_var(self, atom: SizeVar, analyzer: Analyzer) -> Interval:
        return analyzer.range_of(atom.name)

    def visit_min(self, atom: Min, analyzer: Analyzer) -> Interval:
        (alo, ahi), (blo, bhi) = self.operand(atom.a, analyzer), self.operand(atom.b, analyzer)
        return _min_or_none(alo, blo, unbounded_wins=True), _min_or_none(ahi, bhi, unbounded_wins=False)

    def visit_max(self, atom: Max, analyzer: Analyzer) -> Interval:
        (alo, ahi), (blo, bhi) = self.operand(atom.a, analyzer), self.operand(atom.b, analyzer)
        return _max_or_none(alo, blo, unbounded_wins=False), _max_or_none(ahi, bhi, unbounded_wins=True)

    def visit_floor_div(self, atom: FloorDiv, analyzer: Analyzer) -> Interval:
        alo, ahi = self.operand(atom.a, analyzer)
        if not isinstance(atom.b, IntImm):
            positive = analyzer._positive_divisor(analyzer._to_polynomial(atom.b))
            return (None, None) if positive is None else _div_interval(alo, ahi, *positive)
        divisor = atom.b.value
        if divisor > 0:
            return (None if alo is None else alo // divisor), (None if ahi is None else ahi // divisor)
        return (None if ahi is None else ahi // divisor), (None if alo is None else alo // divisor)

    def visit_floor_mod(self, atom: FloorMod, analyzer: Analyzer) -> Interval:
        alo, ahi = self.operand(atom.a, analyzer)
        if not isinstance(atom.b, IntImm):
            positive = analyzer._positive_divisor(analyzer._to_polynomial(atom.b))
            return (None, None) if positive is None else _mod_interval(alo, ahi, *positive)
        divisor = atom.b.value
        return _mod_interval(alo, ahi, divisor, divisor) if divisor > 0 else (divisor + 1, 0)

    def visit_default(self, atom: PrimExpr, analyzer: Analyzer) -> Interval:
        return None, None


class _Candidates(PrimExprFunctor):
    """For each kind of atom, polynomials known to be <= it (``want_low``) or >= it in an
    analyzer, best first (none for a kind without such bounds)."""

    def numerator(self, atom: FloorDiv | FloorMod, analyzer: Analyzer) -> tuple[Polynomial, bool]:
        """The atom's numerator, and whether it is provably >= 0."""
        a = analyzer._to_polynomial(atom.a)
        return a, analyzer._nonnegative(a)

    def visit_floor_div(self, atom: FloorDiv, analyzer: Analyzer, want_low: bool) -> list[dict[Monomial, Fraction]]:
        a, a_nonnegative = self.numerator(atom, analyzer)
        if isinstance(atom.b, IntImm):
            divisor = atom.b.value
            if divisor <= 0:
                return []
            # (a - (c - 1)) / c <= a // c <= a / c
            shifted = a if not want_low else poly_add(a, {(): 1 - divisor})
            return [poly_scale(shifted, Fraction(1, divisor))]
        positive = analyzer._positive_divisor(analyzer._to_polynomial(atom.b))
        if positive is None or not a_nonnegative:
            return []
        blo, bhi = positive
        if want_low and bhi is not None:  # a // b >= a // bhi >= (a - (bhi - 1)) / bhi
            return [poly_scale(poly_add(a, {(): 1 - bhi}), Fraction(1, bhi))]
        if not want_low:  # a // b <= a / blo
            return [poly_scale(a, Fraction(1, blo))]
        return []

    def visit_floor_mod(self, atom: FloorMod, analyzer: Analyzer, want_low: bool) -> list[dict[Monomial, Fraction]]:
        a, a_nonnegative = self.numerator(atom, analyzer)
        if isinstance(atom.b, IntImm):
            divisor = atom.b.value
            if divisor <= 0:
                return []
            # a % c == a - c * (a // c), and a % c <= a when a >= 0
            candidates = [poly_add(a, poly_scale(analyzer._floor_div(a, {(): divisor}), -divisor))]
            if not want_low and a_nonnegative:
                candidates.append(dict(a))
            return candidates
        b = analyzer._to_polynomial(atom.b)
        positive = analyzer._positive_divisor(b)
        if positive is None or not a_nonnegative or want_low:
            return []
        return [poly_add(b, {(): -1}), dict(a)]  # a % b <= b - 1 and a % b <= a

    def visit_min(self, atom: Min, analyzer: Analyzer, want_low: bool) -> list[dict[Monomial, Fraction]]:
        return [] if want_low else self.operands(atom, analyzer)  # min(a, b) <= a, b, (a + b) / 2

    def visit_max(self, atom: Max, analyzer: Analyzer, want_low: bool) -> list[dict[Monomial, Fraction]]:
        return self.operands(atom, analyzer) if want_low else []  # max(a, b) >= a, b, (a + b) / 2

    def operands(self, atom: Min | Max, analyzer: Analyzer) -> list[dict[Monomial, Fraction]]:
        a, b = analyzer._to_polynomial(atom.a), analyzer._to_polynomial(atom.b)
        return [dict(a), dict(b), poly_scale(poly_add(a, b), Fraction(1, 2))]

    def visit_default(self, atom: PrimExpr, analyzer: Analyzer, want_low: bool) -> list[dict[Monomial, Fraction]]:
        return []


_ATOM_INTERVALS = _AtomIntervals()
_CANDIDATES = _Candidates()


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
