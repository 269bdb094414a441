"""bench/run.py without a browser: what it prepares and what its tables say, above all when a
model, a build, a system or a case fails (one line with the reason, the rest goes on).
bench/decode.py: its accounting and tables without a browser, and its page's decode loop on a
toy decoder in Chromium (no timing asserted)."""

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from tests.helpers import F32_LOOSE, in_the_browser, make_model, rand

REPO = Path(__file__).resolve().parents[2]


def bench_module(name: str, file: str):
    """A bench script imported as module ``name`` for the duration of a fixture."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]


@pytest.fixture(scope="module")
def bench():
    yield from bench_module("bench_run", "run.py")


def case_result(median, first, pipelines=0, diff=1e-6):
    return {"median_ms": median, "firstRunMs": first, "firstRun": {"pipelines": pipelines, "dispatches": 10},
            "dispatches_per_run": 10, "max_abs_diff_vs_onnxruntime_cpu": diff, "max_abs_reference": 1.0}


def system_result(load, cases, pipelines_at_load, peak, total_pipelines):
    return {"load_ms": load, "load_counts": {"pipelines": pipelines_at_load}, "cases": cases,
            "totals": {"pipelines": total_pipelines, "peakLiveBytes": peak, "bufferBytes": peak, "buffers": 1},
            "load_and_first_run_ms": load + next(iter(cases.values())).get("firstRunMs", 0), "runtime_bytes": 1}


def test_every_real_model_has_deterministic_cases(bench):
    real = [name for name, model in bench.MODELS.items() if model.real]
    assert set(real) == {"yolov8n", "mobilenet_v3_large", "resnet50", "bert_base", "gpt2_small",
                         "whisper_tiny_encoder"}
    assert [c.label for c in bench.MODELS["yolov8n"].cases] == ["320x320", "640x640"]
    for name in real:
        for case in bench.MODELS[name].cases:
            first, second = case.inputs(), case.inputs()
            assert first.keys() == second.keys()
            for key in first:
                np.testing.assert_array_equal(first[key], second[key])
    prefill, short, decode = (c.inputs() for c in bench.MODELS["gpt2_small"].cases)
    assert prefill["input_ids"].shape == (1, 128) and prefill["past_key_values.11.value"].shape == (1, 12, 0, 64)
    assert short["input_ids"].shape == (1, 8) and short["attention_mask"].shape == (1, 8)
    assert decode["input_ids"].shape == (1, 1) and decode["past_key_values.0.key"].shape == (1, 12, 128, 64)
    assert decode["attention_mask"].shape == (1, 129) and decode["position_ids"].tolist() == [[128]]


def test_tables_say_what_failed_and_keep_the_rest(bench, capsys):
    results = {
        "relaxweb": system_result(1000, {"320x320": case_result(50, 80),
                                         "640x640": {"error": "Error: out of memory"}}, 19, 600, 19),
        "ort-webgpu": system_result(4000, {"320x320": case_result(100, 900, pipelines=20),
                                           "640x640": case_result(400, 500, pipelines=2)}, 2, 1000, 24),
        "ort-wasm": {"system": "ort-wasm", "error": "load: Error: no available backend found"},
    }
    table = bench.print_table("yolov8n", results)
    assert "- relaxweb failed at 640x640: Error: out of memory" in table
    assert "- ort-wasm failed: load: Error: no available backend found" in table
    row = next(line for line in table.splitlines() if line.startswith("| median latency, 320x320"))
    assert row.split("|")[-2].strip() == "0.50"  # relaxweb / ort-webgpu
    overview = bench.overview_table({"yolov8n": results})
    assert "| yolov8n | 640x640 | failed | 400 | failed |" in overview
    goals = bench.goals_table({"yolov8n": results})
    assert "| yolov8n | 0.50 met, - | 0.25 met | 0.22 met | 0.60 met | 0 met |" in goals.splitlines()
    capsys.readouterr()


def test_a_model_that_fails_to_export_or_build_is_not_fatal(bench, tmp_path, monkeypatch, capsys):
    def export_fails(work):
        raise RuntimeError("exit 1: ModuleNotFoundError: No module named 'torchvision'")

    def export_garbage(work):
        path = work / "garbage.onnx"
        path.write_bytes(b"not an onnx model")
        return path

    case = bench.Case("one", lambda: {})
    monkeypatch.setitem(bench.MODELS, "unexportable", bench.BenchModel("unexportable", "", export_fails, (case,)))
    monkeypatch.setitem(bench.MODELS, "unbuildable", bench.BenchModel("unbuildable", "", export_garbage, (case,)))
    prepared = bench.prepare_models(["unexportable", "unbuildable"], tmp_path, build_timeout=300)
    assert prepared["unexportable"] == {
        "error": "export failed: exit 1: ModuleNotFoundError: No module named 'torchvision'"}
    assert prepared["unbuildable"]["onnx"] == tmp_path / "garbage.onnx"  # onnxruntime-web still runs it
    assert prepared["unbuildable"]["build_error"].startswith("relaxweb build failed: exit ")
    assert "bundle" not in prepared["unbuildable"]
    capsys.readouterr()


def test_profiles_are_a_table_per_case_and_a_failed_profile_one_line(bench, capsys):
    row = {"kernel": "fused_matmul", "calls": 12, "totalMs": 40.5, "percent": 81.0, "gflopsPerSecond": 2.5,
           "gbytesPerSecond": 0.004}
    profiled = case_result(50, 80)
    profiled["profile"] = {"method": "timestamp queries", "dispatches": 30, "totalMs": 50.0, "rows": [row] * 7}
    failed = case_result(60, 90)
    failed["profile"] = {"error": "Error: device lost"}
    results = {"gpt2": {"relaxweb": system_result(10, {"prefill": profiled, "decode": failed, "plain": case_result(1, 2)},
                                                  3, 100, 3)}}
    lines = bench.profile_tables(results, top=5).splitlines()
    assert lines[0] == "relaxweb profile, gpt2 prefill: 30 dispatches, 50 ms in kernels (timestamp queries)"
    assert lines.count("| fused_matmul | 12 | 40.50 | 81% | 2.50 | 4.0e-03 |") == 5  # the top 5 of 7
    assert "relaxweb profile, gpt2 decode: Error: device lost" in lines
    assert not any("plain" in line for line in lines)  # not profiled: no table
    capsys.readouterr()


def test_wasm_tables_pair_each_system_with_onnxruntime_at_the_same_threads(bench, capsys):
    def wasm_result(median, threads, isolated, diff=1e-6, **extra):
        result = system_result(500, {"seq 8": case_result(median, median)}, 0, 0, 0)
        result["cases"]["seq 8"]["extra"] = {"threads": threads, **extra}
        result["cross_origin_isolated"] = isolated
        return result

    results = {"tiny": {
        "relaxweb-wasm": {**wasm_result(30, 1, False, unitsRunByWorkers=0, workersCreated=["w.js"]),
                          "kernels_wasm_bytes": 4096},
        "ort-wasm": wasm_result(60, None, False, numThreads=1, workersCreated=[]),
        "relaxweb-wasm-2t": {**wasm_result(40, 2, True, diff=2e-6, unitsRunByWorkers=96, workersCreated=["a", "b"]),
                             "kernels_wasm_bytes": 4096},
        "ort-wasm-2t": {"system": "ort-wasm-2t", "error": "load: Error: no available backend found"},
    }}
    del results["tiny"]["ort-wasm"]["cases"]["seq 8"]["extra"]["threads"]
    lines = bench.wasm_tables(results).splitlines()
    assert lines[0] == ("| model | case | relaxweb-wasm (ms) | ort-wasm (ms) | 1 thread: relaxweb / ort "
                        "| relaxweb-wasm-2t (ms) | ort-wasm-2t (ms) | 2 threads: relaxweb / ort |")
    assert "| tiny | seq 8 | 30 | 60 | 0.50 met | 40 | failed | - |" in lines
    assert "| tiny | relaxweb-wasm | 500 | 1.0e-06 | 1 | no | 1 (0 units run by workers) | 1 | 4,096 |" in lines
    assert "| tiny | ort-wasm | 500 | 1.0e-06 | 1 | no | 1 | 0 | - |" in lines
    assert "| tiny | relaxweb-wasm-2t | 500 | 1.0e-06 | 1 | yes | 2 (96 units run by workers) | 2 | 4,096 |" in lines
    assert "| tiny | ort-wasm-2t | failed: load: Error: no available backend found | | | | | | |" in lines
    results["tiny"]["relaxweb-wasm"]["cases"]["seq 8"]["median_ms"] = 90
    assert "| tiny | seq 8 | 90 | 60 | 1.50 missed | 40 | failed | - |" in bench.wasm_tables(results)
    assert bench.wasm_tables({"tiny": {"relaxweb": results["tiny"]["relaxweb-wasm"]}}) == ""  # no wasm system
    capsys.readouterr()


def tiny_mlp(work: Path) -> Path:
    """x [n, 64] -> relu(x @ w + b) @ w2: enough units per dispatch to split over 2 threads."""
    path = work / "tiny_mlp.onnx"
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    weights = {"w": rand(64, 64, seed=1), "b": rand(64, seed=2), "w2": rand(64, 32, seed=3)}
    onnx.save(make_model(nodes, [("x", ["n", 64])], ["y"], weights, check=True), str(path))
    return path


@in_the_browser
def test_wasm_systems_run_a_tiny_model_at_1_and_2_threads(bench, tmp_path, monkeypatch, capsys):
    """relaxweb's kernels.wasm and onnxruntime-web's wasm provider through run.py's page, each at
    1 thread in a plain page and at 2 in a cross-origin isolated one (relaxweb also at 1 there):
    outputs match onnxruntime (Python), the 2-thread systems really ran on workers, the plain
    page's 1-thread ones did not, the isolated page's 1-thread relaxweb ran on its one worker,
    relaxweb's profile has rows, and the wasm tables have the model's rows."""
    case = bench.Case("n 512", lambda: {"x": rand(512, 64, seed=4)})  # 8 units of two 32-row panels per matmul
    monkeypatch.setitem(bench.MODELS, "tiny_mlp", bench.BenchModel("tiny_mlp", "", tiny_mlp, (case,), runs=2,
                                                                     warmup=1, real=False))
    prepared = bench.prepare_models(["tiny_mlp"], tmp_path, build_timeout=300)
    assert prepared["tiny_mlp"]["kernels_wasm_bytes"] == (tmp_path / "tiny_mlp_bundle" / "kernels.wasm").stat().st_size
    systems = ["relaxweb-wasm", "relaxweb-wasm-1t-iso", "relaxweb-wasm-2t"]
    if (bench.ORT_DIST / "ort.wasm.min.mjs").is_file():
        systems += ["ort-wasm", "ort-wasm-2t"]
    args = argparse.Namespace(runs=None, warmup=None, quick=False, cases=None, profile=True, relaxweb_options={},
                              budget_s=None, work=tmp_path, out=tmp_path / "results.json", interleave=False)
    report = {"results": {}}
    bench.run_systems(prepared, systems, args, report, time.monotonic())
    results = report["results"]["tiny_mlp"]
    for system in systems:
        result = results[system]
        assert "error" not in result and result["page_errors"] == [], (system, result)
        assert result["cross_origin_isolated"] == (system in bench.ISOLATED_SYSTEMS), system
        shape = result["cases"]["n 512"]
        assert len(shape["timesMs"]) == 2 and shape["median_ms"] > 0
        assert shape["max_abs_diff_vs_onnxruntime_cpu"] <= F32_LOOSE.atol + F32_LOOSE.rtol * shape["max_abs_reference"]
    one, two = results["relaxweb-wasm"]["cases"]["n 512"], results["relaxweb-wasm-2t"]["cases"]["n 512"]
    assert (one["extra"]["backend"], one["extra"]["threads"], one["extra"]["unitsRunByWorkers"]) == ("wasm", 1, 0)
    assert (two["extra"]["threads"], two["extra"]["unitsRunByWorkers"] > 0) == (2, True)
    isolated_one = results["relaxweb-wasm-1t-iso"]["cases"]["n 512"]["extra"]
    # its workers: the pool's one (the host module runs on the page's thread)
    assert (isolated_one["threads"], len(isolated_one["workersCreated"]), isolated_one["unitsRunByWorkers"] > 0) == (1, 1, True)
    assert results["relaxweb-wasm"]["kernels_wasm_bytes"] == prepared["tiny_mlp"]["kernels_wasm_bytes"]
    profile = one["profile"]
    assert profile["method"] == "wall clock per kernel call" and profile["rows"] and profile["dispatches"] >= 2
    if "ort-wasm" in systems:
        single, double = results["ort-wasm"]["cases"]["n 512"]["extra"], results["ort-wasm-2t"]["cases"]["n 512"]["extra"]
        assert (single["numThreads"], single["workersCreated"]) == (1, [])
        assert double["numThreads"] == 2 and len(double["workersCreated"]) >= 1  # its pthreads
    tables = bench.wasm_tables(report["results"])
    assert "| tiny_mlp | n 512 |" in tables and "| tiny_mlp | relaxweb-wasm-2t |" in tables
    assert "| relaxweb-wasm-1t-iso (ms) | ort-wasm-1t-iso (ms) | 1 thread: relaxweb / ort |" in tables
    assert "relaxweb-wasm profile, tiny_mlp n 512:" in bench.profile_tables(report["results"])
    # --budget-s spent by the first run: no warm-up, no timed run, the first run is the median
    args.budget_s, args.profile = 1e-6, False
    bench.run_systems(prepared, ["relaxweb-wasm"], args, report, time.monotonic())
    shape = report["results"]["tiny_mlp"]["relaxweb-wasm"]["cases"]["n 512"]
    assert (shape["runs"], shape["timesMs"], shape["median_ms"]) == (0, [], shape["firstRunMs"])
    # --interleave: all loaded at once, the timed runs in rounds; each pair's ratio by round
    args.budget_s, args.interleave, args.runs = None, True, 3
    bench.run_systems(prepared, systems, args, report, time.monotonic())
    results = report["results"]["tiny_mlp"]
    for system in systems:
        shape = results[system]["cases"]["n 512"]
        assert results[system]["page_errors"] == [] and len(shape["timesMs"]) == 3, system
        assert shape["max_abs_diff_vs_onnxruntime_cpu"] <= F32_LOOSE.atol + F32_LOOSE.rtol * shape["max_abs_reference"]
        assert sorted(shape["paired_ratios"]) == sorted(set(systems) - {system})
    assert results["relaxweb-wasm-2t"]["cases"]["n 512"]["extra"]["unitsRunByWorkers"] > 0
    assert "relaxweb-wasm / relaxweb-wasm-2t, paired by round" in capsys.readouterr().out


# bench/decode.py: decode with a KV cache, relaxweb vs onnxruntime-web --------------------


@pytest.fixture(scope="module")
def decode():
    yield from bench_module("bench_decode", "decode.py")


VOCAB, KV_HEADS, HEAD_DIM, WIDTH = 16, 2, 4, 8


def toy_decoder() -> onnx.ModelProto:
    """A one-layer decoder with optimum's signature: present = concat(past, the new token's key
    or value) along the past length, and logits that depend on the token, the whole cache, the
    position and the mask's length (so a cache or a mask that went wrong changes the tokens)."""
    dims = ["batch_size", KV_HEADS, "past_sequence_length", HEAD_DIM]
    inputs = [("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              ("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
              ("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              ("past_key_values.0.key", TensorProto.FLOAT, dims), ("past_key_values.0.value", TensorProto.FLOAT, dims)]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["x"])]
    for kind in ("key", "value"):
        nodes += [helper.make_node("MatMul", ["x", f"w_{kind}"], [f"{kind}_flat"]),
                  helper.make_node("Reshape", [f"{kind}_flat", "heads_shape"], [f"{kind}_heads"]),
                  helper.make_node("Transpose", [f"{kind}_heads"], [f"{kind}_new"], perm=[0, 2, 1, 3]),
                  helper.make_node("Concat", [f"past_key_values.0.{kind}", f"{kind}_new"], [f"present.0.{kind}"], axis=2),
                  helper.make_node("ReduceMean", [f"present.0.{kind}"], [f"{kind}_mean"], axes=[2, 3], keepdims=0)]
    nodes += [helper.make_node("Add", ["key_mean", "value_mean"], ["cache"]),
              helper.make_node("MatMul", ["cache", "w_cache"], ["cache_logits"]),
              helper.make_node("Unsqueeze", ["cache_logits", "axis_1"], ["cache_term"]),
              helper.make_node("MatMul", ["x", "w_out"], ["token_term"]),
              helper.make_node("Cast", ["position_ids"], ["positions"], to=TensorProto.FLOAT),
              helper.make_node("Unsqueeze", ["positions", "axis_2"], ["position_column"]),
              helper.make_node("Mul", ["position_column", "w_position"], ["position_term"]),
              helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
              helper.make_node("ReduceSum", ["mask", "axis_1"], ["seen"], keepdims=1),
              helper.make_node("Unsqueeze", ["seen", "axis_2"], ["seen_column"]),
              helper.make_node("Mul", ["seen_column", "w_seen"], ["seen_term"]),
              # Adds, not one Sum: onnxruntime-web runs a 4-input Sum on the CPU, reading its inputs back
              helper.make_node("Add", ["token_term", "cache_term"], ["partial"]),
              helper.make_node("Add", ["position_term", "seen_term"], ["shift"]),
              helper.make_node("Add", ["partial", "shift"], ["logits"])]
    weights = {"embedding": rand(VOCAB, WIDTH, seed=1), "w_key": rand(WIDTH, KV_HEADS * HEAD_DIM, seed=2),
               "w_value": rand(WIDTH, KV_HEADS * HEAD_DIM, seed=3), "w_cache": rand(KV_HEADS, VOCAB, seed=4),
               "w_out": rand(WIDTH, VOCAB, seed=5), "w_position": rand(VOCAB, seed=6) * 0.3,
               "w_seen": rand(VOCAB, seed=7) * 0.2, "heads_shape": np.array([0, 0, KV_HEADS, HEAD_DIM], np.int64),
               "axis_1": np.array([1], np.int64), "axis_2": np.array([2], np.int64)}
    outputs = ["logits", "present.0.key", "present.0.value"]
    return make_model(nodes, inputs, outputs, weights, check=True)


def test_decoder_signature_and_bounds(decode, tmp_path):
    path = tmp_path / "decoder.onnx"
    onnx.save(toy_decoder(), str(path))
    decoder = decode.decoder_signature(path)
    assert decoder.pasts == ("past_key_values.0.key", "past_key_values.0.value")
    assert decoder.presents == ("present.0.key", "present.0.value") and decoder.past_shapes == ((2, 0, 4),) * 2
    assert {name: array.shape for name, array in decode.random_past(decoder, 5, seed=0).items()} == {
        "past_key_values.0.key": (1, 2, 5, 4), "past_key_values.0.value": (1, 2, 5, 4)}
    # the last timed step after a past of 1024 has a past of 1024 + 15 and 1040 tokens in all
    assert decode.bounds_for(1024, 16) == {"batch_size": 1, "sequence_length": 1, "past_sequence_length": 1040,
                                           "total_sequence_length": 1041}
    not_a_decoder = tmp_path / "mlp.onnx"
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], ["y"]), str(not_a_decoder))
    with pytest.raises(ValueError, match="not a decoder with optimum's signature: missing logits, input_ids"):
        decode.decoder_signature(not_a_decoder)


