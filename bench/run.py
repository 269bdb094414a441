"""Benchmark relaxweb against onnxruntime-web in one headless Chromium, on one WebGPU adapter.

Usage (from the repository root; needs torch, Playwright, Chromium, and ``npm install``)::

    python3 bench/run.py                      # GPT-2-like and BERT-like, seq 8/32/128
    python3 bench/run.py --models gpt2_legacy --runs 50 --out /tmp/results.json

Method
------
1. Models: ``scripts/export_test_models.py`` exports the tiny GPT-2-like / BERT-like ONNX
   models (dynamic ``batch`` and ``seq``); ``relaxweb build`` compiles each ONCE into a bundle
   (no bound, no recompilation per shape). Both land in ``bench/build/`` (git-ignored).
2. Serving: one local HTTP server (127.0.0.1, random port, ``Cache-Control: no-store``) serves
   this folder's page at ``/``, the models and bundles at ``/models/``, and
   ``node_modules/onnxruntime-web/dist`` at ``/ort/``, so every runtime loads over HTTP.
3. Browser: one headless Chromium (``relaxweb.browser.launch_chromium``: WebGPU on the
   SwiftShader adapter), one context with ``instrument.js`` added as an init script, so in
   every page, BEFORE any system initialises, the same wrappers count
   ``createComputePipeline(Async)``, ``createBuffer`` (and bytes; ``GPUBuffer.destroy`` for
   live bytes) and ``dispatchWorkgroups(Indirect)``.
4. Systems: relaxweb (the bundle's ``runtime/relaxweb.js``), onnxruntime-web with the
   ``webgpu`` execution provider, and, for reference, with ``wasm`` (single-threaded: the page
   is not cross-origin isolated). Each system gets a fresh page per model.
5. Per page: load (import of the runtime + model load/session creation: the load time), then
   for each seq in order (8, 32, 128 by default; batch 1): one first run, timed and counted
   alone (the pipelines it creates at seq 32/128 are "pipelines created on shape change"),
   ``--warmup`` runs, then ``--runs`` timed runs (median latency; dispatches per inference
   are the steady runs' dispatches / runs). Each run includes building the input tensors and
   reading the output back to JavaScript.
6. Runtime download size: from the page's network requests, the bytes of the runtime's own
   files (relaxweb: ``runtime/*.js`` + ``host.wasm``; onnxruntime-web: its ``.mjs`` and
   ``.wasm`` files), not the model's (``.onnx``; manifest, kernels, weights).
7. Correctness: each system's output at each shape is compared with onnxruntime (Python, CPU)
   when it is installed, as max |difference|.

The JSON (``--out``, default ``bench/results.json``) has everything measured; the table printed
gives ratios relaxweb / onnxruntime-web (webgpu). SwiftShader is a CPU implementation of
Vulkan, and timings on a shared machine are noisy: read the ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
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
import urllib.parse
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))

from relaxweb.browser import _RoutingHandler, launch_chromium, sync_playwright  # noqa: E402

ORT_DIST = REPO / "node_modules" / "onnxruntime-web" / "dist"
BASELINE = "ort-webgpu"
ALL_SYSTEMS = ("relaxweb", "ort-webgpu", "ort-wasm")


def prepare_models(models: list[str], work: Path) -> dict[str, dict]:
    """Export each model (unless already there) and build its relaxweb bundle once."""
    work.mkdir(parents=True, exist_ok=True)
    prepared = {}
    for name in models:
        onnx_path = work / f"{name}.onnx"
        if not onnx_path.is_file():
            run_command([sys.executable, "scripts/export_test_models.py", str(work), "--only", name])
        bundle = work / f"{name}_bundle"
        shutil.rmtree(bundle, ignore_errors=True)  # a fresh folder: no stale kernels from older builds
        run_command([sys.executable, "-m", "relaxweb", "build", str(onnx_path), "-o", str(bundle)])
        prepared[name] = {"onnx": onnx_path, "bundle": bundle, "info": json.loads((work / f"{name}.json").read_text())}
    return prepared


def run_command(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def make_inputs(info: dict, batch: int, seq: int) -> dict[str, dict]:
    """Deterministic int64 inputs: token ids below the model's vocabulary, masks of ones."""
    rng = np.random.default_rng(seq)
    inputs = {}
    for spec in info["inputs"]:
        shape = [batch, seq]
        if spec["kind"] == "ids":
            values = rng.integers(0, spec["high"], size=shape)
        else:
            values = np.ones(shape, dtype=np.int64)
        inputs[spec["name"]] = {"values": values.reshape(-1).tolist(), "shape": shape}
    return inputs


