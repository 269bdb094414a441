"""Tests of every op: forward deduction with static, symbolic and unknown shapes, the errors
of impossible calls, and legalization checked against the op's numpy reference in the
interpreter; the tensor programs of the newer ops also compile (and some run) on wgpu."""

from __future__ import annotations


import numpy as np
import pytest
from onnx import helper

from relaxweb.errors import RelaxwebError
from relaxweb.frontend import from_onnx
from relaxweb.ir import FunctionBuilder, IRModule, ShapeExpr, SizeVar, TensorProgram, TensorStructInfo, Var
from relaxweb.ir.expr import TupleGetItem
from relaxweb.ir.interpreter import run_module, run_program
from relaxweb.ir.struct_info import ShapeStructInfo, TupleStructInfo, struct_info_equal
from relaxweb.ir.symbolic import IntImm, format_expr, prove_equal
from relaxweb.ir.tir import Binary, Buffer, Cast, Compare, FloatImm, IndexValue, Load, Reduce, Select, format_scalar
from relaxweb.ops import DeductionError, UnknownShapeError, call_op, get_op, strided_slice
from relaxweb.ir.op_registry import AssumptionError
from relaxweb.passes import legalize_ops
from relaxweb.wgsl import emit_wgsl
from tests.gpu_kernels import run_kernel_on_gpu
from tests.helpers import F32, Tolerance, assert_close, make_model, rand

n, m, k = SizeVar("n"), SizeVar("m"), SizeVar("k")
BIG = 2**63 - 1  # what ONNX writes for "to the end"


def tensor(name: str, *shape, dtype: str = "float32") -> Var:
    return Var(name, TensorStructInfo(tuple(shape), dtype))


def unknown(name: str, ndim: int = -1, dtype: str = "float32") -> Var:
    return Var(name, TensorStructInfo(None, dtype, ndim))


def shape_of(expr) -> str:
    return str(expr.struct_info)


def same(actual, expected) -> bool:
    """Annotations equal up to the prover (``n + m`` is ``m + n``)."""
    if not struct_info_equal(actual, expected):
        raise AssertionError(f"{actual} != {expected}")
    return True


def sinfo(*shape, dtype: str = "float32") -> TensorStructInfo:
    return TensorStructInfo(tuple(shape), dtype)


# Building, legalizing and running --------------------------------------------------------------


def build(params: dict[str, TensorStructInfo], make) -> IRModule:
    """A module whose main binds ``make(*params)`` (a call, or a list of calls) as outputs;
    a tuple-valued call outputs each of its fields."""
    builder = FunctionBuilder("main")
    args = [builder.add_param(name, info) for name, info in params.items()]
    calls = make(*args)
    calls = calls if isinstance(calls, list) else [calls]
    outputs = []
    for position, call in enumerate(calls):
        if isinstance(call.struct_info, TupleStructInfo):
            whole = builder.emit(call, f"t{position}")
            outputs += [builder.emit(TupleGetItem(whole, i), f"t{position}_{i}", output=True)
                        for i in range(len(call.struct_info.fields))]
        else:
            outputs.append(builder.emit(call, f"y{position}", output=True))
    return IRModule({"main": builder.finish(outputs, [o.name for o in outputs])})


def check_legalized(module: IRModule, inputs: dict[str, np.ndarray], expected: list[np.ndarray] | None = None,
                    tolerance: Tolerance = F32) -> IRModule:
    """The legalized module computes what the op references compute (and ``expected``)."""
    legalized = legalize_ops(module)
    reference = run_module(module, inputs)
    actual = run_module(legalized, inputs)
    assert len(actual) == len(reference)
    for position, (want, got) in enumerate(zip(reference, actual)):
        assert got.shape == want.shape, position
        assert got.dtype == want.dtype, position
        assert_close(got, want, tolerance, err_msg=f"output {position}")
    for position, (want, got) in enumerate(zip(expected or [], actual)):
        assert_close(got, want, tolerance, err_msg=f"numpy, output {position}")
    return legalized


# Elementwise ----------------------------------------------------------------------------------

BINARY = ["add", "subtract", "multiply", "divide"]
UNARY = ["relu", "sigmoid", "tanh", "exp", "negative", "identity"]


@pytest.mark.parametrize("op", BINARY)
def test_binary_deduction(op: str) -> None:
    assert same(call_op(op, tensor("a", 2, 3), tensor("b", 3)).struct_info, sinfo(2, 3))
    assert same(call_op(op, tensor("a", n, 1), tensor("b", 1, m)).struct_info, sinfo(n, m))
    assert same(call_op(op, tensor("a", n, 4), tensor("b", n, 4)).struct_info, sinfo(n, 4))
    assert call_op(op, tensor("a", n * 4), tensor("b", 2 * n * 2)).struct_info.ndim == 1
    # unknown shapes: the result's rank is the larger one, or unknown
    assert same(call_op(op, tensor("a", n, 4), unknown("u", 2)).struct_info, TensorStructInfo(None, "float32", 2))
    assert same(call_op(op, unknown("u", 3), tensor("b", 4)).struct_info, TensorStructInfo(None, "float32", 3))
    assert same(call_op(op, unknown("u"), tensor("b", n)).struct_info, TensorStructInfo(None, "float32", -1))


