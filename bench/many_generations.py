"""Many generations at once (issue 30): continuous batching over a paged KV cache against the
same prompts generated one after another, on the Python runtime's two backends.

Usage (from the repository root; the tiny Llama is trained once by ``scripts/tiny_llama.py``)::

    python3 bench/many_generations.py                                  # N = 1, 2, 4, 8, 16; both backends
    python3 bench/many_generations.py --counts 8 --backends wasm       # while developing
    python3 bench/many_generations.py --out bench/build/many.json
    python3 bench/many_generations.py --browser        # in headless Chromium, with onnxruntime-web one by one

Method
------
1. The model: the tiny Llama (4 layers, hidden 128, 4 query heads sharing 2 key / value heads
   of 32, 3.2 MB of float32 weights), built twice with the same bounds (``sequence_length`` 64:
   a run's tokens; past 320, so prompts of 256 and 32 new tokens fit): once as it is (one cache,
   one sequence a run; ``sequence_length`` 256, as its prompt runs whole) and once with ``--kv-pages`` (pages of ``--page-size`` positions, enough
   for 16 sequences at their longest).
2. N prompts of 8 to 256 tokens (spread evenly, from the reference text, different for each
   sequence), ``--new-tokens`` greedy tokens each, no stop token.
3. For each backend and N, in one process, in this order:
   - **sequential**: the N prompts one after another, ``generate`` on the unpaged bundle;
   - **paged alone**: the same on the paged bundle (one sequence a step);
   - **together**: ``generate_many`` on the paged bundle (all N joining the steps).
   Figures: aggregate tokens/s (all new tokens / wall time of the whole phase, prefill
   included); decode tokens/s (tokens / time of the steps that only decoded; for the
   sequential runs, each generation's own decode speed, combined as tokens / decode time);
   time to first token (median over the sequences: from the call, or from the request's
   submission when together); the KV memory: the most positions the pool's pages held at once
   against the live sequences' written positions at that moment (pages in use x page size /
   positions written) and against N x the bound (what N unpaged caches would hold).
4. Tokens: every sequence's tokens together must equal its tokens alone (``same`` column).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import relaxweb  # noqa: E402

BOUNDS = {"batch_size": 1, "sequence_length": 64, "past_sequence_length": 320, "total_sequence_length": 384}
#: The unpaged bundle takes a whole prompt in one run (its generate does not cut prompts into chunks).
UNPAGED_BOUNDS = {**BOUNDS, "sequence_length": 256}


def tiny_llama():
    spec = importlib.util.spec_from_file_location("tiny_llama", ROOT / "scripts" / "tiny_llama.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("tiny_llama", module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


#: --model smollm-135m: the tiny Llama's code at SmolLM-135M's shape (30 layers, hidden 576, 9 query
#: heads sharing 3 key / value heads of 64, SwiGLU 1536, vocabulary 49,152; 539 MB of float32
#: weights, random from seed 0, untied), exported as the tiny Llama is (optimum's signature).
SMOLLM_SHAPE = {"vocab": 49152, "dim": 576, "layers": 30, "heads": 9, "kv_heads": 3, "hidden": 1536}


def smollm_shaped(llama, work: Path) -> Path:
    """The SmolLM-135M-shaped model, exported once into ``work``."""
    path = work / "smollm-135m-shaped.onnx"
    if not path.exists():
        import torch

        torch.manual_seed(0)
        model = llama.TinyLlama(llama.Config(**SMOLLM_SHAPE)).eval()
        with torch.no_grad():
            llama.export(model, path)
    return path


def prompts_for(count: int, text_ids: list[int], longest: int = 256) -> list[list[int]]:
    """``count`` prompts of 8 to ``longest`` tokens (evenly spread), each starting elsewhere in the text."""
    lengths = [8] if count == 1 else [8 + (longest - 8) * index // (count - 1) for index in range(count)]
    return [text_ids[(37 * index) % 64:(37 * index) % 64 + length] for index, length in enumerate(lengths)]


def sequential(session, prompts: list[list[int]], new_tokens: int) -> dict:
    started = time.perf_counter()
    results = [(time.perf_counter(), session.generate(p, max_new_tokens=new_tokens, temperature=0, stop_tokens=[]))
               for p in prompts]
    wall = time.perf_counter() - started
    tokens = sum(len(g.tokens) for _, g in results)
    decode_time = sum((len(g.tokens) - 1) / g.tokens_per_second for _, g in results if g.tokens_per_second > 0)
    return {"aggregate": tokens / wall, "decode": sum(len(g.tokens) - 1 for _, g in results) / decode_time,
            "ttft_ms": statistics.median(g.prefill_ms for _, g in results), "wall_s": wall,
            "tokens": [g.tokens for _, g in results]}


def together(session, prompts: list[list[int]], new_tokens: int, bound: int) -> dict:
    before = session.generation_stats
    peak = {"ratio": 0.0, "positions": 0}

    def watch(token, text):
        stats = session.generation_stats
        if stats.positions_live and stats.pages_in_use * stats.page_size > peak["positions"]:
            peak.update(positions=stats.pages_in_use * stats.page_size, live=stats.positions_live,
                        ratio=stats.pages_in_use * stats.page_size / stats.positions_live)

    started = time.perf_counter()
    generations = session.generate_many(prompts, max_new_tokens=new_tokens, temperature=0, stop_tokens=[],
                                        on_tokens=[watch] * len(prompts))
    wall = time.perf_counter() - started
    after = session.generation_stats
    tokens = sum(len(g.tokens) for g in generations)
    return {"aggregate": tokens / wall, "ttft_ms": statistics.median(g.prefill_ms for g in generations),
            "ttft_all_ms": [g.prefill_ms for g in generations],
            "wall_s": wall, "kv_peak_positions": peak["positions"], "kv_over_live": peak["ratio"],
            "kv_over_bound": peak["positions"] / (len(prompts) * bound), "tokens": [g.tokens for g in generations],
            "steps": after.steps - (before.steps if before else 0)}


# -- in Chromium ----------------------------------------------------------------------------

#: (label, decode.js system, bundle, together): relaxweb one after another on the unpaged bundle and
#: together on the paged one, per backend; onnxruntime-web one after another on the ONNX file.
BROWSER_SYSTEMS = (
    ("relaxweb webgpu sequential", "relaxweb", "unpaged", False),
    ("relaxweb webgpu together", "relaxweb-paged", "paged", True),
    ("relaxweb wasm sequential", "relaxweb-wasm", "unpaged", False),
    ("relaxweb wasm together", "relaxweb-wasm-paged", "paged", True),
    ("onnxruntime-web webgpu sequential", "ort-webgpu", None, False),
    ("onnxruntime-web wasm sequential", "ort-wasm", None, False),
)


def in_chromium(model: Path, bundles: dict[str, Path], counts: list[int], text_ids: list[int], new_tokens: int,
                longest: int, systems: list[str] | None = None) -> list[dict]:
    """Each system of :data:`BROWSER_SYSTEMS` in one headless Chromium page (decode.html, the
    SwiftShader adapter), for each N: aggregate and decode tokens/s, time to first token, the
    tokens.  A together system is loaded afresh for each N (its scheduler's counters are then
    that call's)."""
    import decode  # bench/decode.py: the page, its server and onnxruntime-web

    work = bundles["paged"].parent
    onnx_path = model if model.parent.resolve() == work.resolve() else work / f"{bundles['paged'].name}.onnx"
    if not onnx_path.exists() or onnx_path.stat().st_size != model.stat().st_size:  # served beside the bundles
        shutil.copyfile(model, onnx_path)
    routes = [("/ort/", decode.ORT_DIST), ("/models/", work.resolve()), ("/", decode.BENCH_DIR)]
    names = {key: value for key, value in decode.lm_signature(onnx_path).items()
             if key in ("inputs", "pasts", "presents", "logits", "pastShapes")}
    rows = []
    report: dict = {}
    with decode.bench_page(routes, report) as page:
        print(f"Chromium: {report.get('browser')}, adapter {report.get('adapter')}", flush=True)
        for count in counts:
            prompts = prompts_for(count, text_ids, longest)
            row: dict = {"n": count, "systems": {}}
            for label, system, bundle, together in BROWSER_SYSTEMS:
                if systems and not any(label.startswith(prefix) for prefix in systems):
                    continue
                urls = {"onnxUrl": f"/models/{onnx_path.name}",
                        "bundleUrl": f"/models/{bundles[bundle].name}/" if bundle else ""}
                page.evaluate("([s, urls, names]) => decodeBench.loadLm(s, urls, names)", [system, urls, names])
                # a warm start (shaders compiled, buffers made); a together system's figures are
                # its scheduler's counters over the measured call only
                page.evaluate("([s, p, n, t]) => decodeBench.generateManyLm(s, [p, p], n, t)",
                              [system, [1, 2, 3], 2, together])
                result = page.evaluate("([s, p, n, t]) => decodeBench.generateManyLm(s, p, n, t)",
                                       [system, prompts, new_tokens, together])
                page.evaluate("(s) => decodeBench.releaseLm(s)", system)
                tokens = sum(len(t) for t in result["tokens"])
                decode_ms = sum(result["decodeMs"])
                decode_tokens = sum(c - 1 for c in result["counts"])
                figures = {"aggregate": tokens / (result["wallMs"] / 1e3),
                           "decode": (result["stats"]["decodeTokensPerSecond"] if together
                                      else decode_tokens / (decode_ms / 1e3) if decode_ms else 0.0),
                           "ttft_ms": statistics.median(result["ttftMs"]), "tokens": result["tokens"]}
                row["systems"][label] = figures
                print(f"  N={count:2} {label:34} aggregate {figures['aggregate']:7.1f} tok/s  decode "
                      f"{figures['decode']:7.1f} tok/s  TTFT {figures['ttft_ms']:6.0f} ms", flush=True)
            first = next(iter(row["systems"]))
            reference = row["systems"][first]["tokens"]
            row["same"] = {label: figures["tokens"] == reference for label, figures in row["systems"].items()}
            print(f"  N={count:2} tokens equal {first}'s: {row['same']}", flush=True)
            rows.append(row)
    return rows


def policies(paths: dict, args, text_ids: list[int]) -> None:
    """--policies: 16 prompts of 8 to 256 tokens in a scrambled order on a pool sized for 8 at
    their longest (so 8 wait), under each prefill chunk (the prompt tokens a step reads at
    most) and admission order: aggregate and decode tokens/s, the median and the longest time
    to first token (from the call: queueing included)."""
    pages = 8 * -(-(args.max_prompt + args.new_tokens) // args.page_size)
    bundle = relaxweb.build(paths["model"], args.work / f"{args.model}-paged-8", bounds=BOUNDS, kv_pages=pages,
                            kv_page_size=args.page_size)
    prompts = prompts_for(16, text_ids, args.max_prompt)
    prompts = [prompts[(5 * index) % 16] for index in range(16)]  # arrival not sorted by length
    for backend in args.backends:
        session = relaxweb.load(bundle.path, backend=backend)
        session.generate([1, 2, 3], max_new_tokens=2)
        scheduler = session._paged_scheduler  # the policy's knobs (runtime/paged_generate.py)
        reference = None
        for chunk in (None, 32, 16):
            for admission in ("arrival", "shortest"):
                scheduler.prefill_chunk, scheduler.admission = chunk, admission
                result = measured_together(session, prompts, args.new_tokens, BOUNDS["past_sequence_length"])
                generations_ttft = result["ttft_all_ms"]
                reference = reference or result["tokens"]
                print(f"{backend:6} prefill chunk {chunk or scheduler.budget:3}  admission {admission:8}  aggregate "
                      f"{result['aggregate']:7.1f} tok/s  decode {result['decode']:7.1f} tok/s  TTFT median "
                      f"{statistics.median(generations_ttft):6.0f} ms, longest {max(generations_ttft):6.0f} ms  "
                      f"same tokens: {result['tokens'] == reference}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--backends", nargs="+", default=["wasm", "webgpu"])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "build" / "many")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--model", choices=["tiny-llama", "smollm-135m"], default="tiny-llama",
                        help="the tiny Llama (3.2 MB, trained) or the same code at SmolLM-135M's shape (539 MB, random)")
    parser.add_argument("--max-prompt", type=int, default=256, help="the longest prompt (default 256)")
    parser.add_argument("--skip-paged-alone", action="store_true", help="leave out the paged bundle's one-by-one runs")
    parser.add_argument("--policies", action="store_true",
                        help="the scheduling policy's knobs instead: prefill chunk and admission order, 16 prompts on a "
                        "pool for 8")
    parser.add_argument("--systems", nargs="+", metavar="PREFIX",
                        help="with --browser: only the systems whose label starts so (e.g. 'relaxweb wasm')")
    parser.add_argument("--browser", action="store_true",
                        help="in headless Chromium instead (SwiftShader WebGPU and wasm, against onnxruntime-web "
                        "generating the same prompts one after another)")
    args = parser.parse_args()
    llama = tiny_llama()
    paths = llama.tiny_llama_paths()
    reference = json.loads(paths["reference"].read_text())
    text_ids = llama.encode(reference["prompt"] * 8)
    if args.model == "smollm-135m":
        args.work.mkdir(parents=True, exist_ok=True)
        paths = {"model": smollm_shaped(llama, args.work)}
        text_ids = [(7919 * index) % SMOLLM_SHAPE["vocab"] for index in range(1024)]  # ids all over the vocabulary
    capacity = BOUNDS["past_sequence_length"] + BOUNDS["sequence_length"]
    pages = max(args.counts) * -(-(args.max_prompt + args.new_tokens) // args.page_size)
    unpaged = relaxweb.build(paths["model"], args.work / f"{args.model}-unpaged", bounds=UNPAGED_BOUNDS)
    paged = relaxweb.build(paths["model"], args.work / f"{args.model}-paged", bounds=BOUNDS, kv_pages=pages,
                           kv_page_size=args.page_size)
    print(f"pool: {pages} pages of {args.page_size} positions per layer; capacity {capacity}", flush=True)
    if args.policies:
        policies(paths, args, text_ids)
        return
    if args.browser:
        rows = in_chromium(paths["model"], {"paged": paged.path, "unpaged": unpaged.path}, args.counts, text_ids,
                           args.new_tokens, args.max_prompt, args.systems)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps([{**row, "systems": {label: {k: v for k, v in figures.items() if k != "tokens"}
                                                               for label, figures in row["systems"].items()}}
                                            for row in rows], indent=2))
        return
    rows = []
    for backend in args.backends:
        plain = relaxweb.load(unpaged.path, backend=backend)
        pooled = relaxweb.load(paged.path, backend=backend)
        plain.generate([1, 2, 3], max_new_tokens=2)  # warm both (shader compiles, first runs)
        pooled.generate([1, 2, 3], max_new_tokens=2)
        for count in args.counts:
            prompts = prompts_for(count, text_ids, args.max_prompt)
            row = {"backend": backend, "model": args.model, "n": count,
                   "sequential": sequential(plain, prompts, args.new_tokens)}
            row["paged_alone"] = row["sequential"] if args.skip_paged_alone else sequential(pooled, prompts, args.new_tokens)
            row["together"] = measured_together(pooled, prompts, args.new_tokens, capacity)
            row["same"] = row["together"]["tokens"] == row["paged_alone"]["tokens"] == row["sequential"]["tokens"]
            rows.append(row)
            print(line(row), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([{k: ({kk: vv for kk, vv in v.items() if kk != "tokens"} if isinstance(v, dict)
                                                 else v) for k, v in row.items()} for row in rows], indent=2))


