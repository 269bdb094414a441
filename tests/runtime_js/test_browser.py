"""Tests of the browser runtime (``relaxweb/runtime_js``) in headless Chromium with WebGPU.

They run the hand-made bundles (``tests/fixtures/handmade_bundle.py``: ``z = (x + w) * 2``
with ``x: float32[n, 4]``, ``n <= 16``, and ``y = x[x > 0]``, whose output length is read
back from the GPU mid-run) through Playwright, on whatever adapter Chromium offers
(SwiftShader without a GPU), and are skipped when Playwright or Chromium is missing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from relaxweb import browser
from relaxweb.browser import open_runner_page, run_in_browser
from relaxweb.errors import InputShapeError, RelaxwebError
from tests.fixtures.handmade_bundle import (
    DEFAULT_BOUND,
    edit_manifest,
    expected_output,
    random_input,
    write_handmade_bundle,
    write_positives_bundle,
)
from tests.helpers import assert_close, demo_page, rand

ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "test-artifacts"


def _chromium_available() -> bool:
    try:
        browser.find_chromium()
    except RelaxwebError:
        return False
    return True


pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed"),
    pytest.mark.skipif(not _chromium_available(), reason="chromium is not installed"),
]


@pytest.fixture
def bundle_dir(tmp_path: Path) -> Path:
    write_handmade_bundle(tmp_path / "bundle")
    return tmp_path / "bundle"


@pytest.fixture
def unbounded_bundle_dir(tmp_path: Path) -> Path:
    write_handmade_bundle(tmp_path / "unbounded", bound=None)
    return tmp_path / "unbounded"


#: Runs in the runner page: load the bundle with `options`, run it for each row count, and
#: return per run either {shape, data} of z or {error: name: message}.
RUN_ROWS_IN_PAGE = """
async ({ options, rowCounts }) => {
  const results = [];
  let model;
  try {
    model = await window.relaxweb.load("/bundle/", options);
  } catch (error) {
    return { loadError: `${error.name}: ${error.message}` };
  }
  for (const rows of rowCounts) {
    const x = Float32Array.from({ length: rows * 4 }, (_, i) => i * 0.25 - 3);
    try {
      const { z } = await model.run({ x: { data: x, shape: [rows, 4] } });
      results.push({ shape: z.shape, data: Array.from(z.data), input: Array.from(x) });
    } catch (error) {
      results.push({ error: `${error.name}: ${error.message}` });
    }
  }
  model.dispose();
  return { results, symbolicVars: model.symbolicVars };
}
"""


def run_rows(bundle: Path, row_counts: list[int], options: dict | None = None) -> dict:
    """Load ``bundle`` once in the browser and run it for each row count."""
    with open_runner_page(bundle) as page:
        return page.evaluate(RUN_ROWS_IN_PAGE, {"options": options or {}, "rowCounts": row_counts})


def check_run_result(result: dict, rows: int) -> None:
    """A run result from RUN_ROWS_IN_PAGE is z = (x + w) * 2 for x of `rows` rows."""
    assert "error" not in result, result
    assert result["shape"] == [rows, 4]
    x = np.array(result["input"], dtype=np.float32).reshape(rows, 4)
    z = np.array(result["data"], dtype=np.float32).reshape(rows, 4)
    assert_close(z, expected_output(x))


@pytest.mark.parametrize("rows", [1, 5])
def test_run_in_browser_matches_numpy(bundle_dir: Path, rows: int) -> None:
    x = random_input(rows, seed=rows)
    outputs = run_in_browser(bundle_dir, {"x": x})
    assert set(outputs) == {"z"}
    assert outputs["z"].dtype == np.float32
    assert outputs["z"].shape == (rows, 4)
    assert_close(outputs["z"], expected_output(x))


def test_run_above_the_bound_raises_input_shape_error(bundle_dir: Path) -> None:
    with pytest.raises(InputShapeError) as raised:
        run_in_browser(bundle_dir, {"x": random_input(17)})
    message = str(raised.value)
    assert message == "input 'x': dimension 0 (n) is 17, above its bound 16"
    for part in ("'x'", "dimension 0", "17", "16"):
        assert part in message


def test_wrong_dtype_and_rank_raise_input_shape_error(bundle_dir: Path) -> None:
    with pytest.raises(InputShapeError, match=r"input 'x': expected float32 data"):
        run_in_browser(bundle_dir, {"x": np.zeros((2, 4), dtype=np.float64)})
    with pytest.raises(InputShapeError, match=r"input 'x': expected 2 dimensions"):
        run_in_browser(bundle_dir, {"x": np.zeros(4, dtype=np.float32)})
    with pytest.raises(InputShapeError, match=r"input 'x' is missing"):
        run_in_browser(bundle_dir, {})


def test_one_model_runs_many_sizes_and_reports_progress(bundle_dir: Path) -> None:
    script = """
    async () => {
      const progress = [];
      const model = await window.relaxweb.load("/bundle/", { onProgress: (p) => progress.push(p) });
      const shapes = [];
      for (const rows of [3, 0, 16, 2]) {
        const { z } = await model.run({ x: { data: new Float32Array(rows * 4), shape: [rows, 4] } });
        shapes.push(z.shape);
      }
      model.dispose();
      let afterDispose = null;
      try { await model.run({ x: { data: new Float32Array(4), shape: [1, 4] } }); }
      catch (error) { afterDispose = error.message; }
      return { progress, shapes, afterDispose };
    }
    """
    with open_runner_page(bundle_dir) as page:
        result = page.evaluate(script)
    assert result["shapes"] == [[3, 4], [0, 4], [16, 4], [2, 4]]
    assert result["progress"][0] == {"loaded": 0, "total": 16}
    assert result["progress"][-1] == {"loaded": 16, "total": 16}
    assert "disposed" in result["afterDispose"]


def test_tighter_bounds_are_enforced(bundle_dir: Path) -> None:
    outcome = run_rows(bundle_dir, [3, 4], {"bounds": {"n": 3}})
    assert outcome["symbolicVars"] == [{"name": "n", "bound": 3}]
    check_run_result(outcome["results"][0], 3)
    assert outcome["results"][1]["error"] == "InputShapeError: input 'x': dimension 0 (n) is 4, above its bound 3"


def test_a_bound_above_the_build_bound_is_refused(bundle_dir: Path) -> None:
    outcome = run_rows(bundle_dir, [1], {"bounds": {"n": DEFAULT_BOUND + 1}})
    assert "the bound of 'n' is 17, above the bound 16" in outcome["loadError"]


def test_unbounded_storages_grow(unbounded_bundle_dir: Path) -> None:
    outcome = run_rows(unbounded_bundle_dir, [2, 300, 1, 1000])
    assert outcome["symbolicVars"] == [{"name": "n", "bound": None}]
    for result, rows in zip(outcome["results"], [2, 300, 1, 1000]):
        check_run_result(result, rows)


def test_a_limit_the_adapter_lacks_is_named(bundle_dir: Path) -> None:
    edit_manifest(bundle_dir, lambda m: m["required_limits"].update(maxStorageBuffersPerShaderStage=100000))
    assert "maxStorageBuffersPerShaderStage = 100000" in run_rows(bundle_dir, [1])["loadError"]
    edit_manifest(bundle_dir, lambda m: m.update(required_limits={"maxImaginaryThings": 1}))
    assert "maxImaginaryThings" in run_rows(bundle_dir, [1])["loadError"]


#: Runs in the runner page: the adapter's maxStorageBufferBindingSize, and the messages of
#: load() with a requested device and with a given device of default limits and no features.
LOAD_ERRORS_IN_PAGE = """
async () => {
  const adapter = await navigator.gpu.requestAdapter();
  const messages = {};
  for (const [key, options] of [["requested", {}], ["given", { device: await adapter.requestDevice() }]]) {
    try {
      (await window.relaxweb.load("/bundle/", options)).dispose();
      messages[key] = null;
    } catch (error) {
      messages[key] = `${error.name}: ${error.message}`;
    }
  }
  const { maxStorageBufferBindingSize, maxBufferSize } = adapter.limits;
  return { maxStorageBufferBindingSize, maxBufferSize, features: [...adapter.features], messages };
}
"""


def test_a_limit_above_the_adapters_and_a_missing_feature_are_named_at_load(bundle_dir: Path) -> None:
    """SwiftShader offers 1 GiB storage bindings and no shader-f16: load() rejects before
    any WebGPU call, naming both, with the needed and offered values."""
    needed = 1 << 31
    edit_manifest(bundle_dir, lambda m: m.update(
        required_limits={**m["required_limits"], "maxStorageBufferBindingSize": needed},
        required_features=["shader-f16"],
    ))
    with open_runner_page(bundle_dir) as page:
        outcome = page.evaluate(LOAD_ERRORS_IN_PAGE)
    assert "shader-f16" not in outcome["features"]
    binding, buffer = outcome["maxStorageBufferBindingSize"], outcome["maxBufferSize"]
    assert binding < needed and buffer < needed
    assert outcome["messages"]["requested"] == (
        "Error: this model needs the WebGPU feature shader-f16, which the GPU adapter does not offer; "
        f"this model needs the WebGPU limit maxStorageBufferBindingSize = {needed}, but the GPU adapter "
        f"supports {binding}; this model needs the WebGPU limit maxBufferSize = {needed}, but the GPU "
        f"adapter supports {buffer}"
    )
    assert outcome["messages"]["given"].startswith(
        "Error: this model needs the WebGPU feature shader-f16, which the device does not offer; "
        f"this model needs the WebGPU limit maxStorageBufferBindingSize = {needed}, but the device supports "
    )


def test_storages_at_the_bounds_above_a_given_devices_limit_fail_at_load(tmp_path: Path) -> None:
    """n <= 10M rows: 160 MB per storage at the bounds, above a default device's 128 MiB."""
    write_handmade_bundle(tmp_path / "bundle", bound=10_000_000)
    with open_runner_page(tmp_path / "bundle") as page:
        outcome = page.evaluate(LOAD_ERRORS_IN_PAGE)
    assert outcome["messages"]["given"] == (
        "Error: this model needs the WebGPU limit maxStorageBufferBindingSize = 160000000, but the "
        "device supports 134217728: storage 0 (input) needs 160000000 bytes at the bounds (its size: n * 16 bytes; "
        "build with lower --bound values, or run on wasm)"
    )
    assert outcome["messages"]["requested"] is None  # the adapter offers more: load() asks for it


