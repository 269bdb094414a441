"""The ONNX operator suite runner (``scripts/onnx_node_tests.py``) on a small fixed subset.

The whole suite (~1900 cases) is run by hand (see ``docs/onnx-node-tests.md``); here a few
cases of ops relaxweb supports are regenerated from the installed onnx into a temporary
folder and must pass through the runner's functions, and the runner's classification
(pass / fail / unsupported / error), its timeout and crash guards and its report are checked.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relaxweb.runtime.wasm_session import WasmSession
from tests.helpers import make_model

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "onnx_node_tests.py"

MODULES = ["add", "sub", "mul", "div", "relu", "sigmoid", "tanh", "softmax", "matmul", "gemm", "reshape",
           "transpose", "identity"]
PASSING = [
    "test_add", "test_add_bcast", "test_add_uint8",
    "test_sub", "test_sub_bcast", "test_sub_int8",
    "test_mul", "test_mul_bcast", "test_div", "test_div_bcast",
    "test_relu", "test_sigmoid", "test_sigmoid_example", "test_tanh", "test_tanh_example",
    "test_softmax_example", "test_softmax_large_number", "test_softmax_default_axis",
    "test_softmax_negative_axis", "test_softmax_example_expanded",
    "test_matmul_2d", "test_matmul_3d", "test_matmul_4d",
    "test_gemm_default_no_bias", "test_gemm_all_attributes", "test_gemm_transposeA", "test_gemm_transposeB",
    "test_transpose_default", "test_transpose_all_permutations_2", "test_identity",
]
# ONNX's Reshape cases give the target shape as a graph input; relaxweb wants it at compile time.
RESHAPE = ["test_reshape_reordered_all_dims", "test_reshape_negative_dim"]


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("onnx_node_tests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["onnx_node_tests"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The subset, written by the script's ``generate`` (in a process of its own: collecting
    ONNX's cases reseeds numpy's global generator)."""
    out = tmp_path_factory.mktemp("onnx_node_tests")
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "generate", "--out", str(out), "--modules", ",".join(MODULES),
         "--names", ",".join(PASSING + RESHAPE)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert f"wrote {len(PASSING + RESHAPE)} node test cases" in result.stdout
    return out


def test_generate_writes_onnx_test_data_and_an_index(cases: Path, runner) -> None:
    case = cases / "node" / "test_add"
    assert (case / "model.onnx").is_file()
    assert sorted(p.name for p in (case / "test_data_set_0").iterdir()) == ["input_0.pb", "input_1.pb", "output_0.pb"]
    index = {entry["name"]: entry for entry in runner.load_index(cases)}
    assert set(index) == set(PASSING + RESHAPE)
    assert index["test_gemm_transposeA"]["op"] == "Gemm"
    assert index["test_softmax_example_expanded"] == {
        "name": "test_softmax_example_expanded", "op": "Softmax", "domain": "", "expanded": True,
        "dir": "node/test_softmax_example_expanded"}
    assert runner.op_label(index["test_softmax_example_expanded"]) == "Softmax (expanded)"


@pytest.mark.parametrize("name", PASSING)
def test_supported_case_passes(cases: Path, runner, name: str) -> None:
    result = runner.run_case(cases / "node" / name, timeout=20)
    assert result["status"] == "pass", result


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["test_add", "test_relu", "test_matmul_2d", "test_softmax_example", "test_gemm_transposeA"])
def test_supported_case_passes_through_the_compiler_and_wgpu(cases: Path, runner, name: str) -> None:
    """--compiled: import, compile into a bundle, run with the Python runtime (lavapipe here)."""
    result = runner.run_case(cases / "node" / name, timeout=60, compiled=True)
    assert result["status"] == "pass", result


@pytest.mark.parametrize("name", ["test_add", "test_relu", "test_matmul_2d", "test_softmax_example", "test_gemm_transposeA"])
def test_supported_case_passes_through_the_compiler_and_kernels_wasm(cases: Path, runner, name: str) -> None:
    """--compiled --backend wasm: the same bundle run on its kernels.wasm (wasmtime, no GPU)."""
    result = runner.run_case(cases / "node" / name, timeout=60, compiled=True, backend="wasm")
    assert result["status"] == "pass", result


