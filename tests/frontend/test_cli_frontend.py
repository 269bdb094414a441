"""The frontend's side of the command line: ``relaxweb inspect MODEL.onnx`` (op coverage and
symbolic variables), ``relaxweb run MODEL.onnx --reference`` (the reference interpreter, no
GPU), and loading models: external data, float16 and int64 initializers, unreadable files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from examples.make_mlp import make_mlp
from relaxweb.errors import RelaxwebError
from relaxweb.frontend import from_onnx, import_onnx_file, load_onnx
from relaxweb.frontend.onnx import op_coverage, symbolic_vars
from relaxweb.ir import Constant, FunctionBuilder, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import PrimValue
from relaxweb.ops import call_op
from tests.helpers import assert_close, make_model, rand
from tests.e2e.test_end_to_end import assert_user_error, relaxweb


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli_frontend")


@pytest.fixture(scope="module")
def mlp(workdir: Path) -> Path:
    path = workdir / "mlp.onnx"
    onnx.save(make_mlp(), str(path))
    return path


def save(model: onnx.ModelProto, path: Path, **kwargs) -> Path:
    onnx.save(model, str(path), **kwargs)
    return path


def onnxruntime_outputs(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, inputs)))


# inspect: op coverage and symbolic variables ------------------------------------------------


@pytest.mark.slow  # the command line in a subprocess
def test_inspect_prints_coverage_ir_and_symbolic_vars(workdir: Path, mlp: Path) -> None:
    result = relaxweb("inspect", mlp, cwd=workdir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "model mlp.onnx: opset 17, 5 node(s), 5 op type(s)"
    assert lines[1] == "op coverage: 5 of 5 op types supported (5 of 5 nodes)"
    for op in ("Add", "Gemm", "MatMul", "Relu", "Softmax"):
        assert any(line.split() == [op, "1", "node", "supported"] for line in lines), op
    assert 'def main(x: Tensor((batch, 64), "float32")) -> Tensor((batch, 10), "float32"):' in lines
    assert lines[-1] == "symbolic vars: batch"


@pytest.mark.slow  # the command line in a subprocess
def test_inspect_lists_symbolic_vars_in_order_of_appearance(workdir: Path) -> None:
    model = make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "seq", 8]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [8, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    result = relaxweb("inspect", save(model, workdir / "two_vars.onnx"), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "symbolic vars: batch, seq, width" in result.stdout.splitlines()


@pytest.mark.slow  # the command line in a subprocess
def test_inspect_without_symbolic_vars(workdir: Path) -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    result = relaxweb("inspect", save(model, workdir / "static.onnx"), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "symbolic vars: (none)"


@pytest.mark.slow  # the command line in a subprocess
def test_inspect_with_unsupported_ops_prints_coverage_then_fails(workdir: Path) -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         helper.make_node("Foo", ["a"], ["b"], name="foo_1", domain="com.example"),
         helper.make_node("Relu", ["b"], ["c"], name="relu_2"),
         helper.make_node("Foo", ["c"], ["y"], name="foo_2", domain="com.example")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    result = relaxweb("inspect", save(model, workdir / "custom_op.onnx"), cwd=workdir)
    error = assert_user_error(result)
    assert "com.example.Foo" in error and "foo_1" in error and "foo_2" in error
    lines = result.stdout.splitlines()
    assert "op coverage: 1 of 2 op types supported (2 of 4 nodes)" in lines
    assert any(line.split() == ["com.example.Foo", "2", "nodes", "UNSUPPORTED"] for line in lines)
    assert any(line.split() == ["Relu", "2", "nodes", "supported"] for line in lines)
    assert not any(line.startswith("symbolic vars:") for line in lines)


def test_op_coverage_counts_nodes_and_lists_unsupported_first() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Bar", ["b"], ["y"], domain="com.example")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    assert op_coverage(model) == [("com.example.Bar", 1, False), ("Relu", 2, True)]


n, m, p, k = (SizeVar(name) for name in ("n", "m", "p", "k"))


def test_symbolic_vars_include_match_cast_and_if_branches() -> None:
    def tensor(*shape) -> TensorStructInfo:
        return TensorStructInfo(tuple(shape), "float32")

    builder = FunctionBuilder("main", dataflow=False)
    x = builder.add_param("x", tensor(n, 4))
    y = builder.add_param("y", tensor(m, 4))
    chosen = builder.emit_if(
        PrimValue(n % 2),
        lambda branch: branch.emit(call_op("add", x, x), "doubled"),
        lambda branch: branch.emit(call_op("multiply", y, y), "squared"),
        "chosen",
    )
    cast = builder.emit_match_cast(chosen, tensor(p, 4), "cast")
    out = builder.emit(call_op("relu", cast), "out")
    assert symbolic_vars(builder.finish([out], ["out"])) == ["n", "m", "p"]

    builder = FunctionBuilder("main")
    x = builder.add_param("x", tensor(n))
    distinct = builder.emit(call_op("unique", x), "distinct")
    cast = builder.emit_match_cast(distinct, tensor(k), "cast")
    out = builder.emit(call_op("add", cast, cast), "out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    assert symbolic_vars(module.main) == ["n", "k"]


# run --reference ------------------------------------------------------------------------------


@pytest.mark.slow  # the command line in a subprocess
@pytest.mark.parametrize("batch", [1, 4, 13])
def test_run_reference_matches_onnxruntime_on_the_mlp(workdir: Path, mlp: Path, batch: int) -> None:
    x = rand(batch, 64, seed=batch)
    np.savez(workdir / f"x{batch}.npz", x=x)
    out = workdir / f"out{batch}.npz"
    result = relaxweb("run", mlp, "--inputs", f"x{batch}.npz", "--out", out, "--reference", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"probabilities: float32[{batch}, 10] ")
    assert "reference interpreter" in result.stderr
    with np.load(out) as data:
        assert data.files == ["probabilities"]
        actual = data["probabilities"]
    expected = onnxruntime_outputs(mlp, {"x": x})["probabilities"]
    assert_close(actual, expected)


@pytest.mark.slow  # the command line in a subprocess
def test_run_reference_on_a_folder(workdir: Path) -> None:
    (workdir / "some_folder").mkdir(exist_ok=True)
    np.savez(workdir / "in.npz", x=np.zeros((2, 64), np.float32))
    error = assert_user_error(relaxweb("run", "some_folder", "--inputs", "in.npz", "--reference", cwd=workdir))
    assert "--reference runs an .onnx model" in error


@pytest.mark.slow  # the command line in a subprocess
def test_run_model_without_reference(workdir: Path, mlp: Path) -> None:
    np.savez(workdir / "in.npz", x=np.zeros((2, 64), np.float32))
    error = assert_user_error(relaxweb("run", mlp, "--inputs", "in.npz", cwd=workdir))
    assert "not a bundle folder" in error and "relaxweb build" in error and "--reference" in error


@pytest.mark.slow  # the command line in a subprocess
def test_run_reference_with_browser(workdir: Path, mlp: Path) -> None:
    np.savez(workdir / "in.npz", x=np.zeros((2, 64), np.float32))
    error = assert_user_error(relaxweb("run", mlp, "--inputs", "in.npz", "--reference", "--browser", cwd=workdir))
    assert "--reference and --browser" in error


@pytest.mark.slow  # the command line in a subprocess
@pytest.mark.parametrize("inputs, expected", [
    ({"x": np.zeros((2, 64))}, ["'x'", "float64", "float32"]),
    ({"x": np.zeros((2, 63), np.float32)}, ["'x'", "dimension 1 is 63, expected 64"]),
    ({"input": np.zeros((2, 64), np.float32)}, ["unknown input 'input'", "'x'"]),
    ({}, ["missing input 'x'"]),
])
def test_run_reference_checks_inputs(workdir: Path, mlp: Path, inputs: dict, expected: list[str]) -> None:
    np.savez(workdir / "bad.npz", **inputs)
    error = assert_user_error(relaxweb("run", mlp, "--inputs", "bad.npz", "--reference", cwd=workdir))
    for text in expected:
        assert text in error


# loading: external data, float16 and int64 initializers, unreadable files --------------------


def external_data_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """y = reshape((x + w) * cast(h, float32), [rows, 32]): w float32 and h float16 weights,
    the target shape an int64 initializer."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.standard_normal(64).astype(np.float32),
        "h": rng.standard_normal(64).astype(np.float16),
        "target": np.array([-1, 32], np.int64),
    }
    model = make_model(
        [helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT, name="cast"),
         helper.make_node("Add", ["x", "w"], ["a"], name="add"),
         helper.make_node("Mul", ["a", "h32"], ["m"], name="mul"),
         helper.make_node("Reshape", ["m", "target"], ["y"], name="reshape")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return model, weights


@pytest.fixture(scope="module")
def external(workdir: Path) -> Path:
    folder = workdir / "external"
    folder.mkdir()
    model, _ = external_data_model()
    save(model, folder / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
         location="model.onnx.data", size_threshold=0)
    assert (folder / "model.onnx.data").stat().st_size >= 64 * 4 + 64 * 2
    return folder / "model.onnx"


def test_external_data_is_read_next_to_the_model(external: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative to the model, not to the working directory
    model = load_onnx(external)
    _, weights = external_data_model()
    for initializer in model.graph.initializer:
        assert initializer.data_location != TensorProto.EXTERNAL
        np.testing.assert_array_equal(numpy_helper.to_array(initializer), weights[initializer.name])


@pytest.mark.slow  # the command line in a subprocess
def test_run_reference_with_external_data_and_float16(workdir: Path, external: Path) -> None:
    x = rand(3, 64, seed=3)
    np.savez(workdir / "external_in.npz", x=x)
    out = workdir / "external_out.npz"
    result = relaxweb("run", external, "--inputs", "external_in.npz", "--out", out, "--reference", cwd=workdir)
    assert result.returncode == 0, result.stderr
    with np.load(out) as data:
        actual = data["y"]
    model, _ = external_data_model()  # onnxruntime cannot infer shapes from an external Reshape target
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    assert actual.shape == (6, 32)
    assert_close(actual, expected)


@pytest.mark.slow  # the command line in a subprocess
def test_missing_external_data_is_a_clear_error(workdir: Path, external: Path, tmp_path: Path) -> None:
    alone = tmp_path / "alone.onnx"
    alone.write_bytes(external.read_bytes())  # the model without its .data file
    with pytest.raises(RelaxwebError) as error:
        load_onnx(alone)
    assert str(error.value) == (f"{alone}: the external data file 'model.onnx.data' (weights of 'w') is missing; "
                                f"it must be next to the model, at {tmp_path / 'model.onnx.data'}")
    message = assert_user_error(relaxweb("inspect", alone, cwd=workdir))
    assert "the external data file 'model.onnx.data'" in message and "is missing" in message
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 64), np.float32))
    message = assert_user_error(relaxweb("run", alone, "--inputs", tmp_path / "in.npz", "--reference", cwd=workdir))
    assert "is missing" in message


