"""bench/run.py without a browser: what it prepares and what its tables say, above all when a
model, a build, a system or a case fails (one line with the reason, the rest goes on)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_run"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_run"]


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
    prefill, decode = (c.inputs() for c in bench.MODELS["gpt2_small"].cases)
    assert prefill["input_ids"].shape == (1, 128) and prefill["past_key_values.11.value"].shape == (1, 12, 0, 64)
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
