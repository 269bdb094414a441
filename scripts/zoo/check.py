"""Check one exported model against onnxruntime, in relaxweb's environment:

    PYTHONPATH=.:scripts python -m zoo.check MODEL.onnx BUNDLE_DIR NAME [PATH,PATH...]   # prints the result as JSON

The model is built ONCE with ``relaxweb.build`` (no bounds: storages grow as needed) and the
bundle is run at each of the catalog's shapes on every path of ``PATHS``: the Python runtime
on WebGPU (wgpu) and on the bundle's kernels.wasm (wasmtime), each loaded once, and
kernels.wasm in one headless Chromium started without WebGPU (``backend: "auto"`` must pick
wasm; one page runs every shape), and every shape at once as one batch on wgpu
(``run_batch``: each shape an instance with its own sizes; ``mode`` says whether it ran as
ragged dispatches or one by one, and ``reason`` why).  Every output of every path is compared with onnxruntime's
(CPU) on the same inputs, at the same tolerance; the model is ok only when every path is.

Tolerance (``TOLERANCE``): an element matches when it is within 1e-3 of onnxruntime's value,
absolutely or relatively (the issue's rule for float32).  Models computed in float16 by
onnxruntime (``FLOAT16_TOLERANCE``, 1e-2 absolutely or relatively, ten float16 ulps at 1.0):
onnxruntime rounds every intermediate value to float16 (unit roundoff 2**-11 ~ 4.9e-4), while
relaxweb computes float16 models in float32 on devices without shader-f16, so the two differ
by the rounding accumulated over the whole network, not by one rounding.  Integer and bool
outputs must be equal.
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

import relaxweb
from relaxweb.browser import browser_runs
from zoo.catalog import MODELS_BY_NAME, Model

TOLERANCE = 1e-3
FLOAT16_TOLERANCE = 1e-2
#: Where the bundle runs, each compared with onnxruntime: the Python runtime's two backends,
#: kernels.wasm in headless Chromium without WebGPU, and every shape at once as one batch of
#: instances of different sizes (``Session.run_batch`` on wgpu: ragged dispatches, or one by
#: one where the bundle cannot batch; the path records which and why).
PATHS = ("webgpu", "wasm", "chromium-wasm", "batch")
BROWSER_TIMEOUT_S = 600


def tolerance(model: Model) -> float:
    return FLOAT16_TOLERANCE if model.exporter == "ort-float16" else TOLERANCE


# What the model declares -----------------------------------------------------------------------


def written_dim(dim) -> int | str:
    """A dim as the model's annotation writes it: a positive int, its name, or '?' / the
    non-positive value for the dims exporters leave unnamed."""
    if dim.HasField("dim_param"):
        return dim.dim_param
    if dim.HasField("dim_value"):
        return dim.dim_value if dim.dim_value > 0 else str(dim.dim_value)
    return "?"


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are not initializers (old exporters list weights as inputs)."""
    weights = {tensor.name for tensor in graph.initializer}
    return [value for value in graph.input if value.name not in weights]


