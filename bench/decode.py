"""Decode with a KV cache in headless Chromium: relaxweb vs onnxruntime-web (WebGPU), tokens/s.

Usage (from the repository root; needs Playwright, Chromium, ``npm install`` for onnxruntime-web,
and torch for training the tiny Llama once: ``python3 scripts/tiny_llama.py``)::

    python3 bench/decode.py                          # past 16, 256, 1024 (docs/benchmarks.md, "Decode")
    python3 bench/decode.py --past 16 --steps 4      # while developing
    python3 bench/decode.py --table bench/build/decode-results.json   # the tables of a saved run
    python3 bench/decode.py --lm MODEL.onnx [--prompt 32 --new-tokens 32 --runs 3]  # generation (issue 28)

``--lm`` (docs/benchmarks.md, issue 28): a decoder such as ``python3 scripts/export_decoders.py
DIR --size smollm-135m --only builder_int4`` writes, generating on four systems loaded in one
page, ``--runs`` rounds of one generation per system (their order alternating): relaxweb WebGPU (``model.generate``), relaxweb
wasm (``model.generate`` where the wasm model has it, else per-step ``model.run`` with the
presents read back: the table says which), onnxruntime-web WebGPU (present.* kept on the GPU as
'gpu-buffer' outputs and fed back) and onnxruntime-web wasm, one thread each (the page is not
cross-origin isolated). A prompt of random ids, prefilled from an empty past, then greedy new
tokens. Per system: load time, bytes fetched, GPU buffers and wasm memory, prefill time,
decode tokens/s (median over the runs), buffers created, dispatches and bytes per decode token,
and the tokens against onnxruntime (Python, CPU); the ratios against onnxruntime-web of the
same run. The relaxweb bundle is built with bounds for the prompt and the new tokens.

Method
------
1. The model: the tiny Llama of ``scripts/tiny_llama.py`` (optimum's decoder signature:
   ``input_ids``, ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key/.value`` ->
   ``logits``, ``present.{i}.key/.value``), built by relaxweb with bounds large enough for the
   longest past plus every step (``bounds_for``): so relaxweb allocates its memory at load.
2. One page (``decode.html``, ``decode.js``) in one headless Chromium on the SwiftShader adapter
   loads both systems; ``instrument.js`` (an init script, before either runtime loads) counts
   the real WebGPU calls of both the same way: ``createBuffer``, ``queue.writeBuffer`` and the
   ranges of ``mapAsync``-ed / mapped-at-creation buffers (bytes written and read).
3. For each past length P and each system in turn (the order alternating): a prefill of one
   token after a random past of P - 1 - W positions (N(0, 1), uploaded from JavaScript, untimed),
   W = ``--warmup`` untimed decode steps, then ``--steps`` timed ones at past P, P + 1, ...
   (the past the prefill makes is synthetic: the timing does not depend on its values).
   Both systems are driven as
   web libraries drive a decoder (transformers.js): present outputs stay on the GPU (relaxweb
   ``run(inputs, {keepOnGpu: presents})``, onnxruntime-web ``preferredOutputLocation:
   'gpu-buffer'``) and are fed back as the next step's past; the previous past is disposed; the
   logits are read back and the next token is chosen on the host by the same greedy argmax for
   both (onnxruntime-web cannot choose it on the GPU, so neither does relaxweb here).  A timed
   step is all of that: making the inputs, the run, the dispose, the readback and the argmax.
4. Per step and system: the time, and the counters' differences.  Per token (means over the
   timed steps of every round): buffers created; bytes written and read; of them the cache's:
   bytes beyond what the step's input_ids, attention_mask and position_ids (int64) and its
   logits (float32) account for, each rounded up to 16 bytes (runtimes pad uploads), not
   counting writes into uniform buffers (shader parameters, counted apart).  Anything else that
   moves counts there too (an activation read back for an op run on the CPU); a runtime that
   narrows int64 inputs to int32 writes less than their allowance, so that figure is a lower
   bound of what moves (``relaxweb-cache-on-host`` shows it at the cache's size: the tests).
   Tokens/s: 1000 / the median step time (ms), over the timed steps of every round.
5. Correctness: each system's greedy tokens against onnxruntime (Python, CPU) from the same
   prefill, and the prefill's logits (max |difference|).

The JSON (``--out``) has every step's figures and one step's list of transfers per system.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from run import (  # noqa: E402
    ORT_DIST, REPO, first_line, fmt, launch_chromium, ratio, report_header, start_server, sync_playwright,
)

import relaxweb  # noqa: E402

SYSTEMS = ("relaxweb", "ort-webgpu")  # the default; --systems may add the reference below
# relaxweb with the presents read back to JavaScript and uploaded again as the next past: what
# the counters show when the cache does move (a check of them, and what keepOnGpu saves)
ALL_SYSTEMS = ("relaxweb", "ort-webgpu", "relaxweb-cache-on-host")
BASELINE = "ort-webgpu"
PAST_LENGTHS = (16, 256, 1024)
GOAL_SPEEDUP = 2.0  # relaxweb's tokens/s at least twice onnxruntime-web's (issue 14)
ALIGN = 16  # the byte granularity uploads and readbacks are padded to in the cache's accounting
TINY_LLAMA = REPO / "scripts" / "tiny_llama.py"
DEFAULT_OUT = BENCH_DIR / "build" / "decode-results.json"


@dataclass(frozen=True)
class Decoder:
    """A KV-cache decoder's signature, from its ONNX graph: past inputs and present outputs in
    the same order, each past's shape after its batch dim ([heads, length, head dim], the
    length as 0), and the logits' output."""

    pasts: tuple[str, ...]
    presents: tuple[str, ...]
    past_shapes: tuple[tuple[int, ...], ...]  # the fixed dims, the length's place holding 0
    logits: str

    @property
    def names(self) -> dict:
        return {"pasts": list(self.pasts), "presents": list(self.presents), "logits": self.logits}


