"""CI's subset of the model corpus (scripts/model_zoo.py, docs/model-zoo.md): real models
from several exporters, each built and run with the Python runtime on each backend (WebGPU
and kernels.wasm: the ``backend`` fixture) at two or more values of every dynamic dimension,
every output compared with onnxruntime (1e-3 absolutely or relatively, the corpus's rule);
two of them also run in headless Chromium, with WebGPU and without it (kernels.wasm).

The subset is the catalog's ``fast`` models (exported here with torch and transformers, in a
subprocess, as scripts/model_zoo.py does) and its ``committed`` ones: small models of other
exporters (tf2onnx, jax2tf) kept under tests/data/model-zoo/ (each under 1 MB; the command
that regenerates them is in the README there).  Every model in it passes today; the others
are listed in docs/model-zoo.md with their errors.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from relaxweb.browser import browser_runs
from tests.helpers import in_the_browser

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import model_zoo  # noqa: E402
from zoo import check as zoo_check  # noqa: E402
from zoo.catalog import MODELS, MODELS_BY_NAME  # noqa: E402
from zoo.check import check, compare, make_inputs  # noqa: E402

TEST_DATA = ROOT / "tests" / "data" / "model-zoo"
EXPORTED = [m.name for m in MODELS if m.fast and not m.committed]
COMMITTED = [m.name for m in MODELS if m.committed]
#: one model of each kind of input through Chromium: float images (torch) and int32 bytes (jax2tf)
BROWSER = ["hf_resnet", "jax_byte_classifier"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (pip install -e '.[test]')")
    folder = tmp_path_factory.mktemp("zoo-models")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "scripts")])}
    done = subprocess.run([sys.executable, "-m", "zoo.export", str(folder), *EXPORTED], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    failed = [line for line in done.stdout.splitlines() if "FAILED" in line]
    assert not failed and done.returncode == 0, "\n".join(failed) or done.stderr[-3000:]
    return folder


def model_file(name: str, exported_dir: Path | None) -> Path:
    return TEST_DATA / f"{name}.onnx" if MODELS_BY_NAME[name].committed else exported_dir / f"{name}.onnx"


def assert_ok(result: dict) -> None:
    assert result["status"] == "ok", f"{result['name']}: {result['status']}: {result.get('error')}"
    assert len(result["runs"]) == len(MODELS_BY_NAME[result["name"]].shapes)
    for dim, values in result["dim_values"].items():
        assert len(values) >= 2, f"{result['name']}: dynamic dim {dim} is tried at {values} only"


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPORTED)
def test_exported_model_matches_onnxruntime(backend, name, exported, tmp_path):
    assert_ok(check(MODELS_BY_NAME[name], model_file(name, exported), tmp_path / "bundle", paths=(backend,)))


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMITTED)
def test_committed_model_matches_onnxruntime(backend, name, tmp_path):
    assert_ok(check(MODELS_BY_NAME[name], model_file(name, None), tmp_path / "bundle", paths=(backend,)))


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMITTED)
def test_committed_model_batches_ragged(device, name, tmp_path):
    """Every shape of the model as one batch of instances of different sizes (the "batch"
    path: run_batch on wgpu), each instance compared with onnxruntime; no kernel of these
    models lacks a ragged form."""
    result = check(MODELS_BY_NAME[name], model_file(name, None), tmp_path / "bundle", paths=("batch",))
    assert_ok(result)
    assert result["paths"]["batch"]["mode"] == "ragged", result["paths"]["batch"].get("reason")


def test_a_check_of_some_paths_keeps_the_others_in_the_row():
    W, A, B = ([{"dims": {"n": 1}, "max_abs_diff": diff}] for diff in (1e-6, 2.0, 3e-6))
    previous = {"name": "m", "status": "wrong", "error": "wasm: at {}: off", "runs": W, "max_abs_diff": 2.0,
                "paths": {"webgpu": {"status": "ok", "runs": W, "max_abs_diff": 1e-6},
                          "wasm": {"status": "wrong", "error": "at {}: off", "runs": A, "max_abs_diff": 2.0}}}
    batch = {"status": "ok", "runs": B, "max_abs_diff": 3e-6, "mode": "one by one", "reason": "KV caches"}
    merged = model_zoo.merge_paths(previous, {"name": "m", "status": "ok", "runs": B, "paths": {"batch": batch}},
                                   ["batch"])
    assert list(merged["paths"]) == ["webgpu", "wasm", "batch"]
    assert merged["status"] == "wrong" and merged["error"] == "wasm: at {}: off" and merged["max_abs_diff"] == 2.0
    assert model_zoo.path_cell(merged, "batch") == "3.0e-06 one by one*"
    assert model_zoo.path_cell(previous, "batch") == "not checked"
    assert "- **m**: KV caches" in model_zoo.render_doc(
        {"date": "d", "machine": {"platform": "p", "cpu": "c", "cores": 2, "adapter": "a"}, "versions": {},
         "models": {"m": {**merged, "category": "c", "architecture": "a", "exporter": "e"}}})


def test_committed_models_are_small_and_present():
    for name in COMMITTED:
        path = TEST_DATA / f"{name}.onnx"
        assert path.exists(), f"{path}: missing; regenerate it (tests/data/model-zoo/README.md)"
        assert path.stat().st_size < 1 << 20, f"{path}: {path.stat().st_size} bytes, over 1 MB"


@pytest.mark.slow  # a build
def test_a_model_is_ok_only_when_every_path_matches(monkeypatch, tmp_path):
    """A path whose floats are off by one makes the model wrong, naming that path; the path
    before it stays ok (a fake Chromium path here: the wasm session's outputs, shifted)."""
    name = "jax_byte_classifier"
    real_run_on = zoo_check.run_on

    def run_on(bundle_dir, where, runs):
        for outputs in real_run_on(bundle_dir, "wasm", runs):
            yield {key: value + 1 if where == "chromium-wasm" and value.dtype.kind == "f" else value
                   for key, value in outputs.items()}

    monkeypatch.setattr(zoo_check, "run_on", run_on)
    result = check(MODELS_BY_NAME[name], model_file(name, None), tmp_path / "bundle", paths=("wasm", "chromium-wasm"))
    assert result["paths"]["wasm"]["status"] == "ok"
    assert result["paths"]["chromium-wasm"]["status"] == "wrong"
    assert result["status"] == "wrong" and result["error"].startswith("chromium-wasm: at ")
    assert result["runs"] == result["paths"]["wasm"]["runs"]
    cells = [model_zoo.path_cell(result, path) for path in ("wasm", "chromium-wasm", "webgpu")]
    assert cells[0] != "" and cells[1:] == ["**wrong**", ""]
    assert model_zoo.path_cell({"status": "ok"}, "wasm") == "not checked"  # a row from before the paths


def test_an_element_matches_within_1e3_absolutely_or_relatively():
    expected = np.array([0.0, 1.0, 1000.0, -5.0], np.float32)
    within = expected + np.array([9e-4, 9e-4, 0.9, -4e-3], np.float32)  # abs, abs, rel, rel
    assert compare(within, expected, 1e-3)[1] <= 1.0
    assert compare(expected + np.array([0, 0, 0, 6e-3], np.float32), expected, 1e-3)[1] > 1.0
    assert compare(np.array([1, 2]), np.array([1, 3]), 1e-3)[1] == float("inf")
    assert compare(expected[:3], expected, 1e-3)[1] == float("inf")




@in_the_browser
@pytest.mark.slow
@pytest.mark.parametrize("webgpu", [True, False], ids=["webgpu", "without-webgpu"])
@pytest.mark.parametrize("name", BROWSER)
def test_model_matches_onnxruntime_in_chromium(name, webgpu, request, tmp_path):
    """One build, loaded once in the page (``backend: "auto"``: WebGPU, or kernels.wasm in a
    Chromium without WebGPU) and run at every shape of the catalog."""
    import relaxweb

    model = MODELS_BY_NAME[name]
    path = model_file(name, None if model.committed else request.getfixturevalue("exported"))
    onnx_model = onnx.load(str(path))
    relaxweb.build(path, tmp_path / "bundle")
    runs = [make_inputs(model, onnx_model, values, seed=index) for index, values in enumerate(model.shapes)]
    reference = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    done = browser_runs(tmp_path / "bundle", runs, timeout_s=300, webgpu=webgpu)
    assert done.backend == ("webgpu" if webgpu else "wasm")
    for inputs, actual in zip(runs, done.outputs, strict=True):
        for output, expected in zip(names, reference.run(None, inputs)):
            assert compare(actual[output], expected, 1e-3)[1] <= 1.0, f"{name} output {output} at {inputs.keys()}"
