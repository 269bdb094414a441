"""The Python runtime on kernels.wasm (``relaxweb/runtime/wasm_session.py``) and the choice of
backend (``relaxweb.load(dir, backend=...)``, ``relaxweb run --backend``).

The first tests drive the session with a kernels.wasm written here by hand for a one-kernel
bundle (an Add), so that what the runtime does (memory layout, growing storages, a trap, a
kernel that never ends) is checked against a kernel whose behaviour is known; the model
test runs what ``relaxweb build`` writes against onnxruntime, at the tolerance tiers of
tests/helpers.py.  Every other comparison with onnxruntime runs on both backends where it is
written (the ``backend`` fixture of tests/conftest.py: the test models in test_models.py,
loops in test_loop.py, sequences in test_sequence.py, the tiny Llama in test_tiny_llama.py...).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import wasmtime
from onnx import TensorProto, helper

import relaxweb
from relaxweb.cli import main as cli_main
from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.runtime import wasm_backend
from relaxweb.runtime.wasm_session import WasmSession, WasmTensor
from tests.helpers import F32, assert_close, make_model, onnxruntime_outputs, rand

# y[u] = x[u] + w[u % 4] for u in [first, end): the Add bundle's kernel 0, whose params
# block is (element_count, n) and whose units are the n * 4 elements.  BODY is the store.
_ADD_WAT = """(module
  (import "env" "memory" (memory 1 65536))
  (func $k0_units (param $p i32) (result i32)
    (i32.mul (i32.load offset=4 (local.get $p)) (i32.const 4)))
  (func $k0 (param $p i32) (param $first i32) (param $end i32) (param $scratch i32)
            (param $x i32) (param $w i32) (param $y i32)
    (local $u i32)
    (local.set $u (local.get $first))
    (block $done (loop $next
      (br_if $done (i32.ge_s (local.get $u) (local.get $end)))
      BODY
      (local.set $u (i32.add (local.get $u) (i32.const 1)))
      (br $next))))
  (export "k0" (func $k0))
  (export "k0_units" (func $k0_units)))
"""
_ADD = """(f32.store (i32.add (local.get $y) (i32.shl (local.get $u) (i32.const 2)))
        (f32.add (f32.load (i32.add (local.get $x) (i32.shl (local.get $u) (i32.const 2))))
                 (f32.load (i32.add (local.get $w) (i32.shl (i32.rem_u (local.get $u) (i32.const 4)) (i32.const 2))))))"""
_OUT_OF_BOUNDS = "(f32.store (i32.const -16) (f32.const 1))"
_FOREVER = "(local.set $u (i32.const 0))"
_W = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def add_model() -> onnx.ModelProto:
    return make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["n", 4])], ["y"],
                      {"w": _W})


def with_kernels_wasm(bundle: Path, wat: str) -> Path:
    """``bundle`` with its kernels.wasm replaced by ``wat`` assembled, and the manifest's
    ``wasm`` entry naming it."""
    (bundle / "kernels.wasm").write_bytes(wasmtime.wat2wasm(wat))
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["wasm"] = {"file": "kernels.wasm", "scratch_bytes": 0}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


@pytest.fixture(scope="module")
def add_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Add model built without bounds (its storages are placed per run, and grow)."""
    folder = tmp_path_factory.mktemp("wasm") / "add"
    relaxweb.build(add_model(), folder)
    return folder