def measured_together(session, prompts: list[list[int]], new_tokens: int, bound: int) -> dict:
    """``together``'s figures, the decode speed from the scheduler's counters over this call only."""
    before = session.generation_stats
    tokens0, seconds0 = (before.decode_tokens, before.decode_seconds) if before else (0, 0.0)
    result = together(session, prompts, new_tokens, bound)
    after = session.generation_stats
    seconds = after.decode_seconds - seconds0
    result["decode"] = (after.decode_tokens - tokens0) / seconds if seconds > 0 else 0.0
    return result


def line(row: dict) -> str:
    seq, alone, both = row["sequential"], row["paged_alone"], row["together"]
    return (f"{row['backend']:6} N={row['n']:2}  aggregate tok/s: sequential {seq['aggregate']:7.1f}  paged alone "
            f"{alone['aggregate']:7.1f}  together {both['aggregate']:7.1f} ({both['aggregate'] / seq['aggregate']:.2f}x)  "
            f"decode tok/s: {seq['decode']:7.1f} / {alone['decode']:7.1f} / {both['decode']:7.1f} "
            f"({both['decode'] / seq['decode']:.2f}x)  TTFT ms: {seq['ttft_ms']:.0f} / {both['ttft_ms']:.0f}  "
            f"KV: {both['kv_over_live']:.2f}x live, {both['kv_over_bound']:.2f}x of N x bound  same tokens: {row['same']}")


if __name__ == "__main__":
    main()
