#!/usr/bin/env python3
"""Measure what fused attention (``passes/fuse_attention.py``) saves, before / after.

    python3 scripts/measure_attention.py [--model bert_legacy] [--onnx PATH] [--batch 1] [--seq 128]
                                         [--heads 12] [--head 64] [--runs 10] [--json OUT.json]

Two measurements, each built twice at the default opt level (storage reuse on): *unfused*
(the pipeline without ``fuse_attention``: matmul, scale, mask add, softmax and matmul as
separate kernels, the scores ``[batch, heads, seq, seq]`` in GPU memory) and *fused* (the
default pipeline):

1. a whole model (``--model``, exported by ``scripts/export_test_models.py`` into a temporary
   folder, or ``--onnx``) at ``batch`` x ``seq``: dispatches per inference, kernels, the bytes
   of its storages at that shape (every GPU buffer but the weights: the peak, since storages
   are allocated once), the largest difference from onnxruntime, and the run time;
2. the attention subgraph alone (q, k, v ``[batch, heads, seq, head]``, an additive mask
   ``[batch, 1, 1, seq]``), the same figures.

Run times are interleaved (unfused, fused, unfused, ...) in one process, ``--runs`` each
after a warm-up, and reported as medians and the median of the per-pair ratios: on a shared
machine only the ratio means anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from relaxweb.bundle import write_bundle  # noqa: E402
from relaxweb.compiler import compile_model, import_model  # noqa: E402
from relaxweb.ir.symbolic import evaluate  # noqa: E402
from relaxweb.passes import PassContext, fuse_attention, pipeline, run_pipeline  # noqa: E402
from relaxweb.runtime.webgpu import Session  # noqa: E402


def build(model, out: Path, fused: bool):
    """The bundle of ``model`` at the default opt level, with or without ``fuse_attention``."""
    if fused:
        module = compile_model(model, {})
    else:
        with PassContext():
            module = run_pipeline(import_model(model), [p for p in pipeline() if p is not fuse_attention])
    write_bundle(module, out, "model")
    return module


def attention_model(heads: int, head: int):
    """The attention subgraph as torch exports it, q / k / v [batch, heads, seq, head]."""
    shape = ["batch", heads, "seq", head]
    nodes = [
        helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "k_t"], ["scores"]),
        helper.make_node("Mul", ["scores", "factor"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "v"], ["out"]),
    ]
    inputs = [helper.make_tensor_value_info(n, 1, shape) for n in ("q", "k", "v")]
    inputs.append(helper.make_tensor_value_info("mask", 1, ["batch", 1, 1, "seq"]))
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("out", 1, None)],
                              initializer=[numpy_helper.from_array(np.array(head ** -0.5, np.float32), "factor")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def compare(model, inputs: dict, dims: dict, work: Path, runs: int) -> dict:
    import onnxruntime

    reference = onnxruntime.InferenceSession(model.SerializeToString() if not isinstance(model, Path) else str(model),
                                             providers=["CPUExecutionProvider"]).run(None, inputs)
    rows, sessions = {}, {}
    for name, fused in (("unfused", False), ("fused", True)):
        module = build(model, work / name, fused)
        session = sessions[name] = Session(work / name)
        outputs = list(session.run(inputs).values())
        rows[name] = {
            "dispatches": session.last_dispatch_count,
            "kernels": len(json.loads((work / name / "manifest.json").read_text())["kernels"]),
            "storage_bytes": sum(int(evaluate(s.size, dims)) for s in module.main.storages),
            "max_abs_error": max(float(np.nanmax(np.abs(g - w))) for g, w in zip(outputs, reference)),
            "times": [],
        }
    for _ in range(runs):
        for name, session in sessions.items():
            started = time.perf_counter()
            session.run(inputs)
            rows[name]["times"].append(time.perf_counter() - started)
    ratios = [f / u for f, u in zip(rows["fused"]["times"], rows["unfused"]["times"])]
    for row in rows.values():
        row["median_run_s"] = statistics.median(row.pop("times"))
    return {"rows": rows, "time_ratio": statistics.median(ratios), "runs": runs}


def report(title: str, result: dict) -> None:
    print(title)
    print(f"{'build':<10}{'dispatches':>11}{'kernels':>9}{'storage bytes':>15}{'max |err|':>11}{'run (s)':>9}")
    for name, row in result["rows"].items():
        print(f"{name:<10}{row['dispatches']:>11}{row['kernels']:>9}{row['storage_bytes']:>15}"
              f"{row['max_abs_error']:>11.1e}{row['median_run_s']:>9.3f}")
    rows = result["rows"]
    print(f"fused / unfused: dispatches {rows['fused']['dispatches'] / rows['unfused']['dispatches']:.2f}, "
          f"storage bytes {rows['fused']['storage_bytes'] / rows['unfused']['storage_bytes']:.2f}, "
          f"run time {result['time_ratio']:.2f} (median of {result['runs']} interleaved pairs)\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert_legacy", help="a model name of scripts/export_test_models.py")
    parser.add_argument("--onnx", type=Path, help="measure this .onnx file instead (inputs named as --model's)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--heads", type=int, default=12, help="heads of the attention-alone measurement")
    parser.add_argument("--head", type=int, default=64, help="head size of the attention-alone measurement")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per build (after one warm-up)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    from export_test_models import export, make_inputs, model_specs

    spec = model_specs()[args.model]
    dims = {"batch": args.batch, "seq": args.seq}
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        onnx_path = args.onnx
        if onnx_path is None:
            print(f"exporting {args.model} ...", file=sys.stderr)
            export(spec, work)
            onnx_path = work / f"{args.model}.onnx"
        (work / "model").mkdir()
        results["model"] = compare(onnx_path, make_inputs(spec.inputs, dims), dims, work / "model", args.runs)
        generator = np.random.default_rng(0)
        shape = (args.batch, args.heads, args.seq, args.head)
        inputs = {n: generator.standard_normal(shape).astype(np.float32) for n in ("q", "k", "v")}
        inputs["mask"] = np.where(generator.random((args.batch, 1, 1, args.seq)) < 0.1, -3.4028235e38, 0).astype(np.float32)
        (work / "attention").mkdir()
        results["attention"] = compare(attention_model(args.heads, args.head), inputs, dims, work / "attention", args.runs)

    shape = ", ".join(f"{k}={v}" for k, v in dims.items())
    report(f"{onnx_path.name if args.onnx else args.model} at {shape}", results["model"])
    report(f"attention alone: q, k, v [{args.batch}, {args.heads}, {args.seq}, {args.head}], mask [{args.batch}, 1, 1, "
           f"{args.seq}]", results["attention"])
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "dims": dims, "heads": args.heads, "head": args.head,
                                         "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