def test_binary_errors_name_the_op_and_the_dimension() -> None:
    with pytest.raises(DeductionError) as caught:
        call_op("add", tensor("a", n, 4), tensor("b", m, 4))
    message = str(caught.value)
    assert message.startswith("add: cannot broadcast dimension 0 of the result: n vs m")
    assert "dim 0 of argument 0 vs dim 0 of argument 1" in message
    assert "match_cast" in message
    with pytest.raises(DeductionError, match=r"multiply: cannot broadcast dimension 1 of the result: 4 vs 5 "
                                             r"\(dim 1 of argument 0 vs dim 0 of argument 1\)"):
        call_op("multiply", tensor("a", n, 4), tensor("b", 5))
    with pytest.raises(DeductionError, match="subtract: dtypes differ"):
        call_op("subtract", tensor("a", 4), tensor("b", 4, dtype="int32"))
    with pytest.raises(DeductionError, match="divide: takes 2 argument"):
        call_op("divide", tensor("a", 4))
    with pytest.raises(DeductionError, match="add: argument 1 must be a tensor"):
        call_op("add", tensor("a", 4), ShapeExpr((4,)))


def test_an_impossible_program_fails_while_it_is_built() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", sinfo(n, 4))
    y = builder.add_param("y", sinfo(n, 5))
    with pytest.raises(DeductionError, match=r"add: cannot broadcast dimension 1 of the result: 4 vs 5"):
        builder.emit(call_op("add", x, y), "z")


def test_the_frontend_names_the_node_of_an_impossible_program() -> None:
    model = make_model([helper.make_node("Add", ["x", "y"], ["z"], name="bad_add")], [("x", ["n", 4]), ("y", ["n", 5])],
                       ["z"])
    with pytest.raises(RelaxwebError, match=r"Add node 'bad_add' \(binding 'z'\): add: cannot broadcast dimension 1 of the result: 4 vs 5"):
        from_onnx(model)


@pytest.mark.parametrize("op", BINARY)
def test_binary_legalized_matches_numpy(op: str) -> None:
    module = build({"a": sinfo(n, 1, 4), "b": sinfo(m, 1), "c": sinfo(4)},
                   lambda a, b, c: [call_op(op, a, b), call_op(op, a, c)])
    a, b, c = rand((3, 1, 4), seed=1), rand((5, 1), seed=2), rand((4,), seed=3) + 3
    function = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide}[op]
    check_legalized(module, {"a": a, "b": b, "c": c}, [function(a, b), function(a, c)])


@pytest.mark.parametrize("op", UNARY)
def test_unary_deduction_and_legalization(op: str) -> None:
    assert same(call_op(op, tensor("x", 2, 3)).struct_info, sinfo(2, 3))
    assert same(call_op(op, tensor("x", n, 3)).struct_info, sinfo(n, 3))
    for info in (TensorStructInfo(None, "float32", 2), TensorStructInfo(None, "float32", -1)):
        assert same(call_op(op, Var("u", info)).struct_info, info)
    if op in ("negative", "identity"):
        assert call_op(op, tensor("i", 3, dtype="int32")).struct_info.dtype == "int32"
    else:
        with pytest.raises(DeductionError, match=f"{op}: argument 0 must be a float tensor, got int32"):
            call_op(op, tensor("i", 3, dtype="int32"))
    module = build({"x": sinfo(n, 3)}, lambda x: call_op(op, x))
    check_legalized(module, {"x": rand((4, 3), seed=4)})


# matmul ---------------------------------------------------------------------------------------


def test_matmul_deduction() -> None:
    assert same(call_op("matmul", tensor("a", 4, 8), tensor("b", 8, 5)).struct_info, sinfo(4, 5))
    assert same(call_op("matmul", tensor("a", 2, 1, n, 8), tensor("b", m, 8, 5)).struct_info, sinfo(2, m, n, 5))
    assert same(call_op("matmul", tensor("a", n, k), tensor("b", k, m)).struct_info, sinfo(n, m))
    assert same(call_op("matmul", tensor("a", n, 3, 4), unknown("b", 2)).struct_info, TensorStructInfo(None, "float32", 3))
    assert same(call_op("matmul", unknown("a", 4), tensor("b", 4, 2)).struct_info, TensorStructInfo(None, "float32", 4))
    assert same(call_op("matmul", unknown("a"), tensor("b", 4, 2)).struct_info, TensorStructInfo(None, "float32", -1))


def test_matmul_errors() -> None:
    with pytest.raises(DeductionError, match=r"matmul: reduction dims differ: k \(dim 1 of the first operand\) "
                                             r"vs m \(dim 0 of the second\)"):
        call_op("matmul", tensor("a", n, k), tensor("b", m, 4))
    with pytest.raises(DeductionError, match=r"matmul: cannot broadcast dimension 0 of the batch dims: 2 vs 3"):
        call_op("matmul", tensor("a", 2, n, 4), tensor("b", 3, 4, 6))
    with pytest.raises(DeductionError, match="matmul: operands need at least 2 dims, argument 1"):
        call_op("matmul", tensor("a", 4, 4), unknown("b", 1))
    with pytest.raises(DeductionError, match="matmul: dtypes differ"):
        call_op("matmul", tensor("a", 4, 4), tensor("b", 4, 4, dtype="int32"))


def test_matmul_legalized_with_batch_dims() -> None:
    module = build({"a": sinfo(2, 1, n, k), "b": sinfo(3, k, 5)}, lambda a, b: call_op("matmul", a, b))
    a, b = rand((2, 1, 4, 6), seed=5), rand((3, 6, 5), seed=6)
    check_legalized(module, {"a": a, "b": b}, [a @ b])


# reshape --------------------------------------------------------------------------------------