def decode_step(past, ms, buffers=0, written=0, uniform=0, read=0, vocab=VOCAB):
    """One timed step as decode.js reports it: written = the inputs' padded bytes + ``written``."""
    inputs = 16 + -(-8 * (past + 1) // 16) * 16 + 16
    return {"ms": ms, "past": past, "counts": {"buffers": buffers, "bytesWritten": inputs + written + uniform,
                                               "uniformBytesWritten": uniform, "bytesRead": 4 * vocab + read,
                                               "dispatches": 3, "writes": 2, "maps": 1}}


def test_per_token_figures_count_the_cache_beyond_the_inputs_and_logits(decode):
    steps = [decode_step(16, 50.0, uniform=400), decode_step(17, 40.0, uniform=400), decode_step(18, 60.0, uniform=400)]
    figures = decode.per_token(steps, VOCAB)
    assert (figures["median_ms"], figures["tokens_per_s"], figures["steps"]) == (50.0, 20.0, 3)
    assert (figures["buffers"], figures["cache_bytes_written"], figures["cache_bytes_read"]) == (0, 0, 0)
    assert figures["uniform_bytes_written"] == 400 and figures["bytes_read"] == 4 * VOCAB
    # a runtime that uploads a past of 16 positions (2 x 2 x 16 x 4 floats) and reads it back
    cache = 2 * KV_HEADS * 16 * HEAD_DIM * 4
    moved = decode.per_token([decode_step(16, 50.0, buffers=3, written=cache, read=cache)], VOCAB)
    assert (moved["buffers"], moved["cache_bytes_written"], moved["cache_bytes_read"]) == (3, cache, cache)


def test_decode_tables_mark_the_goals(decode):
    def result(tokens_per_s, buffers, cache):
        return {"per_token": {"steps": 16, "median_ms": 1000 / tokens_per_s, "tokens_per_s": tokens_per_s,
                              "buffers": buffers, "bytes_written": 100 + cache, "cache_bytes_written": cache,
                              "bytes_read": 1032, "cache_bytes_read": 0, "uniform_bytes_written": 10,
                              "dispatches": 66},
                "tokens_equal_reference": 17, "tokens": 17, "max_abs_diff_vs_onnxruntime_cpu": 1e-5}

    report = {"results": {"16": {"relaxweb": result(30.0, 0, 0), "ort-webgpu": result(10.0, 5, 0)},
                          "1024": {"relaxweb": result(15.0, 2, 4096), "ort-webgpu": {"error": "Error: out of memory"}}}}
    goals = decode.goals_table(report).splitlines()
    assert "| 16 | 3.00 met | 0 met | 0 met | 5 | 0 |" in goals
    assert "| 1024 | - | 2 missed | 4,096 missed | - | - |" in goals
    table = decode.decode_table(report)
    assert "| 16 | relaxweb | 30.00 | 33.33 | 16 | 0 | 100 | 0 | 1,032 | 0 | 10 | 66 | 17/17 | 1.0e-05 |" in table
    assert "| 1024 | ort-webgpu | failed: Error: out of memory |" in table


@in_the_browser
def test_decode_page_feeds_present_back_on_both_systems(decode, tmp_path):
    """The page's decode loop on a toy decoder (no timing asserted): each system's greedy tokens
    are onnxruntime's (CPU) from the same prefill, the timed steps are at past P, P + 1, ...,
    nothing of the cache moves between JavaScript and the GPU, relaxweb creates no buffers once
    warm, and the page's counters of WebGPU calls agree with relaxweb's own; with the cache read
    back and uploaded again (relaxweb-cache-on-host) the counters see exactly its bytes."""
    path = tmp_path / "decoder.onnx"
    onnx.save(toy_decoder(), str(path))
    relaxweb.build(path, tmp_path / "bundle", bounds=decode.bounds_for(8, 3))
    systems = ["relaxweb", "relaxweb-cache-on-host"]
    if (decode.ORT_DIST / "ort.webgpu.min.mjs").is_file():
        systems.append("ort-webgpu")
    report = decode.bench_decode(path, tmp_path / "bundle", [4, 8], steps=3, warmup=2, systems=systems, log=lambda _: None)
    assert report["page_errors"] == [] and report["adapter"]["architecture"] == "swiftshader"
    for past in (4, 8):
        results = report["results"][str(past)]
        assert len(results["reference_tokens"]) == 2 + 3 + 1  # the prefill's, the warm-up's and the timed steps'
        for system in systems:
            result = results[system]
            assert result["tokens_equal_reference"] == result["tokens"] == 6, (system, past, result["rounds"][0]["tokens"])
            assert result["max_abs_diff_vs_onnxruntime_cpu"] <= 1e-4 * (1 + results["max_abs_reference_logit"])
            timed = result["rounds"][0]["timed"]
            assert [step["past"] for step in timed] == [past, past + 1, past + 2]
            figures = result["per_token"]
            assert figures["bytes_read"] >= 4 * VOCAB  # the logits, read back each step
            if system == "relaxweb-cache-on-host":  # the counters see the cache when it moves
                for step in timed:  # the past read back and uploaded: 2 tensors of [1, 2, past, 4] floats
                    cache = 2 * KV_HEADS * step["past"] * HEAD_DIM * 4
                    # + the new position, + the run status read with the outputs (the embedding's index check)
                    assert step["counts"]["bytesRead"] == 4 * VOCAB + cache + 2 * KV_HEADS * HEAD_DIM * 4 + decode.RUN_STATUS_BYTES
                    # relaxweb writes its int64 inputs as int32: 4 bytes each, less than the allowance
                    # for them (int64, padded), so the figure is a lower bound of the cache's bytes
                    inputs, allowance = 4 * (1 + step["past"] + 1 + 1), 16 + -(-8 * (step["past"] + 1) // 16) * 16 + 16
                    assert decode.per_token([step], VOCAB, decode.RUN_STATUS_BYTES)["cache_bytes_written"] == cache + inputs - allowance > 0
            else:
                assert (figures["cache_bytes_written"], figures["cache_bytes_read"]) == (0, 0), system
        for step in results["relaxweb"]["rounds"][0]["timed"]:
            own = step["runtimeStats"]
            assert step["counts"]["buffers"] == own["buffersCreated"] == 0
            # the run status (32 bytes cleared before the run, read with the logits) is not in the runtime's own counts
            assert step["counts"]["bytesRead"] - decode.RUN_STATUS_BYTES == own["bytesRead"] == 4 * VOCAB
            assert step["counts"]["bytesWritten"] - decode.RUN_STATUS_BYTES == own["inputBytesWritten"] + own["paramsBytesWritten"]
            assert step["counts"]["uniformBytesWritten"] == own["paramsBytesWritten"]
    assert "| 8 | relaxweb |" in decode.decode_table(report)


@in_the_browser
def test_decode_lm_generates_the_reference_tokens_on_every_system(decode, tmp_path):
    """decode.py --lm's page on the toy decoder (no timing asserted): a prompt's prefill from an
    empty past and greedy new tokens on relaxweb (WebGPU, wasm) and onnxruntime-web (WebGPU,
    wasm) give onnxruntime's (CPU) tokens; relaxweb on WebGPU generates with model.generate and,
    its kept outputs' buffers made in the first generation, creates no buffer per token in the
    second (the page's count and the runtime's own); load fetches the model's bytes; the wasm
    systems' memory is seen."""
    path = tmp_path / "decoder.onnx"
    onnx.save(toy_decoder(), str(path))
    signature = decode.lm_signature(path)
    assert signature["pastShapes"] == [[KV_HEADS, 0, HEAD_DIM]] * 2 and "position_ids" in signature["inputs"]
    relaxweb.build(path, tmp_path / "bundle", bounds=decode.lm_bounds(3, 4))
    prompt = decode.lm_prompt(3, VOCAB)
    reference = decode.lm_reference(path, signature, prompt, 4)
    systems = ["relaxweb", "relaxweb-wasm"]
    if (decode.ORT_DIST / "ort.webgpu.min.mjs").is_file():
        systems += ["ort-webgpu", "ort-wasm"]
    report = decode.bench_lm(path, tmp_path / "bundle", signature, prompt, 4, runs=2, systems=systems, log=lambda _: None)
    report["reference_tokens"] = reference
    assert report["page_errors"] == []
    for name in systems:
        system = report["systems"][name]
        assert "error" not in system, system.get("error")
        summary = decode.lm_summary(system, reference)
        assert summary["tokens"] == reference and summary["same_prefix_as_reference"] == 4 and summary["runs_agree"], name
        assert [len(run["steps"]) for run in system["runs"]] == [3, 3] and summary["fetched_bytes"] > 0
        if name.endswith("wasm"):
            assert summary["wasm_memory_bytes"] > 0
    assert decode.lm_summary(report["systems"]["relaxweb"], reference)["mode"] == "model.generate"
    for step in report["systems"]["relaxweb"]["runs"][1]["steps"]:
        assert step["counts"]["buffers"] == step["runtimeStats"]["buffersCreated"] == 0
    for system in report["systems"].values():
        system["summary"] = decode.lm_summary(system, reference)
    assert "| relaxweb-wasm |" in decode.lm_table(report)


# bench/batch.py: ragged batches against one by one and padded ------------------------------


@pytest.fixture(scope="module")
def batch():
    yield from bench_module("bench_batch", "batch.py")


def toy_tokens_model(work: Path) -> Path:
    """ids [batch, seq] -> embedding (16 x 8) @ w (8 x 4): 64 FLOPs per token in the matmul."""
    path = work / "toy_tokens.onnx"
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["x"]), helper.make_node("MatMul", ["x", "w"], ["y"])]
    weights = {"embedding": rand(16, 8, seed=1), "w": rand(8, 4, seed=2)}
    onnx.save(make_model(nodes, [("input_ids", TensorProto.INT64, ["batch", "seq"])], ["y"], weights, check=True), str(path))
    return path


