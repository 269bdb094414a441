"""The well-formedness check, structural equality up to renaming, and the annotation
lattice (is_less_specific, join)."""

from __future__ import annotations

import pytest

from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import (
    BindingBlock, DataflowBlock, DataflowVar, Function, If, PrimValue, SeqExpr, Var, VarBinding,
)
from relaxweb.ir.struct_info import ObjectStructInfo, PrimStructInfo, TupleStructInfo, is_less_specific, join
from relaxweb.ir.structural import assert_structural_equal, structural_equal
from relaxweb.ir.well_formed import WellFormedError, check_well_formed, well_formed_problems
from relaxweb.ops import call_op
from relaxweb.passes import legalize_ops, plan_memory

n, m, k = SizeVar("n"), SizeVar("m"), SizeVar("k")


def tensor(*shape, dtype="float32") -> TensorStructInfo:
    return TensorStructInfo(tuple(shape), dtype)


def relu_module(input_name: str, var_name: str, dim: SizeVar, op: str = "relu") -> IRModule:
    builder = FunctionBuilder("main")
    x = builder.add_param(input_name, tensor(dim, 4))
    hidden = builder.emit(call_op(op, x), var_name)
    out = builder.emit(call_op("add", hidden, x), "out", output=True)
    return IRModule({"main": builder.finish([out], ["out"])})


# Structural equality -----------------------------------------------------------------------


def test_equal_up_to_renaming_of_variables_and_size_variables() -> None:
    assert structural_equal(relu_module("x", "h", n), relu_module("x", "hidden", m))


def test_a_different_op_or_dimension_is_not_equal() -> None:
    assert not structural_equal(relu_module("x", "h", n), relu_module("x", "h", n, op="tanh"))
    builder = FunctionBuilder("main")
    x = builder.add_param("x", tensor(n, 5))
    hidden = builder.emit(call_op("relu", x), "h")
    out = builder.emit(call_op("add", hidden, x), "out", output=True)
    other = IRModule({"main": builder.finish([out], ["out"])})
    assert not structural_equal(relu_module("x", "h", n), other)


def test_renaming_must_be_one_to_one() -> None:
    """f(x: [n, 4], y: [n, 4]) is not f(x: [n, 4], y: [m, 4])."""
    def two_inputs(second: SizeVar) -> IRModule:
        builder = FunctionBuilder("main")
        x = builder.add_param("x", tensor(n, 4))
        y = builder.add_param("y", tensor(second, 4))
        out = builder.emit(call_op("relu", x), "out", output=True)
        return IRModule({"main": builder.finish([out, y], ["out", "y"])})

    assert structural_equal(two_inputs(n), two_inputs(n))
    assert not structural_equal(two_inputs(n), two_inputs(m))
    with pytest.raises(AssertionError, match="not structurally equal"):
        assert_structural_equal(two_inputs(n), two_inputs(m))


def test_legalize_is_deterministic_structurally() -> None:
    """The same input module legalizes to structurally equal modules (programs included)."""
    assert_structural_equal(legalize_ops(relu_module("x", "a", n)), legalize_ops(relu_module("x", "b", m)))


# Well-formedness ---------------------------------------------------------------------------


def test_imported_legalized_and_planned_modules_are_well_formed() -> None:
    module = relu_module("x", "h", n)
    check_well_formed(module)
    check_well_formed(legalize_ops(module))
    check_well_formed(plan_memory(legalize_ops(module)))


def function_of(params, blocks, body) -> IRModule:
    return IRModule({"main": Function("main", tuple(params), SeqExpr(tuple(blocks), body),
                                      tuple(p.name for p in params), ("out",))})


def test_use_before_definition_is_reported() -> None:
    x = Var("x", tensor(n, 4))
    later = Var("later", tensor(n, 4))
    early = Var("early", tensor(n, 4))
    module = function_of([x], [BindingBlock((VarBinding(early, call_op("relu", later)), VarBinding(later, call_op("relu", x))))], early)
    assert any("uses variable 'later' outside its scope or before its definition" in p for p in well_formed_problems(module))
    with pytest.raises(WellFormedError):
        check_well_formed(module)


def test_dataflow_variables_do_not_escape_their_block() -> None:
    x = Var("x", tensor(n, 4))
    inner = DataflowVar("inner", tensor(n, 4))
    module = function_of([x], [DataflowBlock((VarBinding(inner, call_op("relu", x)),))], inner)
    assert any("uses dataflow variable 'inner'" in p for p in well_formed_problems(module))