def test_reshape_infers_minus_one_symbolically() -> None:
    x = tensor("x", n, 12, 64)
    # beside a dim that may be 0, the -1 is inferred once a builder checks it is not (as onnxruntime)
    with pytest.raises(AssumptionError, match="cannot infer -1 .target dim 1. if the other target dims multiply to 0"):
        call_op("reshape", x, ShapeExpr((n, -1)))
    assert same(call_op("reshape", x, ShapeExpr((n, -1)), others_checked=True).struct_info, sinfo(n, 768))
    assert shape_of(call_op("reshape", x, ShapeExpr((-1, 64)))) == "Tensor((n * 12, 64), float32)"
    assert same(call_op("reshape", x, ShapeExpr((-1,))).struct_info, sinfo(n * 768))
    assert same(call_op("reshape", tensor("y", n, m, 6), ShapeExpr((m, -1, 2)), others_checked=True).struct_info,
                sinfo(m, n * 3, 2))
    assert same(call_op("reshape", tensor("s", 2, 6), ShapeExpr((3, -1))).struct_info, sinfo(3, 4))
    # static and symbolic targets without -1
    assert same(call_op("reshape", x, ShapeExpr((n * 12, 64))).struct_info, sinfo(n * 12, 64))


def test_reshape_with_unknown_shapes() -> None:
    assert same(call_op("reshape", unknown("u", 3), ShapeExpr((n, 4))).struct_info, sinfo(n, 4))
    assert same(call_op("reshape", unknown("u"), ShapeExpr((n, -1))).struct_info, TensorStructInfo(None, "float32", 2))
    target = Var("s", ShapeStructInfo(None, 3))
    assert same(call_op("reshape", tensor("x", n, 4), target).struct_info, TensorStructInfo(None, "float32", 3))


def test_reshape_errors() -> None:
    x = tensor("x", n, 3)
    with pytest.raises(DeductionError, match=r"reshape: cannot infer -1 \(target dim 1\): n \* 3 elements are not "
                                             r"provably a multiple of 2"):
        call_op("reshape", x, ShapeExpr((2, -1)))
    with pytest.raises(DeductionError, match=r"reshape: more than one -1 in the target shape \(dims \[0, 1\]\)"):
        call_op("reshape", x, ShapeExpr((-1, -1)))
    with pytest.raises(DeductionError, match=r"reshape: element counts differ: n \* 3 vs n \* 4"):
        call_op("reshape", x, ShapeExpr((n, 4)))
    with pytest.raises(DeductionError, match="reshape: target dim 0 is -2"):
        call_op("reshape", x, ShapeExpr((-2, 3)))
    with pytest.raises(DeductionError, match="other target dims multiply to 0"):
        call_op("reshape", x, ShapeExpr((0, -1)))
    with pytest.raises(DeductionError, match="the target shape must be a known shape value"):
        call_op("reshape", x, tensor("s", 2, dtype="int64"))


def test_reshape_legalized_with_minus_one() -> None:
    module = build({"x": sinfo(n, 3, 4)}, lambda x: call_op("reshape", x, ShapeExpr((-1, 6))))
    data = rand((4, 3, 4), seed=7)
    check_legalized(module, {"x": data}, [data.reshape(-1, 6)])


def test_reshape_indexes_within_groups_of_dims() -> None:
    """A reshape that splits or merges dims in groups whose products match reads each source
    index from its group's own axes: [n, 3, m, 2] -> [n, 3, 2m] -> [n, 3, m, 2] divides by 2
    only, never by a symbolic extent; where no grouping exists ([n, 6] -> [2n, 3]) the flat
    position serves."""
    merged = build({"x": sinfo(n, 3, m, 2)}, lambda x: call_op("reshape", x, ShapeExpr((n, 3, m * 2))))
    split = build({"x": sinfo(n, 3, m * 2)}, lambda x: call_op("reshape", x, ShapeExpr((n, 3, m, 2))))
    (merge_program,), (split_program,) = (legalize_ops(module).programs.values() for module in (merged, split))
    assert format_scalar(merge_program.body) == "A[i0_, i1_, i2_ // 2, i2_ % 2]"
    assert format_scalar(split_program.body) == "A[i0_, i1_, i2_ * 2 + i3_]"
    data = rand((2, 3, 5, 2), seed=9)
    check_legalized(merged, {"x": data}, [data.reshape(2, 3, 10)])
    regrouped = build({"x": sinfo(n, 6)}, lambda x: call_op("reshape", x, ShapeExpr((n * 2, 3))))
    data = rand((3, 6), seed=11)
    check_legalized(regrouped, {"x": data}, [data.reshape(6, 3)])


# transpose and softmax ------------------------------------------------------------------------


def test_transpose() -> None:
    assert same(call_op("transpose", tensor("x", 2, 3, 4), axes=[2, 0, 1]).struct_info, sinfo(4, 2, 3))
    assert same(call_op("transpose", tensor("x", n, m), axes=[1, 0]).struct_info, sinfo(m, n))
    assert same(call_op("transpose", tensor("x", n, 2, m)).struct_info, sinfo(m, 2, n))  # no axes: reversed
    assert same(call_op("transpose", unknown("u", 3), axes=[2, 0, 1]).struct_info, TensorStructInfo(None, "float32", 3))
    assert same(call_op("transpose", unknown("u"), axes=[1, 0]).struct_info, TensorStructInfo(None, "float32", 2))
    with pytest.raises(DeductionError, match=r"transpose: axes \[0, 1\] are not a permutation of 3 dims"):
        call_op("transpose", unknown("u", 3), axes=[0, 1])
    module = build({"x": sinfo(n, 3, m)}, lambda x: call_op("transpose", x, axes=[2, 0, 1]))
    data = rand((2, 3, 5), seed=8)
    check_legalized(module, {"x": data}, [data.transpose(2, 0, 1)])


