"""Real exported models compiled once and run in headless Chromium (WebGPU on SwiftShader).

The GPT-2-like and BERT-like models of scripts/export_test_models.py (tiny configs, random
weights from fixed seeds; TorchScript exporter; its exports committed in tests/data/test-models/),
each built ONCE with ``relaxweb.compiler.build_bundle``, and the one bundle is loaded once in the browser
and run at two shapes, (batch, seq) = (1, 8) and (2, 5); every output must match
onnxruntime (the MODEL tolerance of tests/helpers.py).  Their inputs are int64: they go to
the page as BigInt64Array.

A tiny hand-written ONNX model checks int64 through the whole browser path: int64 in and
out as BigInt64Array, and an input outside the int32 range rejected with the input's name.

Skipped when Playwright or Chromium is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb

from relaxweb.browser import open_runner_page, run_in_browser, run_many_in_browser
from relaxweb.compiler import build_bundle
from relaxweb.errors import InputShapeError
from tests.fixtures.melspectrogram import MEL_KERNEL, audio, melspectrogram_model
from tests.helpers import MODEL, assert_close, make_model, onnxruntime_outputs
from tests.model_exports import Export, committed_exports, export_script
from tests.runtime_js.test_browser import pytestmark as browser_marks

pytestmark = browser_marks

MODELS = ["gpt2_legacy", "bert_legacy"]
SHAPES = [{"batch": 1, "seq": 8}, {"batch": 2, "seq": 5}]
#: Build bounds: above both shapes, so one build serves them from buffers allocated at load.
BOUNDS = {"batch": 4, "seq": 16}


@pytest.fixture(scope="module")
def exports() -> dict[str, Export]:
    return committed_exports(MODELS)


@pytest.fixture(scope="module")
def bundles(exports: dict[str, Export], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One build per model, shared by every test of this module."""
    folder = tmp_path_factory.mktemp("browser-bundles")
    built = {}
    for name in MODELS:
        build_bundle(exports[name].path, folder / name, BOUNDS)
        built[name] = folder / name
    return built


@pytest.mark.parametrize("name", MODELS)
def test_one_build_matches_onnxruntime_at_two_shapes(exports, bundles, name: str) -> None:
    import onnxruntime as ort

    export = exports[name]
    runs = [export_script().make_inputs(export.sidecar["inputs"], dims, seed=sum(dims.values())) for dims in SHAPES]
    assert all(array.dtype == np.int64 for inputs in runs for array in inputs.values())
    reference = ort.InferenceSession(str(export.path), providers=["CPUExecutionProvider"])
    results = run_many_in_browser(bundles[name], runs, timeout_s=300)
    for dims, inputs, actual in zip(SHAPES, runs, results):
        expected = reference.run(None, inputs)
        for output, want in zip(reference.get_outputs(), expected):
            got = actual[output.name]
            assert got.shape == want.shape, f"{name} {output.name} at {dims}: shape {got.shape}, onnxruntime {want.shape}"
            assert got.dtype == want.dtype
            assert_close(got, want, MODEL, err_msg=f"{name} {output.name} at {dims}")


# int64 through the browser -------------------------------------------------------------------


