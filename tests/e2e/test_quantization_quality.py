"""Compressed weights on a trained language model: ``scripts/measure_quantization.py`` at a
smaller scale (the full run, 200 steps on the tiny Llama and a GPT-2-small-shaped model, is
in ``docs/benchmarks.md``, "Compressed weights").

The tiny Llama of ``scripts/tiny_llama.py`` (trained once into ``.cache/tiny-llama/``, ~3 min
on one core, hence ``slow``): its bundles' weight bytes against the float32 bundle's, and the
int8 bundle on wgpu decoding 30 steps of the float32 model's greedy continuation with its KV
cache (teacher-forced) against onnxruntime's float32 tokens.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from relaxweb.passes.compress_weights import dequantized

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "measure_quantization.py"
STEPS = 30


@pytest.fixture(scope="module")
def measure():
    """scripts/measure_quantization.py as a module (it imports torch and scripts/tiny_llama.py)."""
    spec = importlib.util.spec_from_file_location("measure_quantization", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("measure_quantization", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_tiny_llama_int8_agrees_with_float32_and_the_bundles_shrink(measure, device, tmp_path) -> None:
    """Measured: int8 30/30 tokens (200 steps: see docs/benchmarks.md); bytes int4 0.150x,
    int8 0.267x, float16 0.501x.  The bundle's logits equal onnxruntime's run with the weights
    the bundle decodes within float32 rounding (measured 4e-6; a wrong decode is off by the
    quantization error itself, ~0.02 for int8)."""
    (name, path, config, prompt, _, _), = measure.models(["tiny-llama"], STEPS, 0)
    result = measure.measure_model(name, path, config, prompt, STEPS, STEPS, ("int8",), tmp_path, device=device)
    formats = result["formats"]
    assert formats["int4"]["bytes_ratio"] <= 0.17 and formats["int8"]["bytes_ratio"] <= 0.27
    assert formats["float16"]["bytes_ratio"] <= 0.51
    gpu = formats["int8"]["gpu"]
    assert gpu["steps"] == STEPS and gpu["agreement"] >= 0.95, gpu
    assert formats["int8"]["gpu_vs_onnxruntime_logits"] < 1e-3
    assert formats["int8"]["onnxruntime"]["agreement"] >= 0.95


@pytest.mark.parametrize("fmt,bound", [("float16", 2 ** -11), ("int8", 0.5 / 127), ("int4", 0.5 / 15)])
def test_dequantized_is_within_half_a_step_of_each_group_and_what_the_pass_packs(fmt, bound) -> None:
    """Rounding to the nearest level: each value moves by at most half a quantization step
    (int8: max|w| / 127, symmetric; int4: the range [min(w, 0), max(w, 0)] over 15 steps), times
    1.01 for the scale's rounding to float16; float16 is numpy's rounding."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((70, 6)).astype(np.float32)
    decoded = dequantized(weight, fmt, axis=0)
    assert decoded.shape == weight.shape and decoded.dtype == np.float32
    if fmt == "float16":
        np.testing.assert_array_equal(decoded, weight.astype(np.float16).astype(np.float32))
        return
    for start in range(0, 70, 32):
        group = weight[start:start + 32]
        span = (np.abs(group).max(axis=0) if fmt == "int8"
                else np.maximum(group.max(axis=0), 0) - np.minimum(group.min(axis=0), 0))
        error = np.abs(decoded[start:start + 32] - group).max(axis=0)
        assert np.all(error <= span * bound * 1.01), (error, span * bound)
