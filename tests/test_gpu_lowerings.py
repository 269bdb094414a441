"""GPU lowerings of the indexing and math ops that used to run only in the interpreter:
take / gather_elements / gather_nd (through the indirect load ``Gather``), erf and exact gelu,
power, mod, softplus, mish and the prod / l2_norm / log_sum reductions.

Each op is legalized and run in the interpreter against its numpy reference, and every
generated tensor program compiles to WGSL and runs on wgpu (lavapipe on CI) for float32 /
int32 data.  ONNX's own node test cases for Gather, GatherElements, GatherND, Erf and Pow
are imported, legalized and checked against their expected outputs in the interpreter.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from relaxweb.ir import FunctionBuilder, IntImm, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import Constant
from relaxweb.ir.interpreter import run_module, run_program
from relaxweb.ir.tir import (
    Buffer, Cast, FloatImm, Gather, Load, Reduce, TensorProgram, format_scalar, index_exprs, scalar_children,
)
from relaxweb.ops import call_op
from relaxweb.passes import legalize_ops
from relaxweb.wgsl import emit_wgsl
from tests.gpu_kernels import run_kernel_on_gpu

n = SizeVar("n")


def sinfo(*shape, dtype: str = "float32") -> TensorStructInfo:
    return TensorStructInfo(tuple(shape), dtype)


def build(params: dict[str, TensorStructInfo], make) -> IRModule:
    builder = FunctionBuilder("main")
    args = [builder.add_param(name, info) for name, info in params.items()]
    out = builder.emit(make(*args), "y", output=True)
    return IRModule({"main": builder.finish([out], ["y"])})


def check(module: IRModule, inputs: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> IRModule:
    """Legalized == reference in the interpreter, and every program compiles to WGSL."""
    legalized = legalize_ops(module)
    assert not any(True for b in legalized.functions["main"].bindings() if type(b.value).__name__ == "Call")
    want = run_module(module, inputs)
    got = run_module(legalized, inputs)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    for program in legalized.programs.values():
        emit_wgsl(program)
    return legalized


def only_program(module: IRModule) -> TensorProgram:
    (program,) = module.programs.values()
    return program


def on_gpu(device, module: IRModule, arrays: list[np.ndarray], size_vars=None) -> np.ndarray:
    program = only_program(module)
    return run_kernel_on_gpu(device, program, arrays, size_vars or {})


rng = np.random.default_rng(0)


# The Gather node -------------------------------------------------------------------------------


def test_gather_node_clamps_and_walks() -> None:
    data = Buffer("A", (5, 3), "float32")
    indices = Buffer("B", (4,), "int64")
    i0, i1 = SizeVar("i0_"), SizeVar("i1_")
    body = Gather(data, (Cast("int32", Load(indices, (i0,))), i1))
    program = TensorProgram("g", (data, indices), Buffer("out", (4, 3), "float32"), (i0, i1), body)
    assert scalar_children(body) == (Cast("int32", Load(indices, (i0,))),)
    assert i1 in index_exprs(body) and i0 in index_exprs(body)
    assert format_scalar(body) == "A[int32(B[i0_]), i1_]"
    a = np.arange(15, dtype=np.float32).reshape(5, 3)
    got = run_program(program, [a, np.array([0, 4, 9, -3], dtype=np.int64)], {})
    np.testing.assert_array_equal(got, a[[0, 4, 4, 0]])  # out of range: clamped
    source = emit_wgsl(program).source
    assert "clamp(i32(i32(B[i0_])), 0, 4)" in source


# take / gather_elements / gather_nd ----------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("index_shape", [(), (4,), (2, 3)])
def test_take(axis: int, index_shape: tuple) -> None:
    data = rng.standard_normal((3, 5, 4)).astype(np.float32)
    extent = data.shape[axis]
    indices = rng.integers(-extent, extent, size=index_shape).astype(np.int64)
    module = build({"x": sinfo(3, 5, 4), "i": sinfo(*index_shape, dtype="int64")},
                   lambda x, i: call_op("take", x, i, axis=axis))
    check(module, {"x": data, "i": indices})


def test_take_symbolic_embedding_on_gpu(device) -> None:
    """GPT-2 style: a table gathered by token ids of symbolic length (negative ids wrap)."""
    table = rng.standard_normal((10, 6)).astype(np.float32)
    module = build({"w": sinfo(10, 6), "ids": sinfo(1, n, dtype="int32")},
                   lambda w, ids: call_op("take", w, ids, axis=0))
    ids = np.array([[3, -1, 0, 9, 2, -10, 5]], dtype=np.int32)
    legalized = check(module, {"w": table, "ids": ids})
    np.testing.assert_array_equal(on_gpu(device, legalized, [table, ids], {"n": 7}), table[ids % 10])


@pytest.mark.parametrize("axis", [0, 1])
def test_take_on_gpu(device, axis: int) -> None:
    data = rng.standard_normal((4, 6)).astype(np.float32)
    indices = np.array([[0, -1], [2, 3], [-2, 1]], dtype=np.int32)
    module = build({"x": sinfo(4, 6), "i": sinfo(3, 2, dtype="int32")}, lambda x, i: call_op("take", x, i, axis=axis))
    legalized = check(module, {"x": data, "i": indices})
    expected = np.take(data, indices % data.shape[axis], axis=axis)
    np.testing.assert_array_equal(on_gpu(device, legalized, [data, indices]), expected)


def test_take_int_data_on_gpu(device) -> None:
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    indices = np.array([2, 0, -1], dtype=np.int32)
    module = build({"x": sinfo(3, 4, dtype="int32"), "i": sinfo(3, dtype="int32")},
                   lambda x, i: call_op("take", x, i, axis=1))
    legalized = check(module, {"x": data, "i": indices})
    np.testing.assert_array_equal(on_gpu(device, legalized, [data, indices]), data[:, [2, 0, 3]])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(device, axis: int) -> None:
    data = rng.standard_normal((3, 4)).astype(np.float32)
    extent = data.shape[axis]
    indices = rng.integers(-extent, extent, size=(2, 4) if axis != 0 else (5, 4)).astype(np.int32)
    if axis != 0:
        indices = rng.integers(-extent, extent, size=(3, 6)).astype(np.int32)
    shape = indices.shape
    module = build({"x": sinfo(3, 4), "i": sinfo(*shape, dtype="int32")},
                   lambda x, i: call_op("gather_elements", x, i, axis=axis))
    legalized = check(module, {"x": data, "i": indices})
    check(build({"x": sinfo(3, 4), "i": sinfo(*shape, dtype="int64")},
                lambda x, i: call_op("gather_elements", x, i, axis=axis)), {"x": data, "i": indices.astype(np.int64)})
    expected = np.take_along_axis(data, indices % extent, axis=axis)
    np.testing.assert_array_equal(on_gpu(device, legalized, [data, indices]), expected)


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(device, batch_dims: int) -> None:
    data = rng.standard_normal((2, 3, 4)).astype(np.float32)
    if batch_dims == 0:
        indices = np.array([[[0, 1], [1, -1]], [[-2, 0], [1, 2]]], dtype=np.int32)  # (2, 2, 2): rows of data
    else:
        indices = np.array([[[0], [2]], [[-1], [1]]], dtype=np.int32)  # (2, 2, 1)
    module = build({"x": sinfo(2, 3, 4), "i": sinfo(*indices.shape, dtype="int32")},
                   lambda x, i: call_op("gather_nd", x, i, batch_dims=batch_dims))
    legalized = check(module, {"x": data, "i": indices})
    check(build({"x": sinfo(2, 3, 4), "i": sinfo(*indices.shape, dtype="int64")},
                lambda x, i: call_op("gather_nd", x, i, batch_dims=batch_dims)),
          {"x": data, "i": indices.astype(np.int64)})
    expected = run_module(module, {"x": data, "i": indices})[0]
    np.testing.assert_array_equal(on_gpu(device, legalized, [data, indices]), expected)


# erf / gelu ------------------------------------------------------------------------------------


def _erf_module(shape=(n,)):
    return build({"x": sinfo(*shape)}, lambda x: call_op("erf", x))


def test_erf_accuracy_on_a_dense_grid() -> None:
    x = np.linspace(-8, 8, 400_001).astype(np.float32)
    x = np.concatenate([x, np.float32([0.0, -0.0, 0.75, -0.75, 1e-30, 50, -50, 3e38, -3e38])])
    got = run_module(legalize_ops(_erf_module()), {"x": x})[0]
    want = np.array([math.erf(float(v)) for v in x])
    error = np.abs(got.astype(np.float64) - want)
    assert error.max() <= 2e-7, (error.max(), x[error.argmax()])


def test_erf_and_gelu_on_gpu(device) -> None:
    x = np.concatenate([np.linspace(-6, 6, 20_001), [0.0, 0.7499, 0.75, 20.0, -20.0]]).astype(np.float32)
    legalized = legalize_ops(_erf_module((x.size,)))
    got = on_gpu(device, legalized, [x])
    want = np.array([math.erf(float(v)) for v in x])
    assert np.abs(got - want).max() <= 1e-6
    gelu = check(build({"x": sinfo(x.size)}, lambda v: call_op("gelu", v)), {"x": x}, rtol=1e-5, atol=2e-7)
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    np.testing.assert_allclose(on_gpu(device, gelu, [x]), want, rtol=1e-5, atol=1e-6)


# power -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 4, -1, -2, 0.5, 2.5, 7.0, 9.0, 10.0])
def test_power_constant_exponent(device, exponent: float) -> None:
    x = np.concatenate([rng.standard_normal(50) * 2, [0.0, 1.0, -1.0, 2.0]]).astype(np.float32)
    if exponent != int(exponent) or exponent < 0:
        x = np.abs(x) + np.float32(0.25)  # negative bases to fractional powers are NaN; 1/0 is inf
    e = Constant(np.array(exponent, dtype=np.float32), "e")
    module = build({"x": sinfo(x.size)}, lambda v: call_op("power", v, e))
    legalized = check(module, {"x": x}, rtol=2e-6)
    program = only_program(legalized)
    if exponent == int(exponent) and abs(exponent) <= 8:
        assert "pow(" not in emit_wgsl(program).source and len(program.inputs) == 1
    want = np.power(x.astype(np.float64), exponent)
    arrays = [x] if len(program.inputs) == 1 else [x, e.data]
    np.testing.assert_allclose(on_gpu(device, legalized, arrays), want, rtol=1e-5, atol=1e-6)


def test_power_gpt2_gelu_cube_is_exact() -> None:
    e = Constant(np.array(3.0, dtype=np.float32), "three")
    program = only_program(legalize_ops(build({"x": sinfo(n, 8)}, lambda v: call_op("power", v, e))))
    assert format_scalar(program.body) == "((A[i0_, i1_] * A[i0_, i1_]) * A[i0_, i1_])"


def test_power_tensor_exponent(device) -> None:
    base = np.array([2.0, -2.0, -2.0, -3.0, 0.0, 4.0, 1.5, -1.5, 0.5], dtype=np.float32)
    exponent = np.array([3.0, 3.0, 2.0, -1.0, 2.0, 0.5, -2.5, 4.0, 0.0], dtype=np.float32)
    module = build({"a": sinfo(9), "b": sinfo(9)}, lambda a, b: call_op("power", a, b))
    legalized = check(module, {"a": base, "b": exponent})
    assert "pow(" in emit_wgsl(only_program(legalized)).source
    np.testing.assert_allclose(on_gpu(device, legalized, [base, exponent]), np.power(base, exponent), rtol=1e-5)
    # an int64 exponent (ONNX allows another dtype) is cast to float
    check(build({"a": sinfo(9), "b": sinfo(9, dtype="int64")}, lambda a, b: call_op("power", a, b)),
          {"a": base, "b": exponent.astype(np.int64)})


def test_power_int32(device) -> None:
    base = np.array([2, -3, 5, 0, -1, 7], dtype=np.int32)
    exponent = np.array([3, 3, 2, 0, 5, 1], dtype=np.int32)
    legalized = check(build({"a": sinfo(6, dtype="int32"), "b": sinfo(6, dtype="int32")},
                            lambda a, b: call_op("power", a, b)), {"a": base, "b": exponent})
    np.testing.assert_array_equal(on_gpu(device, legalized, [base, exponent]), np.power(base, exponent))


# mod, softplus, mish ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_float(device, fmod: int) -> None:
    a = np.array([5.5, -5.5, 5.5, -5.5, 3.0, -3.0, 0.0, 7.25], dtype=np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 1.5, 1.5, 3.0, 0.5], dtype=np.float32)
    legalized = check(build({"a": sinfo(8), "b": sinfo(8)}, lambda x, y: call_op("mod", x, y, fmod=fmod)),
                      {"a": a, "b": b})
    want = np.fmod(a, b) if fmod else np.mod(a, b)
    np.testing.assert_allclose(on_gpu(device, legalized, [a, b]), want, atol=1e-6)


@pytest.mark.parametrize("op", ["softplus", "mish"])
def test_softplus_mish(device, op: str) -> None:
    x = np.concatenate([np.linspace(-30, 30, 601), [-100.0, 80.0]]).astype(np.float32)
    legalized = check(build({"x": sinfo(x.size)}, lambda v: call_op(op, v)), {"x": x})
    want = run_module(build({"x": sinfo(x.size)}, lambda v: call_op(op, v)), {"x": x})[0]
    # WGSL's tanh of a tiny value (mish at very negative x) is only absolutely accurate
    np.testing.assert_allclose(on_gpu(device, legalized, [x]), want, rtol=1e-5, atol=5e-6)


# reductions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["prod", "l2_norm", "log_sum"])
def test_new_reductions(device, op: str) -> None:
    x = (rng.random((3, 4, 5)) + 0.5).astype(np.float32)
    module = build({"x": sinfo(3, 4, 5)}, lambda v: call_op(op, v, axes=[1, 2], keepdims=False))
    legalized = check(module, {"x": x})
    want = run_module(module, {"x": x})[0]
    np.testing.assert_allclose(on_gpu(device, legalized, [x]), want, rtol=1e-5)


def test_prod_int32_and_empty(device) -> None:
    x = np.array([[1, 2, 3], [-1, 4, 2]], dtype=np.int32)
    legalized = check(build({"x": sinfo(2, 3, dtype="int32")}, lambda v: call_op("prod", v, axes=[1])), {"x": x})
    np.testing.assert_array_equal(on_gpu(device, legalized, [x]), [6, -8])
    reduce = Reduce("prod", SizeVar("r"), IntImm(0), FloatImm(2.0))
    program = TensorProgram("p", (), Buffer("out", (1,), "float32"), (SizeVar("i0_"),), reduce)
    np.testing.assert_array_equal(run_program(program, [], {}), [1.0])
    np.testing.assert_array_equal(run_kernel_on_gpu(device, program, [], {}), [1.0])


# ONNX's node test cases ------------------------------------------------------------------------

ONNX_OPS = ("Gather", "GatherElements", "GatherND", "Erf", "Pow")


def _onnx_cases() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    state = np.random.get_state()  # collecting reseeds numpy's global generator
    try:
        cases = collect_testcases(None)  # (ONNX caches the first collection: filter here)
    finally:
        np.random.set_state(state)
    return {case.name: case for case in cases
            if case.kind == "node" and [node.op_type for node in case.model.graph.node] in ([op] for op in ONNX_OPS)}


ONNX_CASES = _onnx_cases()


@pytest.mark.parametrize("name", sorted(ONNX_CASES))
def test_onnx_node_case_legalized(name: str) -> None:
    from relaxweb.frontend import from_onnx

    case = ONNX_CASES[name]
    module = from_onnx(case.model)
    legalized = legalize_ops(module)
    graph_inputs = [i.name for i in case.model.graph.input]
    for inputs, outputs in case.data_sets:
        got = run_module(legalized, dict(zip(graph_inputs, inputs)))
        for actual, expected in zip(got, outputs):
            np.testing.assert_allclose(actual, expected, rtol=max(case.rtol, 1e-5), atol=max(case.atol, 1e-6))


def test_infinities_survive_max_and_min_on_the_gpu(device) -> None:
    """WGSL lets compilers assume there are no infinities: max / min start from the
    infinities by bit casts, so a row of -inf reduces to -inf as in numpy."""
    x = np.array([[1.0, 2.0, -np.inf], [-np.inf, -np.inf, -np.inf]], np.float32)
    for op in ("max", "min"):
        module = build({"x": TensorStructInfo((2, 3), "float32")}, lambda value: call_op(op, value, axes=[1]))
        (program,) = legalize_ops(module).programs.values()
        expected = x.max(axis=1) if op == "max" else x.min(axis=1)
        np.testing.assert_array_equal(run_kernel_on_gpu(device, program, [x], {}), expected)


def test_isnan_survives_on_the_gpu(tmp_path) -> None:
    """WGSL lets compilers fold x != x away: isnan tests the bit pattern instead."""
    import onnx
    from onnx import TensorProto, helper

    from relaxweb.bundle import build_bundle
    from relaxweb.runtime import Session

    graph = helper.make_graph(
        [helper.make_node("IsNaN", ["x"], ["y"], name="isnan")], "isnan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, ["n"])],
    )
    path = tmp_path / "isnan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    build_bundle(path, tmp_path / "bundle")
    x = np.array([1.0, np.nan, -np.inf, np.inf, 0.0, -np.nan], np.float32)
    np.testing.assert_array_equal(Session(tmp_path / "bundle").run({"x": x})["y"], np.isnan(x))