def test_a_run_above_the_devices_limit_names_it(unbounded_bundle_dir: Path) -> None:
    """Without bounds, a run whose input needs a storage above the device's binding size
    limit rejects with a message naming it (no WebGPU validation error), and the model still
    runs smaller inputs."""
    script = """
    async () => {
      const adapter = await navigator.gpu.requestAdapter();
      const device = await adapter.requestDevice();
      const model = await window.relaxweb.load("/bundle/", { device });
      const limit = device.limits.maxStorageBufferBindingSize;
      const rows = limit / 16 + 1;
      let message = null;
      try {
        await model.run({ x: { data: new Float32Array(rows * 4), shape: [rows, 4] } });
      } catch (error) {
        message = `${error.name}: ${error.message}`;
      }
      const { z } = await model.run({ x: { data: new Float32Array(8).fill(1), shape: [2, 4] } });
      model.dispose();
      return { limit, rows, message, after: Array.from(z.data) };
    }
    """
    with open_runner_page(unbounded_bundle_dir) as page:
        outcome = page.evaluate(script)
    assert outcome["message"] == (
        f"Error: these inputs are too large for this device: input 'x' (storage 0) needs "
        f"{outcome['rows'] * 16} bytes, above the device's WebGPU limit maxStorageBufferBindingSize = "
        f"{outcome['limit']}"
    )
    assert_close(outcome["after"], expected_output(np.ones((2, 4), np.float32)).ravel())