def test_softmax() -> None:
    assert same(call_op("softmax", tensor("x", n, 4), axes=[1]).struct_info, sinfo(n, 4))
    assert same(call_op("softmax", unknown("u", 2), axes=[1]).struct_info, TensorStructInfo(None, "float32", 2))
    assert same(call_op("softmax", unknown("u"), axes=[3]).struct_info, TensorStructInfo(None, "float32", -1))
    assert same(call_op("softmax", unknown("u", 2), axes=[0]).struct_info, TensorStructInfo(None, "float32", 2))
    with pytest.raises(DeductionError, match="needs at least one axis"):
        call_op("softmax", tensor("x", n, 4), axes=[])
    for axes in ([1, 2], [1], [0, 2]):  # any axes, not only trailing ones
        module = build({"x": sinfo(n, 3, 4)}, lambda x: call_op("softmax", x, axes=axes))
        check_legalized(module, {"x": rand((2, 3, 4), seed=9)})


# concat ---------------------------------------------------------------------------------------


def test_concat_deduction() -> None:
    assert same(call_op("concat", tensor("a", 2, 4), tensor("b", 3, 4)).struct_info, sinfo(5, 4))
    assert same(call_op("concat", tensor("a", n, 4), tensor("b", m, 4), axis=0).struct_info, sinfo(n + m, 4))
    info = call_op("concat", tensor("a", n, 4), tensor("b", n, 2), tensor("c", n, k), axis=-1).struct_info
    assert same(info, sinfo(n, k + 6))
    assert shape_of(call_op("concat", tensor("a", n, 4), tensor("b", n, 4))) == "Tensor((n * 2, 4), float32)"
    assert same(call_op("concat", tensor("a", n, 4), unknown("u", 2), axis=1).struct_info, TensorStructInfo(None, "float32", 2))
    assert same(call_op("concat", unknown("u"), unknown("v")).struct_info, TensorStructInfo(None, "float32", -1))


def test_concat_errors() -> None:
    with pytest.raises(DeductionError, match=r"concat: dimension 1 differs: 4 \(argument 0\) vs 5 \(argument 2\); "
                                             r"only axis 0 may differ"):
        call_op("concat", tensor("a", n, 4), tensor("b", m, 4), tensor("c", 1, 5))
    with pytest.raises(DeductionError, match=r"concat: dimension 0 differs: n \(argument 0\) vs m \(argument 1\)"):
        call_op("concat", tensor("a", n, 4), tensor("b", m, 4), axis=1)
    with pytest.raises(DeductionError, match=r"concat: ranks differ \(argument 0 has 2, argument 1 has 1 dims\)"):
        call_op("concat", tensor("a", n, 4), unknown("u", 1))
    with pytest.raises(DeductionError, match="concat: axis 2 is out of range for a 2-d tensor"):
        call_op("concat", tensor("a", n, 4), tensor("b", n, 4), axis=2)
    with pytest.raises(DeductionError, match="concat: dtypes differ"):
        call_op("concat", tensor("a", 4), tensor("b", 4, dtype="int32"))
    with pytest.raises(DeductionError, match="concat: needs at least one tensor"):
        call_op("concat")
    with pytest.raises(DeductionError, match="concat: cannot concatenate 0-d tensors"):
        call_op("concat", tensor("a"), tensor("b"))


@pytest.mark.parametrize("sizes", [(3, 2), (0, 4), (2, 0)])
def test_concat_legalized(sizes: tuple[int, int]) -> None:
    module = build({"a": sinfo(n, 3), "b": sinfo(m, 3), "c": sinfo(2, 3)},
                   lambda a, b, c: [call_op("concat", a, b, c, a, axis=0), call_op("concat", c, c, axis=1)])
    a, b, c = rand((sizes[0], 3), seed=10), rand((sizes[1], 3), seed=11), rand((2, 3), seed=12)
    check_legalized(module, {"a": a, "b": b, "c": c}, [np.concatenate([a, b, c, a]), np.concatenate([c, c], axis=1)])


def test_concat_legalized_int32_on_the_middle_axis() -> None:
    module = build({"a": sinfo(2, n, 3, dtype="int32"), "b": sinfo(2, 1, 3, dtype="int32")},
                   lambda a, b: call_op("concat", a, b, axis=1))
    a, b = rand((2, 4, 3), dtype="int32", seed=13), rand((2, 1, 3), dtype="int32", seed=14)
    check_legalized(module, {"a": a, "b": b}, [np.concatenate([a, b], axis=1)])


# split ----------------------------------------------------------------------------------------


def test_split_deduction() -> None:
    info = call_op("split", tensor("x", n * 4, 3), sections=2).struct_info
    assert same(info, TupleStructInfo((sinfo(n * 2, 3), sinfo(n * 2, 3))))
    info = call_op("split", tensor("x", n, 6), indices=[2, 5], axis=-1).struct_info
    assert same(info, TupleStructInfo((sinfo(n, 2), sinfo(n, 3), sinfo(n, 1))))
    info = call_op("split", tensor("x", 6), indices=[4, 9]).struct_info  # numpy: past the end is empty
    assert same(info, TupleStructInfo((sinfo(4), sinfo(2), sinfo(0))))
    info = call_op("split", tensor("x", n, 2), indices=[1]).struct_info
    assert same(info, TupleStructInfo((sinfo(1, 2), sinfo(n - 1, 2))))
    info = call_op("split", unknown("u", 2), sections=3, axis=1).struct_info
    assert same(info, TupleStructInfo((TensorStructInfo(None, "float32", 2),) * 3))
    info = call_op("split", unknown("u"), indices=[1]).struct_info
    assert same(info, TupleStructInfo((TensorStructInfo(None, "float32", -1),) * 2))


