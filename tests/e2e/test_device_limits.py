"""What a WebGPU device offers by default, and models that reach it.

1. **Kernels fit the bindings.** A kernel may bind at most 8 storage buffers
   (``ir/launch.MAX_STORAGE_BINDINGS``, WebGPU's default ``maxStorageBuffersPerShaderStage``):
   a Concat of more inputs than one kernel can read becomes a tree of concats
   (``passes/split_wide_concats.py``), an Einsum of more operands a chain of einsums
   (``passes/split_wide_einsums.py``), and a Sum of many inputs stays a chain that fusion
   keeps within the limit.  They build and match onnxruntime on WebGPU and on wasm, with
   static and with symbolic shapes (the captcha CRNN's unrolled LSTM concatenates 20 steps).
2. **Limits known at build.** A storage above WebGPU's default maxStorageBufferBindingSize
   (128 MiB) at the bounds is a warning of the build naming the storage, what it holds, its
   size and the bounds to lower (``bundle.limit_warnings``; ``--target-limits`` checks other
   limits), not an error; the manifest says what each storage holds, so a load on an adapter
   offering less names the storage, and ``backend="auto"`` says why it took wasm
   (``session.backend_reason``, a line from the CLI).  lavapipe binds 128 MiB, so the wide
   MatMul below falls back there.  The browser's ``model.backendReason``:
   tests/runtime_js/test_wasm_browser.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import relaxweb
from relaxweb.errors import RelaxwebError

from tests.helpers import build_once, load_bundle, make_model, onnxruntime_outputs, rand

# (inputs, the inputs' shape, concat axis, feeds' shape): static shapes concatenated along a
# constant axis, symbolic ones along the symbolic axis (offsets computed by the host).
CONCATS = {
    "20-static": (20, [2, 3], 1, (2, 3)),
    "20-symbolic": (20, ["b", 3], 0, (2, 3)),
    "100-static": (100, [1, 2], 1, (1, 2)),
    "100-symbolic": (100, [2, "s"], 1, (2, 3)),
}


def concat_model(count: int, shape: list, axis: int) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(count)]
    return make_model([helper.make_node("Concat", names, ["y"], axis=axis, name="many_steps")],
                      [(name, shape) for name in names], ["y"])


@pytest.mark.parametrize("case", CONCATS)
def test_a_concat_of_many_inputs_builds_and_matches_onnxruntime(case: str, backend: str, tmp_path: Path) -> None:
    count, shape, axis, feed_shape = CONCATS[case]
    model = concat_model(count, shape, axis)
    feeds = {f"x{i}": rand(feed_shape, seed=i) for i in range(count)}
    session = load_bundle(build_once(model, tmp_path / "dist"), backend)
    np.testing.assert_array_equal(session.run(feeds)["y"], onnxruntime_outputs(model, feeds)[0])


def test_a_sum_of_twelve_inputs_builds_and_matches_onnxruntime(backend: str, tmp_path: Path) -> None:
    names = [f"x{i}" for i in range(12)]
    model = make_model([helper.make_node("Sum", names, ["y"])], [(name, ["b", 4]) for name in names], ["y"])
    feeds = {name: rand(3, 4, seed=i) for i, name in enumerate(names)}
    session = load_bundle(build_once(model, tmp_path / "dist"), backend)
    np.testing.assert_allclose(session.run(feeds)["y"], onnxruntime_outputs(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_an_einsum_of_eleven_operands_builds_and_matches_onnxruntime(backend: str, tmp_path: Path) -> None:
    """A chain of 11 matrices (split_wide_einsums: two einsums before the last), a batch dim by ellipsis."""
    names = [f"x{i}" for i in range(11)]
    letters = "abcdefghijkl"
    equation = ",".join(f"...{letters[i]}{letters[i + 1]}" for i in range(11)) + "->...al"
    model = make_model([helper.make_node("Einsum", names, ["y"], equation=equation)],
                       [(name, ["b", 3, 3]) for name in names], ["y"])
    feeds = {name: rand(2, 3, 3, seed=i) for i, name in enumerate(names)}
    session = load_bundle(build_once(model, tmp_path / "dist"), backend)
    np.testing.assert_allclose(session.run(feeds)["y"], onnxruntime_outputs(model, feeds)[0], rtol=1e-4, atol=1e-5)


# 2. Limits known at build --------------------------------------------------------------------

#: y = x @ w with x [n, 64], w [64, 1024]: y is n * 4096 bytes, 160 MB at n <= 40000.
WIDE_BOUND = 40000


def wide_matmul(relu: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h" if relu else "y"], name="wide_matmul")]
    if relu:
        nodes.append(helper.make_node("Relu", ["h"], ["y"], name="after"))
    return make_model(nodes, [("x", ["n", 64])], ["y"], {"w": rand(64, 1024, seed=1)})


@pytest.fixture(scope="module")
def wide_bundle(tmp_path_factory) -> Path:
    return relaxweb.build(wide_matmul(), tmp_path_factory.mktemp("wide") / "dist", bounds={"n": WIDE_BOUND}).path


def test_a_storage_above_the_default_binding_is_a_warning_naming_it(tmp_path: Path) -> None:
    bundle = relaxweb.build(wide_matmul(), tmp_path / "dist", bounds={"n": WIDE_BOUND})
    (storage,) = [i for i, s in enumerate(bundle.manifest["storages"]) if s.get("holds") == "output 'y'"]
    assert bundle.warnings == (
        f"storage {storage} (output 'y') needs 163840000 bytes at the bounds n <= 40000 (its size: n * 4096 bytes), "
        "above WebGPU's default maxStorageBufferBindingSize of 134217728: WebGPU adapters offering no more cannot "
        "load the bundle (wasm can); lower the bounds of n (--bound)",)
    assert relaxweb.build(wide_matmul(), tmp_path / "small", bounds={"n": 30000}).warnings == ()
    larger = {"maxStorageBufferBindingSize": 1 << 30, "maxBufferSize": 1 << 30}
    assert relaxweb.build(wide_matmul(), tmp_path / "dist", bounds={"n": WIDE_BOUND}, target_limits=larger).warnings == ()


def test_an_intermediate_storage_is_named_by_the_node_that_writes_it(tmp_path: Path) -> None:
    """At opt level 0 h (the MatMul's output) has a storage of its own, above a target's 1 MiB."""
    bundle = relaxweb.build(wide_matmul(relu=True), tmp_path / "dist", bounds={"n": 300}, opt_level=0,
                            target_limits={"maxStorageBufferBindingSize": 1 << 20})
    assert len(bundle.warnings) == 2, bundle.warnings
    assert any(w.startswith("storage ") and "(the value 'h' of node 'wide_matmul') needs 1228800 bytes at the "
               "bounds n <= 300 (its size: n * 4096 bytes), above the target's maxStorageBufferBindingSize of "
               "1048576" in w for w in bundle.warnings), bundle.warnings


def test_the_cli_warns_and_takes_target_limits(tmp_path: Path) -> None:
    onnx.save(wide_matmul(), tmp_path / "wide.onnx")

    def build(*options: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "relaxweb", "build", str(tmp_path / "wide.onnx"), "-o",
                               str(tmp_path / "dist"), "--bound", f"n={WIDE_BOUND}", *options],
                              capture_output=True, text=True, timeout=120)

    default = build()
    assert default.returncode == 0, default.stderr
    (warning,) = [line for line in default.stderr.splitlines() if line.startswith("warning: ")]
    assert "(output 'y') needs 163840000 bytes" in warning and "lower the bounds of n (--bound)" in warning
    (tmp_path / "limits.json").write_text('{"maxStorageBufferBindingSize": 1073741824, "maxBufferSize": 1073741824, '
                                          '"maxTextureDimension2D": 8192}')
    for options in (["--target-limits", str(tmp_path / "limits.json")],
                    ["--target-limits", "maxStorageBufferBindingSize=1073741824", "--target-limits",
                     "maxBufferSize=1073741824"]):
        quiet = build(*options)
        assert quiet.returncode == 0 and "warning:" not in quiet.stderr, quiet.stderr
    wrong = build("--target-limits", "maxBindings=9")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines()[-1] == (
        "error: target limit 'maxBindings' is not one the build checks (maxStorageBufferBindingSize, maxBufferSize, "
        "maxStorageBuffersPerShaderStage, maxComputeWorkgroupStorageSize, maxComputeInvocationsPerWorkgroup, "
        "maxComputeWorkgroupSizeX)"), wrong.stderr


@pytest.mark.gpu
def test_auto_says_why_it_took_wasm_and_webgpu_names_the_storage(wide_bundle: Path, device) -> None:
    limit = default_binding_size()
    session = relaxweb.load(wide_bundle)
    assert session.backend == "wasm"
    assert session.backend_reason.endswith(
        f"needs the limit maxStorageBufferBindingSize = 163840000, it offers {limit}: storage "
        f"{output_storage(session.manifest)} (output 'y') needs 163840000 bytes at the bounds (its size: n * 4096 bytes; "
        "build with lower --bound values, or run on wasm)"), session.backend_reason
    x = rand(3, 64)
    np.testing.assert_allclose(session.run({"x": x})["y"], onnxruntime_outputs(wide_matmul(), {"x": x})[0],
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(RelaxwebError, match=r"maxStorageBufferBindingSize = 163840000, but this adapter .* offers "
                                            rf"{limit}: storage \d+ \(output 'y'\) needs 163840000 bytes"):
        relaxweb.load(wide_bundle, backend="webgpu")
    small = relaxweb.build(wide_matmul(), wide_bundle.parent / "small", bounds={"n": 8}).path
    assert relaxweb.load(small).backend_reason is None


@pytest.mark.gpu
def test_the_cli_says_why_auto_took_wasm(wide_bundle: Path, device, tmp_path: Path) -> None:
    np.savez(tmp_path / "in.npz", x=rand(2, 64))
    run = subprocess.run([sys.executable, "-m", "relaxweb", "run", str(wide_bundle), "--inputs", str(tmp_path / "in.npz")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    (note,) = [line for line in run.stderr.splitlines() if line.startswith("note: running on kernels.wasm: ")]
    assert "(output 'y') needs 163840000 bytes at the bounds" in note


def default_binding_size() -> int:
    limit = relaxweb.runtime.webgpu.default_adapter().limits["max-storage-buffer-binding-size"]
    if limit >= 163840000:
        pytest.skip(f"this adapter binds {limit} bytes: the bundle loads on WebGPU here")
    return limit


def output_storage(manifest: dict) -> int:
    return manifest["outputs"][0]["storage"]