def test_a_corrupt_shard_is_refused(bundle_dir: Path) -> None:
    shard = bundle_dir / "weights" / "shard0.bin"
    shard.write_bytes(bytes(16))
    with pytest.raises(RelaxwebError, match=r"weight shard weights/shard0.bin is corrupt: sha256"):
        run_in_browser(bundle_dir, {"x": random_input(1)})


def test_a_kernel_that_does_not_compile_is_reported(bundle_dir: Path) -> None:
    (bundle_dir / "kernels" / "multiply_by_two.wgsl").write_text("this is not wgsl")
    with pytest.raises(RelaxwebError, match=r"kernel multiply_by_two does not compile"):
        run_in_browser(bundle_dir, {"x": random_input(1)})


def test_demo_page_runs_and_shows_outputs(bundle_dir: Path) -> None:
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    with demo_page(bundle_dir) as page:
        page.wait_for_selector("#run:not([disabled])", timeout=60_000)
        assert page.input_value("#var-n") == "1"
        assert page.get_attribute("#var-n", "max") == str(DEFAULT_BOUND)
        page.fill("#var-n", "3")
        page.click("#run")
        page.wait_for_selector("#outputs pre", timeout=60_000)
        assert "[3, 4]" in page.inner_text("#outputs")
        assert "ms" in page.inner_text("#time")
        assert page.inner_text("#error") == ""
        page.screenshot(path=str(ARTIFACTS_DIR / "demo.png"), full_page=True)

        page.fill("#var-n", "17")
        page.click("#run")
        page.wait_for_function("document.getElementById('error').textContent !== ''")
        assert "above its bound 16" in page.inner_text("#error")