def test_a_wrong_kernels_wasm_result_fails_the_case(cases: Path, runner, monkeypatch) -> None:
    """The wasm run really reads the wasm session's outputs: a session that answers wrong fails."""
    run = WasmSession.run
    monkeypatch.setattr(WasmSession, "run", lambda self, inputs, **kw: {
        name: value + 1 for name, value in run(self, inputs, **kw).items()})
    result = runner.run_case(cases / "node" / "test_add", timeout=60, compiled=True, backend="wasm")
    assert result["status"] == "fail", result


@pytest.mark.gpu
def test_one_bundle_runs_on_both_backends_each_judged_on_its_own(cases: Path, runner, monkeypatch) -> None:
    """--backend webgpu,wasm compiles once and runs the bundle on each: a wrong wasm answer fails
    the wasm result alone, and each backend's view keeps its own status."""
    run = WasmSession.run
    monkeypatch.setattr(WasmSession, "run", lambda self, inputs, **kw: {
        name: value + 1 for name, value in run(self, inputs, **kw).items()})
    result = runner.run_case(cases / "node" / "test_add", timeout=60, compiled=True, backend=("webgpu", "wasm"))
    assert result["backends"]["webgpu"]["status"] == "pass", result
    assert result["backends"]["wasm"]["status"] == "fail", result
    assert result["status"] == "fail"
    assert runner.backend_result(result, "webgpu")["status"] == "pass"
    wasm = runner.backend_result(result, "wasm")
    assert wasm["status"] == "fail" and wasm["name"] == "test_add" and "backends" not in wasm
    monkeypatch.setattr(WasmSession, "run", run)
    both = runner.run_case(cases / "node" / "test_add", timeout=60, compiled=True, backend=("webgpu", "wasm"))
    assert both["status"] == "pass" and set(both["backends"]) == {"webgpu", "wasm"}, both


def test_runtime_inputs_can_be_made_constants(cases: Path, runner) -> None:
    for name in RESHAPE:
        strict = runner.run_case(cases / "node" / name)
        assert strict["status"] in ("unsupported", "pass"), strict
        inlined = runner.run_case(cases / "node" / name, constant_inputs=True)
        assert inlined["status"] == "pass", inlined
        assert inlined["constant_inputs"] == ["shape"]


def _copy_case(cases: Path, name: str, tmp_path: Path, new_name: str) -> Path:
    target = tmp_path / "node" / new_name
    shutil.copytree(cases / "node" / name, target)
    return target


def _write_output(case: Path, array: np.ndarray, name: str) -> None:
    (case / "test_data_set_0" / "output_0.pb").write_bytes(numpy_helper.from_array(array, name).SerializeToString())


def _expected(case: Path) -> np.ndarray:
    tensor = onnx.TensorProto()
    tensor.ParseFromString((case / "test_data_set_0" / "output_0.pb").read_bytes())
    return numpy_helper.to_array(tensor)


def test_wrong_results_fail(cases: Path, runner, tmp_path: Path) -> None:
    expected = _expected(cases / "node" / "test_add")
    wrong_value = _copy_case(cases, "test_add", tmp_path, "wrong_value")
    changed = expected.copy()
    changed[1, 2, 3] += 0.01
    _write_output(wrong_value, changed, "sum")
    result = runner.run_case(wrong_value)
    assert result["status"] == "fail"
    assert result["message"].startswith("output 'sum': 1 of 60 element(s) differ; at [1, 2, 3]: got ")

    within = _copy_case(cases, "test_add", tmp_path, "within_tolerance")
    _write_output(within, expected * (1 + 5e-4), "sum")
    assert runner.run_case(within)["status"] == "pass"

    wrong_dtype = _copy_case(cases, "test_add", tmp_path, "wrong_dtype")
    _write_output(wrong_dtype, expected.astype(np.float64), "sum")
    result = runner.run_case(wrong_dtype)
    assert (result["status"], result["message"]) == ("fail", "output 'sum': dtype float32, expected float64")

    wrong_shape = _copy_case(cases, "test_add", tmp_path, "wrong_shape")
    _write_output(wrong_shape, expected.reshape(3, 20), "sum")
    result = runner.run_case(wrong_shape)
    assert (result["status"], result["message"]) == ("fail", "output 'sum': shape [3, 4, 5], expected [3, 20]")

    ints = _copy_case(cases, "test_add_uint8", tmp_path, "wrong_int")
    exact = _expected(ints).copy()
    exact.flat[0] ^= 1
    _write_output(ints, exact, "sum")
    assert runner.run_case(ints)["status"] == "fail"


