"""End-to-end tests of the ``relaxweb`` command line, run as a subprocess like a user would.

The MLP of ``examples/make_mlp.py`` is built once with ``--bound batch=64`` and run with the
Python runtime at several batch sizes, against onnxruntime: ``relaxweb run DIR --backend
webgpu`` (wgpu; lavapipe on CI) and ``--backend wasm`` (kernels.wasm on wasmtime), and
``relaxweb run DIR --browser --backend wasm`` in headless Chromium.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from examples.make_mlp import make_mlp
from tests.helpers import MODEL, assert_close, in_the_browser, make_model, rand

pytestmark = pytest.mark.slow  # the command line in subprocesses, a second or more each

REPO = Path(__file__).resolve().parents[2]


def relaxweb(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        [sys.executable, "-m", "relaxweb", *map(str, args)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


def assert_user_error(result: subprocess.CompletedProcess) -> str:
    """Exit status 2, exactly one ``error: `` line (the last one) on stderr, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    error_lines = [line for line in lines if line.startswith("error: ")]
    assert len(error_lines) == 1, result.stderr
    assert lines[-1] == error_lines[0], result.stderr
    return error_lines[0]



@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def model(workdir: Path) -> Path:
    path = workdir / "mlp.onnx"
    onnx.save(make_mlp(), str(path))
    return path