def reference_outputs(onnx_path: Path, inputs: dict) -> np.ndarray | None:
    """The first output from onnxruntime (Python, CPU), or None when it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {name: np.array(v["values"], dtype=np.int64).reshape(v["shape"]) for name, v in inputs.items()}
    return session.run(None, feeds)[0].reshape(-1)


def start_server(routes: list[tuple[str, Path]]) -> http.server.ThreadingHTTPServer:
    """relaxweb.browser's routing handler (no-store, wasm/mjs MIME types) on a random port."""
    handler = type("BenchHandler", (_RoutingHandler,), {"routes": routes, "quiet": True})
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


def bench_system(context, base_url, routes, system, model, args) -> dict:
    """One system on one model, in a fresh page: load, then each seq in order."""
    page = context.new_page()
    requests, errors = [], []  # (url, HTTP status) of every response; page errors
    page.on("response", lambda response: requests.append((response.url, response.status)))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    result: dict = {"system": system}
    try:
        page.goto(base_url + "page.html")
        page.wait_for_function("window.benchReady === true", timeout=30_000)
        result["page_adapter"] = page.evaluate("bench.pageAdapter()")
        urls = {"bundleUrl": f"/models/{model['bundle'].name}/", "onnxUrl": f"/models/{model['onnx'].name}"}
        loaded = page.evaluate("([name, urls]) => bench.load(name, urls)", [system, urls])
        result.update(load_ms=loaded["loadMs"], load_counts=loaded["counts"], system_adapter=loaded["adapterInfo"])
        result["shapes"] = {}
        for seq in args.seqs:
            inputs = make_inputs(model["info"], args.batch, seq)
            shape = page.evaluate("(cfg) => bench.runShape(cfg)",
                                  {"inputs": inputs, "warmup": args.warmup, "runs": args.runs})
            reference = reference_outputs(model["onnx"], inputs)
            output = np.array(shape.pop("output"), dtype=np.float32)
            shape["max_abs_diff_vs_onnxruntime_cpu"] = (
                None if reference is None else float(np.max(np.abs(output - reference))))
            shape["median_ms"] = statistics.median(shape["timesMs"])
            shape["dispatches_per_run"] = shape["steady"]["dispatches"] / args.runs
            result["shapes"][str(seq)] = shape
            print(f"  {system:11s} seq {seq:4d}: median {shape['median_ms']:8.2f} ms, first run "
                  f"{shape['firstRunMs']:8.1f} ms, {shape['dispatches_per_run']:g} dispatches, "
                  f"{shape['firstRun']['pipelines']} new pipelines", flush=True)
        result["totals"] = shape["totals"]
        result["load_and_first_run_ms"] = result["load_ms"] + result["shapes"][str(args.seqs[0])]["firstRunMs"]
    except Exception as error:  # one failing system must not lose the others' numbers
        result["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
        print(f"  {system}: FAILED: {result['error']}", flush=True)
    finally:
        page.close()
    result["page_errors"] = errors
    files = []
    for url, status in dict.fromkeys(requests):
        path = file_for(url, routes)
        size = path.stat().st_size if status == 200 and path is not None and path.is_file() else None
        files.append({"url": urllib.parse.urlsplit(url).path, "status": status, "bytes": size,
                      "runtime": is_runtime_file(url)})
    result["requests"] = files
    result["runtime_bytes"] = sum(f["bytes"] or 0 for f in files if f["runtime"])
    result["runtime_files"] = [f["url"].rsplit("/", 1)[-1] for f in files if f["runtime"] and f["bytes"]]
    return result


def summary_rows(result: dict, seqs: list[int]) -> list[tuple[str, str]]:
    """(label, key) of the table's rows; key is a path into a system's result."""
    rows = [(f"median latency seq {s} (ms)", f"shapes.{s}.median_ms") for s in seqs]
    rows += [(f"first run seq {s} (ms)", f"shapes.{s}.firstRunMs") for s in seqs]
    rows += [("load (ms)", "load_ms"), (f"load + first run seq {seqs[0]} (ms)", "load_and_first_run_ms")]
    rows += [(f"dispatches / inference seq {s}", f"shapes.{s}.dispatches_per_run") for s in seqs]
    rows += [("pipelines created at load", "load_counts.pipelines"),
             (f"pipelines created, first run seq {seqs[0]}", f"shapes.{seqs[0]}.firstRun.pipelines")]
    rows += [(f"pipelines created on change to seq {s}", f"shapes.{s}.firstRun.pipelines") for s in seqs[1:]]
    rows += [("GPU buffer bytes created (all)", "totals.bufferBytes"),
             ("GPU buffer bytes live at peak", "totals.peakLiveBytes"),
             ("GPU buffers created (all)", "totals.buffers"),
             ("runtime download (bytes)", "runtime_bytes")]
    rows += [(f"max abs diff vs onnxruntime CPU, seq {s}", f"shapes.{s}.max_abs_diff_vs_onnxruntime_cpu") for s in seqs]
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
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.2f}" if value < 1000 else f"{value:,.0f}"
    return f"{int(value):,}"


