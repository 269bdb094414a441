"""Weights above one WebGPU binding, bound as parts (docs/bundle-format.md, "Weights in parts").

A weight above the split size (128 MiB, WebGPU's guaranteed ``maxStorageBufferBindingSize``;
lowered here with ``PassContext(binding_split_bytes=...)``) is bound to the kernels that read
it as several parts, and each runtime decides at load, from the device's limits (or the
``limits`` option), whether to bind it whole or split.  The small model here has three 1 MiB
weights split at 256 KiB (a gather with a fused add, a tiled matmul and its CPU variant, a
vectorized elementwise add); GPT-2 small's 154 MB embedding and LM head are the real case
(lavapipe binds at most 128 MiB).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.browser import run_many_in_browser
from relaxweb.ir.launch import binding_parts, smallest_part_bytes
from relaxweb.passes.context import PassContext
from relaxweb.runtime.manifest import manifest_problem
from relaxweb.runtime.webgpu import parts_at_limit
from tests.helpers import (F32, F32_LOOSE, MODEL, assert_close, in_the_browser, js_manifest_problems, make_model,
                           onnxruntime_outputs, rand)
from tests.model_exports import ROOT, export_models, missing_exporter_packages

SPLIT = 256 * 1024  # the split size of the small model: its 1 MiB weights become 4 parts
ROWS = 1024  # each weight is 1024 x 256 float32 (1 MiB)


def small_model() -> onnx.ModelProto:
    """y = (table[ids] + row) @ w (a gather with a fused add, then a tiled matmul), z = x + bias
    (a vectorized add), with table, w and bias 1 MiB each."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"]),
             helper.make_node("Add", ["rows", "row"], ["hidden"]),
             helper.make_node("MatMul", ["hidden", "w"], ["y"]),
             helper.make_node("Add", ["x", "bias"], ["z"])]
    weights = {"table": rand(ROWS, 256, seed=1), "w": rand(256, ROWS, seed=2), "bias": rand(ROWS, 256, seed=3),
               "row": rand(256, seed=4)}
    return make_model(nodes, [("ids", TensorProto.INT64, ["n"]), ("x", [ROWS, 256])], ["y", "z"], weights)


def small_inputs() -> dict[str, np.ndarray]:
    # the first and last rows of the table, and rows in every part
    return {"ids": np.array([0, ROWS - 1, 300, 511, 512, 700, 3], np.int64), "x": rand(ROWS, 256, seed=5)}


def build_split(model: onnx.ModelProto, out: Path, split_bytes: int, bounds: dict[str, int]) -> Path:
    """``model`` built into ``out`` with weights bound in parts of at most ``split_bytes``."""
    with PassContext(binding_split_bytes=split_bytes):
        relaxweb.build(model, out, bounds=bounds)
    return out


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory) -> Path:
    return build_split(small_model(), tmp_path_factory.mktemp("split") / "bundle", SPLIT, {"n": 64})


def check_small_outputs(outputs: dict[str, np.ndarray]) -> None:
    y, z = onnxruntime_outputs(small_model(), small_inputs())
    assert_close(outputs["y"], y, F32_LOOSE)  # a 256-term dot product per element
    assert_close(outputs["z"], z, F32)


# The compiler ---------------------------------------------------------------------------------


def test_part_counts_and_sizes() -> None:
    assert [binding_parts(n, SPLIT) for n in (0, SPLIT, SPLIT + 1, 4 * SPLIT)] == [1, 1, 2, 4]
    assert binding_parts(154389504) == 2  # GPT-2 small's embedding at WebGPU's 128 MiB
    assert smallest_part_bytes(1000, 1) == 1000
    assert smallest_part_bytes(154389504, 2) == 77194752  # half, rounded up to 256 bytes
    # what the runtimes bind: the whole weight when it fits, else parts of the limit (rounded
    # down to 256 bytes) and the rest; None when the bundle's parts are too few
    assert parts_at_limit(1 << 20, 4, 1 << 30) == [1 << 20]
    assert parts_at_limit(1 << 20, 4, 300 * 1024) == [307200, 307200, 307200, 126976]
    assert parts_at_limit(1 << 20, 4, 300 * 1024 + 100) == [307200, 307200, 307200, 126976]
    assert parts_at_limit(1 << 20, 4, 200 * 1024) is None
    with pytest.raises(ValueError, match="multiple of 256"):
        PassContext(binding_split_bytes=1000)