def decoder_signature(onnx_path: Path) -> Decoder:
    """The past/present names and shapes of a decoder with optimum's signature."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    dims = {value.name: [d.dim_value if d.HasField("dim_value") else 0 for d in value.type.tensor_type.shape.dim]
            for value in (*graph.input, *graph.output)}  # a name without a declared shape: []
    pasts = tuple(value.name for value in graph.input if value.name.startswith("past_key_values."))
    presents = tuple("present." + name[len("past_key_values."):] for name in pasts)
    missing = [name for name in (*presents, "logits") if name not in dims]
    required = [name for name in ("input_ids", "attention_mask", "position_ids") if name not in dims]
    if not pasts or missing or required:
        raise ValueError(f"{onnx_path.name} is not a decoder with optimum's signature: "
                         f"missing {', '.join(missing + required) or 'past_key_values.* inputs'}")
    return Decoder(pasts, presents, tuple(tuple(dims[name][1:]) for name in pasts), "logits")


def bounds_for(max_past: int, steps: int) -> dict[str, int]:
    """relaxweb's bounds for the benchmark: batch 1, one token per step (the prefill is one token
    too), and a past long enough for the timed steps after the longest past (the last one's past
    is max_past + steps - 1; one to spare)."""
    past = max_past + steps
    return {"batch_size": 1, "sequence_length": 1, "past_sequence_length": past, "total_sequence_length": past + 1}


def random_past(decoder: Decoder, length: int, seed: int) -> dict[str, np.ndarray]:
    """Keys and values N(0, 1) of ``length`` positions for batch 1."""
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal((1, *(d or length for d in shape))).astype(np.float32)
            for name, shape in zip(decoder.pasts, decoder.past_shapes)}


def step_feeds(token: int, position: int) -> dict[str, np.ndarray]:
    """What decode.js's stepFeeds makes: one token at ``position`` after ``position`` tokens."""
    return {"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, position + 1), np.int64),
            "position_ids": np.array([[position]], np.int64)}


def reference_decode(onnx_path: Path, decoder: Decoder, token: int, past: dict[str, np.ndarray],
                     count: int) -> tuple[np.ndarray, list[int]]:
    """onnxruntime (Python, CPU) from the same prefill: its logits and ``count`` + 1 greedy tokens."""
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    position = next(iter(past.values())).shape[2]
    tokens, prefill = [], None
    for _ in range(count + 1):
        outputs = dict(zip(names, session.run(None, step_feeds(token, position) | past)))
        logits = outputs[decoder.logits].reshape(-1)
        prefill = logits if prefill is None else prefill
        token = int(np.argmax(logits))
        tokens.append(token)
        past = {name: outputs[present] for name, present in zip(decoder.pasts, decoder.presents)}
        position += 1
    return prefill, tokens


def padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


#: The run status relaxweb reads with a run's outputs (relaxweb/runtime_js/run_status.js): not cache.
RUN_STATUS_BYTES = 32