def test_batch_instances_are_deterministic_and_padded_on_the_right(batch):
    lengths = batch.sequence_lengths(32, 8, 128, seed=16)
    assert lengths == batch.sequence_lengths(32, 8, 128, seed=16) and len(lengths) == 32
    assert min(lengths) >= 8 and max(lengths) <= 128 and len(set(lengths)) > 8
    model = batch.MODELS["bert_base"]
    instances = batch.make_instances(model, [3, 5])
    assert [sorted(i) for i in instances] == [["attention_mask", "input_ids", "token_type_ids"]] * 2
    assert instances[1]["input_ids"].shape == (1, 5) and instances[1]["input_ids"].max() < model.vocab
    assert instances[0]["attention_mask"].tolist() == [[1, 1, 1]] and not instances[0]["token_type_ids"].any()
    whole = batch.padded(instances, 6)
    assert whole["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]]
    np.testing.assert_array_equal(whole["input_ids"][1, :5], instances[1]["input_ids"][0])
    assert not whole["input_ids"][0, 3:].any()


def test_batch_work_counts_needed_and_padded_from_the_host_module(batch, tmp_path):
    relaxweb.build(toy_tokens_model(tmp_path), tmp_path / "bundle", bounds={"batch": 4, "seq": 16})
    model = batch.BatchModel("toy", "", toy_tokens_model, 16, "batch", "seq")
    lengths = [3, 16, 7, 9]
    work = batch.batch_work(tmp_path / "bundle", batch.make_instances(model, lengths), 16)
    needed, padded, ragged = work["needed"], work["padded"], work["ragged"]
    per_token = padded["flops"] // (4 * 16)
    assert per_token >= 64 and needed["flops"] == per_token * sum(lengths)  # the matmul's 2 * 8 * 4, at least
    assert work["padded_over_needed"]["flops"] == pytest.approx(64 / sum(lengths))
    assert needed["dispatches"] == 4 * padded["dispatches"] and ragged["dispatches"] == padded["dispatches"]
    assert (ragged["flops"], ragged["invocations"], ragged["workgroups"]) == (
        needed["flops"], needed["invocations"], needed["workgroups"])
    assert needed["uncosted"] == {} and not needed["stopped_at_read"]
    table = batch.work_table("toy", work)
    assert f"| padded / needed | {64 / sum(lengths):.2f} |" in table


def test_batch_tables_say_what_failed_and_give_the_ratios(batch):
    def mode(median, diff=1e-6):
        return {"median_ms": median, "timesMs": [median], "firstMs": 2 * median, "dispatches_per_run": 10,
                "max_abs_diff_vs_onnxruntime_cpu": diff}

    entry = {"title": "toy", "systems": {
        "relaxweb": {"modes": {"batch": mode(50), "one-by-one": mode(100), "padded": {"error": "runBatch missing"}}},
        "ort-webgpu": {"system": "ort-webgpu", "error": "Error: no adapter", "modes": {}}}}
    lines = batch.times_table("toy", entry).splitlines()
    assert "| relaxweb | padded | runBatch missing | | | | |" in lines
    assert "| ort-webgpu | - | failed: Error: no adapter | | | | |" in lines
    assert "| relaxweb batch / relaxweb one-by-one | 0.50 |" in lines
    assert "| relaxweb batch / relaxweb padded | - |" in lines


@in_the_browser
def test_batch_page_runs_every_mode_on_a_toy_model(batch, tmp_path, monkeypatch, capsys):
    """batch.js's modes on a toy model (no timing asserted): every mode's outputs match
    onnxruntime (Python, CPU) instance by instance, the padded modes' rows included; the ragged
    batch (where the runtime has runBatch) makes the merged dispatch count, else says it is missing."""
    model = batch.BatchModel("toy", "toy", toy_tokens_model, 16, "batch", "seq")
    monkeypatch.setitem(batch.MODELS, "toy", model)
    systems = ["relaxweb"] + (["ort-webgpu"] if (batch.ORT_DIST / "ort.webgpu.min.mjs").is_file() else [])
    args = argparse.Namespace(instances=4, min_seq=2, max_seq=16, runs=1, warmup=0, reuse_build=False,
                              build_timeout=300, runtime_js=None, work=tmp_path, out=tmp_path / "results.json")
    report = {"lengths": batch.sequence_lengths(4, 2, 16, seed=3), "results": {}}
    batch.run_models(["toy"], args, report, systems)
    entry = report["results"]["toy"]
    for system in systems:
        result = entry["systems"][system]
        assert "error" not in result and result["page_errors"] == [], result
        assert list(result["modes"]) == list(batch.MODES[system])
        for name, figures in result["modes"].items():
            if (system, name) == batch.RAGGED and figures.get("error") == "runBatch missing":
                continue
            assert "error" not in figures, (system, name, figures)
            assert len(figures["timesMs"]) == 1 and figures["max_abs_diff_vs_onnxruntime_cpu"] <= 1e-5
    ragged = entry["systems"]["relaxweb"]["modes"]["batch"]
    if "error" not in ragged:
        assert ragged["dispatches_per_run"] == entry["work"]["ragged"]["dispatches"]
    assert "| relaxweb batch / relaxweb one-by-one |" in batch.times_table("toy", entry)
    capsys.readouterr()
