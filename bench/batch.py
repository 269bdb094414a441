"""Ragged batches (issue 16) in one headless Chromium: relaxweb's ``runBatch`` against running
the same sequences one by one and padded, and against onnxruntime-web (WebGPU).

Usage (from the repository root; needs Playwright, Chromium, ``npm install`` for onnxruntime-web;
``bert_base`` also the model corpus's torch environment for its export:
``python3 scripts/model_zoo.py setup --only torch``)::

    python3 bench/batch.py                                # the tiny BERT-like and GPT-2-like models
    python3 bench/batch.py --models bert_base --runs 1    # real-size BERT (slow on SwiftShader)
    python3 bench/batch.py --models bert_tiny --runs 1 --warmup 0 --reuse-build   # while developing
    python3 bench/batch.py --models bert_base --work-only   # only the work counts (no browser)
    python3 bench/batch.py --systems relaxweb-python      # relaxweb's modes on wgpu in this process (a GPU machine)
    python3 bench/batch.py --table bench/build/batch-results.json                  # a saved run's tables

Method
------
1. Models (``MODELS``): ``bert_tiny`` and ``gpt2_tiny`` are ``scripts/export_test_models.py``'s
   ``bert_legacy`` and ``gpt2_legacy`` (2 layers, hidden 64, vocab 128); ``bert_base`` is
   ``bench/export_real_models.py``'s (transformers BertModel at bert-base size, optimum).  Each
   is exported once into ``--work`` (``bench/build``, as ``bench/run.py`` does) and built ONCE
   with bounds so that batch 32 x seq 128 fits (``--bound batch=32 --bound seq=128``; BERT-base's
   dims are ``batch_size`` / ``sequence_length``) into ``NAME_batch32x128_bundle`` (the bounds
   follow ``--instances`` and ``--max-seq``).
2. The batch: ``--instances`` (32) sequences, lengths uniform integers in ``--min-seq`` ..
   ``--max-seq`` (8 .. 128) from ``numpy.random.default_rng(--seed)`` (printed and in the JSON);
   each instance is batch 1: token ids uniform in the vocabulary (seeded by the instance's
   index), ``attention_mask`` all ones over its length, ``token_type_ids`` zeros.
3. One local server (``bench/run.py``'s) serves ``batch.html`` / ``batch.js``, the models at
   ``/models/`` and onnxruntime-web at ``/ort/``; one headless Chromium (SwiftShader WebGPU)
   with ``instrument.js`` as an init script (dispatches, buffers, bytes moved); a fresh page per
   system and model.  The instances go to the page once (base64).
4. Modes, each timed as the wall clock of the whole batch, from making the input tensors (fresh
   copies of each instance's arrays, as an application makes them) to every output read back
   to JavaScript:

   - ``relaxweb batch``: one ``model.runBatch([...instances])`` (the ragged batch).
   - ``relaxweb one-by-one``: ``model.run(instance)`` for each instance in a loop.
   - ``relaxweb padded``: one ``model.run`` at batch N x ``--max-seq``: the padded tensors are
     made in the timed region (each input zero-padded on the right along the sequence axis,
     so ``attention_mask`` marks the padding; a model without a mask, GPT-2's causal decoder,
     is padded on the right and its valid positions are unaffected).
   - ``ort padded`` and ``ort one-by-one``: the same with onnxruntime-web's ``webgpu`` provider.

   In a page: one untimed warm-up pass over the modes (the first run compiles pipelines; its
   outputs are the ones checked), ``--warmup`` more, then ``--runs`` timed passes, the modes
   interleaved within each pass; the figure is the median.  Ratios: relaxweb batch / relaxweb
   one-by-one, batch / padded, batch / ort padded, batch / ort one-by-one.
5. Correctness: each instance's first output (for padded modes its rows ``[i, :length]``)
   against onnxruntime (Python, CPU) run on that instance alone: the worst max |difference|.
6. Work, computed in Python from the bundle (no GPU): the bundle's ``host.wasm`` is run on the
   input shapes (``relaxweb.runtime.host.HostModule``) and gives the command list of a run and
   the params block it writes; for each dispatch:

   - ``flops``: the kernel's manifest ``cost.flops`` tree evaluated with the call site's params
     fields (``relaxweb/runtime/profile.py``): output elements x scalar operations per element.
     Library kernels have no cost tree (the fused ``attention``): their FLOPs are NOT in the
     figure; ``uncosted`` lists their calls per run.
   - ``invocations``: the params block's first field, ``element_count``: the invocations the
     dispatch runs (64 per workgroup, the tail masked): the output elements for ``element``
     schedules, a quarter of them for ``vectorized``, 64 per tile for matmul tiles, a workgroup's
     64 per output element for ``workgroup_reduction``.  The manifest gives no output element
     count per dispatch; this is the nearest per-dispatch count of what is computed, and it
     covers every kernel (attention included).
   - ``workgroups``: x * y * z of the dispatch's grid.

   ``needed`` sums these over every instance's run at its own length (batch 1); ``padded`` over
   one run at batch N x max-seq; ``ragged`` is ``needed`` by construction (a ragged dispatch's
   workgroups are the instances' own grids laid end to end, ``relaxweb/wgsl/ragged.py``), not
   measured, except its dispatch count: the instances' dispatch lists merged by
   ``relaxweb.runtime.batch.merge_dispatches`` (what the runtimes do), at most 64 instances
   per dispatch.  A command list that stops for a read (a value computed on the GPU) cannot be
   followed without a GPU: the count stops there and says so.

Until the JS runtime has ``runBatch`` (the batch-js branch), the page reports "runBatch missing"
for that mode and measures the rest.  SwiftShader is a CPU implementation of Vulkan on a shared
machine: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import shutil
import statistics
import struct
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from run import (  # noqa: E402
    ORT_DIST, REPO, _export_real, _export_tiny, encode_inputs, first_line, fmt, launch_chromium, ratio, report_header,
    run_command, start_server, sync_playwright,
)

from relaxweb.runtime.batch import chunks, merge_dispatches  # noqa: E402
from relaxweb.runtime.host import Dispatch, HostModule, Read, Resume  # noqa: E402
from relaxweb.runtime.profile import evaluate_tree  # noqa: E402

SYSTEMS = ("relaxweb", "ort-webgpu", "relaxweb-python")
#: The modes each system runs, in the page's order (batch.js).
MODES = {"relaxweb": ("batch", "one-by-one", "padded"), "ort-webgpu": ("padded", "one-by-one"),
         "relaxweb-python": ("batch", "one-by-one", "padded")}
RAGGED = ("relaxweb", "batch")
#: (label, numerator, denominator) of the printed ratios: below 1, the ragged batch is faster.
RATIOS = (("relaxweb batch / relaxweb one-by-one", RAGGED, ("relaxweb", "one-by-one")),
          ("relaxweb batch / relaxweb padded", RAGGED, ("relaxweb", "padded")),
          ("relaxweb batch / ort-webgpu padded", RAGGED, ("ort-webgpu", "padded")),
          ("relaxweb batch / ort-webgpu one-by-one", RAGGED, ("ort-webgpu", "one-by-one")),
          ("ort-webgpu padded / ort-webgpu one-by-one", ("ort-webgpu", "padded"), ("ort-webgpu", "one-by-one")),
          ("relaxweb-python batch / one-by-one", ("relaxweb-python", "batch"), ("relaxweb-python", "one-by-one")),
          ("relaxweb-python batch / padded", ("relaxweb-python", "batch"), ("relaxweb-python", "padded")))

Inputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class BatchModel:
    name: str
    title: str
    export: Callable[[Path], Path]  # the work folder -> the exported .onnx
    vocab: int
    batch_dim: str  # the symbolic dims the bounds name
    seq_dim: str
    ids: str = "input_ids"
    mask: str | None = None  # all ones over the instance's length
    types: str | None = None  # zeros


MODELS = {model.name: model for model in (
    BatchModel("bert_tiny", "BERT-like, 2 layers, hidden 64 (scripts/export_test_models.py bert_legacy)",
               _export_tiny("bert_legacy"), 128, "batch", "seq", mask="attention_mask"),
    BatchModel("gpt2_tiny", "GPT-2-like, 2 layers, hidden 64, causal, no mask (gpt2_legacy)",
               _export_tiny("gpt2_legacy"), 128, "batch", "seq"),
    BatchModel("bert_base", "BERT-base (transformers, optimum feature-extraction)", _export_real("bert_base"),
               30522, "batch_size", "sequence_length", mask="attention_mask", types="token_type_ids"),
)}
DEFAULT_MODELS = ("bert_tiny", "gpt2_tiny")


def sequence_lengths(count: int, low: int, high: int, seed: int) -> list[int]:
    """``count`` lengths, uniform integers in ``low .. high`` (both included), deterministic."""
    return [int(n) for n in np.random.default_rng(seed).integers(low, high + 1, size=count)]


def make_instances(model: BatchModel, lengths: Sequence[int]) -> list[Inputs]:
    """One batch-1 instance per length: random ids in the vocabulary (seeded by the index),
    the mask all ones, token types zeros."""
    instances = []
    for index, length in enumerate(lengths):
        rng = np.random.default_rng(1000 + index)
        inputs = {model.ids: rng.integers(0, model.vocab, size=(1, length), dtype=np.int64)}
        if model.mask:
            inputs[model.mask] = np.ones((1, length), dtype=np.int64)
        if model.types:
            inputs[model.types] = np.zeros((1, length), dtype=np.int64)
        instances.append(inputs)
    return instances


def padded(instances: Sequence[Inputs], max_seq: int) -> Inputs:
    """The instances as one batch: each input zero-padded on the right to ``max_seq`` (a mask's
    zeros mark the padding), what batch.js makes in the timed region."""
    names = instances[0].keys()
    out = {}
    for name in names:
        stacked = np.zeros((len(instances), max_seq), dtype=instances[0][name].dtype)
        for row, instance in enumerate(instances):
            stacked[row, :instance[name].shape[1]] = instance[name][0]
        out[name] = stacked
    return out


# Work: what the dispatches of a run compute, from the bundle's host module and manifest -----


def run_work(host: HostModule, shapes: Sequence[Sequence[int]]) -> dict:
    """flops (costed kernels), invocations, workgroups and dispatches of one run at ``shapes``
    (manifest input order), the calls of kernels without a cost tree, and (``commands``, not
    in the JSON) the run's dispatches."""
    manifest = host.manifest
    host.run_with_shapes(shapes)
    params, commands = host.params(), host.commands()
    work = {"flops": 0, "invocations": 0, "workgroups": 0, "dispatches": 0, "uncosted": {}, "stopped_at_read": False,
            "commands": [c for c in commands if isinstance(c, Dispatch)]}
    for command in commands:
        if isinstance(command, Read):
            work["stopped_at_read"] = True
            break
        if isinstance(command, Resume):
            work["stopped_at_read"] = True  # a loop: its next iteration's params come after a submit
            break
        assert isinstance(command, Dispatch)
        call_site = manifest["call_sites"][command.call_site]
        kernel = manifest["kernels"][call_site["kernel"]]
        fields = struct.unpack_from(f"<{call_site['params_size'] // 4}i", params, call_site["params_offset"])
        x, y, z = command.grid
        work["dispatches"] += 1
        work["invocations"] += fields[0]
        work["workgroups"] += x * y * z
        flops = evaluate_tree(kernel["cost"]["flops"], dict(zip(kernel.get("params", []), fields))) \
            if "cost" in kernel else None
        if flops is None:
            work["uncosted"][kernel["name"]] = work["uncosted"].get(kernel["name"], 0) + 1
        else:
            work["flops"] += flops
    return work