def test_the_bundle_binds_large_weights_in_parts(small_bundle: Path) -> None:
    manifest = json.loads((small_bundle / "manifest.json").read_text())
    parts = {w["name"]: w.get("parts", 1) for w in manifest["weights"]}
    assert parts == {"table": 4, "w": 4, "bias": 4, "row": 1}
    kernels = {k["name"]: k for k in manifest["kernels"]}
    assert set(kernels) == {"fused_take__add_parts", "matmul_parts", "add1_parts"}
    assert "cpu_file" in kernels["matmul_parts"]
    for kernel in kernels.values():
        source = (small_bundle / kernel["file"]).read_text()
        assert "arrayLength(&" in source and "_part3" in source
    bias = next(i for i, w in enumerate(manifest["weights"]) if w["name"] == "bias")
    add_site = next(s for s in manifest["call_sites"] if manifest["kernels"][s["kernel"]]["name"] == "add1_parts")
    assert [b for b in add_site["buffers"] if "weight_part" in b] == [{"weight_part": [bias, k]} for k in range(4)]
    assert "vec4<f32>" in (small_bundle / kernels["add1_parts"]["file"]).read_text()  # vectorized: vec4 parts
    # a device needs to bind a quarter of each weight (the storages at the bounds are larger here)
    assert manifest["required_limits"]["maxStorageBuffersPerShaderStage"] == 8  # the take's run status too


def test_a_build_at_the_default_split_size_has_no_parts(tmp_path: Path) -> None:
    manifest = relaxweb.build(small_model(), tmp_path / "bundle", bounds={"n": 64}).manifest
    assert all("parts" not in w for w in manifest["weights"])
    # the gather merges into the matmul's prologue here; with table and w in 4 parts each that
    # kernel would bind 10 storage buffers, so the split build keeps them apart
    assert {k["name"] for k in manifest["kernels"]} == {"fused_take__matmul", "add1"}
    assert all({"weight", "storage", "status"} & set(b) for s in manifest["call_sites"] for b in s["buffers"])
    assert not any("arrayLength" in (tmp_path / "bundle" / k["file"]).read_text() for k in manifest["kernels"])


def test_a_weight_in_more_parts_than_a_kernel_can_bind_is_a_build_error(tmp_path: Path) -> None:
    # 1 MiB in parts of 64 KiB is 16 bindings: more than WebGPU's default 8 per kernel
    with PassContext(binding_split_bytes=64 * 1024), pytest.raises(
            relaxweb.UnsupportedModelError, match=r"reads 'table' \(1048576 bytes\) in 16 parts: its kernel would need "
            r"19 storage bindings, above WebGPU's default of 8 \(a weight is bound in parts of at most 65536 bytes\)"):
        relaxweb.build(small_model(), tmp_path / "bundle", bounds={"n": 64})
    assert not (tmp_path / "bundle").exists()


