"""Tests of relaxweb.ir.symbolic: canonical forms, printing, proofs, bounds.

The property tests build random expression trees over two size variables ``n`` and ``m``
(with the raw node classes, so nothing is folded before ``simplify`` sees it) and check the
simplifier and the provers against plain evaluation on random variable values.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaxweb.ir.symbolic import (
    Add, Analyzer, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub, as_expr, as_int,
    evaluate, expr_max, expr_min, format_expr, free_vars, product, prove_equal, prove_less,
    prove_less_equal, prove_nonnegative, simplify, substitute, upper_bound,
)

n = SizeVar("n")
m = SizeVar("m")
k = SizeVar("k")


# Canonical forms ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ((n * 4) // 4, "n"),
        ((n * 12 * 64) // (12 * 64), "n"),
        (FloorDiv(Mul(Mul(n, IntImm(12)), IntImm(64)), Mul(IntImm(12), IntImm(64))), "n"),
        ((4 * n + 3) % 4, "3"),
        ((4 * n + 3) // 4, "n"),
        ((n * 4 + 2) // 2, "n * 2 + 1"),
        ((n * 6) % 3, "0"),
        (expr_min(n, n + 1), "n"),
        (expr_max(n, n + 1), "n + 1"),
        (expr_min(n + 5, n - 2), "n - 2"),
        (n - n, "0"),
        (n + 0, "n"),
        ((n + 1) * (n + 1), "n * n + n * 2 + 1"),
        ((n + 3) // 4, "(n + 3) // 4"),
        (n * 768, "n * 768"),
        (Sub(Add(n, m), m), "n"),
        (Mul(IntImm(1), n), "n"),
    ],
)
def test_simplify_canonical_form(expr: PrimExpr, expected: str) -> None:
    assert format_expr(simplify(expr)) == expected


def test_simplify_makes_commuted_products_identical() -> None:
    a = simplify(n * m * 2)
    b = simplify(2 * m * n)
    assert a == b
    assert str(a) == str(b) == "m * n * 2"
    assert prove_equal(n * m * 2, 2 * m * n)


def test_simplify_orders_min_operands() -> None:
    assert simplify(expr_min(n, m)) == simplify(expr_min(m, n))
    assert str(simplify(expr_max(n, m))) == "max(m, n)"


def test_simplify_of_int_and_constant_expression() -> None:
    assert simplify(7) == IntImm(7)
    assert simplify(IntImm(3) * 4 + 2) == IntImm(14)
    assert as_int((n * 4) // 4 - n + 9) == 9
    assert as_int(n + 1) is None


def test_operators_fold_constants_and_identities() -> None:
    assert IntImm(6) // 4 == IntImm(1)
    assert IntImm(-7) // 2 == IntImm(-4)  # floor division
    assert IntImm(-7) % 2 == IntImm(1)  # floor modulo
    assert n * 1 is n
    assert n + 0 is n
    assert n * 0 == IntImm(0)
    assert n % 1 == IntImm(0)
    assert isinstance(n + 1, Add)


def test_as_expr_accepts_numpy_ints_and_rejects_other_things() -> None:
    import numpy as np

    assert as_expr(np.int64(5)) == IntImm(5)
    with pytest.raises(TypeError):
        as_expr(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        as_expr(True)


def test_division_by_zero_raises() -> None:
    with pytest.raises(ZeroDivisionError):
        simplify(FloorDiv(n, IntImm(0)))
    with pytest.raises(ZeroDivisionError):
        IntImm(3) % 0


# Printing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        (n * 256, "n * 256"),
        ((n + 3) // 4, "(n + 3) // 4"),
        (n * (m + 1), "n * (m + 1)"),
        (n - (m - 1), "n - (m - 1)"),
        (n - m - 1, "n - m - 1"),
        (n + (m + 1), "n + m + 1"),
        (n // (m // 2), "n // (m // 2)"),
        (n // m // 2, "n // m // 2"),
        (expr_min(n, m * 2), "min(n, m * 2)"),
        (expr_max(n + 1, 4), "max(n + 1, 4)"),
        (Add(n, IntImm(-3)), "n + (-3)"),
        (IntImm(-3), "-3"),
    ],
)
def test_format_expr(expr: PrimExpr, text: str) -> None:
    assert format_expr(expr) == text
    assert str(expr) == text


def test_free_vars_and_substitute() -> None:
    expr = (m * n + n) // 4
    assert [v.name for v in free_vars(expr)] == ["m", "n"]
    assert free_vars(IntImm(3)) == []
    assert substitute(n * 4 + m, {"n": IntImm(2)}) == simplify(m + 8)
    assert substitute(n * 12, {"n": m * 2}) == simplify(m * 24)


def test_evaluate_with_values_and_missing_variable() -> None:
    assert evaluate((n * 4 + m) // 3, {"n": 5, "m": 2}) == 7
    assert evaluate(expr_min(n, m) - expr_max(n, m), {"n": 9, "m": 2}) == -7
    with pytest.raises(KeyError, match="'m' has no value"):
        evaluate(n + m, {"n": 1})


def test_product() -> None:
    assert product([]) == IntImm(1)
    assert product([n, 12, 64]) == simplify(n * 768)
    assert str(product([2, m, n, 3])) == "m * n * 6"


# Proofs ------------------------------------------------------------------------------------


def test_prove_equal() -> None:
    assert prove_equal(n * 12 * 64, 768 * n)
    assert prove_equal((n * 4) // 4, n)
    assert prove_equal((n + 1) * (n - 1), n * n - 1)
    assert prove_equal(4, IntImm(4))
    assert not prove_equal(n, m)
    assert not prove_equal(n, n + 1)
    assert not prove_equal((n // 2) * 2, n)  # false for odd n
    assert not prove_equal(n, 4)


def test_prove_less_equal() -> None:
    assert prove_less_equal(n, n + 1)
    assert prove_less_equal(n, n)
    assert prove_less_equal(n * 4, n * 12)
    assert prove_less_equal(0, n * m)
    assert prove_less_equal(n // 4, n // 4 + m)
    assert not prove_less_equal(n + 1, n)
    assert not prove_less_equal(n, m)  # unknown, not false
    assert not prove_less_equal(n * 12, n * 4)
    assert not prove_less_equal(n, 64)


def test_prove_nonnegative() -> None:
    assert prove_nonnegative(n * m + 3)
    assert prove_nonnegative(n // 4)
    assert prove_nonnegative(expr_min(n, m))
    assert not prove_nonnegative(n - 1)
    assert not prove_nonnegative((n - 5) // 4)


def test_upper_bound() -> None:
    assert upper_bound(n * 256, {"n": 64}) == 16384
    assert upper_bound(m * n * 4 + 8, {"n": 3, "m": 5}) == 68
    assert upper_bound((n + 3) // 4, {"n": 5}) == 2
    assert upper_bound(expr_max(n * 4, m), {"n": 2, "m": 100}) == 100
    assert upper_bound(1024, {}) == 1024
    assert upper_bound(n * 4, {}) is None  # n has no bound
    assert upper_bound(n * 4, {"n": None}) is None  # type: ignore[dict-item]
    assert upper_bound(n * m, {"n": 4}) is None
    assert upper_bound(n - m, {"n": 4, "m": 4}) is None  # not provably non-decreasing


@pytest.mark.parametrize(
    ("expr", "bounds", "worst"),
    [
        # n % 4 with n <= 4 reaches 3 (at n = 3), but is 0 at the bound itself.
        (n % 4, {"n": 4}, {"n": 3}),
        # 64 // n with n <= 64 is 64 at n = 1, 1 at the bound.
        (IntImm(64) // n, {"n": 64}, {"n": 1}),
        # n // m decreases in m.
        (n // m, {"n": 10, "m": 5}, {"n": 10, "m": 1}),
    ],
)
def test_upper_bound_is_never_below_a_value_within_the_bounds(expr, bounds, worst) -> None:
    """upper_bound must not claim a bound that a value within the bounds exceeds."""
    bound = upper_bound(expr, bounds)
    assert bound is None or bound >= evaluate(expr, worst), (
        f"upper_bound({format_expr(expr)}, {bounds}) = {bound}, "
        f"but the value at {worst} is {evaluate(expr, worst)}"
    )


# Property tests ----------------------------------------------------------------------------

_LEAVES = st.one_of(st.just(n), st.just(m), st.integers(-4, 9).map(IntImm))


def _extend(children: st.SearchStrategy[PrimExpr]) -> st.SearchStrategy[PrimExpr]:
    binary = st.tuples(st.sampled_from([Add, Sub, Mul, Min, Max]), children, children)
    by_constant = st.tuples(st.sampled_from([FloorDiv, FloorMod]), children, st.integers(1, 8))
    return st.one_of(
        binary.map(lambda t: t[0](t[1], t[2])),
        by_constant.map(lambda t: t[0](t[1], IntImm(t[2]))),
    )


EXPRESSIONS = st.recursive(_LEAVES, _extend, max_leaves=10)
ENVIRONMENT = st.fixed_dictionaries({"n": st.integers(0, 50), "m": st.integers(0, 50)})
ENVIRONMENTS = st.lists(ENVIRONMENT, min_size=1, max_size=6)
CORNERS = [{"n": 0, "m": 0}, {"n": 50, "m": 0}, {"n": 0, "m": 50}, {"n": 50, "m": 50}, {"n": 1, "m": 1}]

PROPERTY_SETTINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@pytest.mark.slow  # hundreds of generated expressions, 3-12 s
@PROPERTY_SETTINGS
@given(EXPRESSIONS, ENVIRONMENTS)
def test_simplify_preserves_value(expr: PrimExpr, environments: list[dict[str, int]]) -> None:
    simplified = simplify(expr)
    for environment in environments + CORNERS:
        assert evaluate(simplified, environment) == evaluate(expr, environment), (
            format_expr(expr), format_expr(simplified), environment,
        )
    # canonical form is a fixed point
    assert simplify(simplified) == simplified


@pytest.mark.slow  # hundreds of generated expressions, 3-12 s
@PROPERTY_SETTINGS
@given(EXPRESSIONS, EXPRESSIONS, ENVIRONMENTS)
def test_provers_are_sound(a: PrimExpr, c: PrimExpr, environments: list[dict[str, int]]) -> None:
    # (a, a + c) and (a, a + c - c) make the provers answer True often enough to matter.
    pairs = [(a, c), (a, Add(a, c)), (a, Sub(Add(a, c), c)), (Add(a, c), a)]
    for x, y in pairs:
        equal, less_equal = prove_equal(x, y), prove_less_equal(x, y)
        for environment in environments + CORNERS:
            vx, vy = evaluate(x, environment), evaluate(y, environment)
            if equal:
                assert vx == vy, (format_expr(x), format_expr(y), environment)
            if less_equal:
                assert vx <= vy, (format_expr(x), format_expr(y), environment)
    # the provers are not vacuous: x == x + c - c is always found
    assert prove_equal(a, Sub(Add(a, c), c))
    assert prove_less_equal(a, Sub(Add(a, c), c))


# Analyzer ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ((n // 4) // 2, "n // 8"),
        ((n * 4) // 8, "n // 2"),
        ((n * 2 + 2) // 4, "(n + 1) // 2"),
        ((n % 8) % 4, "n % 4"),
        ((n * 6 + 4) % 4, "n % 2 * 2"),
        ((n // 4 + 1) // 2, "(n + 4) // 8"),
        (n // 4 * 4 + n % 4, "n"),
        (m * (n // 4 * 4 + n % 4) - n * m, "0"),
        ((n * m * 4) // (m * 2), "n * 2"),
        ((n * m + m) // m, "n + 1"),
        ((n * m * 12) // (n * 8), "m * 3 // 2"),  # a common factor cancels (the divisor is not 0)
        ((n * m + n) // (n * 2), "(m + 1) // 2"),
        ((n * m + n) // (m + 1), "n"),
        ((n * m) % m, "0"),
        ((n * 4 + m + 4) // 4, "m // 4 + n + 1"),
        ((n - 1) // 4, "(n + 3) // 4 - 1"),  # the numerator becomes non-negative
        (expr_min(n, n * 2), "n"),  # size variables are >= 0
        (expr_max(n, 0), "n"),
        (n % (n + 1), "n"),
        (n // (n + 1), "0"),
    ],
)
def test_simplify_divisions_and_ranges(expr: PrimExpr, expected: str) -> None:
    assert format_expr(simplify(expr)) == expected


def test_analyzer_simplify_uses_ranges() -> None:
    small = Analyzer({"n": (0, 7)})
    assert small.simplify(n // 8) == IntImm(0)
    assert small.simplify(n % 8) == n
    assert str(small.simplify(expr_min(n, 64))) == "n"
    assert str(small.simplify(expr_max(n, 7))) == "7"
    assert str(small.simplify((n + 8) // 8)) == "1"
    shifted = Analyzer({"n": (8, 15)})
    assert shifted.simplify(n // 8) == IntImm(1)
    assert str(shifted.simplify(n % 8)) == "n - 8"
    assert str(Analyzer().simplify(n // 8)) == "n // 8"  # unknown without a range


def test_analyzer_ranges_are_immutable_and_intersect() -> None:
    base = Analyzer()
    bounded = base.with_range("n", 0, 63)
    assert base.range_of("n") == (0, None)
    assert bounded.range_of("n") == (0, 63)
    assert bounded.with_range("n", 4, 100).range_of("n") == (4, 63)
    assert Analyzer({"n": (-5, 3)}).range_of("n") == (0, 3)  # size variables are >= 0
    assert Analyzer.from_bounds({"n": 8, "m": None}).ranges == {"n": (0, 8), "m": (0, None)}
    assert base.prove_equal(n // 64, 0) is False
    assert bounded.prove_equal(n // 64, 0) is True
    with pytest.raises(ValueError, match="empty range"):
        bounded.with_range("n", 64, None)


def test_analyzer_proofs() -> None:
    analyzer = Analyzer()
    assert analyzer.prove_less_equal(n, (n + 3) // 4 * 4)
    assert analyzer.prove_less((n + 7) // 8 * 8, n + 8)
    assert analyzer.prove_less(n % 4, 4)
    assert analyzer.prove_less_equal(n - n // 2, n)
    assert analyzer.prove_less_equal(n // 2, n - n // 2)
    assert analyzer.prove_equal(n // 4 * 4 + n % 4, n)
    assert analyzer.prove_equal((n * 5) // 4 - n, n // 4)  # by bounds, not by form
    assert analyzer.prove_less_equal(expr_min(n, m), expr_max(n, m))
    assert analyzer.prove_less_equal(expr_min(n, m) * 2, n + m)
    assert analyzer.prove_less_equal(n // 4 + m // 4, (n + m) // 4)
    assert not analyzer.prove_less(n, n)
    assert not analyzer.prove_less_equal(n // 4 * 4, n - 1)
    assert not analyzer.prove_equal(n // 2 * 2, n)
    assert not analyzer.prove_less_equal(n, m)
    assert prove_less(n, n + 1) and not prove_less(n, n)
    ranged = Analyzer({"n": (8, None), "m": (0, 7)})
    assert ranged.prove_less(m, n)
    assert ranged.prove_less_equal(1, n - m)
    assert Analyzer({"m": (1, None)}).prove_less(n % m, m)
    assert Analyzer({"m": (1, None)}).prove_less_equal(n // m, n)


def test_analyzer_bounds() -> None:
    bounded = Analyzer({"n": (0, 64), "m": (2, 10)})
    assert bounded.upper_bound(n * m * 4) == 2560
    assert bounded.lower_bound(n * m * 4) == 0
    assert bounded.lower_bound(m * 3 - 1) == 5
    assert bounded.upper_bound(n - m) == 62
    assert bounded.lower_bound(n - m) == -10
    assert bounded.upper_bound(n % 8) == 7
    assert bounded.upper_bound((n + 127) // 128) == 1
    assert bounded.upper_bound(64 - expr_min(n, 64)) == 64
    assert bounded.upper_bound(n // m) == 32
    assert bounded.upper_bound(n % m) == 9
    assert Analyzer().upper_bound(n) is None
    assert Analyzer().lower_bound(n - m) is None
    assert Analyzer().lower_bound((n + 3) // 4 * 4 - n) == 0
    assert Analyzer().upper_bound((n + 3) // 4 * 4 - n) == 3


def test_printing_keeps_the_grouping_of_a_right_operand() -> None:
    """m * (n // 3) is not m * n // 3: both print differently and are not proved equal."""
    a = Mul(m, FloorDiv(n, IntImm(3)))
    b = FloorDiv(Mul(m, n), IntImm(3))
    assert format_expr(a) == "m * (n // 3)"
    assert format_expr(b) == "m * n // 3"
    assert format_expr(Mul(n, FloorMod(m, IntImm(4)))) == "n * (m % 4)"
    assert format_expr(Mul(n, Mul(m, k))) == "n * m * k"
    assert not prove_equal(FloorDiv(a, IntImm(5)), FloorDiv(b, IntImm(5)))
    assert evaluate(a, {"n": 2, "m": 3}) != evaluate(b, {"n": 2, "m": 3})


def test_identities_script_proves_the_listed_identities() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "symbolic_identities.py"
    spec = importlib.util.spec_from_file_location("symbolic_identities", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = {text: module.check(rel, a, b, an) for text, rel, a, b, an in module.IDENTITIES}
    assert len(results) >= 20
    for text in ["(n*4)//4 == n", "(n+3)//4*4 >= n", "n*m*2 == 2*m*n", "min(n, n+1) == n",
                 "(n*12*64)//(12*64) == n", "n//4*4 + n%4 == n", "n // 64 == 0 given n <= 63"]:
        assert results[text], text
    assert sum(results.values()) >= 40


# Property tests of the Analyzer over n, m, k and random ranges ------------------------------
#
# Divisors are positive constants, expressions made positive (e + c with e >= 0) or arbitrary
# expressions; assignments where some divisor evaluates to 0 are skipped (the analyzer assumes
# a divisor is non-zero where it is evaluated).

_VARS3 = [n, m, k]
_LEAVES3 = st.one_of(st.sampled_from(_VARS3), st.integers(-3, 9).map(IntImm))
_NONNEGATIVE_LEAVES = st.one_of(st.sampled_from(_VARS3), st.integers(0, 6).map(IntImm))


def _extend_nonnegative(children: st.SearchStrategy[PrimExpr]) -> st.SearchStrategy[PrimExpr]:
    return st.one_of(
        st.tuples(st.sampled_from([Add, Mul, Min, Max]), children, children).map(lambda t: t[0](t[1], t[2])),
        st.tuples(st.sampled_from([FloorDiv, FloorMod]), children, st.integers(1, 8)).map(
            lambda t: t[0](t[1], IntImm(t[2]))),
    )


POSITIVE = st.tuples(st.recursive(_NONNEGATIVE_LEAVES, _extend_nonnegative, max_leaves=3), st.integers(1, 3)).map(
    lambda t: Add(t[0], IntImm(t[1])))


def _extend3(children: st.SearchStrategy[PrimExpr]) -> st.SearchStrategy[PrimExpr]:
    divisor = st.one_of(st.integers(1, 8).map(IntImm), st.integers(-4, -1).map(IntImm), POSITIVE, children)
    return st.one_of(
        st.tuples(st.sampled_from([Add, Sub, Mul, Min, Max]), children, children).map(lambda t: t[0](t[1], t[2])),
        st.tuples(st.sampled_from([FloorDiv, FloorMod]), children, divisor).map(lambda t: t[0](t[1], t[2])),
    )


EXPRESSIONS3 = st.recursive(_LEAVES3, _extend3, max_leaves=8)


@st.composite
def _ranges(draw) -> dict[str, tuple[int, int | None]]:
    ranges = {}
    for var in _VARS3:
        if draw(st.booleans()):
            lo = draw(st.integers(0, 6))
            hi = draw(st.one_of(st.none(), st.integers(lo, lo + 12)))
            ranges[var.name] = (lo, hi)
    return ranges


RANGES = _ranges()


def _assignments(ranges: dict[str, tuple[int, int | None]], draw_values: list[int]) -> list[dict[str, int]]:
    """All assignments within the ranges when there are few, else corners and random ones."""
    spans = {}
    for var in _VARS3:
        lo, hi = ranges.get(var.name, (0, None))
        spans[var.name] = (lo, lo + 40 if hi is None else hi)
    sizes = [hi - lo + 1 for lo, hi in spans.values()]
    if sizes[0] * sizes[1] * sizes[2] <= 64:
        import itertools

        axes = [range(lo, hi + 1) for lo, hi in spans.values()]
        return [dict(zip(spans, values)) for values in itertools.product(*axes)]
    corners = [{name: span[i] for name, span in spans.items()} for i in (0, 1)]
    randoms = []
    for index in range(0, len(draw_values) - 2, 3):
        randoms.append({
            name: lo + draw_values[index + j] % (hi - lo + 1) for j, (name, (lo, hi)) in enumerate(spans.items())
        })
    return corners + randoms


def _value(expr: PrimExpr, environment: dict[str, int]) -> int | None:
    try:
        return evaluate(expr, environment)  # type: ignore[return-value]
    except ZeroDivisionError:
        return None


ANALYZER_SETTINGS = settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
RANDOM_VALUES = st.lists(st.integers(0, 10_000), min_size=12, max_size=24)


@pytest.mark.slow  # hundreds of generated expressions, 3-12 s
@ANALYZER_SETTINGS
@given(EXPRESSIONS3, RANGES, RANDOM_VALUES)
def test_analyzer_simplify_and_bounds_hold(expr: PrimExpr, ranges, values: list[int]) -> None:
    analyzer = Analyzer(ranges)
    try:
        plain = simplify(expr)
        ranged = analyzer.simplify(expr)
    except ZeroDivisionError:  # some divisor simplifies to 0
        return
    assert simplify(plain) == plain
    assert analyzer.simplify(ranged) == ranged
    lo, hi = analyzer.lower_bound(expr), analyzer.upper_bound(expr)
    for environment in _assignments(ranges, values):
        value = _value(expr, environment)
        if value is None:
            continue
        assert _value(plain, environment) == value, (format_expr(plain), format_expr(expr), environment)
        assert _value(ranged, environment) == value, (format_expr(ranged), format_expr(expr), ranges, environment)
        assert lo is None or lo <= value, (lo, format_expr(expr), ranges, environment)
        assert hi is None or value <= hi, (hi, format_expr(expr), ranges, environment)


def _pairs(a: PrimExpr, c: PrimExpr) -> list[tuple[PrimExpr, PrimExpr]]:
    """Pairs for which the provers often answer True (so that their soundness is exercised)."""
    return [
        (a, c), (a, Add(a, c)), (Add(a, c), a), (a, Sub(Add(a, c), c)),
        (Mul(FloorDiv(Add(a, IntImm(3)), IntImm(4)), IntImm(4)), a),
        (FloorMod(a, IntImm(4)), IntImm(3)), (FloorMod(a, IntImm(4)), a),
        (FloorDiv(a, IntImm(4)), a), (Min(a, c), a), (Max(a, c), c), (Min(a, c), Max(a, c)),
        (Add(Mul(FloorDiv(a, IntImm(4)), IntImm(4)), FloorMod(a, IntImm(4))), a),
        (a, IntImm(0)), (IntImm(0), a), (a, IntImm(12)),
    ]


@pytest.mark.slow  # hundreds of generated expressions, 3-12 s
@ANALYZER_SETTINGS
@given(EXPRESSIONS3, EXPRESSIONS3, RANGES, RANDOM_VALUES)
def test_analyzer_proofs_hold(a: PrimExpr, c: PrimExpr, ranges, values: list[int]) -> None:
    analyzer = Analyzer(ranges)
    environments = _assignments(ranges, values)
    for x, y in _pairs(a, c):
        try:
            equal = analyzer.prove_equal(x, y)
            less_equal, less = analyzer.prove_less_equal(x, y), analyzer.prove_less(x, y)
        except ZeroDivisionError:  # some divisor simplifies to 0
            continue
        if not (equal or less_equal or less):
            continue
        for environment in environments:
            vx, vy = _value(x, environment), _value(y, environment)
            if vx is None or vy is None:
                continue
            assert not equal or vx == vy, ("==", format_expr(x), format_expr(y), ranges, environment)
            assert not less_equal or vx <= vy, ("<=", format_expr(x), format_expr(y), ranges, environment)
            assert not less or vx < vy, ("<", format_expr(x), format_expr(y), ranges, environment)