def variant(add_bundle: Path, tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "add"
    shutil.copytree(add_bundle, folder)
    return with_kernels_wasm(folder, _ADD_WAT.replace("BODY", body))


# The session's own mechanics, on a hand-written kernel -------------------------------------


def test_storages_grow_and_shrink_back_across_runs(add_bundle: Path, tmp_path: Path) -> None:
    session = WasmSession(variant(add_bundle, tmp_path, _ADD))
    assert session.backend == "wasm"
    sizes = []
    for n in (1, 3, 5000, 2, 5000):
        x = rand(n, 4, seed=n)
        np.testing.assert_array_equal(session.run({"x": x})["y"], x + _W)
        sizes.append(session.memory_bytes)
    assert sizes[2] > sizes[1]  # 5000 rows needed more memory
    assert sizes[4] == sizes[2]  # and the same inputs again need no more
    assert session.last_dispatch_count == 1


def test_a_kernel_trap_names_the_call_site(add_bundle: Path, tmp_path: Path) -> None:
    session = WasmSession(variant(add_bundle, tmp_path, _OUT_OF_BOUNDS))
    with pytest.raises(RelaxwebError) as caught:
        session.run({"x": rand(2, 4)})
    message = str(caught.value)
    assert "y = add(x, const(\"w\"))" in message and "out of bounds memory access" in message
    assert "Traceback" not in message and "\n" not in message


def test_a_kernel_that_never_ends_is_stopped(add_bundle: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(wasm_backend, "KERNEL_SECONDS_PER_CALL", 1)
    session = WasmSession(variant(add_bundle, tmp_path, _FOREVER))
    with pytest.raises(RelaxwebError, match=r"call site 0 .* ran for more than 1 s and was stopped"):
        session.run({"x": rand(2, 4)})


def test_a_bundle_without_kernels_wasm_is_refused_with_the_reason(add_bundle: Path, tmp_path: Path) -> None:
    folder = variant(add_bundle, tmp_path, _ADD)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["wasm"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RelaxwebError, match="has no kernels.wasm .*no 'wasm' entry"):
        relaxweb.load(folder, backend="wasm")
    manifest["wasm"] = {"unavailable": "kernel 3 (unique) has no WebAssembly version yet"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RelaxwebError, match=r"has no kernels.wasm: kernel 3 \(unique\) has no WebAssembly version yet"):
        relaxweb.load(folder, backend="wasm")


def test_a_damaged_kernels_wasm_is_refused(add_bundle: Path, tmp_path: Path) -> None:
    folder = variant(add_bundle, tmp_path, _ADD)
    (folder / "kernels.wasm").write_bytes(wasmtime.wat2wasm('(module (import "env" "memory" (memory 1 65536)))'))
    with pytest.raises(RelaxwebError, match="does not export k0_units, k0: the bundle is damaged"):
        WasmSession(folder)
    (folder / "kernels.wasm").write_bytes(b"\0asm\x01\0\0\0garbage")
    with pytest.raises(RelaxwebError, match="kernels.wasm cannot be loaded"):
        WasmSession(folder)


def test_the_kernels_with_relaxed_simd_run_where_wasmtime_has_it_and_the_plain_ones_when_asked(tmp_path: Path) -> None:
    """A matmul's kernels.wasm has relaxed multiply-adds (cpu/relaxed_simd.py); a session runs
    them by default, lowered to plain SIMD128 with relaxed_simd=False, and both give the product."""
    w = rand(24, 40, seed=1)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["n", 24])], ["y"],
                       {"w": w})
    bundle = relaxweb.build(model, tmp_path / "mm")
    assert bundle.load(backend="wasm", relaxed_simd=False).relaxed_simd is False  # the Bundle's load passes it on
    x = rand(9, 24)
    results = {}
    for wanted, runs in ((None, True), (True, True), (False, False)):
        session = relaxweb.load(tmp_path / "mm", backend="wasm", relaxed_simd=wanted)
        assert session.relaxed_simd is runs
        results[wanted] = session.run({"x": x})["y"]
        assert_close(results[wanted], x @ w, F32)
    np.testing.assert_array_equal(results[None], results[True])  # one module, one machine: the same bits
    with pytest.raises(ValueError, match="relaxed_simd is a wasm option"):
        relaxweb.load(tmp_path / "mm", backend="webgpu", relaxed_simd=False)
    with pytest.raises(ValueError, match="relaxed_simd must be None"):
        WasmSession(tmp_path / "mm", relaxed_simd="yes")  # type: ignore[arg-type]