# Values read back: the positives bundle, y = x[x > 0] --------------------------------------

#: Runs in the runner page: load the bundle, run it on each input (a list of numbers), all
#: in turn, or all at once when `concurrent`; per run {y, shape, dispatches, reads} or {error}.
RUN_POSITIVES_IN_PAGE = """
async ({ inputs, concurrent }) => {
  const model = await window.relaxweb.load("/bundle/");
  const runOne = async (values) => {
    try {
      const x = { data: Float32Array.from(values), shape: [values.length] };
      const { y } = await model.run({ x });
      return { y: Array.from(y.data), shape: y.shape, dispatches: model.lastDispatchCount,
               reads: model.lastReadCount, dtype: y.data.constructor.name };
    } catch (error) {
      return { error: `${error.name}: ${error.message}` };
    }
  };
  const results = [];
  if (concurrent) {
    results.push(...await Promise.all(inputs.map(runOne)));
  } else {
    for (const values of inputs) results.push(await runOne(values));
  }
  const sizes = model.buffers.storageBuffers.map((buffer) => buffer.size);
  model.dispose();
  return { results, sizes };
}
"""


def positives_input(n: int, seed: int = 0) -> np.ndarray:
    """``n`` multiples of 1/4 in [-4, 4) (exact in JSON), about half of them positive."""
    return (rand(n, seed=seed, low=-16, high=16, dtype=np.int64) / 4).astype(np.float32)


def run_positives(bundle: Path, inputs: list[np.ndarray], concurrent: bool = False) -> dict:
    """Load the positives ``bundle`` once in the browser and run it on each input."""
    with open_runner_page(bundle) as page:
        return page.evaluate(
            RUN_POSITIVES_IN_PAGE,
            {"inputs": [x.tolist() for x in inputs], "concurrent": concurrent},
        )


