"""Tests of the graph-level IR: annotations, the builder, op deduction, the printer, and the
reference interpreter (graph functions and hand-written tensor programs)."""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.errors import InputShapeError
from relaxweb.ir import (
    Binary, Buffer, Constant, DataflowBlock, DataflowVar, FloatImm, FunctionBuilder, IRModule,
    IntImm, Load, ObjectStructInfo, PrimStructInfo, Reduce, ShapeExpr, ShapeStructInfo, SizeVar,
    TensorProgram, TensorStructInfo, TupleStructInfo, Unary, Var, VarBinding, struct_info_equal,
)
from relaxweb.ir.symbolic import as_expr
from relaxweb.ir.interpreter import run_module, run_program
from relaxweb.ir.printer import format_function
from relaxweb.ir.tir import format_program
from relaxweb.ops import DeductionError, call_op
from tests.helpers import assert_close, rand

n = SizeVar("n")
m = SizeVar("m")


def tensor(name: str, *shape, dtype: str = "float32") -> Var:
    return Var(name, TensorStructInfo(tuple(shape), dtype))


def buf(name: str, shape: tuple, dtype: str) -> Buffer:
    """A tensor-program buffer (Buffer shapes hold PrimExprs; ints are wrapped here)."""
    return Buffer(name, tuple(as_expr(d) for d in shape), dtype)


# Annotations ---------------------------------------------------------------------------------


def test_tensor_struct_info_shape_and_ndim() -> None:
    info = TensorStructInfo((n, 64), "float32")
    assert info.ndim == 2
    assert info.shape == (n, IntImm(64))  # ints are wrapped
    assert str(info) == "Tensor((n, 64), float32)"
    unknown = TensorStructInfo(None, "float32", ndim=3)
    assert unknown.ndim == 3
    assert str(unknown) == "Tensor(ndim=3, float32)"
    assert TensorStructInfo(None, "int32").ndim == -1


def test_other_struct_infos_print() -> None:
    assert str(ShapeStructInfo((n, 4))) == "Shape([n, 4])"
    assert ShapeStructInfo((n, 4)).ndim == 2
    assert str(ShapeStructInfo(None, ndim=2)) == "Shape(ndim=2)"
    assert str(PrimStructInfo(value=n * 2)) == "Prim(n * 2)"
    assert str(PrimStructInfo()) == "Prim(int64)"
    assert str(ObjectStructInfo()) == "Object"
    pair = TupleStructInfo((TensorStructInfo((n,), "float32"), ObjectStructInfo()))
    assert str(pair) == "Tuple(Tensor((n), float32), Object)"