def per_token(steps: list[dict], vocab: int, status_bytes: int = 0) -> dict:
    """A system's figures per token over its timed steps (means of exact counts, the median time);
    ``status_bytes`` cleared before and read after each step are not cache (relaxweb's run status)."""
    def mean(values) -> float:
        return float(np.mean(list(values))) if steps else 0.0

    def cache_written(step) -> int:
        past = step["past"]  # input_ids and position_ids one int64 each, the mask past + 1
        allowance = padded(8) + padded(8 * (past + 1)) + padded(8)
        return max(0, step["counts"]["bytesWritten"] - step["counts"]["uniformBytesWritten"] - allowance - status_bytes)

    def cache_read(step) -> int:  # beyond the logits and relaxweb's run status (its kernels' error report)
        return max(0, step["counts"]["bytesRead"] - padded(4 * vocab) - status_bytes)

    median_ms = statistics.median(s["ms"] for s in steps)
    return {"steps": len(steps), "median_ms": median_ms, "tokens_per_s": 1000 / median_ms,
            "buffers": mean(s["counts"]["buffers"] for s in steps),
            "bytes_written": mean(s["counts"]["bytesWritten"] for s in steps),
            "uniform_bytes_written": mean(s["counts"]["uniformBytesWritten"] for s in steps),
            "cache_bytes_written": mean(map(cache_written, steps)),
            "bytes_read": mean(s["counts"]["bytesRead"] for s in steps),
            "cache_bytes_read": mean(map(cache_read, steps)),
            "dispatches": mean(s["counts"]["dispatches"] for s in steps),
            "writes": mean(s["counts"]["writes"] for s in steps), "maps": mean(s["counts"]["maps"] for s in steps)}


def encode(array: np.ndarray) -> dict:
    return {"dtype": str(array.dtype), "shape": list(array.shape),
            "base64": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}


def bench_decode(onnx_path: Path, bundle: Path, past_lengths, steps: int, warmup: int, rounds: int = 1,
                 systems=SYSTEMS, log=print) -> dict:
    """Load every system in one page and decode at each past length (``rounds`` times, the
    systems' order alternating); the results per past length and system."""
    decoder = decoder_signature(onnx_path)
    if min(past_lengths) <= warmup:
        raise ValueError(f"every past length must be above the warm-up steps ({warmup}): the prefill's past is P - 1 - warmup")
    routes = [("/ort/", ORT_DIST), ("/models/", onnx_path.parent.resolve()), ("/", BENCH_DIR)]
    if bundle.parent.resolve() != onnx_path.parent.resolve():
        raise ValueError("the bundle must be in the ONNX model's folder (both are served from /models/)")
    urls = {"onnxUrl": f"/models/{onnx_path.name}", "bundleUrl": f"/models/{bundle.name}/"}
    report: dict = {"systems": {}, "results": {}}
    with bench_page(routes, report) as page:
        for system in systems:
            try:
                loaded = page.evaluate("([s, urls, names]) => decodeBench.load(s, urls, names)",
                                       [system, urls, decoder.names])
                report["systems"][system] = {"load_ms": loaded["loadMs"], "load_counts": loaded["counts"],
                                             "adapter": loaded["adapterInfo"]}
                log(f"{system}: loaded in {loaded['loadMs']:.0f} ms")
            except Exception as error:  # the other system still runs
                report["systems"][system] = {"error": f"load: {type(error).__name__}: {first_line(error)}"}
                log(f"{system}: FAILED: {report['systems'][system]['error']}")
        ready = [s for s in systems if "error" not in report["systems"][s]]
        for index, past_length in enumerate(past_lengths):
            token = index + 1
            past = random_past(decoder, past_length - 1 - warmup, seed=past_length)
            prefill, expected = reference_decode(onnx_path, decoder, token, past, warmup + steps)
            results = report["results"][str(past_length)] = {"reference_tokens": expected,
                                                             "max_abs_reference_logit": float(np.abs(prefill).max())}
            for round_ in range(rounds):
                order = ready if (index + round_) % 2 == 0 else ready[::-1]
                for system in order:
                    result = results.setdefault(system, {"rounds": []})
                    if "error" in result:
                        continue
                    config = {"token": token, "position": past_length - 1 - warmup, "warmup": warmup, "steps": steps,
                              "past": {name: encode(value) for name, value in past.items()}}
                    try:
                        run = page.evaluate("([s, config]) => decodeBench.decode(s, config)", [system, config])
                    except Exception as error:
                        result["error"] = f"{type(error).__name__}: {first_line(error)}"
                        log(f"  past {past_length:5d} {system:11s}: FAILED: {result['error']}")
                        continue
                    logits = np.array(run.pop("prefillLogits"), np.float32)
                    run["max_abs_diff_vs_onnxruntime_cpu"] = float(np.abs(logits - prefill).max())
                    run["tokens_equal_reference"] = sum(a == b for a, b in zip(run["tokens"], expected))
                    result["rounds"].append(run)
                    log(f"  past {past_length:5d} {system:11s} round {round_ + 1}: median "
                        f"{statistics.median(s['ms'] for s in run['timed']):8.1f} ms/token, "
                        f"{run['tokens_equal_reference']}/{len(expected)} tokens as onnxruntime CPU")
            for system in systems:
                result = results.get(system)
                if result and result["rounds"]:
                    timed = [step for run in result["rounds"] for step in run["timed"]]
                    status = RUN_STATUS_BYTES if system.startswith("relaxweb") else 0
                    result["per_token"] = per_token(timed, vocab=prefill.size, status_bytes=status)  # batch 1, one position
                    result["tokens_equal_reference"] = min(r["tokens_equal_reference"] for r in result["rounds"])
                    result["tokens"] = len(expected)
                    result["max_abs_diff_vs_onnxruntime_cpu"] = max(
                        r["max_abs_diff_vs_onnxruntime_cpu"] for r in result["rounds"])
    return report