def check_positives_result(result: dict, x: np.ndarray) -> None:
    """A run result from RUN_POSITIVES_IN_PAGE is y = x[x > 0], after one read."""
    assert "error" not in result, result
    expected = x[x > 0]
    assert result["shape"] == [len(expected)]
    assert result["dtype"] == "Float32Array"
    np.testing.assert_array_equal(np.array(result["y"], dtype=np.float32), expected)
    assert (result["dispatches"], result["reads"]) == (3, 1)


@pytest.fixture
def positives_bundle_dir(tmp_path: Path) -> Path:
    write_positives_bundle(tmp_path / "positives")
    return tmp_path / "positives"


@pytest.fixture
def unbounded_positives_bundle_dir(tmp_path: Path) -> Path:
    write_positives_bundle(tmp_path / "positives-unbounded", bound=None, positive_limit=1_000_000)
    return tmp_path / "positives-unbounded"


def test_values_read_back_give_numpy_results(positives_bundle_dir: Path) -> None:
    inputs = [
        positives_input(16, seed=1),
        positives_input(7, seed=2),
        np.zeros(0, dtype=np.float32),  # n = 0, so k = 0
        -np.arange(1, 17, dtype=np.float32),  # k = 0 < n
        np.arange(1, 17, dtype=np.float32),  # k = n = the bound
        np.array([0.0, -0.0, 2.5, -np.inf, np.inf], dtype=np.float32),
    ]
    outcome = run_positives(positives_bundle_dir, inputs)
    for result, x in zip(outcome["results"], inputs):
        check_positives_result(result, x)
    assert outcome["sizes"] == [64, 128, 16, 64]  # at the bounds (16 bytes at least), never grown


def test_run_in_browser_reads_values_back(positives_bundle_dir: Path) -> None:
    x = positives_input(11, seed=11)
    outputs = run_in_browser(positives_bundle_dir, {"x": x})
    assert set(outputs) == {"y"}
    np.testing.assert_array_equal(outputs["y"], x[x > 0])


def test_storage_grown_between_steps_keeps_its_contents_in_the_browser(
    unbounded_positives_bundle_dir: Path,
) -> None:
    """xc is written before the read and grows after it; the last kernel reads it."""
    x = np.array([1, -2, 3, 4, -5, 6, 7, -8], dtype=np.float32)  # k = 5
    outcome = run_positives(unbounded_positives_bundle_dir, [x])
    check_positives_result(outcome["results"][0], x)
    assert outcome["sizes"] == [32, 52, 16, 20]  # run() sized xc at 32 bytes, resume() at 52


def test_unbounded_storages_grow_across_and_within_runs(
    unbounded_positives_bundle_dir: Path,
) -> None:
    inputs = [positives_input(n, seed=n) for n in (3, 40, 300, 1000, 5, 0)]
    inputs.append(np.ones(2000, dtype=np.float32))  # k = n: everything grows
    outcome = run_positives(unbounded_positives_bundle_dir, inputs)
    for result, x in zip(outcome["results"], inputs):
        check_positives_result(result, x)


def test_concurrent_runs_take_turns(unbounded_positives_bundle_dir: Path) -> None:
    inputs = [positives_input(n, seed=n) for n in (50, 7, 300, 0, 64)]
    outcome = run_positives(unbounded_positives_bundle_dir, inputs, concurrent=True)
    for result, x in zip(outcome["results"], inputs):
        assert "error" not in result, result
        np.testing.assert_array_equal(np.array(result["y"], dtype=np.float32), x[x > 0])


def test_a_failing_resume_raises_the_manifests_message(tmp_path: Path) -> None:
    write_positives_bundle(tmp_path / "limited", positive_limit=3)
    message = "output 'y': x has 4 positive elements, more than the 3 this bundle allows"
    with pytest.raises(InputShapeError) as raised:
        run_in_browser(tmp_path / "limited", {"x": np.array([1, 2, -3, 4, 5], dtype=np.float32)})
    assert str(raised.value) == message

    after = np.array([1, -2, 3], dtype=np.float32)
    outcome = run_positives(tmp_path / "limited", [np.ones(4, dtype=np.float32), after])
    assert outcome["results"][0] == {"error": f"InputShapeError: {message}"}
    check_positives_result(outcome["results"][1], after)  # the model still runs