def add_work(total: dict, work: dict) -> None:
    for key in ("flops", "invocations", "workgroups", "dispatches"):
        total[key] += work[key]
    for name, calls in work["uncosted"].items():
        total["uncosted"][name] = total["uncosted"].get(name, 0) + calls
    total["stopped_at_read"] |= work["stopped_at_read"]


def batch_work(bundle: Path, instances: Sequence[Inputs], max_seq: int) -> dict:
    """``needed`` (every instance at its own length, batch 1), ``padded`` (one run at batch N x
    max_seq), ``ragged`` (= needed: see the module doc) and the ratios padded / needed."""
    host = HostModule.from_bundle(bundle)
    names = host.input_names
    needed = {"flops": 0, "invocations": 0, "workgroups": 0, "dispatches": 0, "uncosted": {}, "stopped_at_read": False}
    lists = {}
    for index, instance in enumerate(instances):
        work = run_work(host, [instance[name].shape for name in names])
        lists[index] = work.pop("commands")
        add_work(needed, work)
    whole = padded(instances, max_seq)
    padded_work = run_work(host, [whole[name].shape for name in names])
    del padded_work["commands"]
    # The ragged batch's dispatches: the first round's lists merged as runtime/batch.py merges
    # them, MAX_INSTANCES instances per dispatch (the whole run where no list stops at a read).
    merged = sum(len(chunks(members)) for _, members in merge_dispatches(lists))
    ragged = {**needed, "uncosted": dict(needed["uncosted"]), "dispatches": merged}
    return {"needed": needed, "padded": padded_work, "ragged": ragged,
            "padded_over_needed": {key: padded_work[key] / needed[key] if needed[key] else None
                                   for key in ("flops", "invocations", "workgroups")}}