def test_truncated_external_data_is_a_clear_error(external: Path, tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(external.read_bytes())
    (tmp_path / "model.onnx.data").write_bytes(external.with_name("model.onnx.data").read_bytes()[:100])
    with pytest.raises(RelaxwebError, match="cannot read its external data"):
        load_onnx(tmp_path / "model.onnx")


def test_external_data_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    model, _ = external_data_model()
    inner = tmp_path / "inner"
    inner.mkdir()
    save(model, tmp_path / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
         location="weights.bin", size_threshold=0)
    loaded = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    for initializer in loaded.graph.initializer:
        for entry in initializer.external_data:
            if entry.key == "location":
                entry.value = "../weights.bin"
    save(loaded, inner / "model.onnx")
    with pytest.raises(RelaxwebError, match="not inside the model's folder"):
        load_onnx(inner / "model.onnx")


def test_float16_and_int64_initializers_become_constants_of_their_dtype() -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "h"], ["y"]), helper.make_node("Add", ["i", "j"], ["z"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["n", 3]),
         helper.make_tensor_value_info("i", TensorProto.INT64, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None),
         helper.make_tensor_value_info("z", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.array([0.5, -1.25, 3.0], np.float16), "h"),
         numpy_helper.from_array(np.array([1, -2, 1 << 40], np.int64), "j")],
    )
    module = from_onnx(model)
    constants = {a.name: a for b in module.main.bindings() for a in b.value.args if isinstance(a, Constant)}
    assert constants["h"].data.dtype == np.float16
    assert constants["j"].data.dtype == np.int64
    np.testing.assert_array_equal(constants["j"].data, [1, -2, 1 << 40])
    assert str(module.main.ret_struct_info) == "Tuple(Tensor((n, 3), float16), Tensor((n, 3), int64))"


