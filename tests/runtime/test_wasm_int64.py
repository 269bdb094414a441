"""int64 on the Python wasm backend: kernels.wasm holds an int64 tensor as an 8-byte int64
(the manifest's ``wasm_dtype`` / ``wasm_bytes``, bundle format 3), so values beyond int32 go in
and come back exactly, where WebGPU holds int64 as int32 and refuses them.

The runtime's side is tested here on the hand-made int64 bundle (``write_int64_bundle``:
``z = (x + w) * 2``, every tensor int64) and its hand-written kernels.wasm (``INT64_KERNELS``:
i64 loads, adds, multiplies and stores), so these tests do not depend on the compiler's
kernels.  End to end through the compiler's kernels (which compute int64 as int64 in
kernels.wasm): ``test_int64_add_mul_like_onnxruntime`` below.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.runtime.wasm_session import WasmSession, WasmTensor
from tests.fixtures.handmade_bundle import (
    INT64_WEIGHT, edit_manifest, expected_int64_output, write_handmade_bundle, write_int64_bundle,
)
from tests.fixtures.handmade_wasm import HANDMADE_KERNELS, INT64_KERNELS, add_kernels_wasm
from tests.helpers import make_model, onnxruntime_outputs

#: Values beyond int32 (2^31, 2^40, near 2^62, the int64 extremes) and within it.
BEYOND_INT32 = np.array([[2**31, -2**31 - 1, 2**40, -2**40 + 3],
                         [2**62 + 1, -2**62, 2**63 - 1, -2**63],
                         [0, -1, 2**31 - 1, 7]], dtype=np.int64)


@pytest.fixture(scope="module")
def int64_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("int64") / "int64"
    write_int64_bundle(folder)
    add_kernels_wasm(folder, INT64_KERNELS)
    return folder


def test_int64_inputs_and_outputs_are_8_byte_int64_in_memory(int64_bundle: Path) -> None:
    session = WasmSession(int64_bundle)
    z = session.run({"x": BEYOND_INT32})["z"]
    assert z.dtype == np.int64
    np.testing.assert_array_equal(z, expected_int64_output(BEYOND_INT32))  # exact, wrapping as int64 does
    assert z[0, 2] == (2**40 + 2**31 - 1) * 2
    last = session.stats.last_run
    assert (last.input_bytes_written, last.bytes_read) == (BEYOND_INT32.size * 8, BEYOND_INT32.size * 8)


def test_an_int32_array_for_an_int64_input_is_widened(int64_bundle: Path) -> None:
    session = WasmSession(int64_bundle)
    x = np.array([[-1, -2**31, 2**31 - 1, 3]], dtype=np.int32)
    z = session.run({"x": x})["z"]
    np.testing.assert_array_equal(z, expected_int64_output(x))  # sign-extended, not read as pairs of int32
    assert session.stats.last_run.input_bytes_written == x.size * 8


def test_an_int64_weight_is_written_as_its_shard_holds_it(int64_bundle: Path) -> None:
    session = WasmSession(int64_bundle)
    # the shard holds w as int64 (32 bytes: elements x wasm_bytes), as the memory does
    assert json.loads((int64_bundle / "manifest.json").read_text())["weights"][0]["nbytes"] == 32
    assert session.stats.total.weight_bytes_written == 32
    z = session.run({"x": np.zeros((1, 4), np.int64)})["z"]
    np.testing.assert_array_equal(z, [2 * INT64_WEIGHT])  # -2^31 * 2 = -2^32: needs the high word's sign
    assert z[0, 3] == -2**32


def test_a_kept_int64_tensor_holds_int64_and_goes_back_as_an_input(int64_bundle: Path) -> None:
    session = WasmSession(int64_bundle)
    z = session.run({"x": BEYOND_INT32}, keep_on_gpu=["z"])["z"]
    assert isinstance(z, WasmTensor) and z.dtype == np.int64 and z.nbytes == BEYOND_INT32.size * 8
    assert z.device_data().dtype == np.int64  # as the memory holds it
    np.testing.assert_array_equal(z.numpy(), expected_int64_output(BEYOND_INT32))
    again = session.run({"x": z})["z"]  # given back: written as int64, no range check
    np.testing.assert_array_equal(again, expected_int64_output(expected_int64_output(BEYOND_INT32)))
    assert session.stats.last_run.input_bytes_written == BEYOND_INT32.size * 8


def test_batches_and_profiles_hold_int64_too(int64_bundle: Path) -> None:
    session = WasmSession(int64_bundle)
    instances = [{"x": BEYOND_INT32[:1]}, {"x": BEYOND_INT32}]
    for instance, result in zip(instances, session.run_batch(instances)):
        np.testing.assert_array_equal(result["z"], expected_int64_output(instance["x"]))
    profile = session.profile({"x": BEYOND_INT32})
    np.testing.assert_array_equal(profile.outputs["z"], expected_int64_output(BEYOND_INT32))


def test_other_int64_input_errors_stay(int64_bundle: Path) -> None:
    session = WasmSession(int64_bundle)
    with pytest.raises(InputShapeError, match=r"input 'x': expected int64 data \(a numpy array of dtype int64 or int32\), "
                                              "got an array of dtype float32"):
        session.run({"x": np.zeros((1, 4), np.float32)})
    with pytest.raises(InputShapeError, match="input 'x': dimension 1 is 3, expected 4"):
        session.run({"x": np.zeros((1, 3), np.int64)})


@pytest.mark.gpu
def test_webgpu_still_refuses_int64_beyond_int32_naming_the_input(int64_bundle: Path) -> None:
    session = relaxweb.load(int64_bundle, backend="webgpu")
    with pytest.raises(InputShapeError, match=r"input 'x': value 2147483648 at index \[0, 0\] does not fit in int32"):
        session.run({"x": BEYOND_INT32})
    x = np.array([[1, -2, 3, 2**30]], dtype=np.int64)
    np.testing.assert_array_equal(session.run({"x": x})["z"], (x + INT64_WEIGHT.astype(np.int32)).astype(np.int32) * 2)


# The manifest: format 3 -------------------------------------------------------------------


def _copy(bundle: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "bundle"
    shutil.copytree(bundle, folder)
    return folder


def test_a_version_2_bundle_is_refused_with_rebuild(int64_bundle: Path, tmp_path: Path) -> None:
    folder = _copy(int64_bundle, tmp_path)
    edit_manifest(folder, lambda manifest: manifest.update(version=2))
    with pytest.raises(RelaxwebError, match="has bundle format version 2; this runtime reads version 3 "
                                            r"\(rebuild the bundle with this relaxweb\)"):
        WasmSession(folder)


@pytest.mark.parametrize(("change", "problem"), [
    (lambda entry: entry.pop("wasm_bytes"), "dtypes[\"int64\"]: has no 'wasm_bytes'"),
    (lambda entry: entry.pop("wasm_dtype"), "dtypes[\"int64\"]: has no 'wasm_dtype'"),
    (lambda entry: entry.update(wasm_bytes=4), "dtypes[\"int64\"]: wasm_bytes 4 is not the size of its wasm_dtype int64 (8 bytes)"),
    (lambda entry: entry.update(wasm_bytes=16), "dtypes[\"int64\"].wasm_bytes: 16 is outside 2..8"),
])
def test_a_dtypes_entry_without_a_right_wasm_form_is_refused(int64_bundle: Path, tmp_path: Path, change,
                                                             problem: str) -> None:
    folder = _copy(int64_bundle, tmp_path)
    edit_manifest(folder, lambda manifest: change(manifest["dtypes"]["int64"]))
    with pytest.raises(RelaxwebError) as caught:
        WasmSession(folder)
    assert str(caught.value).endswith(f"manifest.json: {problem}")


def test_float32_bundles_are_held_as_before(tmp_path: Path) -> None:
    write_handmade_bundle(tmp_path / "f32")
    add_kernels_wasm(tmp_path / "f32", HANDMADE_KERNELS)
    session = WasmSession(tmp_path / "f32")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    session.run({"x": x})
    assert session.stats.total.weight_bytes_written == 16 and session.stats.last_run.input_bytes_written == 32


# End to end, through the compiler's kernels --------------------------------------------------


def int64_add_mul_model() -> onnx.ModelProto:
    """y = (x + 5) * 5 on int64 (an int64 Add and Mul of an input by constants)."""
    return make_model([helper.make_node("Add", ["x", "five"], ["s"]), helper.make_node("Mul", ["s", "five"], ["y"])],
                      [("x", TensorProto.INT64, ["n"])], [("y", TensorProto.INT64, ["n"])], {"five": np.array(5, np.int64)})


def test_int64_add_mul_like_onnxruntime(tmp_path: Path) -> None:
    model = int64_add_mul_model()
    relaxweb.build(model, tmp_path / "b")
    x = np.array([2**31 - 1, 2**31, -2**31 - 5, 2**40, -2**40 + 1, 3], dtype=np.int64)
    [expected] = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_array_equal(relaxweb.load(tmp_path / "b", backend="wasm").run({"x": x})["y"], expected)


def test_a_compiled_int64_weight_and_kept_output_like_onnxruntime(tmp_path: Path) -> None:
    """An int64 weight (int32 in the shard, widened at load) added to values beyond int32, the
    output kept and given back as the next run's input; WebGPU refuses those values."""
    w = np.array([5, -7, 2**31 - 1, -2**31], np.int64)
    model = make_model([helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Mul", ["s", "two"], ["y"])],
                       [("x", TensorProto.INT64, ["n", 4])], [("y", TensorProto.INT64, ["n", 4])],
                       {"w": w, "two": np.array(2, np.int64)})
    relaxweb.build(model, tmp_path / "b")
    session = relaxweb.load(tmp_path / "b", backend="wasm")
    x = np.array([[2**31, -2**31 - 1, 2**40, -2**40 + 3], [0, -1, 1, 2**33]], np.int64)
    y = session.run({"x": x}, keep_on_gpu=["y"])["y"]
    [expected] = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_array_equal(y.numpy(), expected)
    [twice] = onnxruntime_outputs(model, {"x": expected})
    np.testing.assert_array_equal(session.run({"x": y})["y"], twice)


def test_a_webgpu_entry_is_checked_alike_by_both_runtimes(int64_bundle: Path, tmp_path: Path) -> None:
    """The manifest's webgpu entry: {"unavailable": a string of at most 65536 characters}; and an
    int64 weight's nbytes counts 8 bytes an element (its shard's form), not the GPU's 4."""
    from relaxweb.runtime.manifest import manifest_problem  # noqa: PLC0415
    from tests.helpers import js_manifest_problems  # noqa: PLC0415

    base = json.loads((int64_bundle / "manifest.json").read_text())
    cases = [
        ({"webgpu": {"unavailable": "x" * 65536}}, None),
        ({"webgpu": {"unavailable": "x" * 65537}}, "webgpu.unavailable: a string of 65537 characters, at most 65536 allowed"),
        ({"webgpu": {"reason": "no"}}, "webgpu: has no 'unavailable'"),
        ({"weights": [{**base["weights"][0], "nbytes": 16}]}, "weights[0]: nbytes is 16, but its shape and dtype make 32"),
    ]
    manifests = [{**base, **change} for change, _ in cases]
    assert [manifest_problem(m) for m in manifests] == [problem for _, problem in cases]
    if shutil.which("node"):
        assert js_manifest_problems(manifests, tmp_path) == [problem for _, problem in cases]
