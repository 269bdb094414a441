"""If, match_cast and data-dependent shapes: deduction, printing, well-formedness, the
interpreter, the host function, and the compiled bundle on wgpu (lavapipe)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.bundle import write_bundle

from relaxweb.compiler import compile_module
from relaxweb.errors import InputShapeError
from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import PrimValue
from relaxweb.ir.host import HostIf, HostRead
from relaxweb.ir.interpreter import run_host_function
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.struct_info import PrimStructInfo
from relaxweb.ir.well_formed import check_well_formed
from relaxweb.ops import call_op
from relaxweb.runtime import Session
from tests.helpers import assert_close, in_the_browser, load_bundle, make_model, rand

n, m, p, k = (SizeVar(name) for name in ("n", "m", "p", "k"))


def tensor(*shape) -> TensorStructInfo:
    return TensorStructInfo(tuple(shape), "float32")


def if_module(same_shapes: bool) -> IRModule:
    """out = relu(match_cast(if n % 2: x + x else: (x or y) * (x or y), [p, 4]))."""
    builder = FunctionBuilder("main", dataflow=False)
    x = builder.add_param("x", tensor(n, 4))
    y = builder.add_param("y", tensor(m, 4))
    other = x if same_shapes else y
    result = builder.emit_if(
        PrimValue(n % 2),
        lambda branch: branch.emit(call_op("add", x, x), "doubled"),
        lambda branch: branch.emit(call_op("multiply", other, other), "squared"),
        "chosen",
    )
    cast = builder.emit_match_cast(result, tensor(p, 4), "cast")
    out = builder.emit(call_op("relu", cast), "out")
    return IRModule({"main": builder.finish([out], ["out"])})


def expected_if(x: np.ndarray, y: np.ndarray, same_shapes: bool) -> np.ndarray:
    other = x if same_shapes else y
    return np.maximum(x + x, 0) if x.shape[0] % 2 else np.maximum(other * other, 0)


def test_if_with_equal_branch_shapes_keeps_the_shape() -> None:
    chosen = if_module(same_shapes=True).main.bindings()[0].var
    assert str(chosen.struct_info) == "Tensor((n, 4), float32)"


def test_if_with_different_branch_shapes_joins_to_the_rank() -> None:
    module = if_module(same_shapes=False)
    chosen = module.main.bindings()[0].var
    assert str(chosen.struct_info) == "Tensor(ndim=2, float32)"
    text = str(module)
    assert '    chosen: Tensor(ndim=2, dtype="float32")\n    if prim(n % 2):\n' in text
    assert "    else:" in text
    assert 'cast: Tensor((p, 4), "float32") = match_cast(chosen, Tensor((p, 4), "float32"))' in text
    check_well_formed(module)


@pytest.fixture(scope="module")
def if_bundle(tmp_path_factory) -> Path:
    compiled = compile_module(if_module(same_shapes=False), {"n": 16, "m": 16})
    folder = tmp_path_factory.mktemp("if") / "bundle"
    write_bundle(compiled, folder, "if_module")
    return folder


@pytest.mark.parametrize("rows", [3, 4])  # odd: then-branch, even: else-branch
def test_if_runs_both_branches_everywhere(backend, if_bundle, rows: int) -> None:
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    y = rng.standard_normal((5, 4)).astype(np.float32)
    expected = expected_if(x, y, same_shapes=False)
    module = if_module(same_shapes=False)
    assert_close(run_module(module, {"x": x, "y": y})[0], expected)
    compiled = compile_module(module, {"n": 16, "m": 16})
    assert any(isinstance(step, HostIf) for step in compiled.main.steps)
    assert_close(run_host_function(compiled.main, compiled.programs, {"x": x, "y": y})[0], expected)
    outputs = load_bundle(if_bundle, backend).run({"x": x, "y": y})
    assert outputs["out"].shape == expected.shape
    assert_close(outputs["out"], expected)


def tensor_condition_module() -> IRModule:
    """out = if flag (an int32 scalar input, read back from the GPU): x + x else: x * x."""
    builder = FunctionBuilder("main", dataflow=False)
    flag = builder.add_param("flag", TensorStructInfo((), "int32"))
    x = builder.add_param("x", tensor(n, 4))
    result = builder.emit_if(
        flag,
        lambda branch: branch.emit(call_op("add", x, x), "doubled"),
        lambda branch: branch.emit(call_op("multiply", x, x), "squared"),
        "out",
    )
    return IRModule({"main": builder.finish([result], ["out"])})


@pytest.mark.parametrize("flag", [0, 1, 7])
def test_if_on_a_tensor_reads_the_condition_back(backend, tmp_path, flag: int) -> None:
    module = tensor_condition_module()
    check_well_formed(module)
    x = rand(3, 4, seed=flag)
    inputs = {"flag": np.array(flag, dtype=np.int32), "x": x}
    expected = x + x if flag else x * x
    assert_close(run_module(module, inputs)[0], expected)
    compiled = compile_module(module, {"n": 8})
    assert isinstance(compiled.main.steps[0], HostRead)
    assert compiled.main.read_slots == 1
    assert_close(run_host_function(compiled.main, compiled.programs, inputs)[0], expected)
    write_bundle(compiled, tmp_path / "bundle", "tensor_condition")
    session = load_bundle(tmp_path / "bundle", backend)
    assert_close(session.run(inputs)["out"], expected)
    assert session.last_read_count == 1


def unique_module() -> IRModule:
    """u = unique(x); v = match_cast(u, [k]); out = v + v (an op in k)."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", tensor(n))
    distinct = builder.emit(call_op("unique", x), "distinct")
    cast = builder.emit_match_cast(distinct, tensor(k), "cast")
    out = builder.emit(call_op("add", cast, cast), "out", output=True)
    return IRModule({"main": builder.finish([out], ["out"])})