# The Cache API, GPU call counts, device loss, validation errors -----------------------------

#: Runs in the runner page: load the bundle with `options` `times` times, each time running it
#: once on 2 rows and recording the URLs fetched (window.fetch is wrapped) and the progress.
LOAD_WITH_CACHE_IN_PAGE = """
async ({ options, times, corruptCacheFirst }) => {
  const fetched = [];
  const realFetch = window.fetch;
  window.fetch = (url, init) => { fetched.push(new URL(String(url)).pathname); return realFetch(url, init); };
  const loads = [];
  try {
    for (let i = 0; i < times; i++) {
      if (corruptCacheFirst && i === corruptCacheFirst) {
        const cache = await caches.open(options.cache === true ? "relaxweb" : options.cache);
        await cache.put(new URL("/bundle/weights/shard0.bin", location.href), new Response(new Uint8Array(16).fill(7)));
      }
      fetched.length = 0;
      const progress = [];
      try {
        const model = await window.relaxweb.load("/bundle/", { ...options, onProgress: (p) => progress.push(p) });
        const { z } = await model.run({ x: { data: new Float32Array(8).fill(1), shape: [2, 4] } });
        model.dispose();
        loads.push({ fetched: [...fetched], progress, z: Array.from(z.data) });
      } catch (error) {
        loads.push({ fetched: [...fetched], error: error.message });
      }
    }
  } finally {
    window.fetch = realFetch;
  }
  const cache = await caches.open(options.cache === true ? "relaxweb" : options.cache);
  const keys = (await cache.keys()).map((request) => new URL(request.url).pathname);
  return { loads, keys };
}
"""

SHARD_PATH = "/bundle/weights/shard0.bin"


def test_cached_shards_are_not_fetched_again(bundle_dir: Path) -> None:
    with open_runner_page(bundle_dir) as page:
        outcome = page.evaluate(LOAD_WITH_CACHE_IN_PAGE, {"options": {"cache": "test-cache"}, "times": 2})
    first, second = outcome["loads"]
    assert SHARD_PATH in first["fetched"]
    assert SHARD_PATH not in second["fetched"]
    assert "/bundle/manifest.json" in second["fetched"]  # the manifest is always fetched: it has the hashes
    for load in (first, second):
        assert_close(load["z"], expected_output(np.ones((2, 4), np.float32)).ravel())
        assert load["progress"][-1] == {"loaded": 16, "total": 16}
    assert outcome["keys"] == [SHARD_PATH]


def test_a_corrupt_cached_shard_is_fetched_again(bundle_dir: Path) -> None:
    with open_runner_page(bundle_dir) as page:
        outcome = page.evaluate(
            LOAD_WITH_CACHE_IN_PAGE, {"options": {"cache": True}, "times": 3, "corruptCacheFirst": 1})
    first, repaired, after = outcome["loads"]
    assert "error" not in repaired, repaired
    assert SHARD_PATH in repaired["fetched"]  # the cached copy failed its sha256: refetched
    assert SHARD_PATH not in after["fetched"]  # ... and the good copy replaced it in the cache
    assert_close(repaired["z"], first["z"])


def test_a_corrupt_shard_in_cache_and_on_the_server_is_refused(bundle_dir: Path) -> None:
    (bundle_dir / "weights" / "shard0.bin").write_bytes(bytes(16))
    with open_runner_page(bundle_dir) as page:
        outcome = page.evaluate(
            LOAD_WITH_CACHE_IN_PAGE, {"options": {"cache": "c"}, "times": 2, "corruptCacheFirst": 1})
    for load in outcome["loads"]:
        assert load["error"].startswith("weight shard weights/shard0.bin is corrupt: sha256 ")
    assert outcome["keys"] == []  # a corrupt shard is never cached