def test_split_errors() -> None:
    with pytest.raises(DeductionError, match=r"split: dimension 0 \(the split axis\) has n \* 3 elements, not "
                                             r"provably divisible into 2 equal sections"):
        call_op("split", tensor("x", n * 3, 4), sections=2)
    with pytest.raises(DeductionError, match=r"split: dimension 1 \(the split axis\) has 5 elements"):
        call_op("split", tensor("x", n, 5), sections=2, axis=1)
    with pytest.raises(DeductionError, match="split: indices must not decrease: index 1 is 1, after 3"):
        call_op("split", tensor("x", n), indices=[3, 1])
    with pytest.raises(DeductionError, match="split: give exactly one of sections"):
        call_op("split", tensor("x", n), sections=2, indices=[1])
    with pytest.raises(DeductionError, match="split: axis 2 is out of range for a 2-d tensor"):
        call_op("split", tensor("x", n, 4), sections=2, axis=2)


def test_split_legalized() -> None:
    module = build({"x": sinfo(n, 6)},
                   lambda x: [call_op("split", x, sections=2, axis=1), call_op("split", x, indices=[1, 4])])
    data = rand((6, 6), seed=15)
    expected = [*np.split(data, 2, axis=1), *np.split(data, [1, 4])]
    check_legalized(module, {"x": data}, expected)


# strided_slice --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("begin", "end", "stride", "expected"),
    [
        (0, BIG, 1, 10), (-3, BIG, 1, 3), (2, -2, 1, 6), (8, 3, 1, 0), (-100, 100, 1, 10),
        (1, BIG, 3, 3), (BIG, -BIG - 1, -1, 10), (-1, 2, -2, 4), (5, 5, 1, 0), (20, 30, 1, 0),
    ],
)
def test_strided_slice_static_clamps_like_onnx(begin: int, end: int, stride: int, expected: int) -> None:
    call = strided_slice(tensor("x", 10), [0], [begin], [end], [stride])
    assert same(call.struct_info, sinfo(expected))
    reference = get_op("strided_slice").reference(
        [np.arange(10), np.array([begin]), np.array([end])], call.attrs
    )
    python_end = None if end >= BIG or end < -BIG else end
    python_begin = None if begin >= BIG else begin
    np.testing.assert_array_equal(reference, np.arange(10)[python_begin:python_end:stride])


