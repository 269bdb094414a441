"""Symbolic expressions by kind (relaxweb/ir/prim_expr.py's PrimExprFunctor and tables), and
relaxweb.ir.symbolic gathering the modules it was split into."""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.ir import analyzer, prim_expr, symbolic
from relaxweb.ir.prim_expr import (
    OPERATIONS, PRIM_EXPR_METHODS, Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, PrimExprFunctor, SizeVar,
    Sub, evaluate, fold,
)

n, m = SizeVar("n"), SizeVar("m")


def test_the_table_names_every_kind() -> None:
    kinds = {cls for cls in vars(prim_expr).values()
             if isinstance(cls, type) and issubclass(cls, PrimExpr) and cls is not PrimExpr}
    assert set(PRIM_EXPR_METHODS) == kinds
    assert set(OPERATIONS) == kinds - {IntImm, SizeVar}


def test_the_functor_passes_arguments_and_names_a_kind_it_does_not_handle() -> None:
    class Depth(PrimExprFunctor):
        def visit_int_imm(self, expr, depth):
            return depth

        visit_size_var = visit_int_imm

        def visit_add(self, expr, depth):
            return max(self.visit(expr.a, depth + 1), self.visit(expr.b, depth + 1))

    assert Depth().visit(Add(n, Add(m, IntImm(1))), 0) == 2
    with pytest.raises(NotImplementedError, match="Depth does not handle Mul expressions"):
        Depth().visit(Mul(n, m), 0)
    with pytest.raises(TypeError, match="not a symbolic expression kind: int"):
        Depth().visit(3, 0)


@pytest.mark.parametrize(("expr", "folded"), [
    (Add(n, IntImm(0)), n), (Add(IntImm(0), n), n), (Sub(n, IntImm(0)), n), (Mul(IntImm(1), n), n),
    (Mul(n, IntImm(0)), IntImm(0)), (FloorDiv(n, IntImm(1)), n), (FloorMod(n, IntImm(1)), IntImm(0)),
    (Min(IntImm(3), IntImm(-2)), IntImm(-2)), (FloorMod(IntImm(-3), IntImm(2)), IntImm(1)),
    (Sub(IntImm(0), n), Sub(IntImm(0), n)), (Max(n, IntImm(0)), Max(n, IntImm(0))),
])
def test_building_folds_constants_and_identities(expr: PrimExpr, folded: PrimExpr) -> None:
    assert fold(expr) == folded


def test_evaluation_takes_ints_and_index_grids() -> None:
    assert evaluate(Max(n, m) // 2 - FloorMod(n, IntImm(3)), {"n": 7, "m": 4}) == 2
    grid = evaluate(Min(n, IntImm(2)) * 3, {"n": np.arange(4)})
    assert grid.tolist() == [0, 3, 6, 6]
    with pytest.raises(ZeroDivisionError):
        evaluate(n // m, {"n": 1, "m": 0})
    with pytest.raises(KeyError, match="'m' has no value"):
        evaluate(n + m, {"n": 1})


# The public names of relaxweb/ir/symbolic.py before it was split: still importable from it.
SYMBOLIC_API = """
PrimExpr IntImm SizeVar Add Sub Mul FloorDiv FloorMod Min Max IntLike as_expr expr_min expr_max format_expr
format_shape format_size_var evaluate free_vars expr_size free_var_names substitute Monomial Polynomial Bound Interval
Analyzer default_analyzer simplify as_int prove_equal prove_not_equal prove_nonnegative prove_less_equal prove_less
prove_nondecreasing upper_bound product map_vars
""".split()


def test_symbolic_still_has_every_name_it_had() -> None:
    assert set(SYMBOLIC_API) <= set(symbolic.__all__)
    assert all(hasattr(symbolic, name) for name in symbolic.__all__)
    assert symbolic.Analyzer is analyzer.Analyzer and symbolic.PrimExpr is prim_expr.PrimExpr
    assert symbolic.simplify((n * 4) // 4) == n and symbolic.Analyzer({"n": (0, 63)}).prove_equal(n // 64, 0)
    assert symbolic.prove_nondecreasing((n + 3) // 4) and not symbolic.prove_nondecreasing(n % 4)
