"""Kernels with a second shader for CPU adapters (``TargetSchedules.webgpu_cpu``, chosen by
relaxweb/passes/schedule_programs.py): which kernels get one, that both runtimes pick it on a
CPU adapter (lavapipe, SwiftShader) and can be told to take either, and that both shaders
compute what onnxruntime does."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from relaxweb import build, load
from relaxweb.browser import open_runner_page
from tests.helpers import MODEL, assert_close, make_model, onnxruntime_outputs, rand

ROWS, DEPTH, COLUMNS = 70, 33, 90  # not multiples of the 64 tiles: the edges are exercised


def matmul_and_convolution_model():
    """y = relu(x @ w + b) and z = conv3x3(image, k) with padding (an im2col gather whose
    padding test is a select): both get a CPU shader; s = softmax(x), not a matmul, does not."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["xwb"]),
             helper.make_node("Relu", ["xwb"], ["y"]),
             helper.make_node("Conv", ["image", "k"], ["z"], pads=[1, 1, 1, 1]),
             helper.make_node("Softmax", ["x"], ["s"])]
    initializers = {"w": rand(DEPTH, COLUMNS, seed=1), "b": rand(COLUMNS, seed=2), "k": rand(8, 3, 3, 3, seed=3)}
    return make_model(nodes, [("x", ["rows", DEPTH]), ("image", [1, 3, 12, 10])], ["y", "z", "s"], initializers)


@pytest.fixture(scope="module")
def variant_bundle(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("variants")
    model = matmul_and_convolution_model()
    onnx.save(model, folder / "model.onnx")
    bundle = build(str(folder / "model.onnx"), str(folder / "bundle"), bounds={"rows": 128})
    (folder / "inspect.txt").write_text(str(bundle))  # what relaxweb inspect prints
    return folder


def feeds() -> dict[str, np.ndarray]:
    return {"x": rand(ROWS, DEPTH, seed=4), "image": rand(1, 3, 12, 10, seed=5)}


def test_matmuls_and_convolutions_get_a_cpu_shader(variant_bundle: Path) -> None:
    manifest = json.loads((variant_bundle / "bundle" / "manifest.json").read_text())
    with_variant = [k for k in manifest["kernels"] if "cpu_file" in k]
    assert len(manifest["kernels"]) > 2 and len(with_variant) == 2
    for kernel in with_variant:
        source = (variant_bundle / "bundle" / kernel["cpu_file"]).read_text()
        assert "register_matmul" in source and "var<workgroup>" not in source
        assert "var<workgroup> tile_a" in (variant_bundle / "bundle" / kernel["file"]).read_text()
    convolution = (variant_bundle / "bundle" / next(k for k in with_variant if "conv" in k["name"])["cpu_file"]).read_text()
    assert "select(" in convolution and "var sel" not in convolution  # the padding test does not branch
    sizes = {k["file"]: (variant_bundle / "bundle" / k.get("cpu_file", k["file"])).stat().st_size for k in manifest["kernels"]}
    assert (f"on a CPU adapter (SwiftShader, lavapipe) 2 of them compile their cpu_file instead: "
            f"{sum(sizes.values())} bytes of WGSL") in (variant_bundle / "inspect.txt").read_text()


@pytest.mark.gpu
def test_the_python_runtime_runs_both_shaders_like_onnxruntime(variant_bundle: Path) -> None:
    want = onnxruntime_outputs(variant_bundle / "model.onnx", feeds())
    assert load(variant_bundle / "bundle").kernels == "cpu"  # lavapipe is a CPU adapter
    for kernels in ("gpu", "cpu"):
        session = load(variant_bundle / "bundle", kernels=kernels)
        assert session.kernels == kernels
        got = session.run(feeds())
        assert_close(got["y"], want[0], MODEL)
        assert_close(got["z"], want[1], MODEL)
        assert_close(got["s"], want[2], MODEL)
    with pytest.raises(ValueError, match="kernels must be one of auto, gpu, cpu"):
        load(variant_bundle / "bundle", kernels="fast")


BOTH_VARIANTS_IN_PAGE = """
async ({ x, image }) => {
  const outcome = {};
  for (const kernels of ["auto", "gpu", "cpu"]) {
    const model = await window.relaxweb.load("/bundle/", { kernels });
    const outputs = await model.run({ x: { data: new Float32Array(x.data), shape: x.shape },
                                      image: { data: new Float32Array(image.data), shape: image.shape } });
    outcome[kernels] = { kernels: model.kernels, y: Array.from(outputs.y.data), z: Array.from(outputs.z.data) };
    model.dispose();
  }
  return outcome;
}
"""


@pytest.mark.browser
@pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed")
def test_the_browser_runtime_picks_the_cpu_shader_on_swiftshader(variant_bundle: Path) -> None:
    inputs = feeds()
    want = onnxruntime_outputs(variant_bundle / "model.onnx", inputs)
    arguments = {name: {"data": value.reshape(-1).tolist(), "shape": list(value.shape)} for name, value in inputs.items()}
    with open_runner_page(variant_bundle / "bundle") as page:
        outcome = page.evaluate(BOTH_VARIANTS_IN_PAGE, arguments)
    assert [outcome[k]["kernels"] for k in ("auto", "gpu", "cpu")] == ["cpu", "gpu", "cpu"]
    for kernels in ("gpu", "cpu"):
        assert_close(np.array(outcome[kernels]["y"], dtype=np.float32).reshape(want[0].shape), want[0], MODEL)
        assert_close(np.array(outcome[kernels]["z"], dtype=np.float32).reshape(want[1].shape), want[1], MODEL)
