"""The Python API (``relaxweb.build``, ``load``, ``run_reference``, ``inspect``): the example
MLP built, loaded and run on wgpu against onnxruntime; user errors, which must be the
RelaxwebError the command line reports, message for message (the README's example: tests/e2e/test_readme.py).

The command line runs in-process through ``relaxweb.cli.main`` (what the ``relaxweb``
script and ``python -m relaxweb`` call), so its errors are read from stderr as a user sees
them without starting a process and a GPU device per case.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import relaxweb
from examples.make_mlp import make_mlp
from relaxweb.cli import main as cli_main
from tests.runtime_js.test_browser import pytestmark as browser_marks

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api")


@pytest.fixture(scope="module")
def model(workdir: Path) -> Path:
    path = workdir / "mlp.onnx"
    onnx.save(make_mlp(), str(path))
    return path


@pytest.fixture(scope="module")
def bundle(workdir: Path, model: Path) -> relaxweb.Bundle:
    return relaxweb.build(model, workdir / "dist", bounds={"batch": 64})


def mlp_input(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)


def onnxruntime_outputs(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def assert_matches(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(actual) == list(expected)
    for name, value in expected.items():
        assert actual[name].shape == value.shape and actual[name].dtype == value.dtype, name
        np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def run_cli(capsys: pytest.CaptureFixture, *argv: str | Path) -> tuple[int, str, str]:
    """``relaxweb ARGV...`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()  # drop what came before
    status = cli_main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


# build, load, run ----------------------------------------------------------------------------


def test_build_returns_the_bundle_it_wrote(workdir: Path, bundle: relaxweb.Bundle) -> None:
    assert bundle.path == workdir / "dist"
    assert bundle.manifest == json.loads((workdir / "dist" / "manifest.json").read_text())
    assert bundle.inputs == (relaxweb.TensorSpec("x", "float32", ("batch", 64), 2),)
    assert bundle.outputs == (relaxweb.TensorSpec("probabilities", "float32", ("batch", 10), 2),)
    assert bundle.symbolic_vars == {"batch": 64}
    assert str(bundle.inputs[0]) == "x: float32['batch', 64]"
    assert repr(bundle) == (f"Bundle({str(workdir / 'dist')!r}, inputs=[x: float32['batch', 64]], "
                            "outputs=[probabilities: float32['batch', 10]], symbolic_vars={'batch': 64})")
    assert relaxweb.inspect(workdir / "dist") == bundle


@pytest.mark.parametrize("batches", [(3, 64, 1)])
def test_load_runs_at_every_batch_size_like_onnxruntime(device, model: Path, bundle: relaxweb.Bundle,
                                                       batches: tuple[int, ...]) -> None:
    """One session, several batch sizes, without rebuilding or reloading."""
    session = relaxweb.load(bundle.path, device=device)
    assert isinstance(session, relaxweb.Session)
    for batch in batches:
        inputs = {"x": mlp_input(batch)}
        assert_matches(session.run(inputs), onnxruntime_outputs(model, inputs))
    assert bundle.load(device=device).run({"x": mlp_input(2)})["probabilities"].shape == (2, 10)


def test_a_model_in_memory_at_opt_level_0_without_bounds(device, workdir: Path, model: Path) -> None:
    progress: list[str] = []
    bundle = relaxweb.build(make_mlp(), workdir / "dist_in_memory", opt_level=0, progress=progress.append,
                            dump_ir=workdir / "ir")
    assert bundle.manifest["model"] == "mlp (in memory)"
    assert bundle.symbolic_vars == {"batch": None}  # no bound: storages grow at run time
    assert len(bundle.manifest["kernels"]) == 8  # one per op: MatMul, Add, Relu, Gemm (3), Softmax (2)
    assert progress[0] == "imported mlp (in memory): 6 bindings, inputs x"
    assert "pass legalize_ops" in progress and "pass fuse_ops" not in progress
    dumps = sorted(path.name for path in (workdir / "ir").glob("*.txt"))
    assert dumps[0] == "00_imported.txt" and dumps[-1].endswith("_lower_shapes_to_host.txt")
    session = bundle.load(device=device)
    for batch in (2, 9):
        inputs = {"x": mlp_input(batch)}
        assert_matches(session.run(inputs), onnxruntime_outputs(model, inputs))


def test_run_reference_on_a_path_and_on_a_model_in_memory(model: Path) -> None:
    inputs = {"x": mlp_input(4)}
    expected = onnxruntime_outputs(model, inputs)
    assert_matches(relaxweb.run_reference(model, inputs), expected)
    assert_matches(relaxweb.run_reference(str(model), inputs), expected)
    assert_matches(relaxweb.run_reference(make_mlp(), inputs), expected)


def test_inspect_gives_what_the_cli_prints(capsys, model: Path, bundle: relaxweb.Bundle) -> None:
    report = relaxweb.inspect(model)
    assert isinstance(report, relaxweb.ModelReport)
    assert (report.source, report.opset) == ("mlp.onnx", 17)
    assert report.coverage == (("Add", 1, True), ("Gemm", 1, True), ("MatMul", 1, True), ("Relu", 1, True),
                               ("Softmax", 1, True))
    assert report.symbolic_vars == ["batch"]
    assert 'def main(x: Tensor((batch, 64), "float32"))' in str(report.module)
    assert run_cli(capsys, "inspect", model) == (0, f"{report}\n", "")
    assert run_cli(capsys, "inspect", bundle.path) == (0, f"{bundle}\n", "")
    sizes = bundle.shader_bytes  # what a load compiles: one pipeline per kernel file
    assert set(sizes) == {kernel["file"] for kernel in bundle.manifest["kernels"]}
    assert all(size == (bundle.path / file).stat().st_size for file, size in sizes.items())
    assert f"pipelines at load: {len(sizes)}, {sum(sizes.values())} bytes of WGSL" in str(bundle)
    assert str(relaxweb.inspect(make_mlp())).startswith("model mlp (in memory): opset 17, 5 node(s)")


def browser_test(test: Callable) -> Callable:
    """Marks a test as one that runs headless Chromium (skipped without it)."""
    for mark in browser_marks:
        test = mark(test)
    return test


@browser_test
def test_run_in_browser_like_onnxruntime_and_its_errors_are_the_clis(capsys, tmp_path: Path, model: Path,
                                                                     bundle: relaxweb.Bundle) -> None:
    inputs = {"x": mlp_input(5)}
    assert_matches(relaxweb.run_in_browser(bundle.path, inputs), onnxruntime_outputs(model, inputs))
    too_large = {"x": np.zeros((65, 64), np.float32)}
    status, _, stderr = run_cli(capsys, "run", bundle.path, "--inputs", npz(tmp_path / "in.npz", **too_large),
                                "--browser")
    with pytest.raises(relaxweb.InputShapeError) as raised:
        relaxweb.run_in_browser(bundle.path, too_large)
    assert (status, stderr) == (2, f"error: {raised.value}\n")
    assert "above its bound batch <= 64" in str(raised.value)


def test_a_model_with_external_data(tmp_path: Path) -> None:
    """From a path, external data is read next to the model; a model in memory must hold its
    weights, and one that still refers to external data is a clear error."""
    path = tmp_path / "external.onnx"
    onnx.save(make_mlp(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="external.onnx.data", size_threshold=0)
    inputs = {"x": mlp_input(3)}
    expected = onnxruntime_outputs(path, inputs)
    assert_matches(relaxweb.run_reference(path, inputs), expected)
    assert_matches(relaxweb.run_reference(onnx.load(str(path)), inputs), expected)
    unread = onnx.load(str(path), load_external_data=False)
    with pytest.raises(relaxweb.RelaxwebError) as error:
        relaxweb.build(unread, tmp_path / "dist")
    assert str(error.value) == (
        "mlp (in memory): tensor 'fc1.weight' is stored as external data, which is read only next to a "
        "model file; pass the model's path, or load it with onnx.load(path), which reads its external data")
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize(("settings", "message"), [
    ({"opt_level": 2}, "opt level 2 does not exist; expected one of 0, 1"),
    ({"opt_level": True}, "opt level True does not exist; expected one of 0, 1"),
    ({"bounds": {"batch": "64"}}, "--bound batch: the bound must be an integer, got '64'"),
    ({"bounds": {"batch": 2.5}}, "--bound batch: the bound must be an integer, got 2.5"),
    ({"bounds": [("batch", 64)]},
     "bounds must map symbolic variable names to integers (like {'batch': 64}), got an object of type list"),
])
def test_settings_the_cli_cannot_express_are_user_errors(workdir: Path, model: Path, settings: dict,
                                                         message: str) -> None:
    with pytest.raises(relaxweb.RelaxwebError) as error:
        relaxweb.build(model, workdir / "dist_bad_settings", **settings)
    assert str(error.value) == message
    assert not (workdir / "dist_bad_settings").exists()


def test_a_numpy_integer_is_a_bound(workdir: Path, model: Path) -> None:
    bundle = relaxweb.build(model, workdir / "dist_numpy_bound", bounds={"batch": np.int64(8)})
    assert bundle.symbolic_vars == {"batch": 8}


# errors: the CLI's message, raised ------------------------------------------------------------


def unsupported_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Foo", ["x"], ["y"], name="custom_1", domain="com.example")],
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


Case = Callable[[Path, Path, relaxweb.Bundle], tuple[list, Callable[[], object], type, str]]


def build_case(model_of: Callable[[Path, Path], Path | str], cli_options: list, api_options: dict,
               error_type: type, message: str) -> Case:
    """A ``relaxweb build`` case: the model (from the folder and the MLP's path), the CLI's
    options and ``relaxweb.build``'s."""
    def case(folder: Path, model: Path, bundle: relaxweb.Bundle):
        target = model_of(folder, model)
        return (["build", target, "-o", folder / "out", *cli_options],
                lambda: relaxweb.build(target, folder / "out", **api_options), error_type, message)
    return case


def run_case(inputs: dict[str, np.ndarray], error_type: type, message: str) -> Case:
    """A ``relaxweb run DIR`` case: the inputs given to the MLP bundle (as an .npz file)."""
    def case(folder: Path, model: Path, bundle: relaxweb.Bundle):
        return (["run", bundle.path, "--inputs", npz(folder / "inputs.npz", **inputs)],
                lambda: relaxweb.load(bundle.path).run(inputs), error_type, message)
    return case


def run_reference_case(inputs: dict[str, np.ndarray], error_type: type, message: str) -> Case:
    def case(folder: Path, model: Path, bundle: relaxweb.Bundle):
        return (["run", model, "--inputs", npz(folder / "inputs.npz", **inputs), "--reference"],
                lambda: relaxweb.run_reference(model, inputs), error_type, message)
    return case


def not_a_bundle_case(folder: Path, model: Path, bundle: relaxweb.Bundle):
    (folder / "empty").mkdir()
    return (["run", folder / "empty", "--inputs", npz(folder / "inputs.npz", x=mlp_input(2))],
            lambda: relaxweb.load(folder / "empty"), relaxweb.RelaxwebError, "not a bundle folder (no manifest.json)")


def inspect_unsupported_case(folder: Path, model: Path, bundle: relaxweb.Bundle):
    path = unsupported_model(folder / "unsupported.onnx")
    return (["inspect", path], lambda: relaxweb.inspect(path), relaxweb.UnsupportedModelError,
            "the model uses 1 unsupported op type(s): com.example.Foo (nodes: custom_1)")


def text_file(folder: Path, model: Path) -> Path:
    path = folder / "notes.onnx"
    path.write_text("not a model\n")
    return path


ERROR_CASES: dict[str, Case] = {
    "bad model path": build_case(lambda folder, model: str(folder / "missing.onnx"), [], {},
                                 relaxweb.RelaxwebError, "missing.onnx: no such file"),
    "not an ONNX file": build_case(text_file, [], {}, relaxweb.RelaxwebError, "not a readable ONNX model"),
    "unsupported op": build_case(lambda folder, model: unsupported_model(folder / "unsupported.onnx"), [], {},
                                 relaxweb.UnsupportedModelError, "com.example.Foo (nodes: custom_1)"),
    "bound below 1": build_case(lambda folder, model: model, ["--bound", "batch=0"], {"bounds": {"batch": 0}},
                                relaxweb.RelaxwebError, "--bound batch: the bound must be at least 1, got 0"),
    "bound on no variable": build_case(lambda folder, model: model, ["--bound", "seq=8"], {"bounds": {"seq": 8}},
                                       relaxweb.RelaxwebError,
                                       "--bound names seq, but the model's symbolic variables are: batch"),
    "bound exceeded": run_case({"x": np.zeros((65, 64), np.float32)}, relaxweb.InputShapeError,
                               "input 'x': dimension 0 (batch) is 65, above its bound batch <= 64"),
    "wrong shape": run_case({"x": np.zeros((5, 63), np.float32)}, relaxweb.InputShapeError,
                            "input 'x': dimension 1 is 63, expected 64"),
    "wrong dtype": run_case({"x": np.zeros((5, 64), np.float64)}, relaxweb.InputShapeError,
                            "input 'x': expected float32 data (a numpy array of dtype float32), got an array of dtype float64"),
    "missing input": run_case({}, relaxweb.InputShapeError, "missing input 'x' (float32 [batch, 64])"),
    "unknown input": run_case({"x": mlp_input(2), "y": mlp_input(2)}, relaxweb.InputShapeError,
                              "unknown input 'y'"),
    "not a bundle folder": not_a_bundle_case,
    "reference, wrong shape": run_reference_case({"x": np.zeros((5, 63), np.float32)}, relaxweb.InputShapeError,
                                                 "input 'x': dimension 1 is 63, expected 64"),
    "inspect, unsupported op": inspect_unsupported_case,
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_errors_are_the_cli_messages(device, capsys, tmp_path: Path, model: Path, bundle: relaxweb.Bundle,
                                     name: str) -> None:
    argv, call, error_type, expected = ERROR_CASES[name](tmp_path, model, bundle)
    status, _, stderr = run_cli(capsys, *argv)
    assert status == 2, stderr
    error_lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and stderr.splitlines()[-1] == error_lines[0], stderr
    with pytest.raises(relaxweb.RelaxwebError) as raised:
        call()
    assert type(raised.value) is error_type
    assert error_lines[0] == f"error: {raised.value}"
    assert expected in str(raised.value)
    assert not (tmp_path / "out").exists()
