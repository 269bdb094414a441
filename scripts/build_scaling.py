"""How build time grows with the number of ONNX nodes (issue 12: the build must scale).

Builds generated models of 1k / 10k / 100k nodes (``--sizes``) of three shapes, each in a
fresh process, and prints the CPU time of every build stage (import, each pass, the WGSL
kernels, host.wasm, the bundle files; CPU time, so that a shared machine measures the same),
the wall time, the peak memory, and the ratio of times per 10x nodes (10 is linear, 100
quadratic):

- ``elementwise``: a chain of Relu nodes (fusion merges them into kernels of bounded depth);
- ``softmax``: a chain of Softmax nodes (each legalizes to three programs with reductions);
- ``branchy``: residual blocks ``h = h + tanh(h) * sigmoid(h)`` (4 nodes each; every value
  read twice, so fusion sees producers with several consumers).

    python3 scripts/build_scaling.py                       # 1k, 10k, 100k: all three shapes
    python3 scripts/build_scaling.py --sizes 1000,10000 --shapes softmax
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import relaxweb

SHAPE = [4, 8]


def chain_model(op: str, count: int) -> onnx.ModelProto:
    """``count`` nodes of ``op``, each reading the previous one's output."""
    attrs = {"axis": -1} if op == "Softmax" else {}
    nodes, previous = [], "x"
    for index in range(count):
        output = "y" if index == count - 1 else f"t{index}"
        nodes.append(helper.make_node(op, [previous], [output], name=f"{op}_{index}", **attrs))
        previous = output
    return _model(nodes, f"{op.lower()}_chain_{count}")


def branchy_model(count: int) -> onnx.ModelProto:
    """Residual blocks ``h = h + tanh(h) * sigmoid(h)`` up to ``count`` nodes (4 per block)."""
    nodes, previous = [], "x"
    blocks = max(count // 4, 1)
    for index in range(blocks):
        t, s, m = f"tanh{index}", f"sigmoid{index}", f"mul{index}"
        output = "y" if index == blocks - 1 else f"h{index}"
        nodes += [
            helper.make_node("Tanh", [previous], [t], name=f"Tanh_{index}"),
            helper.make_node("Sigmoid", [previous], [s], name=f"Sigmoid_{index}"),
            helper.make_node("Mul", [t, s], [m], name=f"Mul_{index}"),
            helper.make_node("Add", [previous, m], [output], name=f"Add_{index}"),
        ]
        previous = output
    return _model(nodes, f"branchy_{count}")


def _model(nodes: list, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {
    "elementwise": lambda count: chain_model("Relu", count),
    "softmax": lambda count: chain_model("Softmax", count),
    "branchy": branchy_model,
}


def stage_name(line: str) -> str:
    """The stage a progress line of ``relaxweb.build`` ends."""
    if line.startswith("pass "):
        return line[len("pass "):]
    for prefix, name in (("imported", "import"), ("emitted", "wgsl"), ("assembled", "host.wasm"), ("wrote", "write")):
        if line.startswith(prefix):
            return name
    return line


def build_once(shape: str, count: int) -> dict:
    """Build one model in this process; its stage times (s), kernels and peak memory (MB)."""
    model = MODELS[shape](count)
    stages: dict[str, float] = {}
    last = start = time.process_time()
    wall_start = time.perf_counter()

    def progress(line: str) -> None:
        nonlocal last
        now = time.process_time()
        stages[stage_name(line)] = now - last
        last = now

    with tempfile.TemporaryDirectory() as out:
        bundle = relaxweb.build(model, out, progress=progress)
        kernels = len(bundle.manifest["kernels"])
        call_sites = len(bundle.manifest["call_sites"])
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"shape": shape, "nodes": count, "total": time.process_time() - start,
            "wall": time.perf_counter() - wall_start, "stages": stages,
            "kernels": kernels, "call_sites": call_sites, "peak_mb": round(peak_mb)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="node counts, comma-separated")
    parser.add_argument("--shapes", default=",".join(MODELS), help=f"among {', '.join(MODELS)}")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--one", nargs=2, metavar=("SHAPE", "NODES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(build_once(args.one[0], int(args.one[1]))))
        return
    results = []
    for shape in args.shapes.split(","):
        previous = None
        for count in (int(size) for size in args.sizes.split(",")):
            done = subprocess.run([sys.executable, __file__, "--one", shape, str(count)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"{shape} {count}: failed\n{done.stderr[-2000:]}")
                break
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(result)
            report(result, previous)
            previous = result
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def report(result: dict, previous: dict | None) -> None:
    ratio = ""
    if previous is not None:
        growth = (result["total"] / previous["total"]) / (result["nodes"] / previous["nodes"]) * 10
        ratio = f", x{growth:.1f} per 10x nodes"
    print(f"{result['shape']} {result['nodes']} nodes: {result['total']:.1f} s CPU{ratio} "
          f"({result['wall']:.1f} s wall); "
          f"{result['kernels']} kernels, {result['call_sites']} dispatches, peak {result['peak_mb']} MB")
    stages = result["stages"]
    print("   " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in stages.items()), flush=True)


if __name__ == "__main__":
    main()