def test_fusion_counts_each_part_as_a_binding(tmp_path: Path) -> None:
    """x + a + b is one kernel of 4 bindings; with a and b in 4 parts each it would need 10
    storage bindings (WebGPU's default is 8), so it stays two kernels."""
    nodes = [helper.make_node("Add", ["x", "a"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
    model = make_model(nodes, [("x", [ROWS, 256])], ["y"], {"a": rand(ROWS, 256, seed=1), "b": rand(ROWS, 256, seed=2)})
    whole = relaxweb.build(model, tmp_path / "whole").manifest
    with PassContext(binding_split_bytes=SPLIT):
        split = relaxweb.build(model, tmp_path / "split").manifest
    assert len(whole["call_sites"]) == 1
    assert len(split["call_sites"]) == 2
    assert split["required_limits"]["maxStorageBuffersPerShaderStage"] <= 8


# The Python runtime ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
@pytest.mark.parametrize("limits, sizes", [
    (None, [1 << 20]),  # lavapipe binds 1 MiB: whole, the other parts placeholders
    ({"maxStorageBufferBindingSize": SPLIT}, [SPLIT] * 4),
    ({"maxBufferSize": 300 * 1024}, [307200, 307200, 307200, 126976]),  # parts of uneven size
])
def test_weights_in_parts_match_onnxruntime(small_bundle: Path, kernels: str, limits, sizes) -> None:
    session = relaxweb.load(small_bundle, kernels=kernels, limits=limits)
    assert session.kernels == kernels
    assert session.weight_part_sizes == {"table": sizes, "w": sizes, "bias": sizes}
    check_small_outputs(session.run(small_inputs()))


@pytest.mark.gpu
def test_a_device_that_needs_more_parts_than_the_bundle_has_is_refused(small_bundle: Path) -> None:
    with pytest.raises(relaxweb.RelaxwebError, match=r"^weight 'table' has 1048576 bytes, above the device's WebGPU "
                       r"limit maxStorageBufferBindingSize = 4096, and the bundle binds it in at most 4 parts$"):
        relaxweb.load(small_bundle, limits={"maxStorageBufferBindingSize": 4096})
    with pytest.raises(ValueError, match="limits may lower"):
        relaxweb.load(small_bundle, limits={"maxComputeWorkgroupSizeX": 4096})


# The browser runtime -----------------------------------------------------------------------------

#: Runs in the runner page: load with `options`, run once, return the weights' part sizes and the outputs.
PART_SIZES_IN_PAGE = """
async (options) => {
  try {
    const model = await window.relaxweb.load("/bundle/", options);
    const sizes = model.weightPartSizes;
    model.dispose();
    return sizes;
  } catch (error) {
    return { error: error.message };
  }
}
"""


@in_the_browser
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_weights_in_parts_match_onnxruntime_in_the_browser(small_bundle: Path, kernels: str) -> None:
    limits = {"maxStorageBufferBindingSize": SPLIT}
    (outputs,) = run_many_in_browser(small_bundle, [small_inputs()], load_options={"kernels": kernels, "limits": limits})
    check_small_outputs(outputs)
    with relaxweb.browser.open_runner_page(small_bundle) as page:
        weights = ("table", "w", "bias")
        assert page.evaluate(PART_SIZES_IN_PAGE, {"limits": limits}) == {name: [SPLIT] * 4 for name in weights}
        assert page.evaluate(PART_SIZES_IN_PAGE, {}) == {name: [1 << 20] for name in weights}
        assert page.evaluate(PART_SIZES_IN_PAGE, {"limits": {"maxBufferSize": 4096}}) == {"error": (
            "weight 'table' has 1048576 bytes, above the device's WebGPU limit maxBufferSize = 4096, "
            "and the bundle binds it in at most 4 parts")}


# Tampered manifests --------------------------------------------------------------------------------


def test_tampered_parts_are_refused_alike_by_both_runtimes(small_bundle: Path, tmp_path: Path) -> None:
    manifest = json.loads((small_bundle / "manifest.json").read_text())
    site = next(i for i, s in enumerate(manifest["call_sites"]) if any("weight_part" in b for b in s["buffers"]))
    position = next(i for i, b in enumerate(manifest["call_sites"][site]["buffers"]) if "weight_part" in b)
    weight = manifest["call_sites"][site]["buffers"][position]["weight_part"][0]
    where = f"call_sites[{site}].buffers[{position}]"

    def tampered(edit) -> dict:
        copied = copy.deepcopy(manifest)
        edit(copied)
        return copied

    def set_buffer(value):
        return lambda m: m["call_sites"][site]["buffers"].__setitem__(position, value)

    cases = {
        f"{where}.weight_part: weight {weight} has no part 4": set_buffer({"weight_part": [weight, 4]}),
        f"{where}.weight_part: weight 99 has no part 0": set_buffer({"weight_part": [99, 0]}),
        f"{where}.weight: weight {weight} is bound in parts (weight_part)": set_buffer({"weight": weight}),
        f"{where}.weight_part: has 1 items, expected 2": set_buffer({"weight_part": [weight]}),
        f"weights[{weight}].parts: 65 is outside 1..64": lambda m: m["weights"][weight].__setitem__("parts", 65),
        f"weights[{weight}].parts: 0 is outside 1..64": lambda m: m["weights"][weight].__setitem__("parts", 0),
    }
    manifests = [tampered(edit) for edit in cases.values()]
    python_problems = [manifest_problem(m) for m in manifests]
    assert manifest_problem(manifest) is None
    assert python_problems == list(cases)
    if shutil.which("node") is None:
        pytest.skip("node is not installed (scripts/test.sh installs it)")
    assert js_manifest_problems(manifests, tmp_path) == python_problems


# GPT-2 small: a 154 MB embedding and LM head on a device binding 128 MiB -------------------------

GPT2_SMALL_CACHE = ROOT / ".cache" / "gpt2-small"  # the export (~650 MB), made once and kept
LAVAPIPE_BINDING = 128 * 1024 * 1024


@pytest.fixture(scope="module")
def gpt2_small(tmp_path_factory) -> tuple[Path, Path]:
    """GPT-2 small (random weights) exported once into .cache, and its bundle."""
    missing = missing_exporter_packages()
    if missing:
        pytest.skip(f"exporting GPT-2 small needs {', '.join(missing)}")
    model = GPT2_SMALL_CACHE / "gpt2_small.onnx"
    if not (model.exists() and (GPT2_SMALL_CACHE / "gpt2_small.json").exists()):
        export = export_models(GPT2_SMALL_CACHE, ["gpt2_small"], timeout=900)["gpt2_small"]
        assert export.error is None, export.error
    bundle = tmp_path_factory.mktemp("gpt2-small") / "bundle"
    relaxweb.build(model, bundle, bounds={"batch": 2, "seq": 32})
    return model, bundle


def gpt2_runs() -> list[dict[str, np.ndarray]]:
    generator = np.random.default_rng(0)
    return [{"input_ids": generator.integers(0, 50257, shape).astype(np.int64)} for shape in ((1, 8), (2, 3))]


@pytest.mark.slow
@pytest.mark.gpu
def test_gpt2_small_matches_onnxruntime_on_the_python_runtime(gpt2_small) -> None:
    model, bundle = gpt2_small
    manifest = json.loads((bundle / "manifest.json").read_text())
    in_parts = {w["name"]: w["nbytes"] for w in manifest["weights"] if w.get("parts", 1) > 1}
    assert sorted(in_parts.values()) == [50257 * 768 * 4] * 2  # the embedding and the LM head
    session = relaxweb.load(bundle)
    limit = min(session.device.limits["max-storage-buffer-binding-size"], session.device.limits["max-buffer-size"])
    if limit >= max(in_parts.values()):  # a device binding more than 128 MiB: split as if it did not
        session = relaxweb.load(bundle, limits={"maxStorageBufferBindingSize": LAVAPIPE_BINDING})
    split = {name: [LAVAPIPE_BINDING, nbytes - LAVAPIPE_BINDING] for name, nbytes in in_parts.items()}
    assert session.weight_part_sizes == split
    for inputs in gpt2_runs():
        (expected,) = onnxruntime_outputs(model, inputs)
        assert_close(session.run(inputs)["logits"], expected, MODEL)


@pytest.mark.slow
@in_the_browser
def test_gpt2_small_matches_onnxruntime_in_the_browser_at_128_mib(gpt2_small) -> None:
    model, bundle = gpt2_small
    runs = gpt2_runs()
    limits = {"maxStorageBufferBindingSize": LAVAPIPE_BINDING}
    outputs = run_many_in_browser(bundle, runs, timeout_s=600, load_options={"limits": limits})
    for inputs, got in zip(runs, outputs):
        (expected,) = onnxruntime_outputs(model, inputs)
        assert_close(got["logits"], expected, MODEL)


# An int64 weight in parts ----------------------------------------------------------------------
#
# Its shard holds int64 (8 bytes an element, the wasm form); its parts count the GPU's int32 form
# (4 bytes an element): the WebGPU runtimes narrow it, then split the narrowed bytes.

INT64_ROWS = 1024  # a 1024 x 64 int64 table: 256 KiB on the GPU, 512 KiB in its shard
INT64_SPLIT = 64 * 1024


def int64_table_model() -> onnx.ModelProto:
    """y = table[ids] + 1 on an int64 table within int32 (values in every part, negatives too)."""
    table = (np.arange(INT64_ROWS * 64, dtype=np.int64).reshape(INT64_ROWS, 64) * 7919 % 4_000_000_001) - 2_000_000_000
    return make_model([helper.make_node("Gather", ["table", "ids"], ["rows"]), helper.make_node("Add", ["rows", "one"], ["y"])],
                      [("ids", TensorProto.INT64, ["n"])], [("y", TensorProto.INT64, ["n", 64])],
                      {"table": table, "one": np.array(1, np.int64)})


INT64_IDS = np.array([0, INT64_ROWS - 1, 255, 256, 600, 3], np.int64)


@pytest.fixture(scope="module")
def int64_bundle(tmp_path_factory) -> Path:
    return build_split(int64_table_model(), tmp_path_factory.mktemp("split_int64") / "bundle", INT64_SPLIT, {"n": 16})


@pytest.mark.gpu
def test_an_int64_weight_in_parts_is_split_from_its_narrowed_bytes(int64_bundle: Path) -> None:
    manifest = json.loads((int64_bundle / "manifest.json").read_text())
    (table,) = [w for w in manifest["weights"] if w["name"] == "table"]
    assert (table["nbytes"], table["parts"]) == (INT64_ROWS * 64 * 8, 4)  # parts of the 256 KiB the GPU holds
    (expected,) = onnxruntime_outputs(int64_table_model(), {"ids": INT64_IDS})
    for limits, sizes in ((None, [INT64_ROWS * 64 * 4]), ({"maxStorageBufferBindingSize": INT64_SPLIT}, [INT64_SPLIT] * 4)):
        session = relaxweb.load(int64_bundle, backend="webgpu", limits=limits)
        assert session.weight_part_sizes == {"table": sizes}
        np.testing.assert_array_equal(session.run({"ids": INT64_IDS})["y"], expected)
    np.testing.assert_array_equal(relaxweb.load(int64_bundle, backend="wasm").run({"ids": INT64_IDS})["y"], expected)


@in_the_browser
def test_an_int64_weight_in_parts_in_the_browser(int64_bundle: Path) -> None:
    (expected,) = onnxruntime_outputs(int64_table_model(), {"ids": INT64_IDS})
    limits = {"maxStorageBufferBindingSize": INT64_SPLIT}
    (outputs,) = run_many_in_browser(int64_bundle, [{"ids": INT64_IDS}], load_options={"backend": "webgpu", "limits": limits})
    np.testing.assert_array_equal(outputs["y"], expected)
    with relaxweb.browser.open_runner_page(int64_bundle) as page:
        assert page.evaluate(PART_SIZES_IN_PAGE, {"backend": "webgpu", "limits": limits}) == {"table": [INT64_SPLIT] * 4}