def test_struct_info_equal_goes_through_the_prover() -> None:
    assert struct_info_equal(TensorStructInfo((n * 4 * 3, 2), "float32"), TensorStructInfo((12 * n, 2), "float32"))
    assert not struct_info_equal(TensorStructInfo((n, 2), "float32"), TensorStructInfo((m, 2), "float32"))
    assert not struct_info_equal(TensorStructInfo((n, 2), "float32"), TensorStructInfo((n, 2), "int32"))
    assert not struct_info_equal(TensorStructInfo((n, 2), "float32"), TensorStructInfo((n, 2, 1), "float32"))
    assert not struct_info_equal(TensorStructInfo((n,), "float32"), ShapeStructInfo((n,)))
    assert struct_info_equal(TensorStructInfo(None, "float32", 2), TensorStructInfo(None, "float32", 2))
    assert not struct_info_equal(TensorStructInfo(None, "float32", 1), TensorStructInfo((n,), "float32"))
    assert struct_info_equal(PrimStructInfo(value=(n * 4) // 4), PrimStructInfo(value=n))
    assert not struct_info_equal(PrimStructInfo(value=n), PrimStructInfo())
    assert struct_info_equal(
        TupleStructInfo((ShapeStructInfo((n + n,)),)), TupleStructInfo((ShapeStructInfo((2 * n,)),))
    )


def test_constant_and_shape_expr_annotations() -> None:
    constant = Constant(np.zeros((3, 5), np.float32), "w")
    assert constant.struct_info == TensorStructInfo((3, 5), "float32")
    shape = ShapeExpr((n, 4))
    assert shape.values == (n, IntImm(4))
    assert struct_info_equal(shape.struct_info, ShapeStructInfo((n, 4)))


def test_vars_compare_by_identity() -> None:
    info = TensorStructInfo((n,), "float32")
    assert Var("x", info) != Var("x", info)
    a = Var("x", info)
    assert a == a


# The builder ---------------------------------------------------------------------------------


def test_builder_names_are_unique_and_sanitized() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("input:0", TensorStructInfo((n, 4), "float32"))
    assert x.name == "input_0"
    a = builder.emit(call_op("relu", x), "fc1/out")
    b = builder.emit(call_op("relu", a), "fc1/out")
    c = builder.emit(call_op("relu", b), "1st")
    assert (a.name, b.name, c.name) == ("fc1_out", "fc1_out_1", "v1st")
    assert isinstance(a, DataflowVar)
    out = builder.emit(call_op("relu", c), "y", output=True)
    assert type(out) is Var
    function = builder.finish([out], ["y"])
    assert function.input_names == ("input:0",)
    assert function.output_names == ("y",)
    assert [b.var for b in function.bindings()] == [a, b, c, out]
    assert isinstance(function.body.blocks[0], DataflowBlock)
    assert function.ret_struct_info == TensorStructInfo((n, 4), "float32")


def test_builder_finish_with_two_outputs_returns_a_tuple() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.emit(call_op("relu", x), "y", output=True)
    z = builder.emit(call_op("tanh", x), "z", output=True)
    function = builder.finish([y, z], ["y", "z"])
    assert isinstance(function.ret_struct_info, TupleStructInfo)
    assert len(function.ret_struct_info.fields) == 2


# Op deduction --------------------------------------------------------------------------------


def test_broadcast_n_against_1_and_n_against_n() -> None:
    x = tensor("x", n, 4)
    assert call_op("add", x, tensor("b", 1, 4)).struct_info == TensorStructInfo((n, 4), "float32")
    assert call_op("add", tensor("b", 1, 4), x).struct_info == TensorStructInfo((n, 4), "float32")
    assert call_op("multiply", x, x).struct_info == TensorStructInfo((n, 4), "float32")
    assert call_op("add", x, tensor("v", 4)).struct_info == TensorStructInfo((n, 4), "float32")
    assert call_op("subtract", tensor("a", n, 1), tensor("b", 1, m)).struct_info == TensorStructInfo((n, m), "float32")
    # an equal-by-proof symbolic dim broadcasts
    info = call_op("add", tensor("a", n * 4, 2), tensor("b", 2 * n * 2, 2)).struct_info
    assert str(info) == "Tensor((n * 4, 2), float32)"
    # a rank-0 tensor broadcasts against anything
    assert call_op("divide", x, tensor("s")).struct_info == TensorStructInfo((n, 4), "float32")


def test_broadcast_static_mismatch_names_the_dimension() -> None:
    with pytest.raises(DeductionError) as caught:
        call_op("add", tensor("x", 2, n, 4), tensor("y", n, 5))
    message = str(caught.value)
    assert message.startswith("add:")
    assert "dimension 2" in message
    assert "4 vs 5" in message


def test_broadcast_of_two_different_symbols_is_an_error() -> None:
    with pytest.raises(DeductionError, match="dimension 0 of the result: n vs m"):
        call_op("multiply", tensor("x", n, 4), tensor("y", m, 4))
    with pytest.raises(DeductionError, match="n vs 4"):
        call_op("add", tensor("x", n), tensor("y", 4))


def test_binary_dtype_mismatch() -> None:
    with pytest.raises(DeductionError, match="dtypes differ"):
        call_op("add", tensor("x", 4), tensor("y", 4, dtype="int32"))


def test_unary_ops_keep_shape_and_check_dtype() -> None:
    x = tensor("x", n, 3)
    for op in ("relu", "sigmoid", "tanh", "exp", "negative", "identity"):
        assert call_op(op, x).struct_info == TensorStructInfo((n, 3), "float32")
    with pytest.raises(DeductionError, match="float"):
        call_op("relu", tensor("i", 3, dtype="int32"))
    assert call_op("negative", tensor("i", 3, dtype="int32")).struct_info.dtype == "int32"


def test_op_arguments_must_be_tensors() -> None:
    with pytest.raises(DeductionError, match="argument 1 must be a tensor"):
        call_op("add", tensor("x", 4), ShapeExpr((4,)))
    # an unknown shape deduces (tests/ops/test_ops.py); legalizing it is what needs the shape
    unknown = TensorStructInfo(None, "float32", 2)
    assert call_op("relu", Var("x", unknown)).struct_info == unknown


def test_matmul_with_batch_dims() -> None:
    a = tensor("a", 2, 1, n, 8)
    b = tensor("b", 3, 8, 5)
    assert call_op("matmul", a, b).struct_info == TensorStructInfo((2, 3, n, 5), "float32")
    assert call_op("matmul", tensor("x", n, 64), tensor("w", 64, 128)).struct_info == TensorStructInfo((n, 128), "float32")
    # symbolic reduction dim, provably equal
    info = call_op("matmul", tensor("x", 4, n * 2), tensor("w", n + n, 7)).struct_info
    assert info == TensorStructInfo((4, 7), "float32")


def test_matmul_reduction_mismatch() -> None:
    with pytest.raises(DeductionError) as caught:
        call_op("matmul", tensor("a", 2, 1, n, 8), tensor("b", 7, 5))
    message = str(caught.value)
    assert "reduction dims differ" in message
    assert "8 (dim 3 of the first operand)" in message
    assert "7 (dim 0 of the second)" in message


def test_matmul_batch_mismatch_and_rank() -> None:
    with pytest.raises(DeductionError, match="cannot broadcast dimension 0"):
        call_op("matmul", tensor("a", 2, 3, 4), tensor("b", 5, 4, 6))
    with pytest.raises(DeductionError, match="at least 2 dims"):
        call_op("matmul", tensor("a", 4), tensor("b", 4, 6))


def test_reshape_checks_the_element_count() -> None:
    x = tensor("x", n, 12, 64)
    assert call_op("reshape", x, ShapeExpr((n, 768))).struct_info == TensorStructInfo((n, 768), "float32")
    assert str(call_op("reshape", x, ShapeExpr((n * 12, 64))).struct_info) == "Tensor((n * 12, 64), float32)"
    with pytest.raises(DeductionError, match=r"element counts differ: n \* 768 vs n \* 760"):
        call_op("reshape", x, ShapeExpr((n, 760)))
    with pytest.raises(DeductionError, match="element counts differ"):
        call_op("reshape", x, ShapeExpr((m, 768)))
    with pytest.raises(DeductionError, match="known shape value"):
        call_op("reshape", x, tensor("s", 2, dtype="int64"))


def test_transpose() -> None:
    x = tensor("x", n, 2, 3, m)
    assert call_op("transpose", x, axes=[3, 0, 2, 1]).struct_info == TensorStructInfo((m, n, 3, 2), "float32")
    with pytest.raises(DeductionError, match="not a permutation of 4 dims"):
        call_op("transpose", x, axes=[0, 1, 2])
    with pytest.raises(DeductionError, match="not a permutation"):
        call_op("transpose", x, axes=[0, 1, 1, 2])


def test_softmax() -> None:
    x = tensor("x", n, 3, 4)
    assert call_op("softmax", x, axes=[2]).struct_info == TensorStructInfo((n, 3, 4), "float32")
    assert call_op("softmax", x, axes=[1, 2]).struct_info == TensorStructInfo((n, 3, 4), "float32")
    assert call_op("softmax", x, axes=[1]).struct_info == TensorStructInfo((n, 3, 4), "float32")
    with pytest.raises(DeductionError, match="needs at least one axis"):
        call_op("softmax", x, axes=[])
    with pytest.raises(DeductionError, match="float"):
        call_op("softmax", tensor("i", 3, dtype="int32"), axes=[0])


def test_unknown_op() -> None:
    with pytest.raises(KeyError, match="no op named 'no_such_op'"):
        call_op("no_such_op", tensor("x", 3))


# The printer ---------------------------------------------------------------------------------


def small_mlp_module() -> tuple[IRModule, dict[str, np.ndarray]]:
    """x[n, 4] @ w[4, 3] + b[3] -> relu -> softmax over the last axis."""
    w = rand(4, 3, seed=1)
    b = np.array([0.5, -1.25, 2.0], dtype=np.float32)  # written inline by the printer
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    mm = builder.emit(call_op("matmul", x, Constant(w, "w")), "mm")
    biased = builder.emit(call_op("add", mm, Constant(b, "b")), "biased")
    relu = builder.emit(call_op("relu", biased), "r")
    y = builder.emit(call_op("softmax", relu, axes=[1]), "y", output=True)
    return IRModule({"main": builder.finish([y], ["y"])}), {"w": w, "b": b}


def test_printer_output() -> None:
    module, _ = small_mlp_module()
    text = str(module)
    lines = text.splitlines()
    assert lines[0] == '@function(inputs=["x"], outputs=["y"])'
    assert lines[1] == 'def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 3), "float32"):'
    assert "    with dataflow():" in lines
    assert '        mm: Tensor((n, 3), "float32") = matmul(x, const("w"))' in lines
    assert ('        biased: Tensor((n, 3), "float32") = '
            'add(mm, const("b", [0.5, -1.25, 2.0], "float32"))') in lines
    assert '        r: Tensor((n, 3), "float32") = relu(biased)' in lines
    assert '        y: Tensor((n, 3), "float32") = softmax(r, axes=[1])' in lines
    assert "        output(y)" in lines
    assert lines[-1] == "    return y"
    assert text.endswith("\n")


def test_printer_shape_expr_match_cast_and_tuple() -> None:
    builder = FunctionBuilder("f")
    x = builder.add_param("x", TensorStructInfo((n, 12), "float32"))
    r = builder.emit(call_op("reshape", x, ShapeExpr((n * 3, 4))), "r")
    c = builder.emit_match_cast(r, TensorStructInfo((m, 4), "float32"), "c", output=True)
    t = builder.emit(call_op("tanh", x), "t", output=True)
    function = builder.finish([c, t], ["c", "t"])
    text = format_function(function)
    assert 'r: Tensor((n * 3, 4), "float32") = reshape(x, shape((n * 3, 4)))' in text
    assert 'c: Tensor((m, 4), "float32") = match_cast(r, Tensor((m, 4), "float32"))' in text
    assert "    return (c, t)" in text
    assert '-> Tuple(Tensor((m, 4), "float32"), Tensor((n, 12), "float32")):' in text


def test_format_program() -> None:
    i, j, k = SizeVar("i"), SizeVar("j"), SizeVar("k")
    a, b = buf("A", (n, 8), "float32"), buf("B", (8, m), "float32")
    program = TensorProgram(
        "mm", (a, b), buf("out", (n, m), "float32"), (i, j),
        Reduce("sum", k, IntImm(8), Binary("multiply", Load(a, (i, k)), Load(b, (k, j)))),
    )
    assert format_program(program) == (
        "@tensor_program\n"
        'def mm(A: Buffer((n, 8), "float32"), B: Buffer((8, m), "float32"), out: Buffer((n, m), "float32")):\n'
        "    out[i, j] = sum((A[i, k] * B[k, j]) for k in range(8))"
    )
    assert [v.name for v in program.size_vars] == ["n", "m"]


# The interpreter on graph functions ------------------------------------------------------------


def numpy_small_mlp(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ w + b, 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("rows", [1, 7])
def test_interpreter_runs_a_built_function(rows: int) -> None:
    module, weights = small_mlp_module()
    x = rand(rows, 4, seed=rows)
    (y,) = run_module(module, {"x": x})
    assert y.shape == (rows, 3)
    assert y.dtype == np.float32
    assert_close(y, numpy_small_mlp(x, weights["w"], weights["b"]))


def test_interpreter_checks_inputs() -> None:
    module, _ = small_mlp_module()
    with pytest.raises(InputShapeError, match="missing input 'x'"):
        run_module(module, {})
    with pytest.raises(InputShapeError, match="dimension 1 is 5, expected 4"):
        run_module(module, {"x": np.zeros((2, 5), np.float32)})
    with pytest.raises(InputShapeError, match="has 3 dimensions, expected 2"):
        run_module(module, {"x": np.zeros((2, 4, 1), np.float32)})
    with pytest.raises(InputShapeError, match="dtype is float64, expected float32"):
        run_module(module, {"x": np.zeros((2, 4))})


def test_interpreter_binds_a_symbol_shared_by_two_inputs() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 3), "float32"))
    y = builder.add_param("y", TensorStructInfo((n, 3), "float32"))
    z = builder.emit(call_op("subtract", x, y), "z", output=True)
    module = IRModule({"main": builder.finish([z], ["z"])})
    a, b = np.ones((2, 3), np.float32), np.full((2, 3), 3, np.float32)
    np.testing.assert_array_equal(run_module(module, {"x": a, "y": b})[0], a - b)
    with pytest.raises(InputShapeError, match=r"'y': dimension 0 is 4, expected 2 \(n\)"):
        run_module(module, {"x": a, "y": np.zeros((4, 3), np.float32)})