def _handmade_case(folder: Path, nodes, inputs, outputs, data_in, data_out, domains=()) -> Path:
    model = make_model(nodes, inputs, outputs, opset={"": 17, **{d: 1 for d in domains}}, name=folder.name)
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "model.onnx"))
    data = folder / "test_data_set_0"
    data.mkdir()
    for index, array in enumerate(data_in):
        (data / f"input_{index}.pb").write_bytes(numpy_helper.from_array(array).SerializeToString())
    for index, array in enumerate(data_out):
        (data / f"output_{index}.pb").write_bytes(numpy_helper.from_array(array).SerializeToString())
    return folder


def test_unsupported_and_error_cases(runner, tmp_path: Path) -> None:
    x = np.ones((2, 3), np.float32)
    custom = _handmade_case(
        tmp_path / "node" / "custom_domain", [helper.make_node("Foo", ["x"], ["y"], domain="com.example")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [x], [x], domains=["com.example"])
    result = runner.run_case(custom)
    assert result["status"] == "unsupported"
    assert "com.example.Foo" in result["message"]
    assert result["ops"] == ["com.example.Foo"]

    # The data does not match the model's declared input shape: the interpreter refuses it.
    mismatch = _handmade_case(
        tmp_path / "node" / "bad_data", [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])], [x], [x])
    result = runner.run_case(mismatch)
    assert (result["status"], result["error_type"], result["stage"]) == ("error", "InputShapeError", "run")
    assert "dimension 0 is 2, expected 4" in result["message"]

    missing = tmp_path / "node" / "no_model"
    missing.mkdir()
    result = runner.run_case(missing)
    assert (result["status"], result["error_type"], result["stage"]) == ("error", "RelaxwebError", "load")


@pytest.mark.slow  # waits out its timeouts
def test_run_cases_survives_crashes_and_timeouts(cases: Path, runner, monkeypatch) -> None:
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("the patched importer reaches the workers only when they are forked")
    real_from_onnx = runner.from_onnx

    def misbehaving(model, source):
        if source == "test_relu":
            time.sleep(60)  # stopped by the worker's own timer
        if source == "test_sigmoid":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(60)  # deaf to the timer: the parent kills the worker
        if source == "test_tanh":
            os._exit(3)
        if source == "test_identity":
            raise ZeroDivisionError("a converter bug\nsecond line")
        return real_from_onnx(model, source)

    monkeypatch.setattr(runner, "from_onnx", misbehaving)
    names = ["test_add", "test_relu", "test_sub", "test_sigmoid", "test_tanh", "test_identity", "test_mul", "test_div"]
    started = time.monotonic()
    results = runner.run_cases([cases / "node" / n for n in names], jobs=2, timeout=1.0, hard_kill_grace=1.0)
    assert time.monotonic() - started < 30
    by_name = {name: result for name, result in zip(names, results)}
    assert [r["name"] for r in results] == names
    for name in ("test_add", "test_sub", "test_mul", "test_div"):
        assert by_name[name]["status"] == "pass", by_name[name]
    assert (by_name["test_relu"]["status"], by_name["test_relu"]["error_type"]) == ("error", "Timeout")
    assert "took more than 1 s" in by_name["test_relu"]["message"]
    assert (by_name["test_sigmoid"]["status"], by_name["test_sigmoid"]["error_type"]) == ("error", "Timeout")
    assert "worker was killed" in by_name["test_sigmoid"]["message"]
    assert (by_name["test_tanh"]["status"], by_name["test_tanh"]["error_type"]) == ("error", "WorkerCrashed")
    assert "exit code 3" in by_name["test_tanh"]["message"]
    identity = by_name["test_identity"]
    assert (identity["status"], identity["error_type"], identity["message"]) == (
        "error", "ZeroDivisionError", "a converter bug")