def test_strided_slice_symbolic() -> None:
    x = tensor("x", n, 8)
    assert same(strided_slice(x, [0, 1], [1, 0], [BIG, 8], [1, 2]).struct_info, sinfo(n - 1, 4))
    assert same(strided_slice(x, [0], [-1], [BIG]).struct_info, sinfo(1, 8))
    assert same(strided_slice(x, [0], [0], [-1]).struct_info, sinfo(n - 1, 8))
    assert same(strided_slice(x, [0], [BIG], [-BIG - 1], [-1]).struct_info, sinfo(n, 8))
    assert prove_equal(strided_slice(x, [0], [0], [BIG], [2]).struct_info.shape[0], (n + 1) // 2)
    # symbolic begin and end (positions from the start)
    assert same(strided_slice(x, [0], [k], [k + 4]).struct_info, sinfo(4, 8))
    assert same(strided_slice(x, [0], [k], [n]).struct_info, sinfo(n - k, 8))
    # without assume_inbound the undecidable clamps stay in the shape
    assert shape_of(strided_slice(x, [0], [1], [BIG], assume_inbound=False)) == "Tensor((n - min(1, n), 8), float32)"
    # unknown shapes keep the rank
    assert same(strided_slice(unknown("u", 2), [1], [0], [2]).struct_info, TensorStructInfo(None, "float32", 2))


def test_strided_slice_errors() -> None:
    x = tensor("x", n, 8)
    with pytest.raises(DeductionError, match="strided_slice: the stride of axis 1 is 0"):
        strided_slice(x, [1], [0], [4], [0])
    with pytest.raises(DeductionError, match="strided_slice: axis 2 is out of range for a 2-d tensor"):
        strided_slice(x, [2], [0], [4])
    with pytest.raises(DeductionError, match="strided_slice: axis 1 is given twice"):
        strided_slice(x, [1, -1], [0, 0], [4, 4])
    with pytest.raises(DeductionError, match="one entry per sliced axis, got 1 in axes, 1 in strides, 2 in begin"):
        call_op("strided_slice", x, ShapeExpr((0, 0)), ShapeExpr((1,)), axes=[0], strides=[1])


def test_strided_slice_legalized() -> None:
    module = build(
        {"x": sinfo(n, 8), "y": sinfo(k, 2)},
        lambda x, y: [
            strided_slice(x, [0, 1], [1, -1], [BIG, 0], [2, -3]),
            strided_slice(x, [0], [y.struct_info.shape[0]], [y.struct_info.shape[0] + 2]),
            strided_slice(x, [1], [-3], [BIG], assume_inbound=False),
        ],
    )
    data = rand((7, 8), seed=16)
    check_legalized(module, {"x": data, "y": rand((3, 2), seed=17)},
                    [data[1::2, -1:0:-3], data[3:5], data[:, -3:]])


# reductions -----------------------------------------------------------------------------------

REDUCTIONS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduction_deduction(op: str) -> None:
    x = tensor("x", n, 3, m)
    assert same(call_op(op, x).struct_info, sinfo())
    assert same(call_op(op, x, axes=[1]).struct_info, sinfo(n, m))
    assert same(call_op(op, x, axes=[0, -1], keepdims=True).struct_info, sinfo(1, 3, 1))
    assert same(call_op(op, x, axes=[]).struct_info, sinfo(n, 3, m))
    assert same(call_op(op, tensor("s", 4, 5), axes=[0]).struct_info, sinfo(5))
    assert same(call_op(op, unknown("u", 3), axes=[1]).struct_info, TensorStructInfo(None, "float32", 2))
    assert same(call_op(op, unknown("u", 3), axes=[1], keepdims=True).struct_info, TensorStructInfo(None, "float32", 3))
    assert same(call_op(op, unknown("u")).struct_info, sinfo())
    assert same(call_op(op, unknown("u"), axes=[0]).struct_info, TensorStructInfo(None, "float32", -1))


def test_reduction_errors() -> None:
    x = tensor("x", n, 3)
    with pytest.raises(DeductionError, match="sum: axis 2 is out of range for a 2-d tensor"):
        call_op("sum", x, axes=[2])
    with pytest.raises(DeductionError, match=r"max: axis 1 is given twice \(axes \[1, -1\]\)"):
        call_op("max", x, axes=[1, -1])
    with pytest.raises(DeductionError, match="mean: argument 0 must be a float tensor, got int32"):
        call_op("mean", tensor("i", 3, dtype="int32"))
    with pytest.raises(DeductionError, match="min: cannot reduce dimension 1: its extent is 0"):
        call_op("min", tensor("e", n, 0), axes=[1])


@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduction_legalized(op: str) -> None:
    module = build(
        {"x": sinfo(n, 3, m)},
        lambda x: [call_op(op, x), call_op(op, x, axes=[1]), call_op(op, x, axes=[0, 2], keepdims=True),
                   call_op(op, x, axes=[])],
    )
    data = rand((4, 3, 5), seed=18)
    function = REDUCTIONS[op]
    expected = [function(data), function(data, axis=1), function(data, axis=(0, 2), keepdims=True), data]
    check_legalized(module, {"x": data}, expected)
    if op != "mean":
        module = build({"x": sinfo(n, 4, dtype="int32")}, lambda x: call_op(op, x, axes=[-1]))
        ints = rand((3, 4), dtype="int32", seed=19)
        check_legalized(module, {"x": ints}, [function(ints, axis=-1)])


def test_sum_over_an_empty_axis_is_zero() -> None:
    module = build({"x": sinfo(n, m)}, lambda x: [call_op("sum", x, axes=[1]), call_op("mean", x, axes=[0])])
    legalized = legalize_ops(module)
    out_sum, _ = run_module(legalized, {"x": np.zeros((3, 0), np.float32)})
    np.testing.assert_array_equal(out_sum, [0, 0, 0])


# pooling --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel, strides, dilations, padding, ceil_mode, programs", [
    ([5, 5], [1, 1], [1, 1], [2, 2, 2, 2], False, ["max_pool_rows", "max_pool"]),  # YOLO's spatial pyramid
    ([4, 6], [2, 3], [2, 1], [1, 0, 2, 3], True, ["max_pool_rows", "max_pool"]),
    ([3, 3, 3], [1, 2, 1], [1, 1, 1], [1, 0, 1, 1, 1, 1], False, ["max_pool_rows", "max_pool"]),  # 27 taps: 3 + 9
    ([3, 3], [2, 2], [1, 1], [1, 1, 1, 1], False, ["max_pool"]),  # 9 taps, against 3 + 3: one program
    ([1, 7], [1, 1], [1, 1], [0, 3, 0, 3], False, ["max_pool"]),  # a window along one dim
])
def test_large_max_pool_windows_are_taken_apart(kernel, strides, dilations, padding, ceil_mode, programs) -> None:
    """A max pool's large window is legalized as two programs, the maxima along its last dim
    and then those of the other dims; both read nothing of the padding (all values negative,
    so a padded position taken for 0 would show), at symbolic extents."""
    spatial = [n, m, k][:len(kernel)]
    module = build({"x": sinfo(2, 3, *spatial)}, lambda x: call_op(
        "max_pool", x, kernel=kernel, strides=strides, dilations=dilations, padding=padding, ceil_mode=ceil_mode))
    legalized = check_legalized(module, {"x": rand((2, 3, *[9, 11, 7][:len(kernel)]), seed=4) - 2.0})
    assert [program.name for program in legalized.programs.values()] == programs


# unique ---------------------------------------------------------------------------------------


def test_unique() -> None:
    assert same(call_op("unique", tensor("x", n, dtype="int32")).struct_info, TensorStructInfo(None, "int32", 1))
    assert same(call_op("unique", unknown("u")).struct_info, TensorStructInfo(None, "float32", 1))
    with pytest.raises(DeductionError, match=r"unique: needs a 1-d tensor, got 2 dims"):
        call_op("unique", tensor("x", n, 2))
    module = build({"x": sinfo(n, dtype="int32")}, lambda x: call_op("unique", x))
    data = np.array([3, 1, 3, -2, 1, 7], np.int32)
    (out,) = run_module(module, {"x": data})
    np.testing.assert_array_equal(out, [-2, 1, 3, 7])
    legalized = legalize_ops(module)  # library kernels, a read-back and a match_cast
    np.testing.assert_array_equal(run_module(legalized, {"x": data})[0], [-2, 1, 3, 7])