def ratio(a, b) -> str:
    if a is None or b is None:
        return "-"
    if b == 0:
        return "=" if a == 0 else "inf"
    return f"{a / b:.2g}" if a / b < 0.1 else f"{a / b:.2f}"


def print_table(model: str, results: dict[str, dict], seqs: list[int]) -> str:
    systems = list(results)
    header = ["", *systems]
    if "relaxweb" in results and BASELINE in results:
        header.append(f"relaxweb / {BASELINE}")
    lines = [f"### {model}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, key in summary_rows(results[systems[0]], seqs):
        values = [lookup(results[s], key) for s in systems]
        cells = [label, *map(fmt, values)]
        if len(header) > len(systems) + 1:
            cells.append(ratio(lookup(results["relaxweb"], key), lookup(results[BASELINE], key)))
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    return text


def plot(all_results: dict, seqs: list[int], path: Path) -> None:
    """An SVG of median latency against seq, one panel per model, one line per system (no
    plotting library needed); both axes are logarithmic."""
    import math

    colors = {"relaxweb": "#1f77b4", "ort-webgpu": "#d62728", "ort-wasm": "#7f7f7f"}
    width, height, margin = 360, 260, 50
    panels = []
    for index, (model, results) in enumerate(all_results.items()):
        lines = {system: [lookup(result, f"shapes.{s}.median_ms") for s in seqs] for system, result in results.items()}
        values = [v for medians in lines.values() for v in medians if v]
        if not values:
            continue
        low, high = math.log10(min(values)) - 0.1, math.log10(max(values)) + 0.1
        x0 = index * (width + margin)

        def x(seq: int) -> float:
            span = math.log10(max(seqs)) - math.log10(min(seqs)) or 1
            return x0 + margin + (math.log10(seq) - math.log10(min(seqs))) / span * (width - margin - 10)

        def y(ms: float) -> float:
            return 10 + (high - math.log10(ms)) / (high - low) * (height - margin - 10)

        parts = [f'<text x="{x0 + width / 2:.0f}" y="12" text-anchor="middle" font-size="13">{model}</text>',
                 f'<line x1="{x0 + margin}" y1="{height - margin}" x2="{x0 + width}" y2="{height - margin}" stroke="black"/>',
                 f'<line x1="{x0 + margin}" y1="10" x2="{x0 + margin}" y2="{height - margin}" stroke="black"/>',
                 f'<text x="{x0 + width / 2 + 20:.0f}" y="{height - 12}" text-anchor="middle" font-size="11">seq (batch 1)</text>',
                 f'<text x="{x0 + 12}" y="{height / 2 - 20:.0f}" font-size="11" transform="rotate(-90 {x0 + 12} {height / 2 - 20:.0f})" '
                 'text-anchor="middle">median latency (ms)</text>']
        for seq in seqs:
            parts.append(f'<text x="{x(seq):.1f}" y="{height - margin + 14}" text-anchor="middle" font-size="10">{seq}</text>')
        for decade in range(math.floor(low), math.ceil(high) + 1):
            for step in (1, 2, 5):
                ms = step * 10 ** decade
                if low <= math.log10(ms) <= high:
                    parts.append(f'<text x="{x0 + margin - 4}" y="{y(ms) + 3:.1f}" text-anchor="end" font-size="10">{ms:g}</text>')
        for row, (system, medians) in enumerate(lines.items()):
            points = " ".join(f"{x(s):.1f},{y(m):.1f}" for s, m in zip(seqs, medians) if m)
            color = colors.get(system, "black")
            parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
            parts.append(f'<text x="{x0 + margin + 8}" y="{24 + 13 * row}" font-size="11" fill="{color}">{system}</text>')
        panels.append("\n".join(parts))
    total_width = len(panels) * (width + margin)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_width}" height="{height}" font-family="sans-serif">\n'
           f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(panels) + "\n</svg>\n")
    path.write_text(svg)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2_legacy", "bert_legacy"])
    parser.add_argument("--systems", nargs="+", default=list(ALL_SYSTEMS), choices=ALL_SYSTEMS)
    parser.add_argument("--seqs", nargs="+", type=int, default=[8, 32, 128])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20, help="timed runs per shape (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per shape after the first")
    parser.add_argument("--work", type=Path, default=BENCH_DIR / "build", help="models and bundles")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results.json")
    parser.add_argument("--plot", type=Path, default=BENCH_DIR / "latency.svg", help="the latency plot (SVG)")
    parser.add_argument("--table", type=Path, metavar="JSON", help="only print the tables of a results JSON")
    args = parser.parse_args()
    if args.table:
        report = json.loads(args.table.read_text())
        for name, results in report["results"].items():
            print_table(name, results, report["settings"]["seqs"])
            print()
        plot(report["results"], report["settings"]["seqs"], args.plot)
        return

    systems = list(args.systems)
    if not (ORT_DIST / "ort.webgpu.min.mjs").is_file():
        print(f"onnxruntime-web is missing ({ORT_DIST}): run `npm install` in {REPO}; "
              "benchmarking relaxweb alone", flush=True)
        systems = [s for s in systems if s == "relaxweb"]

    models = prepare_models(args.models, args.work)
    routes = [("/ort/", ORT_DIST), ("/models/", args.work.resolve()), ("/", BENCH_DIR)]
    server = start_server(routes)
    base_url = f"http://127.0.0.1:{server.server_address[1]}/"
    all_results: dict[str, dict[str, dict]] = {}
    browser_version = None
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            browser_version = browser.version
            context = browser.new_context()
            context.add_init_script(path=str(BENCH_DIR / "instrument.js"))
            for name, model in models.items():
                print(f"{name}:", flush=True)
                all_results[name] = {s: bench_system(context, base_url, routes, s, model, args) for s in systems}
            browser.close()
    finally:
        server.shutdown()
        server.server_close()

    adapters = {json.dumps(r.get("page_adapter"), sort_keys=True) for rs in all_results.values() for r in rs.values()}
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python3", "bench/run.py", *sys.argv[1:]]),
        "browser": f"Chromium {browser_version}",
        "platform": platform.platform(),
        "adapter": [json.loads(a) for a in sorted(adapters)],
        "onnxruntime_web": json.loads((ORT_DIST.parent / "package.json").read_text())["version"]
        if ORT_DIST.is_dir() else None,
        "settings": {"batch": args.batch, "seqs": args.seqs, "runs": args.runs, "warmup": args.warmup},
        "results": all_results,
    }
    if len(adapters) != 1:
        print(f"WARNING: pages saw different adapters: {sorted(adapters)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nadapter: {report['adapter']}\n")
    for name, results in all_results.items():
        print_table(name, results, args.seqs)
        print()
    print(f"wrote {args.out}")
    plot(all_results, args.seqs, args.plot)


if __name__ == "__main__":
    main()