def test_a_weight_is_packed_at_load_into_its_region_and_read_there(tmp_path: Path, monkeypatch) -> None:
    """A matmul's weight gets a prepacked region (the manifest's ``wasm.prepacked``: its bytes
    and the params block its ``kK_pack`` runs on, the columns' and depth's size variables the
    call site's constants, the rows' 1); the session packs it at load, and the kernel's packed
    tier (9 rows and more) reads the panels there: the weight overwritten with zeros in the
    memory leaves its product as it was.  Past ``PREPACKED_LIMIT_BYTES`` a call site gets no
    region and its kernel packs per call."""
    w = rand(24, 40, seed=1)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["n", 24])], ["y"],
                       {"w": w})
    relaxweb.build(model, tmp_path / "mm")
    manifest = json.loads((tmp_path / "mm" / "manifest.json").read_text())
    [region] = manifest["wasm"]["prepacked"]
    assert (region["call_site"], region["bytes"]) == (0, 16 + 5 * 8 * 24 * 4)  # 40 columns: 5 blocks of 8
    session = relaxweb.load(tmp_path / "mm", backend="wasm")
    backend = session._backend
    address, size = backend._prepacked_regions[0]
    assert np.frombuffer(backend._read(address, 8), np.uint32).tolist() == [1, size]
    for rows in (2, 9, 33):  # 2: the matrix-vector tier, which reads the weight as it is
        x = rand(rows, 24, seed=rows)
        assert_close(session.run({"x": x})["y"], x @ w, F32)
    backend._memory.write(backend._store, bytes(w.nbytes), backend._weight_addresses[0])
    x = rand(12, 24, seed=5)
    assert_close(session.run({"x": x})["y"], x @ w, F32)  # the panels, not the zeroed weight
    monkeypatch.setattr(wasm_backend, "PREPACKED_LIMIT_BYTES", 0)
    unpacked = relaxweb.load(tmp_path / "mm", backend="wasm")
    assert unpacked._backend._prepacked_regions == {}
    assert_close(unpacked.run({"x": x})["y"], x @ w, F32)


def test_a_bundle_without_relaxed_kernels_runs_the_plain_ones_and_refuses_relaxed_simd_true(add_bundle: Path,
                                                                                               tmp_path: Path) -> None:
    folder = variant(add_bundle, tmp_path, _ADD)  # its manifest's wasm entry counts no relaxed_madd_sites
    assert WasmSession(folder).relaxed_simd is False
    with pytest.raises(RelaxwebError, match="relaxed_simd=True, but the bundle's kernels use no relaxed SIMD"):
        WasmSession(folder, relaxed_simd=True)


def test_kept_outputs_stay_in_the_session_and_go_back_as_inputs(add_bundle: Path, tmp_path: Path) -> None:
    session = WasmSession(variant(add_bundle, tmp_path, _ADD))
    x = rand(2, 4)
    y = session.run({"x": x}, keep_on_gpu=True)["y"]
    assert isinstance(y, WasmTensor) and y.cache_view is None and (y.shape, y.nbytes) == ((2, 4), 32)
    assert session.stats.last_run.bytes_read == 32  # its copy, made at the run's end
    np.testing.assert_array_equal(y.numpy(), x + _W)
    np.testing.assert_array_equal(session.run({"x": y})["y"], x + 2 * _W)  # given back: written as the input
    assert session.stats.last_run.input_bytes_written == 32
    y.dispose()
    with pytest.raises(RelaxwebError, match="input 'x': tensor 'y' was disposed"):
        session.run({"x": y})
    with pytest.raises(RelaxwebError, match="keep_on_gpu names unknown output 'z'"):
        session.run({"x": x}, keep_on_gpu=["z"])
    with pytest.raises(RelaxwebError, match="this bundle cannot generate: it has no input 'input_ids'"):
        session.generate("hello")
    with pytest.raises(ValueError, match="device and kernels are WebGPU options"):
        relaxweb.load(tmp_path / "add", backend="wasm", device=object(), kernels="cpu")


def test_profile_rows_time_each_kernel_call(add_bundle: Path, tmp_path: Path) -> None:
    session = WasmSession(variant(add_bundle, tmp_path, _ADD))
    x = rand(64, 4)
    profile = session.profile({"x": x})
    np.testing.assert_array_equal(profile.outputs["y"], x + _W)
    assert [(row.kernel, row.calls) for row in profile.rows] == [("add", 1)]
    assert profile.rows[0].flops == 64 * 4 and profile.dispatches == 1
    assert "wall clock per kernel call" in profile.table()