#: Runs in the runner page: wrap GPUQueue.writeBuffer/submit and GPUDevice.createBindGroup to
#: count calls per run, for runs of the given row counts.
COUNT_GPU_CALLS_IN_PAGE = """
async ({ rowCounts, positives }) => {
  const counts = { writeBuffer: 0, paramsWrites: 0, submit: 0, createBindGroup: 0 };
  let paramsBuffer = null;
  const wrap = (proto, name, count) => {
    const original = proto[name];
    proto[name] = function (...args) { count(args); return original.apply(this, args); };
  };
  wrap(GPUQueue.prototype, "writeBuffer", (args) => {
    counts.writeBuffer += 1;
    if (args[0] === paramsBuffer) counts.paramsWrites += 1;
  });
  wrap(GPUQueue.prototype, "submit", () => { counts.submit += 1; });
  wrap(GPUDevice.prototype, "createBindGroup", () => { counts.createBindGroup += 1; });
  const model = await window.relaxweb.load("/bundle/");
  await model.ready; // counted once every pipeline is ready (load does not wait for them)
  paramsBuffer = model.buffers.paramsBuffer;
  const perRun = [];
  for (const rows of rowCounts) {
    for (const key of Object.keys(counts)) counts[key] = 0;
    const n = positives ? rows : rows * 4;
    const x = { data: Float32Array.from({ length: n }, (_, i) => i - 1), shape: positives ? [rows] : [rows, 4] };
    await model.run({ x });
    perRun.push({ ...counts });
  }
  model.dispose();
  return perRun;
}
"""


def test_one_params_upload_one_submit_and_bind_groups_made_once(bundle_dir: Path) -> None:
    with open_runner_page(bundle_dir) as page:
        per_run = page.evaluate(COUNT_GPU_CALLS_IN_PAGE, {"rowCounts": [3, 16, 1], "positives": False})
    first, *later = per_run
    # one upload for the input x, one for the params block; two call sites
    assert first == {"writeBuffer": 2, "paramsWrites": 1, "submit": 1, "createBindGroup": 2}
    for counts in later:
        assert counts == {"writeBuffer": 2, "paramsWrites": 1, "submit": 1, "createBindGroup": 0}


#: Runs in the runner page: the second kernel's pipeline is held back until the first run has
#: submitted what it could; returns what that run saw and computed.
FIRST_RUN_BEFORE_PIPELINES_IN_PAGE = """
async ({ rows }) => {
  const original = GPUDevice.prototype.createComputePipelineAsync;
  let created = 0;
  let release = () => {};
  const held = new Promise((resolve) => { release = resolve; });
  GPUDevice.prototype.createComputePipelineAsync = function (...args) {
    const pipeline = original.apply(this, args);
    created += 1;
    return created === 2 ? held.then(() => pipeline) : pipeline;
  };
  let submits = 0;
  const submit = GPUQueue.prototype.submit;
  GPUQueue.prototype.submit = function (...args) {
    submits += 1;
    if (submits === 1) setTimeout(release, 50); // the first part is on the GPU: let the rest compile
    return submit.apply(this, args);
  };
  const model = await window.relaxweb.load("/bundle/");
  const x = { data: Float32Array.from({ length: rows * 4 }, (_, i) => i - 1), shape: [rows, 4] };
  const early = await model.run({ x });
  const submitsEarly = submits;
  await model.ready;
  submits = 0;
  const later = await model.run({ x });
  model.dispose();
  return { submitsEarly, submitsLater: submits, kernels: created,
           same: Array.from(early.z.data).every((v, i) => Object.is(v, later.z.data[i])), z: Array.from(later.z.data) };
}
"""