def make_int64_model() -> onnx.ModelProto:
    """y = x + 1000 and s = ReduceSum(x, axis 1) (both int64), for x: int64[n, 3]."""
    nodes = [
        helper.make_node("Add", ["x", "thousand"], ["y"]),
        helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
    ]
    initializers = [
        helper.make_tensor("thousand", TensorProto.INT64, [], [1000]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
    ]
    int64 = TensorProto.INT64
    return make_model(nodes, [("x", int64, ["n", 3])], [("y", int64, ["n", 3]), ("s", int64, ["n"])], initializers,
                      name="int64_model")


@pytest.fixture(scope="module")
def int64_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("int64")
    onnx.save(make_int64_model(), str(folder / "int64.onnx"))
    build_bundle(folder / "int64.onnx", folder / "bundle", {"n": 8})
    return folder / "bundle"


def test_int64_in_and_out_as_bigint64array(int64_bundle: Path) -> None:
    x = np.array([[-5, 0, 7], [2_000_000_000, -2_000_000_000, 3]], dtype=np.int64)
    outputs = run_in_browser(int64_bundle, {"x": x})
    assert outputs["y"].dtype == np.int64 and outputs["s"].dtype == np.int64  # BigInt64Array in the page
    np.testing.assert_array_equal(outputs["y"], x + 1000)
    np.testing.assert_array_equal(outputs["s"], x.sum(axis=1))


def test_int64_classes_in_the_page(int64_bundle: Path) -> None:
    """In the page: outputs are BigInt64Array; an Int32Array input is accepted too; a value
    outside int32 and a wrong typed array are rejected naming the input."""
    script = """
    async () => {
      const model = await window.relaxweb.load("/bundle/");
      const run = async (data) => {
        try {
          const { y, s } = await model.run({ x: { data, shape: [1, 3] } });
          return { y: y.data.constructor.name, s: s.data.constructor.name, values: Array.from(y.data, Number) };
        } catch (error) {
          return { error: `${error.name}: ${error.message}` };
        }
      };
      const results = {
        bigint: await run(BigInt64Array.from([1n, 2n, 3n])),
        int32: await run(Int32Array.from([4, 5, 6])),
        outside: await run(BigInt64Array.from([1n, 2n ** 40n, 3n])),
        float: await run(Float32Array.from([1, 2, 3])),
      };
      model.dispose();
      return results;
    }
    """
    with open_runner_page(int64_bundle) as page:
        results = page.evaluate(script)
    assert results["bigint"] == {"y": "BigInt64Array", "s": "BigInt64Array", "values": [1001, 1002, 1003]}
    assert results["int32"]["values"] == [1004, 1005, 1006]
    assert results["outside"]["error"].startswith("InputShapeError: input 'x'")
    assert results["float"]["error"].startswith("InputShapeError: input 'x': expected")


def test_an_int64_value_outside_int32_is_rejected_by_run_in_browser(int64_bundle: Path) -> None:
    with pytest.raises(InputShapeError, match=r"input 'x'"):
        run_in_browser(int64_bundle, {"x": np.array([[1, 2, 2**33]], dtype=np.int64)})


@pytest.fixture(scope="module")
def melspectrogram_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return relaxweb.build(melspectrogram_model(), tmp_path_factory.mktemp("mel") / "mel", bounds={"samples": 4000}).path


def test_a_melspectrogram_compiles_and_matches_onnxruntime(melspectrogram_bundle: Path) -> None:
    """The melspectrogram of ``tests/fixtures/melspectrogram.py`` (a Conv STFT, its mel kernel
    dividing through the floor helpers about 130 times per reduction step) on SwiftShader, at
    both ends of the audio lengths it serves.  While the helpers branched, SwiftShader compiled
    that one kernel for minutes and Chromium lost its GPU process; now the load and both runs
    take seconds (a timeout of 60 s leaves room for a busy machine)."""
    runs = [{"audio": audio(1280)}, {"audio": audio(4000, seed=1)}]
    results = run_many_in_browser(melspectrogram_bundle, runs, timeout_s=60)
    for inputs, actual in zip(runs, results):
        (expected,) = onnxruntime_outputs(melspectrogram_model(), inputs)
        assert_close(actual["melspectrogram"], expected, MODEL, err_msg=f"{inputs['audio'].shape[1]} samples")


#: Runs in the runner page: load the bundle and start a run, whose settling (and when, on the
#: page's clock) `window.outcome` gives.
START_A_RUN_IN_PAGE = """
async (samples) => {
  const model = await window.relaxweb.load("/bundle/");
  window.outcome = model.run({ audio: { data: new Float32Array(samples), shape: [1, samples] } }).then(
    () => ({ settled: "resolved", at: performance.now() }),
    (error) => ({ settled: `rejected: ${error.message}`, at: performance.now() }));
  return performance.now();
}
"""


def test_a_gpu_process_lost_while_a_kernel_compiles_fails_the_run_at_once(melspectrogram_bundle: Path, tmp_path: Path) -> None:
    """Chromium's GPU process goes away (a crash, or its watchdog stopping a compilation that
    took minutes, as SwiftShader's of the mel kernel did while the floor helpers branched)
    while a run waits for a kernel's pipeline: the run fails at once, naming the kernel and
    saying the GPU process was lost.  The kernel made slow again by branching helpers; the
    GPU process killed (it is this test's own Chromium's: the only one it started, besides
    those the suite keeps for its other pages)."""
    bundle = tmp_path / "slow"
    shutil.copytree(melspectrogram_bundle, bundle)
    slow = bundle / "kernels" / f"{MEL_KERNEL}.cpu.wgsl"
    slow.write_text(slow.read_text().replace(") & ((", ") && (("))
    before = set(gpu_processes())
    with open_runner_page(bundle, own_browser=True) as page:
        page.evaluate(START_A_RUN_IN_PAGE, 1280)
        time.sleep(1.0)  # the run waits for the mel kernel, which compiles for minutes
        (gpu_process,) = [pid for pid in gpu_processes() if pid not in before]
        killed_at = page.evaluate("performance.now()")
        os.kill(gpu_process, signal.SIGKILL)
        outcome = page.evaluate(
            "Promise.race([window.outcome, new Promise((resolve) => setTimeout(() => resolve({ settled: 'hung' }), 30000))])")
    assert outcome["settled"].startswith(f"rejected: kernel {MEL_KERNEL}: cannot create its pipeline: "), outcome
    assert "the browser's GPU process was lost" in outcome["settled"], outcome
    assert outcome["at"] - killed_at < 10_000, outcome


def gpu_processes() -> list[int]:
    """The ids of the GPU processes of the Chromiums this process started."""
    return [pid for pid in own_processes() if b"--type=gpu-process" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def own_processes() -> list[int]:
    """The ids of this process's descendants (the Chromium it started, among them)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return [pid for pid in parents if descends(pid)]