# Legalization needs known shapes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "where"),
    [
        (lambda u, x: call_op("add", u, x), "argument 0"),
        (lambda u, x: call_op("relu", u), "argument 0"),
        (lambda u, x: call_op("concat", x, u, axis=1), "argument 1"),
        (lambda u, x: call_op("sum", u, axes=[1]), "argument 0"),
        (lambda u, x: call_op("reshape", x, Var("s", ShapeStructInfo(None, 2))), "the result"),
    ],
)
def test_legalizing_an_unknown_shape_asks_for_a_match_cast(make, where: str) -> None:
    module = build({"u": TensorStructInfo(None, "float32", 2), "x": sinfo(n, 4)}, make)
    with pytest.raises(UnknownShapeError, match=f"{where} has an unknown shape .*add a match_cast"):
        legalize_ops(module)


def test_legalizing_after_a_match_cast() -> None:
    builder = FunctionBuilder("main")
    u = builder.add_param("u", TensorStructInfo(None, "float32", 2))
    cast = builder.emit_match_cast(u, sinfo(n, 4), "cast")
    y = builder.emit(call_op("sum", cast, axes=[0]), "y", output=True)
    module = IRModule({"main": builder.finish([y], ["y"])})
    data = rand((3, 4), seed=20)
    check_legalized(module, {"u": data}, [data.sum(axis=0)])


# Scalar expressions of tensor programs --------------------------------------------------------


I0, I1, R = SizeVar("i0_"), SizeVar("i1_"), SizeVar("r_")


def test_compare_select_cast_and_index_value_in_the_interpreter() -> None:
    a = Buffer("A", (n, 3), "float32")
    # out[i, j] = A[i, j] if i < n - 1 else float(j * n); then the count as a float
    body = Select(Compare("lt", IndexValue(I0), IndexValue(n - 1)), Load(a, (I0, I1)),
                  Cast("float32", IndexValue(I1 * n)))
    program = TensorProgram("pick", (a,), Buffer("out", (n, 3), "float32"), (I0, I1), body)
    data = rand((4, 3), seed=21)
    expected = data.copy()
    expected[3] = np.arange(3) * 4
    np.testing.assert_array_equal(run_program(program, [data], {"n": 4}), expected)
    assert format_scalar(body) == "select((index(i0_) < index(n - 1)), A[i0_, i1_], float32(index(i1_ * n)))"
    # a select's untaken branch may read out of bounds (a concat's second input)
    shifted = Select(Compare("ge", IndexValue(I0), IndexValue(2)), Load(a, (I0 - 2, I1)), FloatImm(-1.0))
    program = TensorProgram("shift", (a,), Buffer("out", (n, 3), "float32"), (I0, I1), shifted)
    out = run_program(program, [data], {"n": 4})
    np.testing.assert_array_equal(out[:2], -1)
    np.testing.assert_array_equal(out[2:], data[:2])
    # …but a plain out-of-bounds load is a bug and says so
    program = TensorProgram("bad", (a,), Buffer("out", (n, 3), "float32"), (I0, I1), Load(a, (I0 + 1, I1)))
    with pytest.raises(IndexError, match="load of A: index 4 is out of bounds for dimension 0 of extent 4"):
        run_program(program, [data], {"n": 4})


def test_min_reduction_and_empty_reductions_in_the_interpreter() -> None:
    a = Buffer("A", (n, m), "int32")
    for combiner, identity in (("min", np.iinfo(np.int32).max), ("max", np.iinfo(np.int32).min), ("sum", 0)):
        program = TensorProgram(combiner, (a,), Buffer("out", (n,), "int32"), (I0,),
                                Reduce(combiner, R, m, Load(a, (I0, R))))
        data = rand((3, 4), dtype="int32", seed=22)
        np.testing.assert_array_equal(run_program(program, [data], {"n": 3, "m": 4}),
                                      getattr(data, combiner)(axis=1))
        empty = run_program(program, [np.zeros((2, 0), np.int32)], {"n": 2, "m": 0})
        np.testing.assert_array_equal(empty, [identity, identity])


def test_wgsl_of_the_new_scalar_nodes() -> None:
    a = Buffer("A", (n, 3), "int32")
    body = Select(Compare("lt", IndexValue(I0), IndexValue(n - 1)),
                  Cast("int32", Binary("multiply", Cast("float32", Load(a, (I0, I1))), FloatImm(2.0))),
                  Reduce("min", R, IntImm(3), Load(a, (I0, R))))
    program = TensorProgram("mix", (a,), Buffer("out", (n, 3), "int32"), (I0, I1), body)
    lines = [line.strip() for line in emit_wgsl(program).source.splitlines()]
    assert "var sel0: i32;" in lines
    assert "if ((i0_ < (params.n - 1))) {" in lines
    assert "sel0 = i32((f32(A[(i0_ * 3) + i1_]) * 2.0));" in lines
    assert "} else {" in lines
    assert "var acc0: i32 = 2147483647;" in lines  # the min reduction runs only in its branch
    assert "acc0 = min(acc0, A[(i0_ * 3) + r_]);" in lines
    assert lines.index("} else {") < lines.index("var acc0: i32 = 2147483647;")
    assert "out[index] = sel0;" in lines


# WGSL on wgpu ---------------------------------------------------------------------------------