def test_markdown_report(runner, tmp_path: Path) -> None:
    results = [
        {"name": "test_a", "op_label": "Add", "status": "pass", "message": ""},
        {"name": "test_a2", "op_label": "Add", "status": "fail", "message": "output 'y': shape [1], expected [2]"},
        {"name": "test_s", "op_label": "Softmax (expanded)", "status": "unsupported",
         "message": "the model uses 2 unsupported op type(s): Exp (nodes: #1 (unnamed)); ReduceMax (nodes: #0)"},
        {"name": "test_c", "op_label": "Conv", "status": "error", "error_type": "KeyError", "stage": "import",
         "message": "'pads'"},
    ]
    path = tmp_path / "report.md"
    runner.write_markdown(results, path, "python scripts/onnx_node_tests.py run", "2024-01-02", "1.2.3")
    text = path.read_text()
    lines = text.splitlines()
    assert "- command: `python scripts/onnx_node_tests.py run`" in lines
    assert "- date: 2024-01-02" in lines
    assert "- onnx version: 1.2.3" in lines
    assert "| op | cases | passed | failed | unsupported | error |" in lines
    assert "| Add | 2 | 1 | 1 | 0 | 0 |" in lines
    assert "| Conv | 1 | 0 | 0 | 0 | 1 |" in lines
    assert "| Softmax (expanded) | 1 | 0 | 0 | 1 | 0 |" in lines
    assert "| **total** | **4** | **1** | **1** | **1** | **1** |" in lines
    assert "| test_c | error | KeyError (import): 'pads' |" in lines
    assert "Exp (1), ReduceMax (1)" in text
    assert runner.totals(results) == {"cases": 4, "pass": 1, "fail": 1, "unsupported": 1, "error": 1}
    assert lines[0] == "# ONNX operator test suite"
    for backend, title in (("webgpu", "WebGPU"), ("wasm", "kernels.wasm")):
        runner.write_markdown(results, path, "run --compiled", "2024-01-02", "1.2.3", compiled=True, backend=backend)
        assert path.read_text().splitlines()[0] == f"# ONNX operator test suite through the compiler and {title}"


@pytest.mark.slow  # a subprocess
def test_run_command_writes_json(cases: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    doc = tmp_path / "table.md"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--cases", str(cases), "--filter", "test_gemm", "--out", str(out),
         "--doc", str(doc)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("4 cases: 4 passed, 0 failed, 0 unsupported, 0 errors")
    report = json.loads(out.read_text())
    assert report["totals"] == {"cases": 4, "pass": 4, "fail": 0, "unsupported": 0, "error": 0}
    assert report["onnx_version"] == onnx.__version__
    assert {c["op_label"] for c in report["cases"]} == {"Gemm"}
    assert "| Gemm | 4 | 4 | 0 | 0 | 0 |" in doc.read_text().splitlines()


@pytest.mark.gpu
@pytest.mark.slow  # a subprocess
def test_run_command_on_both_backends_writes_a_file_for_each(cases: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "run", "--compiled", "--backend", "webgpu,wasm", "--check", "--cases", str(cases),
         "--filter", "test_gemm_default", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("1 cases on webgpu: 1 passed, 0 failed") and lines[1].startswith("1 cases on wasm: 1 passed")
    for backend in ("webgpu", "wasm"):
        report = json.loads((tmp_path / f"results-{backend}.json").read_text())
        assert report["backend"] == backend and report["totals"]["pass"] == 1
        assert all("backends" not in case for case in report["cases"])
    assert not out.exists()
    refused = subprocess.run([sys.executable, str(SCRIPT), "run", "--compiled", "--backend", "webgpu,cuda"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "give webgpu, wasm or both" in refused.stderr
