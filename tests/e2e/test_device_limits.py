"""What a WebGPU device offers by default, and models that reach it.

1. **Kernels fit the bindings.** A kernel may bind at most 8 storage buffers
   (``ir/launch.MAX_STORAGE_BINDINGS``, WebGPU's default ``maxStorageBuffersPerShaderStage``):
   a Concat of more inputs than one kernel can read becomes a tree of concats
   (``passes/split_wide_concats.py``), and a Sum of many inputs stays a chain that fusion
   keeps within the limit.  They build and match onnxruntime on WebGPU and on wasm, with
   static and with symbolic shapes (the captcha CRNN's unrolled LSTM concatenates 20 steps).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

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