def new_op_programs() -> dict[str, TensorProgram]:
    """The tensor programs of the newer ops, float32 and int32, symbolic and static."""
    programs = {}
    for dtype in ("float32", "int32"):
        module = build(
            {"a": sinfo(n, 3, m, dtype=dtype), "b": sinfo(k, 3, m, dtype=dtype)},
            lambda a, b: [
                call_op("concat", a, b, a, axis=0), call_op("concat", a, a, axis=-1),
                call_op("split", a, sections=3, axis=1), call_op("split", b, indices=[1, 3], axis=2),
                strided_slice(a, [0, 2], [1, -1], [BIG, -BIG - 1], [2, -1]),
                strided_slice(b, [0], [1], [BIG], assume_inbound=False),
                *(call_op(op, a, axes=[0, 2], keepdims=keep) for op in ("sum", "max", "min") for keep in (False, True)),
                *([call_op("mean", a, axes=[1]), call_op("mean", a)] if dtype == "float32" else []),
            ],
        )
        for name, program in legalize_ops(module).programs.items():
            programs[f"{dtype}/{name}"] = program
    return programs


def test_new_op_programs_compile_on_wgpu(device) -> None:
    programs = new_op_programs()
    kinds = {name.split("/")[1].rstrip("0123456789") for name in programs}
    assert kinds == {"concat", "split", "strided_slice", "sum", "mean", "max", "min"}
    for name, program in sorted(programs.items()):
        shader = emit_wgsl(program)
        module = device.create_shader_module(code=shader.source)
        pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        assert pipeline is not None, name


def legalized_program(module: IRModule, name: str) -> TensorProgram:
    return legalize_ops(module).programs[name]


def test_mean_and_min_kernels_run_on_wgpu(device) -> None:
    module = build({"x": sinfo(n, 3, m)}, lambda x: [call_op("mean", x, axes=[0, 2]), call_op("min", x, axes=[1], keepdims=True)])
    programs = legalize_ops(module).programs
    data = rand((5, 3, 7), seed=23)
    sizes = {"n": 5, "m": 7}
    assert_close(run_kernel_on_gpu(device, programs["mean"], [data], sizes), data.mean(axis=(0, 2)))
    np.testing.assert_array_equal(run_kernel_on_gpu(device, programs["min"], [data], sizes), data.min(axis=1, keepdims=True))
    ints = rand((4, 3), dtype="int32", seed=24)
    int_module = build({"x": sinfo(n, 3, dtype="int32")}, lambda x: call_op("sum", x, axes=[0]))
    out = run_kernel_on_gpu(device, legalize_ops(int_module).programs["sum"], [ints], {"n": 4})
    np.testing.assert_array_equal(out, ints.sum(axis=0))


@pytest.mark.parametrize("sizes", [(3, 2), (0, 4)])
def test_concat_and_slice_kernels_run_kernel_on_gpu(device, sizes: tuple[int, int]) -> None:
    module = build({"a": sinfo(n, 3), "b": sinfo(m, 3)},
                   lambda a, b: [call_op("concat", a, b, a, axis=0), strided_slice(a, [0], [-1], [-BIG - 1], [-2])])
    programs = legalize_ops(module).programs
    a, b = rand((sizes[0], 3), seed=25), rand((sizes[1], 3), seed=26)
    size_vars = {"n": sizes[0], "m": sizes[1]}
    out = run_kernel_on_gpu(device, programs["concat"], [a, b, a], size_vars)
    np.testing.assert_array_equal(out, np.concatenate([a, b, a]))
    if sizes[0]:
        np.testing.assert_array_equal(run_kernel_on_gpu(device, programs["strided_slice"], [a], size_vars), a[::-2])


def test_symbolic_dims_print_readably() -> None:
    """The deduced extents of the new ops stay in canonical form (what the docs show)."""
    assert format_expr(call_op("concat", tensor("a", n, 4), tensor("b", m, 4)).struct_info.shape[0]) == "m + n"


def test_builder_errors_name_the_binding_and_the_dimension() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", sinfo(n, 4))
    y = builder.add_param("y", sinfo(n, 5))
    with pytest.raises(DeductionError, match=r"binding 'z': add: cannot broadcast dimension 1 of the result: 4 vs 5"):
        builder.emit_op("add", x, y, name_hint="z")


@pytest.mark.parametrize("scales, sizes", [((1, 1, 2, 2), None), ((1, 1, 1.5, 0.5), None), ((1, 1, 3, 0.75), None),
                                           (None, (1, 1, 7, 2))])
def test_nearest_asymmetric_floor_resize_reads_without_clamping(scales, sizes) -> None:
    """A nearest resize with asymmetric coordinates rounded down (ultralytics' upsample) never
    reads past the input, whatever the scale or sizes: its program indexes the input by
    ``(y * q) // p`` alone, without the min / max clamp the other modes need, and matches
    the reference at symbolic sizes (the output's extents ``floor(in * scale)``)."""
    h, w = SizeVar("h"), SizeVar("w")
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((1, 2, h, w) if sizes is None else (1, 2, 5, 3), "float32"))
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    if scales is not None:
        attrs.update(scales=list(scales))
    else:
        attrs.update(sizes=list(sizes))
    out = builder.emit(call_op("resize", x, **attrs), "y", output=True)
    module = legalize_ops(IRModule({"main": builder.finish([out], ["y"])}))
    [program] = [p for p in module.programs.values() if isinstance(p, TensorProgram)]
    text = format_scalar(program.body)
    assert "min(" not in text and "max(" not in text, text
    for height, width in ((5, 3), (4, 8), (7, 1)) if sizes is None else ((5, 3),):
        data = rand((1, 2, height, width), seed=height)
        reference = run_module(IRModule({"main": builder.finish([out], ["y"])}), {"x": data})
        assert_close(run_module(module, {"x": data})[0], reference[0], F32)