def test_variables_bound_in_an_if_branch_are_not_visible_after_it() -> None:
    x = Var("x", tensor(n, 4))
    inner, chosen, after = Var("inner", tensor(n, 4)), Var("chosen", tensor(n, 4)), Var("after", tensor(n, 4))
    branch = SeqExpr((BindingBlock((VarBinding(inner, call_op("relu", x)),)),), inner)
    module = function_of([x], [BindingBlock((
        VarBinding(chosen, If(PrimValue(n % 2), branch, SeqExpr((), x))),
        VarBinding(after, call_op("add", chosen, inner)),
    ))], after)
    assert well_formed_problems(module) == [
        "main: after: uses variable 'inner' outside its scope or before its definition"
    ]


def test_dataflow_variables_belong_in_dataflow_blocks() -> None:
    x = Var("x", tensor(n, 4))
    inner = DataflowVar("inner", tensor(n, 4))
    module = function_of([x], [BindingBlock((VarBinding(inner, call_op("relu", x)),))], x)
    assert any("bound outside a dataflow block" in p for p in well_formed_problems(module))


def test_symbolic_variables_must_be_defined_before_use() -> None:
    x = Var("x", tensor(n, 4))
    wrong = Var("wrong", tensor(k, 4))  # k is defined nowhere
    module = function_of([x], [BindingBlock((VarBinding(wrong, call_op("relu", x)),))], wrong)
    problems = well_formed_problems(module)
    assert any("symbolic variables ['k'] are not defined before" in p for p in problems)
    assert any("annotated Tensor((k, 4), float32), but its value is Tensor((n, 4), float32)" in p for p in problems)


def test_match_cast_defines_symbolic_variables() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo(None, "float32", 2))
    cast = builder.emit_match_cast(x, tensor(k, 4), "cast")
    out = builder.emit(call_op("relu", cast), "out", output=True)
    check_well_formed(IRModule({"main": builder.finish([out], ["out"])}))


def test_a_match_cast_reason_is_one_line() -> None:
    """The reason starts the one-line error of a failed check: a line break would split it."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", tensor(n, 4))
    cast = builder.emit_match_cast(x, tensor(m, 4), "cast", reason="Add node 'a\nb': dimension 0 of input 1")
    module = IRModule({"main": builder.finish([builder.emit(call_op("relu", cast), "out", output=True)], ["out"])})
    assert well_formed_problems(module) == [
        "main: match_cast 'cast': its reason \"Add node 'a\\nb': dimension 0 of input 1\" spans several lines"
    ]


def test_calls_of_missing_programs_are_reported() -> None:
    legalized = legalize_ops(relu_module("x", "h", n))
    broken = legalized.replace(programs={})
    assert any("which is not in the module" in p for p in well_formed_problems(broken))


# The annotation lattice ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("general", "specific", "expected"),
    [
        (ObjectStructInfo(), tensor(n, 4), True),
        (TensorStructInfo(None, "float32", 2), tensor(n, 4), True),
        (TensorStructInfo(None, "float32", -1), tensor(n, 4), True),
        (tensor(n, 4), TensorStructInfo(None, "float32", 2), False),
        (tensor(n, 4), tensor(n, 4), True),
        (tensor(n * 2, 4), tensor(2 * n, 4), True),
        (tensor(n, 4), tensor(m, 4), False),
        (TensorStructInfo(None, "int32", 2), tensor(n, 4), False),
        (PrimStructInfo("int64"), PrimStructInfo("int64", n), True),
        (PrimStructInfo("int64", n), PrimStructInfo("int64"), False),
        (TupleStructInfo((ObjectStructInfo(), tensor(n))), TupleStructInfo((tensor(m), tensor(n))), True),
    ],
)
def test_is_less_specific(general, specific, expected) -> None:
    assert is_less_specific(general, specific) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (tensor(n, 4), tensor(n, 4), "Tensor((n, 4), float32)"),
        (tensor(n, 4), tensor(m, 4), "Tensor(ndim=2, float32)"),
        (tensor(n, 4), tensor(n), "Tensor(ndim=-1, float32)"),
        (tensor(n, 4), tensor(n, 4, dtype="int32"), "Object"),
        (PrimStructInfo("int64", n), PrimStructInfo("int64", m), "Prim(int64)"),
        (TupleStructInfo((tensor(n), tensor(m))), TupleStructInfo((tensor(n), tensor(n))),
         "Tuple(Tensor((n), float32), Tensor(ndim=1, float32))"),
    ],
)
def test_join(a, b, expected) -> None:
    assert str(join(a, b)) == expected
    assert is_less_specific(join(a, b), a) and is_less_specific(join(a, b), b)