@pytest.fixture(scope="module")
def bundle(workdir: Path, model: Path) -> Path:
    result = relaxweb("build", model, "-o", "dist", "--bound", "batch=64", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "error" not in result.stderr
    return workdir / "dist"


def write_inputs(workdir: Path, name: str, x: np.ndarray) -> Path:
    path = workdir / name
    np.savez(path, x=x)
    return path


# build and run ---------------------------------------------------------------------------------


def test_build_writes_the_bundle(bundle: Path) -> None:
    for relative in ("manifest.json", "host.wasm", "kernels.wasm", "weights/shard0.bin", "runtime/relaxweb.js"):
        assert (bundle / relative).is_file(), relative
    # the modules' text is for people (relaxweb build --debug), not for pages
    assert not (bundle / "host.wat").exists() and not (bundle / "kernels.wat").exists()
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert sorted(p.name for p in (bundle / "kernels").glob("*.wgsl")) == sorted(
        Path(file).name for k in manifest["kernels"] for key, file in k.items() if key.endswith("file"))
    # MatMul+Add+Relu, Gemm and Softmax: 8 kernels unfused (opt level 0), fewer by default
    assert len(manifest["kernels"]) < 8


def test_opt_level_0_builds_one_kernel_per_op(workdir: Path, model: Path) -> None:
    result = relaxweb("build", model, "-o", "dist0", "--opt-level", "0", cwd=workdir)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((workdir / "dist0" / "manifest.json").read_text())
    assert len(manifest["kernels"]) == 8
    # rebuilding into the same folder leaves no kernel of the last build behind
    result = relaxweb("build", model, "-o", "dist0", cwd=workdir)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((workdir / "dist0" / "manifest.json").read_text())
    assert sorted(p.name for p in (workdir / "dist0" / "kernels").glob("*.wgsl")) == sorted(
        Path(file).name for k in manifest["kernels"] for key, file in k.items() if key.endswith("file"))
    result = relaxweb("build", model, "-o", "dist2", "--opt-level", "2", cwd=workdir)
    assert result.returncode == 2 and "invalid choice: 2" in result.stderr


RAN_IN = {"webgpu": "ran in Python runtime (wgpu)", "wasm": "ran in Python runtime (kernels.wasm on wasmtime)",
          "browser-wasm": "ran in headless Chromium (kernels.wasm)"}


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_run_matches_onnxruntime(backend: str, workdir: Path, model: Path, bundle: Path, batch: int) -> None:
    check_run_against_onnxruntime(workdir, model, bundle, batch, backend, "--backend", backend)


@in_the_browser
def test_run_in_chromium_on_the_wasm_backend_matches_onnxruntime(workdir: Path, model: Path, bundle: Path) -> None:
    check_run_against_onnxruntime(workdir, model, bundle, 5, "browser-wasm", "--browser", "--backend", "wasm")


def check_run_against_onnxruntime(workdir: Path, model: Path, bundle: Path, batch: int, where: str, *options: str) -> None:
    """``relaxweb run`` with ``options`` on ``batch`` rows: onnxruntime's probabilities, and the
    line that says where it ran (``RAN_IN[where]``)."""
    x = rand(batch, 64, seed=batch)
    inputs = write_inputs(workdir, f"inputs_{batch}.npz", x)
    out = workdir / f"outputs_{batch}_{where}.npz"
    result = relaxweb("run", bundle, "--inputs", inputs, "--out", out, *options, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert RAN_IN[where] in result.stderr
    assert result.stdout.startswith(f"probabilities: float32[{batch}, 10] ")
    with np.load(out) as data:
        assert data.files == ["probabilities"]
        actual = data["probabilities"]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    assert actual.shape == (batch, 10)
    assert actual.dtype == np.float32
    assert_close(actual, expected, MODEL)
    assert_close(actual.sum(axis=1), 1)


@pytest.mark.gpu
def test_run_above_the_bound(workdir: Path, bundle: Path) -> None:
    inputs = write_inputs(workdir, "inputs_65.npz", np.zeros((65, 64), np.float32))
    result = relaxweb("run", bundle, "--inputs", inputs, cwd=workdir)
    error = assert_user_error(result)
    assert len(result.stderr.splitlines()) == 1
    assert "'x'" in error
    assert "dimension 0" in error
    assert "65" in error
    assert "64" in error
    assert error == "error: input 'x': dimension 0 (batch) is 65, above its bound batch <= 64"
    assert result.stdout == ""


@pytest.mark.gpu
def test_run_wrong_fixed_dimension(workdir: Path, bundle: Path) -> None:
    inputs = write_inputs(workdir, "inputs_5_63.npz", np.zeros((5, 63), np.float32))
    result = relaxweb("run", bundle, "--inputs", inputs, cwd=workdir)
    error = assert_user_error(result)
    assert len(result.stderr.splitlines()) == 1
    assert error == "error: input 'x': dimension 1 is 63, expected 64"


@pytest.mark.gpu
def test_run_with_a_missing_inputs_file(workdir: Path, bundle: Path) -> None:
    error = assert_user_error(relaxweb("run", bundle, "--inputs", "nothing.npz", cwd=workdir))
    assert error == "error: nothing.npz: no such file"


@pytest.mark.gpu
def test_run_with_float64_inputs(workdir: Path, bundle: Path) -> None:
    inputs = write_inputs(workdir, "inputs_f64.npz", np.zeros((2, 64)))
    error = assert_user_error(relaxweb("run", bundle, "--inputs", inputs, cwd=workdir))
    assert "'x'" in error and "float32" in error and "float64" in error


@pytest.mark.gpu
def test_run_with_an_inputs_file_that_is_not_npz(workdir: Path, bundle: Path) -> None:
    (workdir / "notes.npz").write_text("not numpy data\n")
    error = assert_user_error(relaxweb("run", bundle, "--inputs", "notes.npz", cwd=workdir))
    assert error.startswith("error: notes.npz: not an .npz file")


def test_run_on_a_folder_that_is_not_a_bundle(workdir: Path) -> None:
    (workdir / "empty_folder").mkdir(exist_ok=True)
    error = assert_user_error(relaxweb("run", "empty_folder", "--inputs", "x.npz", cwd=workdir))
    assert "not a bundle folder (no manifest.json)" in error


# build errors ----------------------------------------------------------------------------------


def test_build_with_unsupported_ops(workdir: Path) -> None:
    nodes = [
        helper.make_node("StringNormalizer", ["x"], ["a"], name="normalize_a"),
        helper.make_node("Foo", ["a"], ["b"], name="custom_1", domain="com.example"),
        helper.make_node("StringNormalizer", ["b"], ["y"], name="normalize_b"),
    ]
    path = workdir / "unsupported.onnx"
    onnx.save(make_model(nodes, [("x", TensorProto.STRING, ["batch"])], [("y", TensorProto.STRING)]), str(path))
    error = assert_user_error(relaxweb("build", path, "-o", "dist_unsupported", cwd=workdir))
    assert error == (
        "error: the model uses 2 unsupported op type(s): StringNormalizer (nodes: normalize_a, normalize_b); "
        "com.example.Foo (nodes: custom_1)"
    ) or error == (
        "error: the model uses 2 unsupported op type(s): com.example.Foo (nodes: custom_1); "
        "StringNormalizer (nodes: normalize_a, normalize_b)"
    )
    assert not (workdir / "dist_unsupported").exists()


def test_build_with_ops_that_have_no_gpu_lowering_lists_them(workdir: Path, monkeypatch, capsys) -> None:
    """Ops that import (and run with --reference) but cannot be compiled yet: one error.

    Every op lowers today, so two ops' lowerings are taken away; in this process (the
    command's ``main``), where the patch reaches the build."""
    import dataclasses

    from relaxweb.cli import main
    from relaxweb.ir.op_registry import OPS

    for name in ("erf", "sin"):
        monkeypatch.setitem(OPS, name, dataclasses.replace(OPS[name], legalize=None))
    nodes = [helper.make_node("Erf", ["x"], ["a"], name="erf"), helper.make_node("Sin", ["a"], ["y"], name="sin")]
    path = workdir / "no_lowering.onnx"
    onnx.save(make_model(nodes, [("x", ["n"])], ["y"]), str(path))
    status = main(["build", str(path), "-o", str(workdir / "dist_no_lowering")])
    captured = capsys.readouterr()
    error = assert_user_error(subprocess.CompletedProcess([], status, captured.out, captured.err))
    assert error == ("error: no GPU lowering yet for 2 op(s): erf, sin "
                     "(the model imports and runs with 'relaxweb run MODEL.onnx --reference')")
    assert not (workdir / "dist_no_lowering").exists()
