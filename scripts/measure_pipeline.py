#!/usr/bin/env python3
"""Measure what fusion and memory planning save on the GPT-2-like model, at one fixed shape.

    python3 scripts/measure_pipeline.py [--model gpt2_legacy] [--batch 1] [--seq 32] [--json OUT.json]

Builds the model (exported by ``scripts/export_test_models.py`` into a temporary folder
unless ``--onnx PATH`` is given) four ways, runs each once in the Python runtime (wgpu;
lavapipe on a machine without a GPU), checks the output against onnxruntime, and prints:

- dispatches per inference at ``--opt-level 0`` (one kernel per op) and at the default
  (fused, scheduled), and their ratio (goal: at most 0.5);
- total bytes of the storages (inputs, intermediates, outputs; weights are separate) with
  storage reuse and without it (every tensor its own storage), and their ratio (goal: at
  most 0.5), at the default opt level;
- kernels compiled, and a median run time per build for reference only (this machine may
  have no GPU; times here say little, so no goal is attached to them).
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from relaxweb.bundle import write_bundle  # noqa: E402
from relaxweb.compiler import compile_model  # noqa: E402
from relaxweb.ir.symbolic import evaluate  # noqa: E402

VARIANTS = [
    # name, opt level, storage reuse
    ("opt0", 0, True),
    ("opt0-no-reuse", 0, False),
    ("default", 1, True),
    ("default-no-reuse", 1, False),
]


def build_variant(onnx_path: Path, out: Path, opt_level: int, reuse: bool):
    module = compile_model(onnx_path, {}, opt_level=opt_level, storage_reuse=reuse)
    write_bundle(module, out, onnx_path.name)
    return module


def storage_bytes(module, dims: dict[str, int]) -> int:
    return sum(int(evaluate(storage.size, dims)) for storage in module.main.storages)


def measure(onnx_path: Path, dims: dict[str, int], inputs: dict[str, np.ndarray], reference: list[np.ndarray],
            work: Path, runs: int) -> dict:
    from relaxweb.runtime.webgpu import Session

    results = {}
    for name, level, reuse in VARIANTS:
        module = build_variant(onnx_path, work / name, level, reuse)
        session = Session(work / name)
        outputs = list(session.run(inputs).values())
        error = max(float(np.abs(got - want).max()) for got, want in zip(outputs, reference))
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            session.run(inputs)
            times.append(time.perf_counter() - started)
        results[name] = {
            "opt_level": level, "storage_reuse": reuse,
            "dispatches": session.last_dispatch_count,
            "kernels": len(json.loads((work / name / "manifest.json").read_text())["kernels"]),
            "storages": len(module.main.storages),
            "storage_bytes": storage_bytes(module, dims),
            "max_abs_error": error,
            "median_run_s": statistics.median(times),
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2_legacy", help="a model name of scripts/export_test_models.py")
    parser.add_argument("--onnx", type=Path, help="measure this .onnx file instead (inputs named as --model's)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per build (after one warm-up)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)

    import onnxruntime
    from export_test_models import export, make_inputs, model_specs

    spec = model_specs()[args.model]
    dims = {"batch": args.batch, "seq": args.seq}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        onnx_path = args.onnx
        if onnx_path is None:
            print(f"exporting {args.model} ...", file=sys.stderr)
            export(spec, work)
            onnx_path = work / f"{args.model}.onnx"
        inputs = make_inputs(spec.inputs, dims)
        reference = onnxruntime.InferenceSession(str(onnx_path)).run(None, inputs)
        results = measure(onnx_path, dims, inputs, reference, work, args.runs)

    shape = ", ".join(f"{k}={v}" for k, v in dims.items())
    print(f"{onnx_path.name if args.onnx else args.model} at {shape}")
    print(f"{'build':<18}{'dispatches':>11}{'kernels':>9}{'storages':>9}{'storage bytes':>15}{'max |err|':>11}{'run (s)':>9}")
    for name, row in results.items():
        print(f"{name:<18}{row['dispatches']:>11}{row['kernels']:>9}{row['storages']:>9}{row['storage_bytes']:>15}"
              f"{row['max_abs_error']:>11.1e}{row['median_run_s']:>9.3f}")
    dispatch_ratio = results["default"]["dispatches"] / results["opt0"]["dispatches"]
    storage_ratio = results["default"]["storage_bytes"] / results["default-no-reuse"]["storage_bytes"]
    print(f"dispatches, default / opt level 0: {dispatch_ratio:.2f} (goal <= 0.5)")
    print(f"storage bytes, reuse / no reuse (default opt level): {storage_ratio:.2f} (goal <= 0.5)")
    print(f"median run time, default / opt level 0: {results['default']['median_run_s'] / results['opt0']['median_run_s']:.2f} "
          "(this machine's adapter; for reference only)")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "dims": dims, "results": results,
                                         "dispatch_ratio": dispatch_ratio, "storage_ratio": storage_ratio}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