@pytest.mark.gpu
def test_input_errors_are_the_webgpu_sessions(add_bundle: Path, tmp_path: Path) -> None:
    folder = variant(add_bundle, tmp_path, _ADD)
    sessions = [relaxweb.load(folder, backend="webgpu"), relaxweb.load(folder, backend="wasm")]
    cases = [{"x": np.zeros((2, 3), np.float32)}, {"x": np.zeros((2, 4), np.int32)}, {"x": np.zeros(4, np.float32)},
             {}, {"x": rand(2, 4), "z": rand(1)}]
    for inputs in cases:
        messages = []
        for session in sessions:
            with pytest.raises(InputShapeError) as caught:
                session.run(inputs)
            messages.append(str(caught.value))
        assert messages[0] == messages[1], inputs


@pytest.mark.gpu
def test_auto_is_webgpu_here_and_wasm_where_no_adapter_meets_the_limits(add_bundle: Path, tmp_path: Path) -> None:
    folder = variant(add_bundle, tmp_path, _ADD)
    assert relaxweb.load(folder).backend == "webgpu"
    # a limit no adapter offers: the honest "WebGPU cannot run this" on a machine that has one
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["required_limits"] = {**manifest.get("required_limits", {}), "maxComputeWorkgroupsPerDimension": 2**31 - 1}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    session = relaxweb.load(folder)
    assert session.backend == "wasm"
    x = rand(3, 4)
    np.testing.assert_array_equal(session.run({"x": x})["y"], x + _W)
    with pytest.raises(RelaxwebError, match="WebGPU limit maxComputeWorkgroupsPerDimension"):
        relaxweb.load(folder, backend="webgpu")
    del manifest["wasm"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RelaxwebError, match=r"cannot run the bundle: the WebGPU adapter .* maxComputeWorkgroupsPerDimension"
                                            r" .*, and the bundle .* has no kernels.wasm"):
        relaxweb.load(folder)


def test_cli_runs_on_the_wasm_backend(add_bundle: Path, tmp_path: Path, capsys) -> None:
    folder = variant(add_bundle, tmp_path, _ADD)
    x = rand(3, 4)
    np.savez(tmp_path / "in.npz", x=x)
    capsys.readouterr()
    assert cli_main(["run", str(folder), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"),
                     "--backend", "wasm"]) == 0
    assert "ran in Python runtime (kernels.wasm on wasmtime)" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], x + _W)
    assert cli_main(["run", str(folder), "--inputs", str(tmp_path / "in.npz"), "--backend", "wasm",
                     "--kernels", "cpu"]) == 2
    assert "--kernels picks WebGPU shaders" in capsys.readouterr().err


# Bundles relaxweb builds, against onnxruntime ----------------------------------------------


def nonzero_model() -> onnx.ModelProto:
    """A shape known only at run time: NonZero's count is read back, then the positions of
    the nonzeros feed more kernels (storages grow between the steps of one run)."""
    nodes = [helper.make_node("NonZero", ["x"], ["where"]),
             helper.make_node("Transpose", ["where"], ["pairs"], perm=[1, 0]),
             helper.make_node("Cast", ["pairs"], ["positions"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["positions", "positions"], ["squares"])]
    return make_model(nodes, [("x", ["n", 3])], [("pairs", TensorProto.INT64), "squares"])


def assert_like_onnxruntime(model: onnx.ModelProto, outputs: dict, feeds: dict) -> None:
    for output, want in zip(model.graph.output, onnxruntime_outputs(model, feeds)):
        got = outputs[output.name]
        assert got.shape == want.shape and got.dtype == want.dtype, output.name
        assert_close(got, want, F32, err_msg=output.name)


def test_values_read_back_match_onnxruntime(tmp_path: Path) -> None:
    model = nonzero_model()
    session = relaxweb.load(relaxweb.build(model, tmp_path).path, backend="wasm")
    for n, seed in ((5, 1), (3000, 2), (1, 3), (64, 4)):
        x = np.round(rand(n, 3, seed=seed)).astype(np.float32)  # about half zeros
        assert_like_onnxruntime(model, session.run({"x": x}), {"x": x})
        assert session.last_read_count == 1
