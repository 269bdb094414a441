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
    Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub, as_expr, as_int,
    evaluate, expr_max, expr_min, format_expr, free_vars, product, prove_equal, prove_less_equal,
    prove_nonnegative, simplify, substitute, upper_bound,
)

n = SizeVar("n")
m = SizeVar("m")


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
