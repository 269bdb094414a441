"""The browser runtime's wasm backend (``relaxweb/runtime_js/wasm_backend.js``) in headless
Chromium started without WebGPU (``launch_chromium(playwright, webgpu=False)``: no adapter).

The hand-made bundles (``tests/fixtures/handmade_bundle.py``) with hand-written kernels.wasm
(``tests/fixtures/handmade_wasm.py``) test the backend itself: ``backend: "auto"`` picks it,
one thread on a page that is not cross-origin isolated, a pool of workers on one that is
(``model.unitsRunByWorkers`` counts the units the workers ran), reads and resumes, the host
module's input errors, and a kernel trap naming its call site.

The GPT-2-like, BERT-like and CNN test models (tests/model_exports.py, as
tests/runtime_js/test_browser_models.py gets them) are built once and run with ``backend: "auto"`` in
that Chromium on worker threads, matching onnxruntime (the MODEL tolerance); the CNN also on a
page that is not isolated (one thread), with the same bytes.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb import browser
from relaxweb.browser import browser_runs, open_runner_page, profile_in_browser
from relaxweb.compiler import build_bundle
from relaxweb.cli import main as cli_main
from tests.fixtures.handmade_bundle import (
    DEFAULT_BOUND,
    edit_manifest,
    expected_output,
    write_handmade_bundle,
    write_positives_bundle,
)
from tests.fixtures.handmade_wasm import HANDMADE_KERNELS, POSITIVES_KERNELS, add_kernels_wasm
from tests.helpers import F32, MODEL, assert_close, make_model, onnxruntime_outputs, rand
from tests.model_exports import Export, committed_exports, export_script
from tests.runtime_js.test_browser import pytestmark as browser_marks
from tests.ops.test_sequence import appending_model, assert_sequences_equal, growing_sequence_model, onnxruntime_outputs
from tests.e2e.test_tiny_llama import CACHE_BOUNDS, PREFILL
from tests.e2e.test_tiny_llama import SCRIPT as TINY_LLAMA_SCRIPT

pytestmark = browser_marks

#: Runs in the runner page: load the bundle with `options`, run it on each input list
#: ([name, shape, values] triples), and report the backend, the threads, the kernel deadline,
#: load's console warnings, whether the page is isolated, the units the workers ran, and per
#: run the outputs or the error.
RUN_IN_PAGE = """
async ({ options, runs }) => {
  const report = { isolated: self.crossOriginIsolated, results: [], warnings: [] };
  let model;
  const warn = console.warn;
  console.warn = (...parts) => { report.warnings.push(parts.join(" ")); warn(...parts); };
  try {
    model = await window.relaxweb.load("/bundle/", options);
  } catch (error) {
    return { ...report, loadError: `${error.name}: ${error.message}` };
  } finally {
    console.warn = warn;
  }
  report.backend = model.backend;
  report.backendReason = model.backendReason;
  report.threads = model.threads;
  report.kernelTimeoutMs = model.kernelTimeoutMs ?? null;
  report.relaxedSimd = model.relaxedSimd ?? null;
  report.warmedUp = model.runBackend?.warmUp?.kernels ?? null;
  for (const inputs of runs) {
    const tensors = Object.fromEntries(inputs.map(([name, shape, values]) => [name, { data: Float32Array.from(values), shape }]));
    try {
      const outputs = await model.run(tensors);
      report.results.push(Object.fromEntries(Object.entries(outputs).map(([name, t]) => [name, { shape: t.shape, data: Array.from(t.data) }])));
    } catch (error) {
      report.results.push({ error: `${error.name}: ${error.message}` });
    }
  }
  report.unitsRunByWorkers = model.unitsRunByWorkers ?? null;
  model.dispose();
  return report;
}
"""


def run_page(bundle: Path, runs: list[list], *, options: dict | None = None, webgpu: bool = False,
             isolated: bool = True) -> dict:
    with open_runner_page(bundle, webgpu=webgpu, isolated=isolated) as page:
        return page.evaluate(RUN_IN_PAGE, {"options": options or {}, "runs": runs})


def x_rows(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-10, 10, (rows, 4)).astype(np.float32)


def handmade_runs(row_counts: list[int]) -> tuple[list[list], list[np.ndarray]]:
    """Runs of the hand-made bundle at these row counts, and the expected z of each."""
    inputs = [x_rows(rows, seed=rows) for rows in row_counts]
    return [[["x", list(x.shape), x.ravel().tolist()]] for x in inputs], [expected_output(x) for x in inputs]


@pytest.fixture
def handmade(tmp_path: Path) -> Path:
    write_handmade_bundle(tmp_path / "bundle")
    add_kernels_wasm(tmp_path / "bundle", HANDMADE_KERNELS)
    return tmp_path / "bundle"


def check_handmade(report: dict, expected: list[np.ndarray]) -> None:
    assert "loadError" not in report, report["loadError"]
    for result, want in zip(report["results"], expected, strict=True):
        assert "error" not in result, result["error"]
        assert result["z"]["shape"] == list(want.shape)
        np.testing.assert_array_equal(np.array(result["z"]["data"], np.float32).reshape(want.shape), want)


def test_auto_without_webgpu_runs_wasm_on_one_thread_when_not_isolated(handmade: Path) -> None:
    runs, expected = handmade_runs([5, DEFAULT_BOUND, 1])
    report = run_page(handmade, runs, isolated=False)
    assert report["isolated"] is False
    assert (report.get("backend"), report.get("threads")) == ("wasm", 1), report
    assert report["backendReason"] in ("WebGPU is available but no GPU adapter was found",
                                       "WebGPU is not available here (navigator.gpu is missing)"), report
    check_handmade(report, expected)
    assert report["unitsRunByWorkers"] == 0
    # kernels on the page's thread, under the same deadline as on workers (interruptible_kernels.js)
    assert report["kernelTimeoutMs"] == 10_000
    assert report["warnings"] == []


def test_an_isolated_page_splits_units_between_the_pool_and_the_page(handmade: Path) -> None:
    runs, expected = handmade_runs([DEFAULT_BOUND, 3, 9])
    report = run_page(handmade, runs, options={"threads": 3})
    assert report["isolated"] is True
    assert (report.get("backend"), report.get("threads")) == ("wasm", 3), report
    check_handmade(report, expected)
    assert (report["kernelTimeoutMs"], report["warnings"]) == (10_000, [])
    # n = 16: 64 units per dispatch, 3 ranges (two on workers); n = 9: 36 units; n = 3: 12 units
    assert report["unitsRunByWorkers"] > 0


def test_the_default_thread_count_is_the_cores_up_to_four(handmade: Path) -> None:
    runs, expected = handmade_runs([DEFAULT_BOUND])
    report = run_page(handmade, runs)
    with open_runner_page(handmade, webgpu=False) as page:
        cores = page.evaluate("navigator.hardwareConcurrency")
    assert report["threads"] == min(cores, 4)
    check_handmade(report, expected)


def test_reads_resumes_and_growth_with_threads(tmp_path: Path) -> None:
    bundle = tmp_path / "positives"
    write_positives_bundle(bundle, bound=None)
    add_kernels_wasm(bundle, POSITIVES_KERNELS)
    xs = [np.array([1, -2, 3, 0, 5], np.float32), np.linspace(-3, 3, 161).astype(np.float32)]
    report = run_page(bundle, [[["x", [len(x)], x.tolist()]] for x in xs], options={"threads": 2})
    assert report["threads"] == 2 and "loadError" not in report
    for result, x in zip(report["results"], xs, strict=True):
        assert "error" not in result, result["error"]
        assert result["y"]["data"] == x[x > 0].tolist()
    assert report["unitsRunByWorkers"] > 0  # the copy kernel: one unit per element


def test_an_input_shape_error_is_the_host_modules(handmade: Path) -> None:
    bad = x_rows(DEFAULT_BOUND + 1)
    report = run_page(handmade, [[["x", list(bad.shape), bad.ravel().tolist()]]])
    assert report["results"] == [{"error": "InputShapeError: input 'x': dimension 0 (n) is 17, above its bound 16"}]


@pytest.mark.parametrize(("isolated", "trap_kernel", "named"), [
    (False, 0, "add_broadcast failed at call site 0 (y = add_broadcast(x, w))"),
    (True, 1, "multiply_by_two failed at call site 1 (z = multiply_by_two(y))"),  # the stage's second dispatch on the pool
])
def test_a_kernel_trap_rejects_the_run_naming_its_call_site(tmp_path: Path, isolated: bool, trap_kernel: int,
                                                            named: str) -> None:
    bundle = tmp_path / "trap"
    write_handmade_bundle(bundle)
    add_kernels_wasm(bundle, HANDMADE_KERNELS, trap_kernel=trap_kernel)
    runs, _ = handmade_runs([DEFAULT_BOUND])
    (result,) = run_page(bundle, runs, isolated=isolated)["results"]
    assert result["error"].startswith(f"Error: kernel {named}: ")
    assert "unreachable" in result["error"]


def test_with_webgpu_auto_picks_webgpu_and_wasm_can_be_asked_for(handmade: Path) -> None:
    runs, expected = handmade_runs([4])
    webgpu = run_page(handmade, runs, webgpu=True)
    assert (webgpu.get("backend"), webgpu.get("backendReason")) == ("webgpu", None), webgpu
    check_handmade(webgpu, expected)
    wasm = run_page(handmade, runs, webgpu=True, options={"backend": "wasm"})
    assert (wasm.get("backend"), wasm.get("backendReason")) == ("wasm", None), wasm
    check_handmade(wasm, expected)


def test_auto_says_why_a_bundle_above_the_adapters_binding_runs_on_wasm(tmp_path: Path) -> None:
    """y = x @ w is 1.2 GB at the bound n <= 300000, above SwiftShader's 1 GiB binding: "auto"
    takes wasm and `backendReason` names the storage (tests/e2e/test_device_limits.py: Python)."""
    from tests.e2e.test_device_limits import wide_matmul  # noqa: PLC0415 - one model for both tests

    bundle = relaxweb.build(wide_matmul(), tmp_path / "bundle", bounds={"n": 300000})
    x = rand(2, 64)
    report = run_page(bundle.path, [[["x", [2, 64], x.ravel().tolist()]]], webgpu=True)
    assert report.get("backend") == "wasm", report
    output = bundle.manifest["outputs"][0]["storage"]
    assert report["backendReason"].startswith("this model needs the WebGPU limit maxStorageBufferBindingSize = 1228800000, "
                                              "but the GPU adapter supports "), report["backendReason"]
    assert report["backendReason"].endswith(
        f": storage {output} (output 'y') needs 1228800000 bytes at the bounds (its size: n * 4096 bytes; build with lower "
        "--bound values, or run on wasm)"), report["backendReason"]
    (result,) = report["results"]
    assert_close(np.array(result["y"]["data"], np.float32).reshape(2, 1024), x @ rand(64, 1024, seed=1))


def test_a_bundle_without_kernels_wasm(tmp_path: Path) -> None:
    write_handmade_bundle(tmp_path / "bundle")
    runs, _ = handmade_runs([2])
    missing = 'this bundle has no kernels.wasm (its manifest has no "wasm" entry: rebuild it with a relaxweb that writes one)'
    report = run_page(tmp_path / "bundle", runs, options={"backend": "wasm"})
    assert report["loadError"] == f'Error: {missing}; load it with backend "webgpu"'
    report = run_page(tmp_path / "bundle", runs)  # auto, no WebGPU: the WebGPU error says both
    assert report["loadError"] == f"Error: WebGPU is available but no GPU adapter was found, and {missing}"
    edit_manifest(tmp_path / "bundle", lambda manifest: manifest.update(wasm={"unavailable": "kernel k has no wasm form"}))
    report = run_page(tmp_path / "bundle", runs, options={"backend": "wasm"})
    assert report["loadError"] == 'Error: this bundle has no kernels.wasm: kernel k has no wasm form; load it with backend "webgpu"'


def test_cli_runs_in_the_browser_on_the_wasm_backend(handmade: Path, tmp_path: Path, capsys) -> None:
    x = x_rows(6)
    np.savez(tmp_path / "in.npz", x=x)
    capsys.readouterr()
    assert cli_main(["run", str(handmade), "--inputs", str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"),
                     "--browser", "--backend", "wasm"]) == 0
    assert "ran in headless Chromium (kernels.wasm)" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["z"], expected_output(x))


@pytest.mark.parametrize("isolated", [True, False], ids=["workers", "page thread"])
def test_chromium_runs_the_kernels_with_relaxed_simd_and_the_plain_ones_when_asked(tmp_path: Path, isolated: bool) -> None:
    """Chromium compiles relaxed SIMD: load() runs kernels.wasm's multiply-adds with it (on the
    workers, and rewritten to be interruptible on the page's thread), or lowered to plain
    SIMD128 with relaxedSimd: false; both give the MatMul's product, the kernel warmed up at
    load either way."""
    w = rand(24, 40, seed=1)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["n", 24])], ["y"],
                       {"w": w})
    relaxweb.build(model, tmp_path / "bundle")
    x = rand(9, 24)
    runs = [[["x", [9, 24], x.ravel().tolist()]]]
    for options, relaxed in (({}, True), ({"relaxedSimd": False}, False)):
        report = run_page(tmp_path / "bundle", runs, options={"backend": "wasm", "warmUp": True, **options},
                          isolated=isolated)
        assert "loadError" not in report, report["loadError"]
        assert (report["relaxedSimd"], report["threads"] > 1) == (relaxed, isolated)
        assert report["warmedUp"] == 1  # its one kernel (asked for: so small a model is not warmed by default),
        # by the page's thread or the pool's leader (warm_up.js)
        [result] = report["results"]
        assert "error" not in result, result["error"]
        assert_close(np.array(result["y"]["data"], np.float32).reshape(9, 40), x @ w, F32)


def test_the_demo_page_shows_the_wasm_backend_and_its_threads(handmade: Path) -> None:
    server = browser.start_server(handmade)  # as `relaxweb serve` serves it: cross-origin isolated
    try:
        with browser.sync_playwright() as playwright:
            chromium = browser.launch_chromium(playwright, webgpu=False)
            try:
                page = chromium.new_page()
                page.goto(server.url)  # type: ignore[attr-defined]
                page.wait_for_selector("#run:not([disabled])", timeout=60_000)
                cores = page.evaluate("navigator.hardwareConcurrency")
                threads = min(cores, 4)
                assert page.inner_text("#device") == f"Backend: wasm (CPU, {threads} thread{'s' if threads > 1 else ''})"
                page.fill("#var-n", "3")
                page.click("#run")
                page.wait_for_selector("#outputs pre", timeout=60_000)
                assert "z shape [3, 4]" in page.inner_text("#outputs")
                assert page.inner_text("#error") == ""
            finally:
                chromium.close()
    finally:
        browser.stop_server(server)


# The test models on the wasm backend ------------------------------------------------------------

MODELS = {  # name -> (shapes run, build bounds above them)
    "gpt2_legacy": ([{"batch": 1, "seq": 8}, {"batch": 2, "seq": 5}], {"batch": 4, "seq": 16}),
    "bert_legacy": ([{"batch": 1, "seq": 8}, {"batch": 2, "seq": 5}], {"batch": 4, "seq": 16}),
    "cnn_legacy": ([{"batch": 1, "height": 32, "width": 32}, {"batch": 2, "height": 27, "width": 13}],
                   {"batch": 2, "height": 32, "width": 32}),
}


@pytest.fixture(scope="module")
def exports() -> dict[str, Export]:
    return committed_exports(list(MODELS))


@pytest.fixture(scope="module")
def model_bundles(exports: dict[str, Export], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("wasm-browser-bundles")
    for name, (_, bounds) in MODELS.items():
        build_bundle(exports[name].path, folder / name, bounds)
    return {name: folder / name for name in MODELS}


def model_runs(export: Export, shapes: list[dict]) -> list[dict[str, np.ndarray]]:
    return [export_script().make_inputs(export.sidecar["inputs"], dims, seed=sum(dims.values())) for dims in shapes]


@pytest.mark.parametrize("name", list(MODELS))
def test_the_test_models_match_onnxruntime_on_the_wasm_backend(exports, model_bundles, name: str) -> None:
    import onnxruntime as ort

    shapes, _ = MODELS[name]
    runs = model_runs(exports[name], shapes)
    reference = ort.InferenceSession(str(exports[name].path), providers=["CPUExecutionProvider"])
    result = browser_runs(model_bundles[name], runs, timeout_s=300, webgpu=False)
    assert result.backend == "wasm" and result.threads > 1, (result.backend, result.threads)
    assert result.units_run_by_workers > 0
    for dims, inputs, actual in zip(shapes, runs, result.outputs, strict=True):
        for output, want in zip(reference.get_outputs(), reference.run(None, inputs)):
            got = actual[output.name]
            assert got.shape == want.shape, f"{name} {output.name} at {dims}: shape {got.shape}, onnxruntime {want.shape}"
            assert got.dtype == want.dtype
            assert_close(got, want, MODEL, err_msg=f"{name} {output.name} at {dims}")


def test_one_thread_and_the_pool_give_the_same_bytes(exports, model_bundles) -> None:
    shapes, _ = MODELS["cnn_legacy"]
    runs = model_runs(exports["cnn_legacy"], shapes)
    single = browser_runs(model_bundles["cnn_legacy"], runs, timeout_s=300, webgpu=False, isolated=False)
    pooled = browser_runs(model_bundles["cnn_legacy"], runs, timeout_s=300, webgpu=False)
    assert (single.backend, single.threads) == ("wasm", 1)
    assert pooled.threads > 1
    for one, many in zip(single.outputs, pooled.outputs, strict=True):
        assert one.keys() == many.keys()
        for name in one:
            np.testing.assert_array_equal(one[name], many[name])


def test_a_per_kernel_profile_of_the_wasm_backend(exports, model_bundles) -> None:
    shapes, _ = MODELS["cnn_legacy"]
    (inputs,) = model_runs(exports["cnn_legacy"], shapes[:1])
    profile = profile_in_browser(model_bundles["cnn_legacy"], inputs, timeout_s=300, backend="wasm")
    assert profile.method == "wall clock per kernel call"
    manifest_kernels = {k["name"] for k in json.loads((model_bundles["cnn_legacy"] / "manifest.json").read_text())["kernels"]}
    assert {row.kernel for row in profile.rows} <= manifest_kernels
    assert sum(row.calls for row in profile.rows) == profile.dispatches > 0
    assert any(row.flops for row in profile.rows)  # generated kernels carry their cost
    assert all(row.ms >= 0 for row in profile.rows)


# Sequences, loops and KV caches on the wasm backend ------------------------------------------------


def test_a_loop_growing_a_sequence_and_a_sequence_input(tmp_path: Path) -> None:
    """Resumes (a loop's iterations), a sequence arena growing between them, sequence inputs and outputs."""
    grown = relaxweb.build(growing_sequence_model(), tmp_path / "growing").path
    runs = [{"x": rand(6, seed=3), "trip": np.array(trip, np.int64), "cond": np.array(True)} for trip in (0, 1, 4)]
    result = browser_runs(grown, runs, webgpu=False)
    assert result.backend == "wasm"
    for feeds, outputs in zip(runs, result.outputs, strict=True):
        (expected,) = onnxruntime_outputs(growing_sequence_model(), feeds)
        assert_sequences_equal(outputs["grown"], expected)
    appended = relaxweb.build(appending_model(), tmp_path / "appending").path
    feeds = {"s": [rand(2, 3, seed=1), rand(0, 4, seed=2)], "t": rand(3, 2, seed=9)}
    (expected,) = onnxruntime_outputs(appending_model(), feeds)
    (outputs,) = browser_runs(appended, [feeds], webgpu=False).outputs
    assert_sequences_equal(outputs["grown"], expected)


@pytest.mark.slow
def test_the_tiny_llamas_kv_caches_written_from_arrays_and_read_back(tmp_path: Path) -> None:
    """Prefill, then a decode step whose past is the prefill's presents as arrays (written into
    the caches block by block, presents read back from them): onnxruntime's logits and presents."""
    spec = importlib.util.spec_from_file_location("tiny_llama", TINY_LLAMA_SCRIPT)
    tiny_llama = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tiny_llama", tiny_llama)  # its dataclasses look themselves up there
    spec.loader.exec_module(tiny_llama)  # type: ignore[union-attr]
    paths = tiny_llama.tiny_llama_paths()  # trained once into .cache/tiny-llama/
    bundle = relaxweb.build(paths["model"], tmp_path / "bundle", bounds=CACHE_BOUNDS).path
    assert json.loads((bundle / "manifest.json").read_text())["caches"]
    reference = json.loads(paths["reference"].read_text())
    onnxruntime_run = tiny_llama.onnxruntime_runner(paths["model"])
    config = tiny_llama.Config()
    present = tiny_llama.past_names(config, "present")
    ids = tiny_llama.encode(reference["prompt"]) + reference["continuation_ids"]
    prefill = tiny_llama.decoder_feeds(config, ids[:PREFILL], 0, None)
    expected_prefill = onnxruntime_run(prefill)
    step = tiny_llama.decoder_feeds(config, ids[PREFILL:PREFILL + 2], PREFILL, [expected_prefill[name] for name in present])
    result = browser_runs(bundle, [prefill, step], timeout_s=300, webgpu=False)
    assert result.backend == "wasm"
    for actual, expected in zip(result.outputs, [expected_prefill, onnxruntime_run(step)], strict=True):
        assert set(actual) == set(expected)
        for name, want in expected.items():
            assert actual[name].shape == want.shape, name
            assert_close(actual[name], want, MODEL, err_msg=name)


@pytest.mark.parametrize("isolated", [True, False])
def test_the_server_sends_the_isolation_headers_unless_told_not_to(handmade: Path, isolated: bool) -> None:
    server = browser.start_server(handmade, isolated=isolated)
    try:
        for path in ("", "runtime/wasm_worker.js", "bundle/kernels.wasm"):
            with urllib.request.urlopen(server.url + path) as response:  # type: ignore[attr-defined]
                headers = {name: response.headers.get(name) for name, _ in browser.ISOLATION_HEADERS}
            assert headers == ({name: value for name, value in browser.ISOLATION_HEADERS} if isolated
                               else {name: None for name, _ in browser.ISOLATION_HEADERS}), path
    finally:
        browser.stop_server(server)


def test_a_worker_that_never_finishes_rejects_the_run_instead_of_freezing_the_page(handmade: Path) -> None:
    with open_runner_page(handmade, webgpu=False) as page:
        result = page.evaluate("""async (rows) => {
          const model = await window.relaxweb.load("/bundle/", { threads: 2, kernelTimeoutMs: 300 });
          model.runBackend.pool.chunkDispatches = 1;  // the stage's two dispatches posted one at a time
          const { z } = await model.run({ x: { data: Float32Array.from(rows), shape: [16, 4] } });
          model.runBackend.pool.quit(1);  // as dispose() stops it, or as a browser stopping it would
          await new Promise((resolve) => setTimeout(resolve, 200));
          const quit = model.unitsRunByWorkers;
          const x = { x: { data: new Float32Array(64), shape: [16, 4] } };
          const first = await model.run(x).then(() => "no error", (e) => e.message);
          const second = await model.run(x).then(() => "no error", (e) => e.message);
          const after = model.unitsRunByWorkers;
          model.dispose();
          return { first, second, ran: after - quit, z: Array.from(z.data) };
        }""", x_rows(DEFAULT_BOUND).ravel().tolist())
    stopped = ("a kernel call ran for more than 0.3 s and its worker threads were stopped (the bundle's kernels.wasm "
               "loops, or is damaged; a model this slow on purpose: raise the kernelTimeoutMs load option); load the "
               "model again")
    assert result["first"] == f"kernel add_broadcast failed at call site 0 (y = add_broadcast(x, w)): {stopped}"
    assert result["second"] == f"cannot run: {stopped}"
    assert result["ran"] <= 32  # worker 0's range of the one call at most: a stopped pool runs nothing more
    np.testing.assert_array_equal(np.array(result["z"], np.float32), expected_output(x_rows(DEFAULT_BOUND)).ravel())


#: Runs a bundle whose kernels loop (tests/fixtures/looping_kernels.py) with a short deadline,
#: counting the page's timer ticks meanwhile (a frozen page would count none).
LOOPING_RUN = """
async ({ x, shape }) => {
  const model = await window.relaxweb.load("/bundle/", { backend: "wasm", kernelTimeoutMs: 400 });
  let ticks = 0;
  const ticker = setInterval(() => { ticks += 1; }, 20);
  const started = performance.now();
  const first = await model.run({ x: { data: Float32Array.from(x), shape } }).then(() => "no error", (e) => e.message);
  const ms = performance.now() - started;
  clearInterval(ticker);
  const second = await model.run({ x: { data: Float32Array.from(x), shape } }).then(() => "no error", (e) => e.message);
  model.dispose();
  // disposed while a kernel loops: the run rejects at once, not at its deadline
  const other = await window.relaxweb.load("/bundle/", { backend: "wasm", kernelTimeoutMs: 60000 });
  const running = other.run({ x: { data: Float32Array.from(x), shape } }).then(() => "no error", (e) => e.message);
  await new Promise((resolve) => setTimeout(resolve, 300));
  const disposedAt = performance.now();
  other.dispose();
  const disposed = await running;
  return { first, second, ms, ticks, threads: model.threads, disposed, disposedMs: performance.now() - disposedAt };
}
"""

#: The same page loads the bundle again, with a deadline of a day: a run ends when its kernels
#: do (the page is woken by the workers, not by the deadline), here within 30 s or "hung".
RELOADED_RUN = """
async ({ x, shape }) => {
  const model = await window.relaxweb.load("/bundle/", { backend: "wasm", kernelTimeoutMs: 86400000 });
  const run = model.run({ x: { data: Float32Array.from(x), shape } });
  const outputs = await Promise.race([run, new Promise((resolve) => setTimeout(() => resolve("hung"), 30000))]);
  if (outputs === "hung") return { hung: true };
  model.dispose();
  return { shape: outputs.probabilities.shape, data: Array.from(outputs.probabilities.data) };
}
"""


def test_a_looping_kernel_rejects_the_run_without_freezing_the_page_and_the_model_loads_again(tmp_path: Path) -> None:
    from tests.fixtures.looping_kernels import restore_kernels, write_looping_kernels
    from tests.runtime.test_threads import FEATURES, classifier_model

    bundle = relaxweb.build(classifier_model(), tmp_path / "bundle", bounds={"batch": 64}).path
    original = write_looping_kernels(bundle)
    x = np.random.default_rng(3).standard_normal((5, FEATURES)).astype(np.float32)
    feeds = {"x": x.ravel().tolist(), "shape": list(x.shape)}
    with open_runner_page(bundle, webgpu=False) as page:
        looped = page.evaluate(LOOPING_RUN, feeds)
        restore_kernels(bundle, original)
        reloaded = page.evaluate(RELOADED_RUN, feeds)
    assert looped["first"].startswith("kernel ") and "failed at call site 0 (" in looped["first"]
    assert looped["first"].endswith("a kernel call ran for more than 0.4 s and its worker threads were stopped (the "
                                    "bundle's kernels.wasm loops, or is damaged; a model this slow on purpose: raise the "
                                    "kernelTimeoutMs load option); load the model again")
    assert looped["second"].startswith("cannot run: a kernel call ran for more than 0.4 s")
    assert looped["ms"] < 5000 and looped["ticks"] >= 5, looped  # the page kept running meanwhile
    assert looped["disposed"].endswith(": the model was disposed") and looped["disposedMs"] < 5000, looped
    (want,) = onnxruntime_outputs(classifier_model(), {"x": x})
    assert "hung" not in reloaded, "a run waited for its deadline, not for its workers"
    assert reloaded["shape"] == list(want.shape)
    assert_close(np.array(reloaded["data"], np.float32).reshape(want.shape), want, MODEL)


#: On a page that is not isolated: the kernel runs on the page's thread, which it holds until
#: the deadline (0.4 s here), then the run rejects; the model cannot run again.
LOOPING_RUN_ON_THE_PAGE = """
async ({ x, shape }) => {
  const model = await window.relaxweb.load("/bundle/", { backend: "wasm", kernelTimeoutMs: 400 });
  const started = performance.now();
  const first = await model.run({ x: { data: Float32Array.from(x), shape } }).then(() => "no error", (e) => e.message);
  const ms = performance.now() - started;
  const second = await model.run({ x: { data: Float32Array.from(x), shape } }).then(() => "no error", (e) => e.message);
  model.dispose();
  return { first, second, ms, threads: model.threads, deadline: model.kernelTimeoutMs };
}
"""


def test_a_looping_kernel_on_a_page_that_is_not_isolated_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    from tests.fixtures.looping_kernels import restore_kernels, write_looping_kernels
    from tests.runtime.test_threads import FEATURES, classifier_model

    bundle = relaxweb.build(classifier_model(), tmp_path / "bundle", bounds={"batch": 64}).path
    original = write_looping_kernels(bundle)
    x = np.random.default_rng(3).standard_normal((5, FEATURES)).astype(np.float32)
    feeds = {"x": x.ravel().tolist(), "shape": list(x.shape)}
    with open_runner_page(bundle, webgpu=False, isolated=False) as page:
        looped = page.evaluate(LOOPING_RUN_ON_THE_PAGE, feeds)
        restore_kernels(bundle, original)
        reloaded = page.evaluate(RELOADED_RUN, feeds)
    assert (looped["threads"], looped["deadline"]) == (1, 400), looped
    assert looped["first"].startswith("kernel ") and "failed at call site 0 (" in looped["first"]
    assert looped["first"].endswith("a kernel call ran for more than 0.4 s and was stopped (the bundle's kernels.wasm "
                                    "loops, or is damaged; a model this slow on purpose: raise the kernelTimeoutMs load "
                                    "option); load the model again")
    assert 400 <= looped["ms"] < 5000, looped
    assert looped["second"].startswith("cannot run: a kernel call ran for more than 0.4 s")
    (want,) = onnxruntime_outputs(classifier_model(), {"x": x})
    assert "hung" not in reloaded
    assert_close(np.array(reloaded["data"], np.float32).reshape(want.shape), want, MODEL)


@pytest.mark.slow
def test_a_looping_kernel_ends_relaxweb_run_in_the_browser_in_one_line(tmp_path: Path) -> None:
    """The default deadline (10 s) on the command line's browser path: one error line, exit 2."""
    from tests.fixtures.looping_kernels import write_looping_kernels
    from tests.runtime.test_threads import FEATURES, classifier_model

    bundle = relaxweb.build(classifier_model(), tmp_path / "bundle", bounds={"batch": 64}).path
    write_looping_kernels(bundle)
    np.savez(tmp_path / "in.npz", x=np.ones((2, FEATURES), np.float32))
    result = subprocess.run([sys.executable, "-m", "relaxweb", "run", str(bundle), "--inputs", str(tmp_path / "in.npz"),
                             "--browser", "--backend", "wasm"], capture_output=True, text=True, timeout=100)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "a kernel call ran for more than 10 s and its worker threads were stopped" in line


def test_float16_inputs_and_outputs_cross_to_the_page_as_half_bits(tmp_path: Path) -> None:
    """run_in_browser passes float16 as the Uint16Array of half bits the runtime takes, and gives
    float16 outputs back as float16 (the corpus's float16 ResNet could not be run in the page)."""
    model = make_model([helper.make_node("Add", ["x", "y"], ["z"])],
                       [("x", TensorProto.FLOAT16, ["n"]), ("y", TensorProto.FLOAT16, ["n"])],
                       [("z", TensorProto.FLOAT16, ["n"])])
    path = tmp_path / "half.onnx"
    onnx.save(model, path)
    build_bundle(path, tmp_path / "bundle")
    x = np.array([1.5, 2.25, -3.0, 0.0], np.float16)
    y = np.array([0.5, 1.0, 65000.0, -0.0], np.float16)
    outputs = relaxweb.run_in_browser(tmp_path / "bundle", {"x": x, "y": y}, backend="wasm")
    assert outputs["z"].dtype == np.float16
    np.testing.assert_array_equal(outputs["z"], x + y)


#: Runs in the runner page: the Gather_3 bundle (tests/e2e/test_index_checks.py) on each
#: backend, with an index past its axis, then a valid negative one (int64 indices as an Int32Array).
GATHER_IN_PAGE = """
async () => {
  const results = {};
  for (const backend of ["webgpu", "wasm"]) {
    const model = await window.relaxweb.load("/bundle/", { backend });
    const x = { data: Float32Array.from({ length: 12 }, (_, k) => k), shape: [4, 3] };
    const outcome = [model.backend];
    for (const indices of [[1, 7], [1, -1]]) {
      try {
        const { y } = await model.run({ x, i: { data: Int32Array.from(indices), shape: [2] } });
        outcome.push(Array.from(y.data));
      } catch (error) {
        outcome.push(`${error.name}: ${error.message}`, error instanceof window.relaxweb.RunCheckError);
      }
    }
    // a run that keeps its outputs reads nothing back: on WebGPU its error surfaces at the next read
    await model.run({ x, i: { data: Int32Array.from([1, 7]), shape: [2] } }, { keepOnGpu: ["y"] })
      .then(({ y }) => y.read().finally(() => y.dispose()))
      .then(() => outcome.push("read"), (error) => outcome.push(error.message));
    model.dispose();
    // generate: the prompt's 250 lies past the 200-row embedding (the logits have 258 entries)
    const decoder = await window.relaxweb.load("/bundle/decoder/", { backend });
    await decoder.generate([1, 250, 3], { maxNewTokens: 2, temperature: 0 })
      .then(() => outcome.push("generated"), (error) => outcome.push(`${error.name}: ${error.message}`));
    decoder.dispose();
    results[backend] = outcome;
  }
  return results;
}
"""


def test_an_index_past_its_axis_rejects_the_run_on_both_backends(tmp_path: Path) -> None:
    """Also where the error surfaces later on WebGPU: a kept output's read, generate's token read."""
    from tests.e2e.test_index_checks import gather_model
    from tests.fixtures.tiny_decoder import BOUNDS, tiny_decoder
    relaxweb.build(gather_model(), tmp_path / "bundle")
    relaxweb.build(tiny_decoder(embedding_rows=200), tmp_path / "bundle" / "decoder", bounds=BOUNDS)
    with open_runner_page(tmp_path / "bundle", webgpu=True) as page:
        results = page.evaluate(GATHER_IN_PAGE)
    error = "node 'Gather_3' (Gather): index 7 is out of range for axis 0 of extent 4"
    in_generate = "RunCheckError: node '#0 (unnamed)' (Gather): index 250 is out of range for axis 0 of extent 200"
    for backend in ("webgpu", "wasm"):
        assert results[backend] == [backend, f"RunCheckError: {error}", True, [3, 4, 5, 9, 10, 11], error,
                                    in_generate], results


#: Runs in the runner page: load the bundle with backend "auto", then "webgpu"; the first's
#: backend, reason and y for x (decimal strings: int64 through BigInt64Array), the second's error.
INT64_AUTO_IN_PAGE = """
async (values) => {
  const info = console.info;
  console.info = () => {};
  try {
    const model = await window.relaxweb.load("/bundle/");
    const x = BigInt64Array.from(values, BigInt);
    const { y } = await model.run({ x: { data: x, shape: [x.length] } });
    const report = { backend: model.backend, backendReason: model.backendReason, y: Array.from(y.data, String) };
    model.dispose();
    try {
      await window.relaxweb.load("/bundle/", { backend: "webgpu" });
    } catch (error) {
      report.webgpuError = `${error.name}: ${error.message}`;
    }
    return report;
  } finally {
    console.info = info;
  }
}
"""


def test_auto_on_a_page_with_webgpu_runs_an_int64_weight_outside_int32_on_wasm(tmp_path: Path) -> None:
    """y = x + c with the int64 constant c = 2^53 + 1: SwiftShader's adapter would take the
    bundle, but its manifest says WebGPU cannot hold c (webgpu.unavailable): "auto" takes wasm,
    `backendReason` naming the weight, and answers onnxruntime's values exactly; "webgpu" rejects."""
    from tests.e2e.test_integer_arithmetic import BIG, BIG_REASON, _constant_model  # noqa: PLC0415

    model = _constant_model("Add", np.array(BIG, np.int64))
    bundle = relaxweb.build(model, tmp_path / "bundle")
    x = np.array([0, -3, 2**31, 2**40, -2**40 + 7, -BIG], np.int64)
    [expected] = onnxruntime_outputs(model, {"x": x})
    with open_runner_page(bundle.path, webgpu=True) as page:
        report = page.evaluate(INT64_AUTO_IN_PAGE, [str(v) for v in x.tolist()])
    assert (report["backend"], report["backendReason"]) == ("wasm", f"WebGPU cannot run this bundle: {BIG_REASON}")
    assert report["y"] == [str(v) for v in expected.tolist()]
    assert report["webgpuError"] == f'Error: WebGPU cannot run this bundle: {BIG_REASON}; load it with backend "wasm"'
