"""GPU lowerings of the indexing and math ops that used to run only in the interpreter:
take / gather_elements / gather_nd (through the indirect load ``Gather``), erf and exact gelu,
power, mod, softplus, mish and the prod / l2_norm / log_sum reductions.

Each op is legalized and run in the interpreter against its numpy reference, and every
generated tensor program compiles to WGSL and runs on wgpu (lavapipe on CI) for float32 /
int32 data.  The ops lowered to several programs or with read-backs of data-dependent sizes
(argmax / argmin, log_sum_exp, topk, the scatters, nonzero, squeeze / expand_dims,
dynamic_reshape / dynamic_slice, run-time axes, shapes, pads, sizes and k, shifts,
max_pool_indices, dropout_mask) are compiled whole into a bundle and run with the Python
runtime (``check_compiled``).  ONNX's own node test cases for Gather, GatherElements, GatherND, Erf and Pow
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
from tests.helpers import F32, F32_LOOSE, Tolerance, assert_close, make_model, onnx_node_cases, rand

n = SizeVar("n")


def sinfo(*shape, dtype: str = "float32") -> TensorStructInfo:
    return TensorStructInfo(tuple(shape), dtype)


def build(params: dict[str, TensorStructInfo], make) -> IRModule:
    builder = FunctionBuilder("main")
    args = [builder.add_param(name, info) for name, info in params.items()]
    out = builder.emit(make(*args), "y", output=True)
    return IRModule({"main": builder.finish([out], ["y"])})


def check(module: IRModule, inputs: dict[str, np.ndarray], tolerance: Tolerance = F32) -> IRModule:
    """Legalized == reference in the interpreter, and every program compiles to WGSL."""
    legalized = legalize_ops(module)
    assert not any(True for b in legalized.functions["main"].bindings() if type(b.value).__name__ == "Call")
    want = run_module(module, inputs)
    got = run_module(legalized, inputs)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert_close(a, b, tolerance)
    for program in legalized.programs.values():
        emit_wgsl(program)
    return legalized


def only_program(module: IRModule) -> TensorProgram:
    (program,) = module.programs.values()
    return program


def on_gpu(device, module: IRModule, arrays: list[np.ndarray], size_vars=None) -> np.ndarray:
    program = only_program(module)
    return run_kernel_on_gpu(device, program, arrays, size_vars or {})


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
    data = rand((3, 5, 4), seed=1)
    extent = data.shape[axis]
    indices = rand(index_shape, seed=2, low=-extent, high=extent, dtype=np.int64)
    module = build({"x": sinfo(3, 5, 4), "i": sinfo(*index_shape, dtype="int64")},
                   lambda x, i: call_op("take", x, i, axis=axis))
    check(module, {"x": data, "i": indices})


def test_take_symbolic_embedding_on_gpu(device) -> None:
    """GPT-2 style: a table gathered by token ids of symbolic length (negative ids wrap)."""
    table = rand((10, 6), seed=3)
    module = build({"w": sinfo(10, 6), "ids": sinfo(1, n, dtype="int32")},
                   lambda w, ids: call_op("take", w, ids, axis=0))
    ids = np.array([[3, -1, 0, 9, 2, -10, 5]], dtype=np.int32)
    legalized = check(module, {"w": table, "ids": ids})
    np.testing.assert_array_equal(on_gpu(device, legalized, [table, ids], {"n": 7}), table[ids % 10])


@pytest.mark.parametrize("axis", [0, 1])
def test_take_on_gpu(device, axis: int) -> None:
    data = rand((4, 6), seed=4)
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
    data = rand((3, 4), seed=5)
    extent = data.shape[axis]
    indices = rand((2, 4) if axis != 0 else (5, 4), seed=6, low=-extent, high=extent, dtype=np.int32)
    if axis != 0:
        indices = rand((3, 6), seed=7, low=-extent, high=extent, dtype=np.int32)
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
    data = rand((2, 3, 4), seed=8)
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
    gelu = check(build({"x": sinfo(x.size)}, lambda v: call_op("gelu", v)), {"x": x})
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert_close(on_gpu(device, gelu, [x]), want)


# power -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, 4, -1, -2, 0.5, 2.5, 7.0, 9.0, 10.0])
def test_power_constant_exponent(device, exponent: float) -> None:
    x = np.concatenate([rand(50, seed=9) * 2, [0.0, 1.0, -1.0, 2.0]]).astype(np.float32)
    if exponent != int(exponent) or exponent < 0:
        x = np.abs(x) + np.float32(0.25)  # negative bases to fractional powers are NaN; 1/0 is inf
    e = Constant(np.array(exponent, dtype=np.float32), "e")
    module = build({"x": sinfo(x.size)}, lambda v: call_op("power", v, e))
    legalized = check(module, {"x": x})
    program = only_program(legalized)
    if exponent == int(exponent) and abs(exponent) <= 8:
        assert "pow(" not in emit_wgsl(program).source and len(program.inputs) == 1
    want = np.power(x.astype(np.float64), exponent)
    arrays = [x] if len(program.inputs) == 1 else [x, e.data]
    assert_close(on_gpu(device, legalized, arrays), want, F32_LOOSE)


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
    assert_close(on_gpu(device, legalized, [base, exponent]), np.power(base, exponent))
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
    assert_close(on_gpu(device, legalized, [a, b]), want)


@pytest.mark.parametrize("op", ["softplus", "mish"])
def test_softplus_mish(device, op: str) -> None:
    x = np.concatenate([np.linspace(-30, 30, 601), [-100.0, 80.0]]).astype(np.float32)
    # mish at very negative x cancels: an absolute error of |x| * eps (x down to -30), and
    # WGSL's tanh of a tiny value is only absolutely accurate
    legalized = check(build({"x": sinfo(x.size)}, lambda v: call_op(op, v)), {"x": x}, F32_LOOSE)
    want = run_module(build({"x": sinfo(x.size)}, lambda v: call_op(op, v)), {"x": x})[0]
    assert_close(on_gpu(device, legalized, [x]), want, F32_LOOSE)


# reductions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["prod", "l2_norm", "log_sum"])
def test_new_reductions(device, op: str) -> None:
    x = rand((3, 4, 5), seed=10, low=0.5, high=1.5)
    module = build({"x": sinfo(3, 4, 5)}, lambda v: call_op(op, v, axes=[1, 2], keepdims=False))
    legalized = check(module, {"x": x})
    want = run_module(module, {"x": x})[0]
    assert_close(on_gpu(device, legalized, [x]), want)


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
    cases = onnx_node_cases(["gather", "gatherelements", "gathernd", "erf", "pow"])  # only these ops' modules
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
            assert_close(actual, expected, Tolerance(max(case.rtol, F32.rtol), max(case.atol, F32.atol)))


def test_infinities_survive_max_and_min_on_the_gpu(device) -> None:
    """WGSL lets compilers assume there are no infinities: max / min start from the
    infinities by bit casts, so a row of -inf reduces to -inf as in numpy."""
    x = np.array([[1.0, 2.0, -np.inf], [-np.inf, -np.inf, -np.inf]], np.float32)
    for op in ("max", "min"):
        module = build({"x": TensorStructInfo((2, 3), "float32")}, lambda value: call_op(op, value, axes=[1]))
        (program,) = legalize_ops(module).programs.values()
        expected = x.max(axis=1) if op == "max" else x.min(axis=1)
        np.testing.assert_array_equal(run_kernel_on_gpu(device, program, [x], {}), expected)


@pytest.mark.gpu
def test_isnan_survives_on_the_gpu(tmp_path) -> None:
    """WGSL lets compilers fold x != x away: isnan tests the bit pattern instead."""
    import onnx
    from onnx import TensorProto, helper

    from relaxweb.compiler import build_bundle
    from relaxweb.runtime import Session

    path = tmp_path / "isnan.onnx"
    onnx.save(make_model([helper.make_node("IsNaN", ["x"], ["y"], name="isnan")], [("x", ["n"])],
                         [("y", TensorProto.BOOL, ["n"])]), str(path))
    build_bundle(path, tmp_path / "bundle")
    x = np.array([1.0, np.nan, -np.inf, np.inf, 0.0, -np.nan], np.float32)
    np.testing.assert_array_equal(Session(tmp_path / "bundle").run({"x": x})["y"], np.isnan(x))


# Ops lowered through several programs (and read-backs): compiled whole and run on wgpu -------


def run_compiled(tmp_path, module: IRModule, inputs: dict[str, np.ndarray], bounds=None) -> list[np.ndarray]:
    """Compile the module into a bundle and run it with the Python runtime (wgpu)."""
    from relaxweb.bundle import write_bundle
    from relaxweb.compiler import compile_module
    from relaxweb.runtime import Session

    compiled = compile_module(module, bounds or {})
    folder = tmp_path / "bundle"
    write_bundle(compiled, folder, "module")
    outputs = Session(folder).run(inputs)
    return list(outputs.values())


def check_compiled(tmp_path, module: IRModule, inputs: dict[str, np.ndarray], expected=None,
                   tolerance: Tolerance = F32, bounds=None) -> None:
    """Legalized == reference in the interpreter, and the compiled bundle == the reference."""
    want = run_module(module, inputs) if expected is None else expected
    got = run_module(legalize_ops(module), inputs)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        assert_close(a, b, tolerance)
    for a, b in zip(run_compiled(tmp_path, module, inputs, bounds), want):
        assert a.shape == b.shape, (a.shape, b.shape)
        assert_close(a, b.astype(a.dtype), tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, True, False), (1, False, False), (-1, True, True), (1, False, True)])
def test_argmax_argmin(tmp_path, op: str, axis: int, keepdims: bool, last: bool) -> None:
    x = rand((3, 5, 4), seed=11, low=0, high=4, dtype=np.int64).astype(np.float32)  # many ties
    module = build({"x": sinfo(3, 5, 4)},
                   lambda v: call_op(op, v, axis=axis, keepdims=keepdims, select_last_index=last))
    check_compiled(tmp_path, module, {"x": x})
    ints = build({"x": sinfo(n, 5, dtype="int32")}, lambda v: call_op(op, v, axis=1, keepdims=keepdims))
    check_compiled(tmp_path, ints, {"x": x[:, :, 0].astype(np.int32)})


@pytest.mark.gpu
@pytest.mark.parametrize("axes,keepdims", [([1], False), ([0, 2], True), (None, False)])
def test_log_sum_exp(tmp_path, axes, keepdims: bool) -> None:
    x = rand((3, 4, 5), seed=12) * 30
    module = build({"x": sinfo(3, 4, 5)}, lambda v: call_op("log_sum_exp", v, axes=axes, keepdims=keepdims))
    check_compiled(tmp_path, module, {"x": x})


@pytest.mark.gpu
def test_log_sum_exp_infinities(tmp_path) -> None:
    x = np.array([[1.0, -np.inf, 2.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0], [1e30, 1e30, -1e30]],
                 np.float32)
    module = build({"x": sinfo(4, 3)}, lambda v: call_op("log_sum_exp", v, axes=[1]))
    check_compiled(tmp_path, module, {"x": x})


# Data-dependent shapes read back: squeeze, expand_dims, dynamic_reshape ------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("axes", [[0], [-2], [2, 0]])
def test_squeeze_run_time_axes(tmp_path, axes) -> None:
    x = rand((1, 3, 1, 2), seed=13)
    a = np.array(axes, np.int64)
    module = build({"x": sinfo(1, 3, 1, 2), "a": sinfo(len(axes), dtype="int64")},
                   lambda v, w: call_op("squeeze", v, w))
    check_compiled(tmp_path, module, {"x": x, "a": a}, expected=[np.squeeze(x, tuple(axes))])


def test_squeeze_constant_axes_and_none(tmp_path) -> None:
    x = rand((1, 3, 1, 2), seed=14)
    axes = Constant(np.array([2], np.int64), "axes")
    check(build({"x": sinfo(1, 3, 1, 2)}, lambda v: call_op("squeeze", v, axes)), {"x": x})
    check(build({"x": sinfo(1, 3, 1, 2)}, lambda v: call_op("squeeze", v)), {"x": x})


@pytest.mark.gpu
@pytest.mark.parametrize("axes", [[0], [-1], [3, 1], [1, 4, 0]])
def test_expand_dims_run_time_axes(tmp_path, axes) -> None:
    x = rand((3, 2), seed=15)
    a = np.array(axes, np.int64)
    module = build({"x": sinfo(3, 2), "a": sinfo(len(axes), dtype="int64")},
                   lambda v, w: call_op("expand_dims", v, w))
    rank = x.ndim + len(axes)
    expected = np.expand_dims(x, tuple(v % rank for v in axes))
    check_compiled(tmp_path, module, {"x": x, "a": a}, expected=[expected])


@pytest.mark.gpu
@pytest.mark.parametrize("target,copy_zeros", [([4, -1], True), ([0, 2, 2], True), ([2, 0, 3], False), ([-1], False)])
def test_dynamic_reshape(tmp_path, target, copy_zeros: bool) -> None:
    x = rand((4, 2, 2), seed=16) if 0 not in target or copy_zeros else \
        np.zeros((0, 3), np.float32)
    shape = x.shape
    t = np.array(target, np.int64)
    module = build({"x": sinfo(*shape), "t": sinfo(len(target), dtype="int64")},
                   lambda v, w: call_op("dynamic_reshape", v, w, copy_zeros=copy_zeros))
    check_compiled(tmp_path, module, {"x": x, "t": t})


# scatters, topk, nonzero -----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements(tmp_path, reduction: str, axis: int) -> None:
    data = rand((3, 4), seed=17)
    indices = np.array([[1, 0, -1], [0, 2, 2]], np.int64) if axis == 1 else np.array([[1, 0, 2], [-3, 1, 1]], np.int64)
    updates = rand(indices.shape, seed=18)
    module = build({"d": sinfo(3, 4), "i": sinfo(2, 3, dtype="int64"), "u": sinfo(2, 3)},
                   lambda d, i, u: call_op("scatter_elements", d, i, u, axis=axis, reduction=reduction))
    check_compiled(tmp_path, module, {"d": data, "i": indices, "u": updates})


@pytest.mark.gpu
def test_scatter_elements_int_duplicates_last_wins(tmp_path) -> None:
    data = np.zeros((5,), np.int32)
    indices = np.array([1, 3, 1, -1], np.int32)
    updates = np.array([10, 20, 30, 40], np.int32)
    module = build({"d": sinfo(5, dtype="int32"), "i": sinfo(4, dtype="int32"), "u": sinfo(4, dtype="int32")},
                   lambda d, i, u: call_op("scatter_elements", d, i, u))
    check_compiled(tmp_path, module, {"d": data, "i": indices, "u": updates},
                   expected=[np.array([0, 30, 0, 20, 40], np.int32)])


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("depth", [1, 2])
def test_scatter_nd(tmp_path, reduction: str, depth: int) -> None:
    data = rand((4, 3, 2), seed=19)
    indices = np.array([[[0], [2]], [[-1], [2]]], np.int64) if depth == 1 else \
        np.array([[0, 1], [3, -1], [0, 1]], np.int64)
    updates = rand(indices.shape[:-1] + data.shape[depth:], seed=20)
    module = build({"d": sinfo(4, 3, 2), "i": sinfo(*indices.shape, dtype="int64"), "u": sinfo(*updates.shape)},
                   lambda d, i, u: call_op("scatter_nd", d, i, u, reduction=reduction))
    check_compiled(tmp_path, module, {"d": data, "i": indices, "u": updates})


@pytest.mark.gpu
@pytest.mark.parametrize("axis,largest", [(-1, True), (0, False), (1, True)])
def test_topk(tmp_path, axis: int, largest: bool) -> None:
    x = rand((4, 6), seed=21, low=0, high=5, dtype=np.int64).astype(np.float32)  # ties: the lower index first
    check_compiled(tmp_path, topk_module(sinfo(4, 6), None, k=3, axis=axis, largest=largest), {"x": x})
    ints = build({"x": sinfo(n, 6, dtype="int32")}, lambda v: call_op("topk", v, k=2, axis=1, largest=largest))
    check(ints, {"x": x.astype(np.int32)})


def topk_module(data: TensorStructInfo, k_info: TensorStructInfo | None, **attrs) -> IRModule:
    """values, indices = topk(x[, k])."""
    from relaxweb.ir.expr import TupleGetItem

    builder = FunctionBuilder("main")
    args = [builder.add_param("x", data)] + ([builder.add_param("k", k_info)] if k_info is not None else [])
    pair = builder.emit(call_op("topk", *args, **attrs), "pair")
    values = builder.emit(TupleGetItem(pair, 0), "values", output=True)
    indices = builder.emit(TupleGetItem(pair, 1), "indices", output=True)
    return IRModule({"main": builder.finish([values, indices], ["values", "indices"])})


@pytest.mark.gpu
@pytest.mark.parametrize("k", [0, 2, 5])
def test_topk_run_time_k(tmp_path, k: int) -> None:
    x = rand((3, 5), seed=22)
    module = topk_module(sinfo(3, 5), sinfo(1, dtype="int64"), axis=1)
    check_compiled(tmp_path, module, {"x": x, "k": np.array([k], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("x", [np.array([[1, 0, 2], [0, 0, 3]], np.float32), np.zeros((2, 2), np.float32),
                               np.array([0, 5, 0, 7, 1], np.float32)], ids=["2d", "none", "1d"])
def test_nonzero(tmp_path, x: np.ndarray) -> None:
    module = build({"x": sinfo(*x.shape)}, lambda v: call_op("nonzero", v))
    check_compiled(tmp_path, module, {"x": x}, expected=[np.array(np.nonzero(x), np.int64)])


@pytest.mark.gpu
def test_nonzero_bool_and_int(tmp_path) -> None:
    mask = np.array([[True, False], [False, True], [True, True]])
    module = build({"x": sinfo(3, 2, dtype="bool")}, lambda v: call_op("nonzero", v))
    check_compiled(tmp_path, module, {"x": mask}, expected=[np.array(np.nonzero(mask), np.int64)])


@pytest.mark.gpu
@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0, 1], [2, 3], [0, 1], [1, 1]),
    ([-1, 10], [-100, 0], [1, 0], [-1, -2]),      # negative steps, clamped starts and ends
    ([1], [1000], [-1], [2]),
    ([2], [1], [0], [1]),                          # empty
    ([-100], [-200], [1], [-1]),                   # empty, from before the start
])
def test_dynamic_slice(tmp_path, starts, ends, axes, steps) -> None:
    x = rand((3, 5), seed=23)
    operands = [np.array(v, np.int64) for v in (starts, ends, axes, steps)]
    k = len(starts)
    module = build({"x": sinfo(3, 5), "s": sinfo(k, dtype="int64"), "e": sinfo(k, dtype="int64"),
                    "a": sinfo(k, dtype="int64"), "t": sinfo(k, dtype="int64")},
                   lambda *args: call_op("dynamic_slice", *args))
    check_compiled(tmp_path, module, dict(zip("xseat", [x, *operands])))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["int32", "uint32", "uint8", "uint16", "int8", "int64"])
@pytest.mark.parametrize("op", ["left_shift", "right_shift"])
def test_shifts(tmp_path, op: str, dtype: str) -> None:
    bits = np.iinfo(dtype).bits
    info = np.iinfo(dtype if dtype != "int64" else "int32")  # int64 values are i32 on the device
    a = np.array([1, 5, info.max, info.min, 3, 7, 12, info.max // 3, 0, 1], dtype)
    if info.min < 0:
        a[3:6] = [-1, -7, info.min + 3]
    amounts = [0, 1, 3, bits - 1, bits, bits + 5, 2, bits - 1, 31 % bits, 1]
    if dtype == "int64":  # values and results that fit in 32 bits (right shifts by 31 or more too)
        a = np.array([1, 5, 1000, -1000, 3, -7, 12, 100, 0, -1], dtype)
        amounts = [0, 1, 3, 4, 64, 70, 2, 5, 0, 1] if op == "left_shift" else [0, 1, 3, 40, 64, 70, 2, 31, 0, 1]
    b = np.array(amounts, dtype)
    if info.min < 0:
        b[-1] = -1
    module = build({"a": sinfo(a.size, dtype=dtype), "b": sinfo(a.size, dtype=dtype)},
                   lambda x, y: call_op(op, x, y))
    want = run_module(module, {"a": a, "b": b})
    check_compiled(tmp_path, module, {"a": a, "b": b}, expected=want)


# max_pool_indices, dropout_mask ----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("padding,strides", [([0, 0, 0, 0], [1, 1]), ([1, 1, 1, 1], [2, 2])])
def test_max_pool_indices(tmp_path, storage_order: int, padding, strides) -> None:
    x = rand((2, 2, 5, 5), seed=24, low=0, high=4, dtype=np.int64).astype(np.float32)  # ties: the first in the window
    attrs = dict(kernel=[3, 3], strides=strides, dilations=[1, 1], padding=padding, storage_order=storage_order)
    module = build({"x": sinfo(2, 2, 5, 5)}, lambda v: call_op("max_pool_indices", v, **attrs))
    check_compiled(tmp_path, module, {"x": x})


@pytest.mark.gpu
def test_dropout_mask(tmp_path) -> None:
    x = rand((3, 4), seed=25)
    module = build({"x": sinfo(3, 4)}, lambda v: call_op("dropout_mask", v))
    check_compiled(tmp_path, module, {"x": x}, expected=[np.ones((3, 4), bool)])


# reductions with the axes given at run time -----------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod", "l1_norm", "l2_norm", "sum_square", "log_sum",
                                "log_sum_exp"])
@pytest.mark.parametrize("axes,keepdims", [([1], False), ([-1, 0], True), ([2, 0], False)])
def test_reduction_run_time_axes(tmp_path, op: str, axes, keepdims: bool) -> None:
    x = rand((2, 3, 4), seed=26, low=0.5, high=1.5)
    module = build({"x": sinfo(2, 3, 4), "a": sinfo(len(axes), dtype="int64")},
                   lambda v, a: call_op(op, v, a, keepdims=keepdims))
    check_compiled(tmp_path, module, {"x": x, "a": np.array(axes, np.int64)})


@pytest.mark.parametrize("noop", [0, 1])
def test_reduction_empty_run_time_axes(tmp_path, noop: int) -> None:
    x = rand((2, 3), seed=27)
    module = build({"x": sinfo(2, 3), "a": sinfo(0, dtype="int64")},
                   lambda v, a: call_op("sum", v, a, keepdims=True, noop_with_empty_axes=noop))
    check(module, {"x": x, "a": np.zeros((0,), np.int64)})


@pytest.mark.gpu
def test_reduction_run_time_axes_int(tmp_path) -> None:
    x = rand((3, 4), seed=28, low=-5, high=5, dtype=np.int32)
    for op in ("max", "min", "sum"):
        module = build({"x": sinfo(3, 4, dtype="int32"), "a": sinfo(1, dtype="int64")},
                       lambda v, a: call_op(op, v, a, keepdims=False))
        check_compiled(tmp_path, module, {"x": x, "a": np.array([1], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["max", "min"])
def test_bool_max_min(tmp_path, op: str) -> None:
    x = np.array([[True, False, True], [False, False, False], [True, True, True]])
    static = build({"x": sinfo(3, 3, dtype="bool")}, lambda v: call_op(op, v, axes=[1], keepdims=False))
    check_compiled(tmp_path, static, {"x": x})
    run_time = build({"x": sinfo(3, 3, dtype="bool"), "a": sinfo(1, dtype="int64")},
                     lambda v, a: call_op(op, v, a, keepdims=True))
    check_compiled(tmp_path, run_time, {"x": x, "a": np.array([0], np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive,reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_cumsum_run_time_axis(tmp_path, axis: int, exclusive: bool, reverse: bool) -> None:
    x = rand((3, 4), seed=29, low=-3, high=4, dtype=np.int64).astype(np.float32)
    module = build({"x": sinfo(3, 4), "a": TensorStructInfo((), "int64")},
                   lambda v, a: call_op("cumsum", v, a, exclusive=exclusive, reverse=reverse))
    check_compiled(tmp_path, module, {"x": x, "a": np.array(axis, np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("shape,target", [((3, 1), [2, 1, 4]), ((1,), [3]), ((2, 3), [1, 1])])
def test_broadcast_to_run_time_shape(tmp_path, shape, target) -> None:
    x = rand(shape, seed=30)
    module = build({"x": sinfo(*shape), "t": sinfo(len(target), dtype="int64")},
                   lambda v, t: call_op("broadcast_to", v, t))
    check_compiled(tmp_path, module, {"x": x, "t": np.array(target, np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("repeats", [[1, 2], [3, 1], [2, 0]])
def test_tile_run_time_repeats(tmp_path, repeats) -> None:
    x = rand((2, 3), seed=31)
    module = build({"x": sinfo(2, 3), "r": sinfo(2, dtype="int64")}, lambda v, r: call_op("tile", v, r))
    check_compiled(tmp_path, module, {"x": x, "r": np.array(repeats, np.int64)})


@pytest.mark.gpu
def test_full_run_time_shape(tmp_path) -> None:
    module = build({"s": sinfo(2, dtype="int64")}, lambda s: call_op("full", s, value=1.5, dtype="float32"))
    check_compiled(tmp_path, module, {"s": np.array([2, 3], np.int64)}, expected=[np.full((2, 3), 1.5, np.float32)])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,start,limit,delta", [("float32", 1.0, 5.0, 0.75), ("int32", 10, 2, -3),
                                                     ("int64", 0, 7, 2), ("int32", 5, 1, 1)])
def test_arange_run_time_operands(tmp_path, dtype: str, start, limit, delta) -> None:
    scalar = TensorStructInfo((), dtype)
    module = build({"a": scalar, "b": scalar, "c": scalar},
                   lambda a, b, c: call_op("arange", a, b, c, dtype=dtype))
    feeds = {name: np.array(v, dtype) for name, v in zip("abc", (start, limit, delta))}
    check_compiled(tmp_path, module, feeds, expected=[np.arange(start, limit, delta).astype(dtype)])


@pytest.mark.gpu
@pytest.mark.parametrize("sizes,axis", [([1, 3], 1), ([2, 0, 1], 0)])
def test_split_run_time_sizes(tmp_path, sizes, axis: int) -> None:
    from relaxweb.ir.expr import TupleGetItem

    x = rand((3, 4), seed=32)
    builder = FunctionBuilder("main")
    v = builder.add_param("x", sinfo(3, 4))
    s = builder.add_param("s", sinfo(len(sizes), dtype="int64"))
    parts = builder.emit(call_op("split", v, s, count=len(sizes), axis=axis), "parts")
    outs = [builder.emit(TupleGetItem(parts, j), f"p{j}", output=True) for j in range(len(sizes))]
    module = IRModule({"main": builder.finish(outs, [f"p{j}" for j in range(len(sizes))])})
    expected = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    check_compiled(tmp_path, module, {"x": x, "s": np.array(sizes, np.int64)}, expected=expected)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["constant", "edge"])
@pytest.mark.parametrize("pads", [[1, 0, 2, 3], [0, 2, 0, 1], [-1, 1, 1, -2]])
def test_pad_run_time_pads(tmp_path, mode: str, pads) -> None:
    x = rand((3, 4), seed=33)
    fill = np.array(2.5, np.float32)
    module = build({"x": sinfo(3, 4), "p": sinfo(4, dtype="int64"), "v": TensorStructInfo((), "float32")},
                   lambda v, p, f: call_op("pad", v, p, f, mode=mode))
    check_compiled(tmp_path, module, {"x": x, "p": np.array(pads, np.int64), "v": fill})


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_run_time_sizes(tmp_path, mode: str) -> None:
    x = rand((1, 1, 3, 4), seed=34)
    module = build({"x": sinfo(1, 1, 3, 4), "s": sinfo(2, dtype="int64")},
                   lambda v, s: call_op("resize", v, s, inputs=["sizes"], axes=[2, 3], mode=mode))
    check_compiled(tmp_path, module, {"x": x, "s": np.array([5, 2], np.int64)})