def describe(model: onnx.ModelProto) -> dict:
    """Op count (nodes of the main graph), op types (subgraphs' too; other domains prefixed),
    each input's annotation and the dynamic dims as the exporter wrote them."""
    op_types: set[str] = set()

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            op_types.add(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}")
            for attribute in node.attribute:
                for sub in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                    walk(sub)

    walk(model.graph)
    inputs, dynamic = {}, []
    for value in graph_inputs(model.graph):
        dims = [written_dim(d) for d in value.type.tensor_type.shape.dim]
        inputs[value.name] = f"{onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)}{dims}"
        dynamic += [d for d in dims if isinstance(d, str) and d not in dynamic]
    return {"ops": len(model.graph.node), "op_types": sorted(op_types), "inputs": inputs, "dynamic_dims": dynamic,
            "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import}}


# Inputs ------------------------------------------------------------------------------------------


def logical_dims(model: Model, value: onnx.ValueInfoProto) -> list[int | str]:
    if value.name in model.inputs:
        return list(model.inputs[value.name])
    dims = []
    for axis, dim in enumerate(value.type.tensor_type.shape.dim):
        written = written_dim(dim)
        if isinstance(written, int):
            dims.append(written)
        elif written in model.dim_names:
            dims.append(model.dim_names[written])
        elif dim.HasField("dim_param"):
            dims.append(written)
        else:
            raise ValueError(f"input '{value.name}' dim {axis} is {written}: give the input's dims in the catalog")
    return dims


def size(dim: int | str, values: dict[str, int]) -> int:
    """A logical dim's value: an int, a name, or a sum of names and ints ("past+seq")."""
    if isinstance(dim, int):
        return dim
    return sum(int(term) if term.strip().isdigit() else values[term.strip()] for term in dim.split("+"))


def make_inputs(model: Model, onnx_model: onnx.ModelProto, values: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Inputs for one run: token ids in [0, vocab), masks of ones with a padded tail on later
    rows, position ids counting on from the past length, token type ids 0, floats N(0, 1)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for value in graph_inputs(onnx_model.graph):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        shape = tuple(size(d, values) for d in logical_dims(model, value))
        name = value.name.lower()
        if "mask" in name:
            array = np.ones(shape, dtype)
            if len(shape) == 2:
                for row in range(1, shape[0]):
                    array[row, shape[1] - min(row, shape[1] - 1):] = 0
        elif "position" in name:
            start = values.get("past", 0)
            array = np.broadcast_to(np.arange(start, start + shape[-1]), shape).astype(dtype)
        elif "token_type" in name:
            array = np.zeros(shape, dtype)
        elif np.issubdtype(dtype, np.integer):
            array = rng.integers(0, model.vocab, size=shape).astype(dtype)
        elif dtype == np.bool_:
            array = rng.integers(0, 2, size=shape).astype(bool)
        else:
            array = rng.standard_normal(shape).astype(dtype)
        arrays[value.name] = np.ascontiguousarray(array)
    return arrays


# Comparing -----------------------------------------------------------------------------------------


def compare(actual: np.ndarray, expected: np.ndarray, tol: float) -> tuple[float, float]:
    """(max |actual - expected|, the largest error in units of ``tol``: each element's
    min(absolute, relative) difference / tol; inf on a shape or dtype mismatch)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return float("inf"), float("inf")
    if actual.size == 0:
        return 0.0, 0.0
    if not np.issubdtype(expected.dtype, np.floating):
        mismatch = float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64))))
        return mismatch, 0.0 if mismatch == 0 else float("inf")
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(e)
    same_inf = np.isinf(a) & (a == e)
    diff = np.where(both_nan | same_inf, 0.0, np.abs(a - e))
    diff = np.where(np.isnan(diff), np.inf, diff)
    relative = diff / np.maximum(np.abs(e), np.finfo(np.float64).tiny)
    return float(np.max(diff)), float(np.max(np.minimum(diff, relative)) / tol)


def dim_values(model: Model, onnx_model: onnx.ModelProto) -> dict[str, list[int]]:
    """Each logical dim the inputs use by name -> the values the shapes give it."""
    names = {term.strip() for value in graph_inputs(onnx_model.graph) for dim in logical_dims(model, value)
             if isinstance(dim, str) for term in dim.split("+") if not term.strip().isdigit()}
    return {name: sorted({values[name] for values in model.shapes}) for name in sorted(names)}


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    prefix = "" if isinstance(error, relaxweb.RelaxwebError) else f"{type(error).__name__}: "
    return (prefix + text)[:500]


def check(model: Model, path: Path, bundle_dir: Path, paths: tuple[str, ...] = PATHS) -> dict:
    """Build once, run every shape on each of ``paths``, compare; the result as a dict: status
    (ok, wrong, build error, run error or reference error: the first path's that is not ok,
    with the first line of its error prefixed by the path), ``paths`` (each path's status,
    error, runs and largest difference), and ``runs`` the first path's."""
    onnx_model = onnx.load(str(path))
    result = {"name": model.name, **describe(onnx_model), "tolerance": tolerance(model), "runs": [],
              "dim_values": dim_values(model, onnx_model), "paths": {}}
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    try:
        reference = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - a model onnxruntime rejects is no test of relaxweb
        result.update(status="reference error", error=f"onnxruntime: {first_line(error)}")
        return result
    runs, expected = [], []
    for index, values in enumerate(model.shapes):
        inputs = make_inputs(model, onnx_model, values, seed=index)
        try:
            expected.append(dict(zip([o.name for o in reference.get_outputs()], reference.run(None, inputs))))
        except Exception as error:  # noqa: BLE001
            result.update(status="reference error", error=f"at {values}: onnxruntime: {first_line(error)}")
            return result
        runs.append(inputs)
    start = time.perf_counter()
    try:
        relaxweb.build(path, bundle_dir)
    except Exception as error:  # noqa: BLE001 - a build error is a result
        result.update(status="build error", error=first_line(error), build_seconds=round(time.perf_counter() - start, 2))
        return result
    result["build_seconds"] = round(time.perf_counter() - start, 2)
    for where in paths:
        result["paths"][where] = check_path(model, bundle_dir, where, runs, expected)
    first_bad = next((where for where in paths if result["paths"][where]["status"] != "ok"), None)
    result["status"] = result["paths"][first_bad]["status"] if first_bad else "ok"
    if first_bad:
        result["error"] = f"{first_bad}: {result['paths'][first_bad]['error']}"
    result["runs"] = result["paths"][paths[0]]["runs"]
    diffs = [checked["max_abs_diff"] for checked in result["paths"].values() if "max_abs_diff" in checked]
    if diffs:
        result["max_abs_diff"] = max(diffs)
    return result


def run_on(bundle_dir: Path, where: str, runs: list[dict[str, np.ndarray]], batch: dict | None = None):
    """The outputs of each run on one path, one at a time (a generator: an error at a shape
    comes after the shapes before it were compared).  ``batch`` (the "batch" path) gets the
    batch's mode and reason."""
    if where == "batch":
        session = relaxweb.load(bundle_dir, backend="webgpu")
        outputs = session.run_batch(runs)
        report = session.last_batch
        if batch is not None:
            batch.update(mode=report.mode, **({"reason": report.reason} if report.reason else {}),
                         dispatches=report.dispatches, rounds=report.rounds)
        yield from outputs
        return
    if where == "chromium-wasm":
        done = browser_runs(bundle_dir, runs, timeout_s=BROWSER_TIMEOUT_S, webgpu=False)
        if done.backend != "wasm":
            raise relaxweb.RelaxwebError(f"Chromium without WebGPU loaded the bundle on {done.backend}, not wasm")
        yield from done.outputs
        return
    session = relaxweb.load(bundle_dir, backend=where)
    for inputs in runs:
        yield session.run(inputs)


def check_path(model: Model, bundle_dir: Path, where: str, runs: list[dict], expected: list[dict]) -> dict:
    """One path's status (ok, wrong or run error), error, runs and largest difference."""
    checked = {"status": "ok", "runs": []}
    batch: dict = {}
    outputs = run_on(bundle_dir, where, runs, batch) if where == "batch" else run_on(bundle_dir, where, runs)
    for values, want_by_name in zip(model.shapes, expected):
        try:
            actual = next(outputs)
        except Exception as error:  # noqa: BLE001 - a run error is a result
            at = f"batch of {len(runs)}" if where == "batch" else f"at {values}"
            checked.update(status="run error", error=f"{at}: {first_line(error)}")
            break
        run = {"dims": values, "outputs": {}}
        for name, want in want_by_name.items():
            got = actual.get(name)
            run["outputs"][name] = compare(got, want, tolerance(model)) if got is not None else (float("inf"),) * 2
        worst = max(score for _, score in run["outputs"].values())
        run["max_abs_diff"] = max(diff for diff, _ in run["outputs"].values())
        run["error_in_tolerances"] = worst
        checked["runs"].append(run)
        if worst > 1.0 and checked["status"] == "ok":
            name = max(run["outputs"], key=lambda n: run["outputs"][n][1])
            checked.update(status="wrong", error=f"at {values}: output '{name}' max |diff| {run['outputs'][name][0]:.3g}")
    if checked["runs"]:
        checked["max_abs_diff"] = max(run["max_abs_diff"] for run in checked["runs"])
    checked.update(batch)
    return checked


def main(argv: list[str]) -> int:
    path, bundle_dir, name = Path(argv[0]), Path(argv[1]), argv[2]
    paths = tuple(argv[3].split(",")) if len(argv) > 3 else PATHS
    unknown = [where for where in paths if where not in PATHS]
    if unknown:
        print(f"unknown path(s) {', '.join(unknown)}; the paths are {', '.join(PATHS)}", file=sys.stderr)
        return 2
    try:
        result = check(MODELS_BY_NAME[name], path, bundle_dir, paths)
    except Exception as error:  # noqa: BLE001 - the driver records it
        traceback.print_exc()
        result = {"name": name, "status": "check error", "error": first_line(error)}
    print("RESULT " + json.dumps(result, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