def test_interpreter_reshape_transpose_and_match_cast() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 12), "float32"))
    r = builder.emit(call_op("reshape", x, ShapeExpr((n, 3, 4))), "r")
    t = builder.emit(call_op("transpose", r, axes=[2, 0, 1]), "t")
    c = builder.emit_match_cast(t, TensorStructInfo((4, n, 3), "float32"), "c", output=True)
    module = IRModule({"main": builder.finish([c], ["c"])})
    data = np.arange(24, dtype=np.float32).reshape(2, 12)
    (out,) = run_module(module, {"x": data})
    np.testing.assert_array_equal(out, data.reshape(2, 3, 4).transpose(2, 0, 1))


# The interpreter on hand-written tensor programs -----------------------------------------------


I0, I1, I2 = SizeVar("i0_"), SizeVar("i1_"), SizeVar("i2_")
K, R = SizeVar("k_"), SizeVar("r_")


def test_run_program_elementwise_with_broadcast() -> None:
    a, b = buf("A", (n, 3), "float32"), buf("B", (3,), "float32")
    program = TensorProgram(
        "axpb", (a, b), buf("out", (n, 3), "float32"), (I0, I1),
        Binary("add", Binary("multiply", Load(a, (I0, I1)), FloatImm(2.0)), Load(b, (I1,))),
    )
    x = rand(5, 3, seed=2)
    y = rand(3, seed=3)
    out = run_program(program, [x, y], {"n": 5})
    assert out.dtype == np.float32
    assert_close(out, x * 2 + y)


