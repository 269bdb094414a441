"""The example MLP compiled once and run in headless Chromium on WebGPU (SwiftShader).

One build with ``--bound batch=64``; batch 1 and 5 must match onnxruntime, and wrong shapes
must be rejected in the page by the host module's checks with a message naming the input,
the dimension, the value and the bound (or the expected value).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from examples.make_mlp import make_mlp
from relaxweb.browser import run_in_browser
from relaxweb.compiler import build_bundle
from relaxweb.errors import InputShapeError
from tests.helpers import MODEL, assert_close, rand
from tests.runtime_js.test_browser import pytestmark as browser_marks

pytestmark = browser_marks


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("mlp")
    model_path = folder / "mlp.onnx"
    onnx.save(make_mlp(), str(model_path))
    build_bundle(model_path, folder / "dist", {"batch": 64})
    return model_path, folder / "dist"


@pytest.mark.parametrize("batch", [1, 5])
def test_mlp_matches_onnxruntime_in_chromium(mlp, batch):
    model_path, bundle = mlp
    x = rand(batch, 64, seed=batch)
    expected = onnxruntime.InferenceSession(str(model_path)).run(None, {"x": x})[0]
    outputs = run_in_browser(bundle, {"x": x})
    assert outputs["probabilities"].shape == (batch, 10)
    assert_close(outputs["probabilities"], expected, MODEL)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((65, 64), "input 'x': dimension 0 (batch) is 65, above its bound batch <= 64"),
        ((5, 63), "input 'x': dimension 1 is 63, expected 64"),
    ],
)
def test_wrong_shape_is_rejected_in_the_page(mlp, shape, message):
    _, bundle = mlp
    with pytest.raises(InputShapeError) as caught:
        run_in_browser(bundle, {"x": np.zeros(shape, np.float32)})
    assert str(caught.value) == message


def test_cli_browser_run_reports_bound_error(mlp, tmp_path):
    _, bundle = mlp
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.zeros((65, 64), np.float32))
    result = subprocess.run(
        [sys.executable, "-m", "relaxweb", "run", str(bundle), "--inputs", str(inputs), "--browser"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: input 'x': dimension 0 (batch) is 65, above its bound batch <= 64"]