def decode_table(report: dict) -> str:
    """One row per past length and system: tokens/s and what moved per token."""
    header = ["past", "system", "tokens/s", "ms / token (median)", "timed steps", "buffers created / token",
              "bytes written / token", "of them cache", "bytes read / token", "of them cache",
              "uniform bytes written / token", "dispatches / token", "greedy tokens = onnxruntime CPU",
              "prefill logits max abs diff"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for past, results in report["results"].items():
        for system in ALL_SYSTEMS:
            result = results.get(system)
            if result is None:
                continue
            if "error" in result or "per_token" not in result:
                lines.append(f"| {past} | {system} | failed: {result.get('error', 'no run')} |" + " |" * (len(header) - 3))
                continue
            t = result["per_token"]
            cells = [past, system, f"{t['tokens_per_s']:.2f}", fmt(t["median_ms"]), str(t["steps"]), fmt(t["buffers"]),
                     fmt(t["bytes_written"]), fmt(t["cache_bytes_written"]), fmt(t["bytes_read"]),
                     fmt(t["cache_bytes_read"]), fmt(t["uniform_bytes_written"]), fmt(t["dispatches"]),
                     f"{result['tokens_equal_reference']}/{result['tokens']}",
                     fmt(result["max_abs_diff_vs_onnxruntime_cpu"])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals_table(report: dict) -> str:
    """Issue 14's decode goals at each past length: relaxweb's tokens/s >= 2x onnxruntime-web's,
    0 buffers created and 0 cache bytes moved per token (onnxruntime-web's beside them)."""
    lines = [f"| past | tokens/s relaxweb / {BASELINE} (goal >= {GOAL_SPEEDUP:g}) | relaxweb buffers created / token (goal 0) "
             f"| relaxweb cache bytes moved / token (goal 0) | {BASELINE} buffers created / token "
             f"| {BASELINE} cache bytes moved / token |", "|---|---|---|---|---|---|"]

    def figure(results: dict, system: str, key: str):
        return results.get(system, {}).get("per_token", {}).get(key)

    def moved(results: dict, system: str):
        written, read = figure(results, system, "cache_bytes_written"), figure(results, system, "cache_bytes_read")
        return None if written is None else written + read

    def goal(value, met: bool, text: str | None = None) -> str:
        return "-" if value is None else f"{text or fmt(value)} {'met' if met else 'missed'}"

    for past, results in report["results"].items():
        mine, theirs = figure(results, "relaxweb", "tokens_per_s"), figure(results, BASELINE, "tokens_per_s")
        speed = (goal(mine, mine / theirs >= GOAL_SPEEDUP, ratio(mine, theirs))
                 if mine is not None and theirs else "-")
        buffers, cache = figure(results, "relaxweb", "buffers"), moved(results, "relaxweb")
        lines.append(f"| {past} | {speed} | {goal(buffers, buffers == 0)} | {goal(cache, cache == 0)} | "
                     f"{fmt(figure(results, BASELINE, 'buffers'))} | {fmt(moved(results, BASELINE))} |")
    return "\n".join(lines)


def print_report(report: dict) -> None:
    print(f"{report.get('browser', '?')}, adapter {report.get('adapter', '?')}, "
          f"onnxruntime-web {report.get('onnxruntime_web', '?')}, {report.get('seconds', '?')} s in all")
    for system, loaded in report.get("systems", {}).items():
        print(f"{system}: " + (loaded["error"] if "error" in loaded else f"load {loaded['load_ms']:.0f} ms"))
    print()
    print(decode_table(report))
    print()
    print(goals_table(report))
    if report.get("page_errors"):
        print("\npage errors:", *report["page_errors"], sep="\n  ")


# Language-model generation (--lm): load, prefill, decode tokens/s, bytes, memory ---------------

LM_SYSTEMS = ("relaxweb", "relaxweb-wasm", "ort-webgpu", "ort-wasm")
#: each relaxweb system's onnxruntime-web baseline, and issue 28's goal for the ratio of decode tokens/s
LM_BASELINES = {"relaxweb": ("ort-webgpu", 2.0), "relaxweb-wasm": ("ort-wasm", 1.0)}
GPU_SYSTEMS = ("relaxweb", "ort-webgpu")


def lm_signature(onnx_path: Path) -> dict:
    """What decode.js needs to feed a decoder from an empty past: the inputs' names, the past and
    present names, each past's shape after the batch ([kv heads, 0, head size]). A symbolic
    head size (the builder's ``kv_cache_dim``) is read from the sidecar ``NAME.json``
    scripts/export_decoders.py writes beside the model."""
    decoder = decoder_signature_any(onnx_path)
    sidecar = onnx_path.with_suffix(".json")
    head = json.loads(sidecar.read_text())["decoder"]["head_size"] if sidecar.is_file() else None
    shapes = []
    for shape in decoder["past_shapes"]:  # [heads, length, head size], the symbolic ones 0
        if shape[2] == 0 and head is None:
            raise ValueError(f"{onnx_path.name}: the past's head size is symbolic and {sidecar.name} is missing "
                             "(scripts/export_decoders.py writes it)")
        shapes.append([shape[0], 0, shape[2] or head])
    return {**decoder, "pastShapes": shapes}


def decoder_signature_any(onnx_path: Path) -> dict:
    """input_ids -> logits and a present.X for each past_key_values.X (attention_mask and
    position_ids optional: the builder's models have no position_ids)."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    dims = {v.name: [d.dim_value if d.HasField("dim_value") else 0 for d in v.type.tensor_type.shape.dim]
            for v in (*graph.input, *graph.output)}
    inputs = [v.name for v in graph.input]
    pasts = [name for name in inputs if name.startswith("past_key_values.")]
    presents = ["present." + name[len("past_key_values."):] for name in pasts]
    missing = [name for name in (*presents, "logits", "input_ids") if name not in dims]
    if not pasts or missing:
        raise ValueError(f"{onnx_path.name} is not a decoder: missing {', '.join(missing) or 'past_key_values.* inputs'}")
    return {"inputs": inputs, "pasts": pasts, "presents": presents, "logits": "logits",
            "past_shapes": [dims[name][1:] for name in pasts]}


def lm_bounds(prompt: int, new_tokens: int) -> dict[str, int]:
    """Batch 1, the prompt in one run, a cache long enough for every new token."""
    total = prompt + new_tokens
    return {"batch_size": 1, "sequence_length": prompt, "past_sequence_length": total, "total_sequence_length": total}


def lm_prompt(length: int, vocab: int, seed: int = 0) -> list[int]:
    """A prompt of random token ids (the model's weights are random too), away from the low ids
    tokenizers reserve."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, vocab, length)]


def float_activations(onnx_path: Path) -> bytes | None:
    """The model with every MatMulNBits at ``accuracy_level`` 0 (float activations), or None
    when none has another level: the builder's int4 sets 4, with which onnxruntime's CPU kernel
    quantizes the activations to int8 (the web runtimes compute in float32)."""
    model = onnx.load(str(onnx_path))
    levels = [attribute for node in model.graph.node if node.op_type == "MatMulNBits"
              for attribute in node.attribute if attribute.name == "accuracy_level" and attribute.i != 0]
    for attribute in levels:
        attribute.i = 0
    return model.SerializeToString() if levels else None


def lm_reference(model: Path | bytes, signature: dict, prompt: list[int], new_tokens: int) -> list[int]:
    """onnxruntime (Python, CPU) greedy from an empty past: the tokens every system should give."""
    session = onnxruntime.InferenceSession(model if isinstance(model, bytes) else str(model),
                                           providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    past = {name: np.zeros((1, *shape), np.float32) for name, shape in zip(signature["pasts"], signature["pastShapes"])}
    fed, tokens, total = prompt, [], len(prompt)
    while len(tokens) < new_tokens:
        feeds = {"input_ids": np.array([fed], np.int64)} | past
        if "attention_mask" in signature["inputs"]:
            feeds["attention_mask"] = np.ones((1, total), np.int64)
        if "position_ids" in signature["inputs"]:
            feeds["position_ids"] = np.arange(total - len(fed), total, dtype=np.int64)[None]
        outputs = dict(zip(names, session.run(None, feeds)))
        tokens.append(int(np.argmax(outputs["logits"][0, -1])))
        past = {name: outputs[present] for name, present in zip(signature["pasts"], signature["presents"])}
        fed, total = [tokens[-1]], total + 1
    return tokens


def bench_lm(onnx_path: Path, bundle: Path, signature: dict, prompt: list[int], new_tokens: int, runs: int,
             systems, log=print) -> dict:
    """Every system loaded in one page, then ``runs`` rounds of one generation each (the
    systems' order alternating), then each released."""
    routes = [("/ort/", ORT_DIST), ("/models/", onnx_path.parent.resolve()), ("/", BENCH_DIR)]
    urls = {"onnxUrl": f"/models/{onnx_path.name}", "bundleUrl": f"/models/{bundle.name}/"}
    names = {key: signature[key] for key in ("inputs", "pasts", "presents", "logits", "pastShapes")}
    report: dict = {"systems": {}}
    with bench_page(routes, report) as page:
        for system in systems:
            result = report["systems"][system] = {"runs": []}
            try:
                result["load"] = page.evaluate("([s, urls, names]) => decodeBench.loadLm(s, urls, names)",
                                               [system, urls, names])
                log(f"{system}: loaded in {result['load']['loadMs']:.0f} ms")
            except Exception as error:  # the other systems still run
                result["error"] = f"load: {type(error).__name__}: {first_line(error)}"
                log(f"{system}: FAILED: {result['error']}")
        ready = [s for s in systems if "error" not in report["systems"][s]]
        for index in range(runs):  # the systems interleaved, their order alternating: a change of the machine's load
            for system in ready if index % 2 == 0 else ready[::-1]:  # reaches them all alike
                result = report["systems"][system]
                if "error" in result:
                    continue
                try:
                    run = page.evaluate("([s, p, n]) => decodeBench.generateLm(s, p, n)", [system, prompt, new_tokens])
                except Exception as error:
                    result["error"] = f"{type(error).__name__}: {first_line(error)}"
                    log(f"  {system}: FAILED: {result['error']}")
                    continue
                result["runs"].append(run)
                log(f"  {system} run {index + 1}: prefill {run['prefillMs']:.0f} ms, decode "
                    f"{lm_tokens_per_s(run):.2f} tokens/s ({run['mode']})")
        for system in ready:
            with contextlib.suppress(Exception):
                page.evaluate("(s) => decodeBench.releaseLm(s)", system)
    return report


@contextlib.contextmanager
def bench_page(routes: list, report: dict):
    """decode.html served with ``routes`` in a fresh headless Chromium, instrumented
    (instrument.js), once it is ready; notes the browser, the adapter and the page's errors
    (``page_errors``) in ``report``; closes it all after."""
    server = start_server(routes)
    errors: list[str] = []
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            report["browser"] = f"Chromium {browser.version}"
            context = browser.new_context()
            context.add_init_script(path=str(BENCH_DIR / "instrument.js"))
            page = context.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/decode.html")
            page.wait_for_function("window.decodeBenchReady === true", timeout=30_000)
            report["adapter"] = page.evaluate("decodeBench.pageAdapter()")
            try:
                yield page
            finally:
                with contextlib.suppress(Exception):
                    page.close()
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
        report["page_errors"] = errors[:20]


def lm_tokens_per_s(run: dict) -> float:
    """Decode tokens/s of one generation: the new tokens after the first over their time."""
    total = sum(step["ms"] for step in run["steps"])
    return 1000 * len(run["steps"]) / total if total else 0.0


def lm_summary(system: dict, reference: list[int], float_reference: list[int] | None = None) -> dict | None:
    """A system's medians over its runs, its counts per decode token, its tokens against the reference."""
    runs = system.get("runs") or []
    if not runs:
        return None
    steps = [step for run in runs for step in run["steps"]]
    per_step = lambda key: float(np.mean([s["counts"][key] for s in steps])) if steps else 0.0  # noqa: E731
    stats = [s["runtimeStats"] for s in steps if s.get("runtimeStats")]
    tokens = runs[0]["tokens"]

    def same(other: list[int] | None) -> int | None:  # the new tokens equal before the first difference
        return None if other is None else next((k for k, (a, b) in enumerate(zip(tokens, other)) if a != b),
                                               min(len(tokens), len(other)))

    return {"load_ms": system["load"]["loadMs"], "fetched_bytes": system["load"]["fetchedBytes"],
            "gpu_bytes_after_load": system["load"]["gpuLiveBytes"],
            "gpu_peak_bytes": max(run["gpuPeakLiveBytes"] for run in runs),
            "wasm_memory_bytes": max(run["wasmMemoryBytes"] for run in runs),
            "prefill_ms": statistics.median(run["prefillMs"] for run in runs),
            "tokens_per_s": statistics.median(lm_tokens_per_s(run) for run in runs),
            "tokens_per_s_runs": [round(lm_tokens_per_s(run), 3) for run in runs],
            "buffers_per_token": per_step("buffers"), "dispatches_per_token": per_step("dispatches"),
            "bytes_written_per_token": per_step("bytesWritten"), "bytes_read_per_token": per_step("bytesRead"),
            "runtime_buffers_per_token": (float(np.mean([s.get("buffersCreated", 0) for s in stats])) if stats else None),
            "mode": runs[0]["mode"], "tokens": tokens, "same_prefix_as_reference": same(reference),
            "same_prefix_as_float_reference": same(float_reference),
            "runs_agree": all(run["tokens"] == tokens for run in runs)}


def lm_table(report: dict) -> str:
    header = ["system", "load ms", "fetched MB", "GPU MB after load", "GPU MB peak", "wasm memory MB", "prefill ms (median)",
              "decode tokens/s (median)", "runs", "buffers created / token", "dispatches / token", "bytes written / token",
              "bytes read / token", "greedy tokens = onnxruntime CPU", "= onnxruntime CPU, float activations",
              "decode loop"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    mb = lambda n: f"{n / 1e6:.1f}"  # noqa: E731
    reference = report["reference_tokens"]
    for name, system in report["systems"].items():
        summary = system.get("summary")
        if summary is None:
            lines.append(f"| {name} | failed: {system.get('error', 'no run')} |" + " |" * (len(header) - 2))
            continue
        gpu = name in GPU_SYSTEMS  # the WebGPU counters of a wasm system are all 0: "-"
        cells = [name, fmt(summary["load_ms"]), mb(summary["fetched_bytes"]), mb(summary["gpu_bytes_after_load"]) if gpu else "-",
                 mb(summary["gpu_peak_bytes"]) if gpu else "-", mb(summary["wasm_memory_bytes"]), fmt(summary["prefill_ms"]),
                 f"{summary['tokens_per_s']:.3f}", str(len(system["runs"])),
                 *((fmt(summary[key]) if gpu else "-") for key in ("buffers_per_token", "dispatches_per_token",
                                                                    "bytes_written_per_token", "bytes_read_per_token")),
                 f"{summary['same_prefix_as_reference']}/{len(reference)}" + ("" if summary["runs_agree"] else " (runs differ)"),
                 "-" if summary.get("same_prefix_as_float_reference") is None
                 else f"{summary['same_prefix_as_float_reference']}/{len(reference)}", summary["mode"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def lm_goals(report: dict) -> str:
    lines = ["| relaxweb system | against | decode tokens/s ratio (goal) | prefill time ratio (theirs / ours) | load time ratio "
             "(theirs / ours) | relaxweb buffers created / token (goal 0) |", "|---|---|---|---|---|---|"]
    for mine, (theirs, goal) in LM_BASELINES.items():
        a, b = (report["systems"].get(s, {}).get("summary") for s in (mine, theirs))
        if a is None or b is None:
            continue
        speed = a["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else float("inf")
        lines.append(f"| {mine} | {theirs} | {speed:.2f} (>= {goal:g}: {'met' if speed >= goal else 'missed'}) | "
                     f"{ratio(b['prefill_ms'], a['prefill_ms'])} | {ratio(b['load_ms'], a['load_ms'])} | "
                     + (f"{fmt(a['buffers_per_token'])} {'met' if a['buffers_per_token'] == 0 else 'missed'} |"
                        if mine in GPU_SYSTEMS else f"- ({a['mode']}) |"))
    return "\n".join(lines)


def print_lm_report(report: dict) -> None:
    print(f"{report.get('model')}: {report.get('browser', '?')}, adapter {report.get('adapter', '?')}, "
          f"onnxruntime-web {report.get('onnxruntime_web', '?')}, prompt {report['settings']['prompt']} tokens, "
          f"{report['settings']['new_tokens']} new, {report['settings']['runs']} runs, {report.get('seconds', '?')} s in all")
    print()
    print(lm_table(report))
    print()
    print(lm_goals(report))
    if report.get("page_errors"):
        print("\npage errors:", *report["page_errors"], sep="\n  ")


def lm_main(args: argparse.Namespace, systems: list[str]) -> None:
    """--lm: build the bundle (or reuse it), run every system, print and save the tables."""
    started = time.monotonic()
    source = args.lm.resolve()
    signature = lm_signature(source)
    work = args.work / source.stem
    work.mkdir(parents=True, exist_ok=True)
    onnx_path = work / "decoder.onnx"  # served beside its bundle (a hard link: the server follows no symlink)
    if onnx_path.is_symlink() or not (onnx_path.exists() and onnx_path.samefile(source)):
        onnx_path.unlink(missing_ok=True)
        try:
            os.link(source, onnx_path)
        except OSError:  # another file system
            shutil.copyfile(source, onnx_path)
    bounds = lm_bounds(args.prompt, args.new_tokens)
    stamp = work / "bundle.stamp"
    key = json.dumps({"bounds": bounds, "model": str(source), "mtime": source.stat().st_mtime})
    if not (args.reuse_bundle and stamp.is_file() and stamp.read_text() == key):
        build_start = time.monotonic()
        relaxweb.build(onnx_path, work / "bundle", bounds=bounds)
        stamp.write_text(key)
        print(f"built the bundle in {time.monotonic() - build_start:.0f} s")
    vocab = onnx.load(str(source), load_external_data=False).graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    prompt = lm_prompt(args.prompt, vocab)
    reference = lm_reference(source, signature, prompt, args.new_tokens)
    floats = float_activations(source)
    float_reference = None if floats is None else lm_reference(floats, signature, prompt, args.new_tokens)
    report = {**report_header("bench/decode.py"), "model": str(source), "bounds": bounds, "prompt_ids": prompt,
              "reference_tokens": reference, "float_reference_tokens": float_reference,
              "settings": {"prompt": args.prompt, "new_tokens": args.new_tokens, "runs": args.runs}}
    report |= bench_lm(onnx_path, work / "bundle", signature, prompt, args.new_tokens, args.runs, systems)
    for system in report["systems"].values():
        system["summary"] = lm_summary(system, reference, float_reference)
    report["seconds"] = round(time.monotonic() - started)
    out = args.out if args.out != DEFAULT_OUT else BENCH_DIR / "build" / f"decode-lm-{source.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print()
    print_lm_report(report)
    print(f"wrote {out}")


def tiny_llama_onnx() -> Path:
    """The trained tiny Llama's ONNX file (trained and exported first when missing: ~3 min)."""
    spec = importlib.util.spec_from_file_location("tiny_llama", TINY_LLAMA)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tiny_llama", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module.tiny_llama_paths()["model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--past", type=int, nargs="+", default=list(PAST_LENGTHS), help="past lengths (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps per past length and round (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps after the prefill (default: %(default)s: a kept output's buffer is "
                             "reused from the second step on)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times every past length runs on every system, the systems' order alternating (default: %(default)s)")
    parser.add_argument("--systems", nargs="+", choices=(*ALL_SYSTEMS, *LM_SYSTEMS[1::2]),
                        help="default: %(default)s; relaxweb-cache-on-host: relaxweb with the cache through JavaScript")
    parser.add_argument("--model", type=Path, help="a decoder's ONNX file (default: the tiny Llama, scripts/tiny_llama.py)")
    parser.add_argument("--work", type=Path, default=BENCH_DIR / "build" / "decode", help="the model's copy and the bundle")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--lm", type=Path, metavar="ONNX",
                        help="generation instead: a decoder (e.g. scripts/export_decoders.py --size smollm-135m's), "
                             "relaxweb WebGPU and wasm against onnxruntime-web WebGPU and wasm")
    parser.add_argument("--prompt", type=int, default=32, help="--lm: prompt tokens (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=32, help="--lm: greedy new tokens (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="--lm: generations per system (default: %(default)s)")
    parser.add_argument("--reuse-bundle", action="store_true", help="--lm: keep the bundle built for the same model and bounds")
    parser.add_argument("--table", type=Path, metavar="JSON", help="only print the tables of a results JSON")
    args = parser.parse_args()
    if args.table:
        saved = json.loads(args.table.read_text())
        print_lm_report(saved) if "reference_tokens" in saved else print_report(saved)
        return
    systems = list(args.systems or (LM_SYSTEMS if args.lm else SYSTEMS))
    if not args.lm and set(systems) - set(ALL_SYSTEMS):
        parser.error(f"{', '.join(sorted(set(systems) - set(ALL_SYSTEMS)))}: only with --lm")
    if args.lm:
        if not (ORT_DIST / "ort.webgpu.min.mjs").is_file():
            parser.error(f"onnxruntime-web is missing ({ORT_DIST}): run `npm install` in {REPO}")
        lm_main(args, systems)
        return
    if not (ORT_DIST / "ort.webgpu.min.mjs").is_file():
        print(f"onnxruntime-web is missing ({ORT_DIST}): run `npm install` in {REPO}; benchmarking relaxweb alone")
        systems = [s for s in systems if s != BASELINE]

    started = time.monotonic()
    if min(args.past) <= args.warmup:
        parser.error(f"every --past must be above --warmup ({args.warmup}): the prefill's past is P - 1 - warmup")
    source = args.model or tiny_llama_onnx()
    try:
        decoder_signature(source)
    except ValueError as error:
        parser.error(str(error))
    initializers = onnx.load(str(source), load_external_data=False).graph.initializer
    if any(onnx.external_data_helper.uses_external_data(tensor) for tensor in initializers):
        parser.error(f"{source} keeps weights in external data files: save it with its weights inside "
                     "(the page serves the one .onnx file to onnxruntime-web)")
    args.work.mkdir(parents=True, exist_ok=True)
    onnx_path = args.work / "decoder.onnx"  # served beside its bundle
    onnx_path.write_bytes(source.read_bytes())
    bounds = bounds_for(max(args.past), args.steps)
    relaxweb.build(onnx_path, args.work / "bundle", bounds=bounds)
    report = {**report_header("bench/decode.py"),
              "model": str(source), "bounds": bounds,
              "settings": {"past": args.past, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds}}
    report |= bench_decode(onnx_path, args.work / "bundle", args.past, args.steps, args.warmup, args.rounds, systems)
    report["seconds"] = round(time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print()
    print_report(report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