def test_run_program_unary_ops() -> None:
    a = buf("A", (n,), "float32")
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    expected = {
        "exp": np.exp(x), "tanh": np.tanh(x), "negative": -x, "sigmoid": 1 / (1 + np.exp(-x)),
    }
    for op, reference in expected.items():
        program = TensorProgram(op, (a,), buf("out", (n,), "float32"), (I0,), Unary(op, Load(a, (I0,))))
        assert_close(run_program(program, [x], {"n": 7}), reference, err_msg=op)


def test_run_program_index_arithmetic() -> None:
    """A reshape-like copy: out[i, j] = A[(i * 4 + j) // 6, (i * 4 + j) % 6]."""
    a = buf("A", (n, 6), "float32")
    flat = I0 * 4 + I1
    program = TensorProgram(
        "reshape", (a,), buf("out", (n * 6 // 4, 4), "float32"), (I0, I1), Load(a, (flat // 6, flat % 6))
    )
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(run_program(program, [x], {"n": 2}), x.reshape(3, 4))


def test_run_program_reduce_matmul() -> None:
    a, b = buf("A", (n, m), "float32"), buf("B", (m, 5), "float32")
    program = TensorProgram(
        "mm", (a, b), buf("out", (n, 5), "float32"), (I0, I1),
        Reduce("sum", K, m, Binary("multiply", Load(a, (I0, K)), Load(b, (K, I1)))),
    )
    x = rand(3, 6, seed=4)
    w = rand(6, 5, seed=5)
    assert_close(run_program(program, [x, w], {"n": 3, "m": 6}), x @ w)


def test_run_program_reduce_max_to_kept_dim() -> None:
    a = buf("A", (n, 4), "float32")
    program = TensorProgram(
        "rowmax", (a,), buf("out", (n, 1), "float32"), (I0, I1), Reduce("max", K, IntImm(4), Load(a, (I0, K)))
    )
    x = rand(3, 4, seed=6)
    np.testing.assert_array_equal(run_program(program, [x], {"n": 3}), x.max(axis=1, keepdims=True))


def test_run_program_nested_reduce() -> None:
    """out[i] = sum_k max_r (A[i, k, r] * 2) over a 3-d input; then sum over two axes."""
    a = buf("A", (n, 3, 4), "float32")
    nested = TensorProgram(
        "summax", (a,), buf("out", (n,), "float32"), (I0,),
        Reduce("sum", K, IntImm(3), Reduce("max", R, IntImm(4), Binary("multiply", Load(a, (I0, K, R)), FloatImm(2.0)))),
    )
    x = rand(5, 3, 4, seed=7)
    assert_close(run_program(nested, [x], {"n": 5}), (x * 2).max(axis=2).sum(axis=1))

    both = TensorProgram(
        "sum2", (a,), buf("out", (n, 1, 1), "float32"), (I0, I1, I2),
        Reduce("sum", K, IntImm(3), Reduce("sum", R, IntImm(4), Load(a, (I0, K, R)))),
    )
    assert_close(run_program(both, [x], {"n": 5}), x.sum(axis=(1, 2), keepdims=True))


def test_run_program_reduce_inside_an_expression() -> None:
    """out[i, j] = A[i, j] / sum_k A[i, k] (the reduction depends on the outer axis only)."""
    a = buf("A", (n, 4), "float32")
    program = TensorProgram(
        "normalize", (a,), buf("out", (n, 4), "float32"), (I0, I1),
        Binary("divide", Load(a, (I0, I1)), Reduce("sum", K, IntImm(4), Load(a, (I0, K)))),
    )
    x = rand(3, 4, seed=8, low=1, high=2)
    assert_close(run_program(program, [x], {"n": 3}), x / x.sum(axis=1, keepdims=True))


def test_run_program_empty_reduction_and_empty_output() -> None:
    a = buf("A", (n, m), "float32")
    total = TensorProgram(
        "rowsum", (a,), buf("out", (n,), "float32"), (I0,), Reduce("sum", K, m, Load(a, (I0, K)))
    )
    np.testing.assert_array_equal(run_program(total, [np.zeros((2, 0), np.float32)], {"n": 2, "m": 0}), [0, 0])
    assert run_program(total, [np.zeros((0, 3), np.float32)], {"n": 0, "m": 3}).shape == (0,)


def test_run_program_rejects_wrong_buffer_shape() -> None:
    a = buf("A", (n, 3), "float32")
    program = TensorProgram("copy", (a,), buf("out", (n, 3), "float32"), (I0, I1), Load(a, (I0, I1)))
    with pytest.raises(ValueError, match=r"buffer A has shape \(2, 4\), expected \(2, 3\)"):
        run_program(program, [np.zeros((2, 4), np.float32)], {"n": 2})


def test_module_replace_and_with_function() -> None:
    module, _ = small_mlp_module()
    other = module.replace(attrs={"source": "mlp.onnx"})
    assert other.attrs == {"source": "mlp.onnx"}
    assert module.attrs == {}
    builder = FunctionBuilder("helper")
    x = builder.add_param("x", TensorStructInfo((2,), "float32"))
    helper = builder.finish([builder.emit(call_op("exp", x), "y", output=True)], ["y"])
    both = module.with_function(helper)
    assert set(both.functions) == {"main", "helper"}
    assert set(module.functions) == {"main"}
    assert_close(run_module(both, {"x": np.zeros(2, np.float32)}, "helper")[0], [1, 1])


def test_var_binding_and_block_types() -> None:
    module, _ = small_mlp_module()
    bindings = module.main.bindings()
    assert all(isinstance(b, VarBinding) for b in bindings)
    assert [b.var.name for b in bindings] == ["mm", "biased", "r", "y"]