def test_data_dependent_shape_deduces_prints_and_is_well_formed() -> None:
    module = unique_module()
    bindings = module.main.bindings()
    assert str(bindings[0].var.struct_info) == "Tensor(ndim=1, float32)"
    assert str(bindings[1].var.struct_info) == "Tensor((k), float32)"
    assert 'cast: Tensor((k,), "float32") = match_cast(distinct, Tensor((k,), "float32"))' in str(module)
    check_well_formed(module)


UNIQUE_CASES = [
    np.array([3, 1, 3, 2, 1], np.float32),
    np.array([5, 5, 5], np.float32),
    np.array([4, 3, 2, 1, 0, -1], np.float32),
    np.array([7], np.float32),
]


@pytest.fixture(scope="module")
def unique_bundle(tmp_path_factory) -> Path:
    compiled = compile_module(unique_module(), {"n": 64, "k": 6})
    folder = tmp_path_factory.mktemp("unique") / "bundle"
    write_bundle(compiled, folder, "unique_module")
    return folder


@pytest.mark.parametrize("x", UNIQUE_CASES, ids=lambda x: f"n{x.size}")
def test_unique_then_ops_in_k_run_everywhere(backend, unique_bundle, x: np.ndarray) -> None:
    expected = np.unique(x) * 2
    module = unique_module()
    assert_close(run_module(module, {"x": x})[0], expected)
    compiled = compile_module(module, {"n": 64, "k": 6})
    assert_close(run_host_function(compiled.main, compiled.programs, {"x": x})[0], expected)
    session = load_bundle(unique_bundle, backend)
    out = session.run({"x": x})["out"]
    assert out.shape == expected.shape
    assert_close(out, expected)
    assert session.last_read_count == 1


def test_unique_of_int64_runs_on_each_backend(backend, tmp_path: Path) -> None:
    """The library kernels take the element type of the device dtype (int64 is i32 there)."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n,), "int64"))
    distinct = builder.emit(call_op("unique", x), "distinct")
    out = builder.emit_match_cast(distinct, TensorStructInfo((k,), "int64"), "out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    write_bundle(compile_module(module, {"n": 64, "k": 8}), tmp_path / "bundle", "unique_int64")
    x_value = np.array([7, -3, 7, 2**31 - 1, -3, 0], np.int64)
    np.testing.assert_array_equal(load_bundle(tmp_path / "bundle", backend).run({"x": x_value})["out"],
                                  np.unique(x_value))


@pytest.mark.gpu
def test_the_compiled_cast_is_checked_at_run_time(unique_bundle) -> None:
    """k is bound from the value read back and checked against its bound (k <= 6)."""
    x = np.arange(7, dtype=np.float32)
    with pytest.raises(InputShapeError, match=r"\(k\) is 7, above its bound k <= 6"):
        Session(unique_bundle).run({"x": x})
    compiled = compile_module(unique_module(), {"n": 64, "k": 6})
    with pytest.raises(InputShapeError, match=r"\(k\) is 7, above its bound k <= 6"):
        run_host_function(compiled.main, compiled.programs, {"x": x})


def test_match_cast_of_a_prim_value_binds_a_variable() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", tensor(n, 4))
    half = builder.emit_match_cast(PrimValue(n // 2), PrimStructInfo("int64", p), "half")
    assert str(half.struct_info) == "Prim(p)"
    out = builder.emit(call_op("relu", x), "out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    check_well_formed(module)
    x_value = np.ones((6, 4), np.float32)
    assert_close(run_module(module, {"x": x_value})[0], x_value)




@in_the_browser
def test_compiled_read_back_runs_in_chromium(unique_bundle) -> None:
    """The browser runtime follows the same read/resume steps on compiler output."""
    from relaxweb.browser import run_in_browser

    x = UNIQUE_CASES[0]
    assert_close(run_in_browser(unique_bundle, {"x": x})["out"], np.unique(x) * 2)
    with pytest.raises(InputShapeError, match=r"\(k\) is 7, above its bound k <= 6"):
        run_in_browser(unique_bundle, {"x": np.arange(7, dtype=np.float32)})


def two_output_if_model():
    """An ONNX If with two outputs (Silero-style: the model and its next state chosen by one
    condition); the else branch's second output needs the first's work."""
    def graph(name, nodes, outputs):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                    for o in outputs])
    then_branch = graph("then", [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])],
                        ["a", "b"])
    else_branch = graph("else", [helper.make_node("Sigmoid", ["x"], ["c"]), helper.make_node("Mul", ["c", "x"], ["d"])],
                        ["c", "d"])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["first", "second"], name="choose", then_branch=then_branch,
                              else_branch=else_branch),
             helper.make_node("Sub", ["first", "second"], ["y"])]
    return make_model(nodes, [("x", ["n", 3])], ["y", "second"], {"zero": np.array(0, np.float32)}, opset=17)


def test_an_onnx_if_with_two_outputs_matches_onnxruntime(backend, tmp_path) -> None:
    model = two_output_if_model()
    relaxweb.build(model, tmp_path / "bundle")
    session = load_bundle(tmp_path / "bundle", backend)
    reference = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for rows, sign in ((2, 1.0), (5, -1.0)):
        feeds = {"x": sign * np.abs(rand(rows, 3, seed=rows))}
        expected = reference.run(None, feeds)
        actual = session.run(feeds)
        assert_close(actual["y"], expected[0], err_msg=f"y at {rows} rows, sign {sign}")
        assert_close(actual["second"], expected[1], err_msg=f"second at {rows} rows, sign {sign}")