# Building, the page, the reference ---------------------------------------------------------


def prepare(model: BatchModel, work: Path, instances: int, max_seq: int, reuse: bool, timeout: int,
            runtime_js: Path | None = None) -> dict:
    """Export (unless there) and build the bundle with bounds for instances x max_seq; errors
    are one line in the entry (``error``: nothing runs; ``build_error``: onnxruntime-web still runs).
    With ``runtime_js``, the bundle's ``runtime/`` is replaced by that folder's files (the JS
    runtime of another checkout, e.g. a branch adding runBatch, before it is merged)."""
    entry = _build(model, work, instances, max_seq, reuse, timeout)
    if runtime_js is not None and "bundle" in entry:
        runtime = entry["bundle"] / "runtime"
        shutil.rmtree(runtime)
        shutil.copytree(runtime_js, runtime, ignore=shutil.ignore_patterns("*.d.ts", "__pycache__"))
        entry["runtime_js"] = str(runtime_js)
    return entry


def _build(model: BatchModel, work: Path, instances: int, max_seq: int, reuse: bool, timeout: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    try:
        onnx_path = model.export(work)
    except (RuntimeError, OSError) as error:
        return {"error": f"export failed: {first_line(error)}"}
    data = onnx_path.with_name(onnx_path.name + ".data")
    entry = {"onnx": onnx_path, "external_data": [data.name] if data.is_file() else []}
    bundle = work / f"{model.name}_batch{instances}x{max_seq}_bundle"  # its bounds in its name: --reuse-build
    if reuse and (bundle / "manifest.json").is_file():
        return {**entry, "bundle": bundle}
    shutil.rmtree(bundle, ignore_errors=True)
    start = time.monotonic()
    try:
        run_command([sys.executable, "-m", "relaxweb", "build", str(onnx_path), "-o", str(bundle),
                     "--bound", f"{model.batch_dim}={instances}", "--bound", f"{model.seq_dim}={max_seq}"],
                    timeout=timeout)
    except RuntimeError as error:
        return {**entry, "build_error": f"relaxweb build failed: {first_line(error)}"}
    return {**entry, "bundle": bundle, "build_s": round(time.monotonic() - start, 1)}


def references(onnx_path: Path, instances: Sequence[Inputs]) -> list[np.ndarray] | None:
    """onnxruntime (Python, CPU) on each instance alone: its first output, flat; None without it."""
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return [session.run(None, instance)[0].reshape(-1).astype(np.float32) for instance in instances]


def bench_system(context, base_url: str, system: str, prepared: dict, instances: Sequence[Inputs],
                 reference: list[np.ndarray] | None, args: argparse.Namespace) -> dict:
    """One system on one model in a fresh page: load, then its modes (MODES), interleaved."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    result: dict = {"system": system}
    try:
        page.goto(base_url + "batch.html")
        page.wait_for_function("window.batchBenchReady === true", timeout=30_000)
        result["page_adapter"] = page.evaluate("batchBench.pageAdapter()")
        urls = {"onnxUrl": f"/models/{prepared['onnx'].name}",
                "externalData": [{"path": f, "data": f"/models/{f}"} for f in prepared["external_data"]],
                "bundleUrl": f"/models/{prepared['bundle'].name}/" if "bundle" in prepared else None}
        loaded = page.evaluate("([name, urls]) => batchBench.load(name, urls)", [system, urls])
        result.update(load_ms=loaded["loadMs"], system_adapter=loaded["adapterInfo"])
        page.evaluate("(config) => batchBench.setInstances(config)",
                      {"instances": [encode_inputs(instance) for instance in instances], "maxSeq": args.max_seq})
        measured = page.evaluate("(config) => batchBench.measure(config)",
                                 {"modes": list(MODES[system]), "warmup": args.warmup, "runs": args.runs})
    except Exception as error:  # one failing system must not lose the other's numbers
        result["error"] = f"{type(error).__name__}: {first_line(error)}"
        print(f"  {system}: FAILED: {result['error']}", flush=True)
        measured = {}
    result["modes"] = {}
    for mode, figures in measured.items():
        if "error" not in figures:
            outputs = figures.pop("outputs")
            if reference is not None:
                diffs = [float(np.max(np.abs(np.frombuffer(base64.b64decode(o), np.float32) - r)))
                         if len(base64.b64decode(o)) == 4 * r.size else float("inf") for o, r in zip(outputs, reference)]
                figures["max_abs_diff_vs_onnxruntime_cpu"] = max(diffs)
                figures["max_abs_reference"] = max(float(np.max(np.abs(r))) for r in reference)
            timed = figures["timesMs"]
            figures["median_ms"] = statistics.median(timed) if timed else figures["firstMs"]
            figures["dispatches_per_run"] = figures["steady"]["dispatches"] / len(timed) if timed else \
                figures["first"]["dispatches"]
            print(f"  {system:11s} {mode:11s}: median {figures['median_ms']:10.1f} ms over {len(timed)} run(s), first "
                  f"{figures['firstMs']:10.1f} ms, {figures['dispatches_per_run']:g} dispatches, max diff "
                  f"{figures.get('max_abs_diff_vs_onnxruntime_cpu', float('nan')):.2g}", flush=True)
        else:
            print(f"  {system:11s} {mode:11s}: {figures['error']}", flush=True)
        result["modes"][mode] = figures
    with contextlib.suppress(Exception):
        page.close()
    result["page_errors"] = errors[:20]
    return result


def bench_python(prepared: dict, instances: Sequence[Inputs], reference: list[np.ndarray] | None,
                 args: argparse.Namespace) -> dict:
    """relaxweb's three modes through the Python runtime (``relaxweb.load(bundle,
    backend="webgpu")``: wgpu on this machine's adapter, lavapipe here, a GPU's Vulkan driver
    on a machine with one), timed from the arrays in to the arrays out with ``perf_counter``,
    the modes interleaved as in the page.  No browser: the system to run on a GPU machine."""
    import relaxweb  # noqa: PLC0415 - only this system needs the runtime and wgpu

    result: dict = {"system": "relaxweb-python"}
    started = time.perf_counter()
    try:
        session = relaxweb.load(prepared["bundle"], backend="webgpu")
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {first_line(error)}"
        print(f"  relaxweb-python: FAILED: {result['error']}", flush=True)
        return result
    result["load_ms"] = (time.perf_counter() - started) * 1000
    info = session.device.adapter.info
    result["page_adapter"] = {key: info.get(key, "") for key in ("vendor", "architecture", "device", "description")}
    first_output = session.manifest["outputs"][0]["name"]
    whole = padded(instances, args.max_seq)
    lengths = [next(iter(instance.values())).shape[1] for instance in instances]

    def batch() -> tuple[list[np.ndarray], int]:
        outputs = session.run_batch(instances)
        return [o[first_output] for o in outputs], session.last_batch.dispatches

    def one_by_one() -> tuple[list[np.ndarray], int]:
        outputs, dispatches = [], 0
        for instance in instances:
            outputs.append(session.run(instance)[first_output])
            dispatches += session.last_dispatch_count
        return outputs, dispatches

    def padded_run() -> tuple[list[np.ndarray], int]:
        out = session.run(whole)[first_output]
        return [out[row:row + 1, :length] for row, length in enumerate(lengths)], session.last_dispatch_count

    modes = {"batch": batch, "one-by-one": one_by_one, "padded": padded_run}
    figures: dict[str, dict] = {mode: {"timesMs": []} for mode in modes}
    for mode, run in modes.items():  # the first run of each: untimed for the median, checked
        started = time.perf_counter()
        outputs, dispatches = run()
        figures[mode].update(firstMs=(time.perf_counter() - started) * 1000, dispatches_per_run=dispatches)
        if reference is not None:
            figures[mode]["max_abs_diff_vs_onnxruntime_cpu"] = max(
                float(np.max(np.abs(o.reshape(-1) - r))) if o.size == r.size else float("inf")
                for o, r in zip(outputs, reference))
    for timed in [False] * args.warmup + [True] * args.runs:
        for mode, run in modes.items():
            started = time.perf_counter()
            run()
            if timed:
                figures[mode]["timesMs"].append((time.perf_counter() - started) * 1000)
    result["modes"] = {}
    for mode, entry in figures.items():
        entry["median_ms"] = statistics.median(entry["timesMs"]) if entry["timesMs"] else entry["firstMs"]
        print(f"  {'relaxweb-python':15s} {mode:11s}: median {entry['median_ms']:10.1f} ms over {len(entry['timesMs'])} "
              f"run(s), first {entry['firstMs']:10.1f} ms, {entry['dispatches_per_run']:g} dispatches, max diff "
              f"{entry.get('max_abs_diff_vs_onnxruntime_cpu', float('nan')):.2g}", flush=True)
        result["modes"][mode] = entry
    return result


def work_only(names: Sequence[str], args: argparse.Namespace, report: dict) -> None:
    """--work-only: export, build and count the work of each model, no browser."""
    for name in names:
        model = MODELS[name]
        print(f"{name}:", flush=True)
        entry = report["results"][name] = {"title": model.title}
        prepared = prepare(model, args.work, args.instances, args.max_seq, args.reuse_build, args.build_timeout)
        if "bundle" not in prepared:
            entry["error"] = prepared.get("error") or prepared["build_error"]
            print(f"  not counted: {entry['error']}", flush=True)
            continue
        entry["work"] = batch_work(prepared["bundle"], make_instances(model, report["lengths"]), args.max_seq)
        print(work_table(name, entry["work"]), flush=True)


def run_models(names: Sequence[str], args: argparse.Namespace, report: dict, systems: Sequence[str]) -> None:
    routes = [("/ort/", ORT_DIST), ("/models/", args.work.resolve()), ("/", BENCH_DIR)]
    server = start_server(routes)
    base_url = f"http://127.0.0.1:{server.server_address[1]}/"
    lengths = report["lengths"]
    try:
        with sync_playwright() as playwright:
            browser = None
            for name in names:
                model = MODELS[name]
                print(f"{name}:", flush=True)
                entry = report["results"][name] = {"title": model.title}
                prepared = prepare(model, args.work, args.instances, args.max_seq, args.reuse_build, args.build_timeout,
                                   args.runtime_js)
                if "error" in prepared:
                    entry["error"] = prepared["error"]
                    print(f"  not benchmarked: {entry['error']}", flush=True)
                    continue
                if "build_error" in prepared:
                    entry["build_error"] = prepared["build_error"]
                    print(f"  {prepared['build_error']} (onnxruntime-web still runs)", flush=True)
                instances = make_instances(model, lengths)
                if "bundle" in prepared:
                    entry["work"] = batch_work(prepared["bundle"], instances, args.max_seq)
                    entry["build_s"] = prepared.get("build_s")
                    print(work_table(name, entry["work"]), flush=True)
                reference = references(prepared["onnx"], instances)
                entry["systems"] = {}
                for system in systems:
                    if system.startswith("relaxweb") and "build_error" in prepared:
                        entry["systems"][system] = {"system": system, "error": prepared["build_error"]}
                        continue
                    if system == "relaxweb-python":
                        entry["systems"][system] = bench_python(prepared, instances, reference, args)
                        continue
                    if browser is None or not browser.is_connected():  # the first, or after a crash
                        browser = launch_chromium(playwright)
                        report["browser"] = f"Chromium {browser.version}"
                        context = browser.new_context()
                        context.add_init_script(path=str(BENCH_DIR / "instrument.js"))
                    entry["systems"][system] = bench_system(context, base_url, system, prepared, instances,
                                                            reference, args)
                args.out.write_text(json.dumps(report, indent=1))  # what is done so far survives a crash
            if browser is not None:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()


# Tables --------------------------------------------------------------------------------------


def median_of(entry: dict, system: str, mode: str) -> float | None:
    figures = entry.get("systems", {}).get(system, {}).get("modes", {}).get(mode, {})
    return figures.get("median_ms")


def times_table(name: str, entry: dict) -> str:
    """Per system and mode: the median, the first run, dispatches per run, correctness; then the ratios."""
    lines = [f"### {name}: {entry.get('title', name)}", ""]
    if "error" in entry:
        return "\n".join([*lines, f"- not benchmarked: {entry['error']}"])
    lines += ["| system | mode | median (ms) | runs | first run (ms) | dispatches / run | max abs diff vs onnxruntime CPU |",
              "|---|---|---|---|---|---|---|"]
    for system, result in entry.get("systems", {}).items():
        if "error" in result:
            lines.append(f"| {system} | - | failed: {result['error']} | | | | |")
        for mode, figures in result.get("modes", {}).items():
            if "error" in figures:
                lines.append(f"| {system} | {mode} | {figures['error']} | | | | |")
                continue
            lines.append(f"| {system} | {mode} | {fmt(figures['median_ms'])} | {len(figures['timesMs'])} | "
                         f"{fmt(figures['firstMs'])} | {fmt(figures['dispatches_per_run'])} | "
                         f"{fmt(figures.get('max_abs_diff_vs_onnxruntime_cpu'))} |")
    lines += ["", "| ratio (below 1: the first is faster) | |", "|---|---|"]
    for label, (a_system, a_mode), (b_system, b_mode) in RATIOS:
        lines.append(f"| {label} | {ratio(median_of(entry, a_system, a_mode), median_of(entry, b_system, b_mode))} |")
    return "\n".join(lines)


def work_table(name: str, work: dict) -> str:
    """needed / padded / ragged: FLOPs (costed kernels), invocations, workgroups, dispatches."""
    lines = [f"{name}: work per batch (from the bundle's host module and cost trees)", "",
             "| | GFLOP (costed kernels) | invocations | workgroups | dispatches | FLOPs not counted (calls) |",
             "|---|---|---|---|---|---|"]
    for label in ("needed", "padded", "ragged"):
        w = work[label]
        uncosted = ", ".join(f"{kernel} x{calls}" for kernel, calls in w["uncosted"].items()) or "none"
        if w["stopped_at_read"]:
            uncosted += " (stopped at a read: counted up to it)"
        lines.append(f"| {label} | {w['flops'] / 1e9:.4g} | {fmt(w['invocations'])} | {fmt(w['workgroups'])} | "
                     f"{fmt(w['dispatches'])} | {uncosted} |")
    over = work["padded_over_needed"]
    lines.append(f"| padded / needed | {fmt(over['flops'])} | {fmt(over['invocations'])} | {fmt(over['workgroups'])} | | |")
    return "\n".join(lines)


def print_report(report: dict) -> None:
    print(f"{report.get('browser', '?')}, adapter {report.get('adapter', '?')}, onnxruntime-web "
          f"{report.get('onnxruntime_web', '?')}, {report.get('seconds', '?')} s in all")
    print(f"{len(report['lengths'])} instances, lengths (seed {report['settings']['seed']}): {report['lengths']} "
          f"(sum {sum(report['lengths'])}, padded {len(report['lengths'])} x {report['settings']['max_seq']} = "
          f"{len(report['lengths']) * report['settings']['max_seq']})\n")
    for name, entry in report["results"].items():
        if "systems" in entry or "error" in entry:
            print(times_table(name, entry))
            print()
        if "work" in entry:
            print(work_table(name, entry["work"]))
            print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(DEFAULT_MODELS), metavar="NAME",
                        help="default: %(default)s; also bert_base (seconds per sequence on SwiftShader)")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=["relaxweb", "ort-webgpu"],
                        help="relaxweb and ort-webgpu run in Chromium; relaxweb-python runs relaxweb's modes in this "
                             "process on wgpu (this machine's adapter: a GPU where there is one). Default: %(default)s")
    parser.add_argument("--runs", type=int, default=3, help="timed passes over the modes (median)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="untimed passes after the first (the first is always run, untimed, and checked)")
    parser.add_argument("--instances", type=int, default=32)
    parser.add_argument("--min-seq", type=int, default=8)
    parser.add_argument("--max-seq", type=int, default=128, help="the longest length, and the padded length")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--reuse-build", action="store_true", help="keep a bundle already in --work")
    parser.add_argument("--build-timeout", type=int, default=1800)
    parser.add_argument("--runtime-js", type=Path, metavar="DIR",
                        help="replace each bundle's runtime/ by this folder's files (e.g. another checkout's "
                             "relaxweb/runtime_js, to measure a runBatch not merged yet)")
    parser.add_argument("--work", type=Path, default=BENCH_DIR / "build", help="models and bundles")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "build" / "batch-results.json")
    parser.add_argument("--work-only", action="store_true",
                        help="only export, build and count the work (FLOPs, invocations, workgroups): no browser")
    parser.add_argument("--table", type=Path, metavar="JSON", help="only print the tables of a results JSON")
    args = parser.parse_args()
    if args.table:
        print_report(json.loads(args.table.read_text()))
        return
    systems = list(args.systems)
    if not (ORT_DIST / "ort.webgpu.min.mjs").is_file():
        print(f"onnxruntime-web is missing ({ORT_DIST}): run `npm install`; benchmarking relaxweb alone", flush=True)
        systems = [s for s in systems if s == "relaxweb"]
    started = time.monotonic()
    lengths = sequence_lengths(args.instances, args.min_seq, args.max_seq, args.seed)
    print(f"{args.instances} instances, lengths (seed {args.seed}): {lengths} (sum {sum(lengths)}, "
          f"padded {args.instances} x {args.max_seq} = {args.instances * args.max_seq})", flush=True)
    report = {
        **report_header("bench/batch.py"),
        "settings": {"runs": args.runs, "warmup": args.warmup, "instances": args.instances, "min_seq": args.min_seq,
                     "max_seq": args.max_seq, "seed": args.seed,
                     "runtime_js": str(args.runtime_js) if args.runtime_js else None},
        "lengths": lengths,
        "results": {},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.work_only:
        work_only(args.models, args, report)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
        return
    run_models(args.models, args, report, systems)
    report["seconds"] = round(time.monotonic() - started)
    report["adapter"] = sorted({json.dumps(r.get("page_adapter"), sort_keys=True) for e in report["results"].values()
                                for r in e.get("systems", {}).values() if "page_adapter" in r})
    args.out.write_text(json.dumps(report, indent=1))
    print()
    print_report(report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