@pytest.mark.slow  # the command line in a subprocess
def test_inspect_and_run_on_a_file_that_is_not_onnx(workdir: Path, mlp: Path) -> None:
    truncated = workdir / "truncated.onnx"
    truncated.write_bytes(mlp.read_bytes()[: mlp.stat().st_size // 3])
    notes = workdir / "notes.onnx"
    notes.write_text("these are notes, not a model\n")
    np.savez(workdir / "in.npz", x=np.zeros((2, 64), np.float32))
    for path in (truncated, notes):
        error = assert_user_error(relaxweb("inspect", path, cwd=workdir))
        assert error.startswith(f"error: {path}: not ") and "ONNX model" in error
        error = assert_user_error(relaxweb("run", path, "--inputs", "in.npz", "--reference", cwd=workdir))
        assert error.startswith(f"error: {path}: not ") and "ONNX model" in error
    with pytest.raises(RelaxwebError, match="not a readable ONNX model"):
        import_onnx_file(truncated)
    # onnx parses .json and .txt files as text formats: their parse errors are user errors too
    for name, text in (("sidecar.json", '{"name": "m"}'), ("notes.txt", "not: [a model")):
        (workdir / name).write_text(text)
        with pytest.raises(RelaxwebError, match="not a readable ONNX model"):
            import_onnx_file(workdir / name)