def test_the_first_run_starts_before_every_pipeline_is_ready(bundle_dir: Path) -> None:
    """load() does not wait for the pipelines: a run submits the dispatches whose pipelines
    are ready, waits for the next one, and computes what a run after model.ready computes."""
    with open_runner_page(bundle_dir) as page:
        outcome = page.evaluate(FIRST_RUN_BEFORE_PIPELINES_IN_PAGE, {"rows": 3})
    assert outcome["kernels"] == 2
    assert outcome["submitsEarly"] == 2  # the first kernel's dispatch, then the rest once its pipeline came
    assert outcome["submitsLater"] == 1
    assert outcome["same"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 1
    assert_close(np.array(outcome["z"], dtype=np.float32).reshape(3, 4), expected_output(x))


def test_bind_groups_are_rebuilt_only_when_a_storage_grows(unbounded_bundle_dir: Path) -> None:
    with open_runner_page(unbounded_bundle_dir) as page:
        per_run = page.evaluate(COUNT_GPU_CALLS_IN_PAGE, {"rowCounts": [2, 1, 500, 500, 3], "positives": False})
    assert [counts["createBindGroup"] for counts in per_run] == [2, 0, 2, 0, 0]
    assert {counts["submit"] for counts in per_run} == {1}


def test_a_run_with_a_read_submits_once_per_step(positives_bundle_dir: Path) -> None:
    with open_runner_page(positives_bundle_dir) as page:
        per_run = page.evaluate(COUNT_GPU_CALLS_IN_PAGE, {"rowCounts": [8, 8], "positives": True})
    for counts in per_run:
        assert (counts["submit"], counts["paramsWrites"]) == (2, 2)  # one read: two steps
    assert per_run[1]["createBindGroup"] == 0


#: Runs in the runner page: destroy the device (with a run in flight when `inFlight`), then run
#: again; every promise must settle within 20 s.
DEVICE_LOSS_IN_PAGE = """
async ({ inFlight, givenDevice }) => {
  const options = {};
  if (givenDevice) options.device = await (await navigator.gpu.requestAdapter()).requestDevice();
  const model = await window.relaxweb.load("/bundle/", options);
  const x = () => ({ x: { data: new Float32Array(8), shape: [2, 4] } });
  const settle = (promise) => Promise.race([
    promise.then(() => "resolved", (error) => `rejected: ${error.message}`),
    new Promise((resolve) => setTimeout(() => resolve("hung"), 20000)),
  ]);
  await model.run(x());
  const running = inFlight ? settle(model.run(x())) : null;
  model.device.destroy();
  const next = await settle(model.run(x()));
  const later = await settle(model.run(x()));
  return { inFlight: running ? await running : null, next, later };
}
"""


@pytest.mark.parametrize(("in_flight", "given_device"), [(False, False), (True, False), (False, True)])
def test_a_destroyed_device_rejects_the_next_run(bundle_dir: Path, in_flight: bool, given_device: bool) -> None:
    with open_runner_page(bundle_dir) as page:
        outcome = page.evaluate(DEVICE_LOSS_IN_PAGE, {"inFlight": in_flight, "givenDevice": given_device})
    for key in ("next", "later"):
        assert outcome[key].startswith("rejected: "), outcome
        assert "the WebGPU device was lost (destroyed)" in outcome[key]
    if in_flight:
        assert outcome["inFlight"] != "hung"


def test_a_writable_binding_bound_twice_is_refused_at_load(bundle_dir: Path) -> None:
    """A call site that binds storage 1 both as its input and as its output, which WebGPU
    would refuse at dispatch: the manifest check refuses the bundle at load, before any GPU
    call, with the message the Python runtime gives too."""
    edit_manifest(bundle_dir, lambda m: m["call_sites"][1].update(buffers=[{"storage": 1}, {"storage": 1}]))
    outcome = run_rows(bundle_dir, [2, 2])
    assert outcome["loadError"] == "Error: manifest.json: call_sites[1].buffers: storage 1 is both written and bound again"
