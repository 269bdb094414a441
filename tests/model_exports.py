"""Helpers of tests/e2e/test_models.py: the tiny PyTorch models as scripts/export_test_models.py
exports them (committed in tests/data/test-models/; larger ones, such as GPT-2 small, exported in
a subprocess), find the symbolic variables of an imported function, and run it with a check of
every binding's value against its annotation."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from relaxweb.ir.expr import Function, MatchCast, Var, VarBinding
from relaxweb.ir.functor import iter_bindings
from relaxweb.ir.interpreter import Interpreter
from relaxweb.ir.struct_info import (
    FuncStructInfo, PrimStructInfo, ShapeStructInfo, StructInfo, TensorStructInfo, TupleStructInfo,
)
from relaxweb.ir.symbolic import PrimExpr, evaluate, format_expr, free_vars
from tests.helpers import MODEL

ROOT = Path(__file__).resolve().parents[1]
# seq 1 too: a dim equal to 1 at run time must not be taken for a broadcast dim
TOKEN_SHAPES = [{"batch": 1, "seq": 8}, {"batch": 2, "seq": 5}, {"batch": 3, "seq": 1}]
# odd sizes too: MaxPool(2) floors, and the pooled dims are (height // 2, width // 2)
IMAGE_SHAPES = [
    {"batch": 1, "height": 32, "width": 32}, {"batch": 2, "height": 24, "width": 40}, {"batch": 3, "height": 27, "width": 13},
]

# model -> (its symbolic variables, the shapes it runs at)
MODELS = {
    "gpt2_legacy": ({"batch", "seq"}, TOKEN_SHAPES),
    "gpt2_dynamo": ({"batch", "seq"}, TOKEN_SHAPES),
    "bert_legacy": ({"batch", "seq"}, TOKEN_SHAPES),
    "bert_dynamo": ({"batch", "seq"}, TOKEN_SHAPES),
    "cnn_legacy": ({"batch", "height", "width"}, IMAGE_SHAPES),
    "cnn_dynamo": ({"batch", "height", "width"}, IMAGE_SHAPES),
}

EXPORT_SCRIPT = ROOT / "scripts" / "export_test_models.py"
#: the script's exports of MODELS, with their sidecars (tests/data/test-models/README.md)
COMMITTED = ROOT / "tests" / "data" / "test-models"


@functools.lru_cache(maxsize=None)
def export_script():
    """scripts/export_test_models.py as a module (for its model list and input maker)."""
    spec = importlib.util.spec_from_file_location("export_test_models", EXPORT_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("export_test_models", module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def missing_exporter_packages() -> list[str]:
    return [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]


@dataclass
class Export:
    """The result of exporting one model: its file and sidecar, or why it failed."""

    name: str
    path: Path | None
    sidecar: dict | None
    error: str | None


def export_models(out_dir: Path, names: list[str], timeout: float = 240) -> dict[str, Export]:
    """Run the export script once for all ``names`` (a subprocess: torch stays out of the
    test process); a model whose export failed carries the script's message."""
    command = [sys.executable, str(EXPORT_SCRIPT), str(out_dir), "--keep-going"]
    for name in names:
        command += ["--only", name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    log = done.stdout + done.stderr
    results = {}
    for name in names:
        path, sidecar_path = out_dir / f"{name}.onnx", out_dir / f"{name}.json"
        if path.exists() and sidecar_path.exists():
            results[name] = Export(name, path, json.loads(sidecar_path.read_text()), None)
        else:
            lines = [line for line in log.splitlines() if line.startswith(f"{name}: ")]
            message = lines[-1] if lines else f"no output; the export script said:\n{log[-4000:]}"
            results[name] = Export(name, None, None, message)
    return results


def committed_exports(names: list[str]) -> dict[str, Export]:
    """``names`` (of MODELS) as the export script wrote them, committed in tests/data/test-models/:
    exporting the six in each test session took CI about 20 s of CPU time."""
    return {name: Export(name, COMMITTED / f"{name}.onnx", json.loads((COMMITTED / f"{name}.json").read_text()), None)
            for name in names}


# Symbolic variables of a function ------------------------------------------------------------


def struct_info_exprs(info: StructInfo | None) -> Iterator[PrimExpr]:
    if isinstance(info, TensorStructInfo) and info.shape is not None:
        yield from info.shape
    elif isinstance(info, ShapeStructInfo) and info.values is not None:
        yield from info.values
    elif isinstance(info, PrimStructInfo) and info.value is not None:
        yield info.value
    elif isinstance(info, TupleStructInfo):
        for field in info.fields:
            yield from struct_info_exprs(field)
    elif isinstance(info, FuncStructInfo):
        for param in info.params:
            yield from struct_info_exprs(param)
        yield from struct_info_exprs(info.ret)


def symbolic_vars(function: Function) -> dict[str, str]:
    """Every distinct size variable in the annotations of the parameters and of all bindings
    (inside If branches too, and match_cast targets) -> where it first appears."""
    found: dict[str, str] = {}

    def note(info: StructInfo | None, where: str) -> None:
        for expr in struct_info_exprs(info):
            for var in free_vars(expr):
                found.setdefault(var.name, f"{where}: {info}")

    for param in function.params:
        note(param.struct_info, f"param {param.name}")
    for binding in iter_bindings(function):
        note(binding.var.struct_info, f"binding {binding.var.name}")
        if isinstance(binding, MatchCast):
            note(binding.struct_info, f"match_cast {binding.var.name}")
    return found


# Running with annotation checks ---------------------------------------------------------------


class AnnotationMismatch(AssertionError):
    pass


class CheckingInterpreter(Interpreter):
    """The reference interpreter, also checking each binding's value against its deduced
    annotation (dtype and, where known, every dim), so a wrong deduction names its binding."""

    def visit_var_binding(self, binding: VarBinding) -> None:
        super().visit_var_binding(binding)
        check_annotation(binding.var, self.values[binding.var], self.size_vars)


def check_annotation(var: Var, value, size_vars: dict[str, int]) -> None:
    info = var.struct_info
    if not isinstance(info, TensorStructInfo) or not isinstance(value, np.ndarray):
        return
    if np.dtype(info.dtype) != value.dtype:
        raise AnnotationMismatch(f"binding {var.name}: annotated {info}, the value's dtype is {value.dtype}")
    if info.ndim >= 0 and info.ndim != value.ndim:
        raise AnnotationMismatch(f"binding {var.name}: annotated {info}, the value has shape {value.shape}")
    if info.shape is None:
        return
    for axis, (dim, actual) in enumerate(zip(info.shape, value.shape)):
        unbound = [v.name for v in free_vars(dim) if v.name not in size_vars]
        if unbound:
            continue  # a variable no input or match_cast defines: reported by symbolic_vars
        expected = int(evaluate(dim, size_vars))
        if expected != actual:
            raise AnnotationMismatch(
                f"binding {var.name}: annotated {info}, dim {axis} ({format_expr(dim)}) is {expected} at "
                f"{ {k: v for k, v in size_vars.items()} } but the value has shape {value.shape}"
            )


# Diagnosis: how far a model gets, node by node ------------------------------------------------
#
#     python3 -m tests.model_exports MODELS_DIR [NAME ...]
#
# For each exported model: the unsupported op types; then the convertible part of the graph
# (every node that does not depend on an unsupported one, with all its values as outputs)
# is imported, its symbolic variables listed, and each value compared with onnxruntime at the
# model's test shapes, naming the first node whose value differs.  Only public entry points
# of relaxweb are used (from_onnx, find_unsupported, run_module), so the report keeps
# working while converters land.


def convertible_submodel(model, unsupported_ops: set[str]):
    """The nodes that neither are unsupported nor depend on one; its outputs are the values
    the blocked nodes would read (typed through shape inference) and the graph outputs that
    are still computed.  Returns (submodel, blocked node count)."""
    import onnx
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)}
    blocked_values: set[str] = set()
    kept, blocked_nodes = [], []
    for node in model.graph.node:
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if op in unsupported_ops or any(name in blocked_values for name in node.input if name):
            blocked_values.update(name for name in node.output if name)
            blocked_nodes.append(node)
        else:
            kept.append(node)
    computed = {name for node in kept for name in node.output if name}
    wanted = [name for node in blocked_nodes for name in node.input if name in computed]
    wanted += [o.name for o in model.graph.output if o.name in computed]
    outputs = []
    for name in dict.fromkeys(wanted):
        if name in types and types[name].HasField("tensor_type"):
            value = helper.make_empty_tensor_value_info(name)
            value.type.CopyFrom(types[name])
            outputs.append(value)
    graph = helper.make_graph(kept, model.graph.name, list(model.graph.input), outputs, list(model.graph.initializer))
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return sub, len(blocked_nodes)


def _var_name(onnx_name: str) -> str:
    """The binding name FunctionBuilder.unique_name gives an ONNX value (before de-duplication)."""
    import re

    base = re.sub(r"[^0-9A-Za-z_]", "_", onnx_name) or "v"
    return "v" + base if base[0].isdigit() else base


class CapturingInterpreter(CheckingInterpreter):
    """Also keeps every binding's value by variable name, in binding order."""

    def __init__(self, module) -> None:
        super().__init__(module)
        self.captured: dict[str, object] = {}

    def visit_var_binding(self, binding: VarBinding) -> None:
        super().visit_var_binding(binding)
        self.captured.setdefault(binding.var.name, self.values[binding.var])

    def visit_match_cast(self, binding: MatchCast) -> None:
        super().visit_match_cast(binding)
        self.captured.setdefault(binding.var.name, self.values[binding.var])


def compare_values(model, module, inputs: dict[str, np.ndarray], rtol: float = MODEL.rtol,
                   atol: float = MODEL.atol) -> list[str]:
    """Run ``module`` (the import of ``model``) and onnxruntime (with every node output as an
    extra output); the values that differ, in node order (a binding is matched to the ONNX
    value it is named after)."""
    import onnxruntime as ort
    from onnx import helper

    interpreter = CapturingInterpreter(module)
    try:
        actual = interpreter.run(module.main, inputs)
    except Exception as error:  # noqa: BLE001
        return [f"interpreter: {type(error).__name__}: {error}"]
    probe = type(model)()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    extra = [name for node in probe.graph.node for name in node.output if name and name not in existing]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in extra)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    expected = dict(zip(names, session.run(None, inputs)))
    problems = []

    def check(where: str, got, want) -> None:
        got = np.asarray(got)
        if got.shape != want.shape or got.dtype != want.dtype:
            problems.append(f"{where}: relaxweb {got.dtype}{list(got.shape)}, onnxruntime {want.dtype}{list(want.shape)}")
        elif not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
            diff = np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))
            problems.append(f"{where}: max |diff| {diff:.3g}")

    compared = 0
    for node in model.graph.node:
        for name in node.output:
            var = _var_name(name)
            if name in expected and var in interpreter.captured and isinstance(interpreter.captured[var], np.ndarray):
                compared += 1
                check(f"{node.op_type} node '{node.name}' output '{name}'", interpreter.captured[var], expected[name])
    for value, got in zip(model.graph.output, actual):
        check(f"graph output '{value.name}'", got, expected[value.name])
    compare_values.last_count = compared + len(actual)
    return problems


def diagnose(path: Path, expected_vars: set[str], shapes: list[dict[str, int]], inputs_spec: list) -> list[str]:
    import onnx
    from relaxweb.frontend import from_onnx
    from relaxweb.frontend.onnx import find_unsupported

    lines = []
    model = onnx.load(str(path))
    unsupported = find_unsupported(model)
    if unsupported:
        lines.append(f"unsupported ({len(unsupported)}): " + ", ".join(
            f"{op} x{len(nodes)} [{nodes[0]}{', ...' if len(nodes) > 1 else ''}]" for op, nodes in sorted(unsupported.items())))
        target, blocked = convertible_submodel(model, set(unsupported))
        lines.append(f"convertible part: {len(target.graph.node)} of {len(model.graph.node)} nodes ({blocked} blocked)")
        if not target.graph.output:
            lines.append("nothing to import before the first unsupported node")
            return lines
    else:
        target = model
        lines.append(f"all {len(model.graph.node)} nodes have converters")
    try:
        module = from_onnx(target, path.name)
    except Exception as error:  # noqa: BLE001
        lines.append(f"import error: {type(error).__name__}: {error}")
        return lines
    found = symbolic_vars(module.main)
    fresh = {v: w for v, w in found.items() if v not in expected_vars}
    lines.append(f"symbolic vars: {sorted(found)}" + ("" if not fresh else " FRESH: " + "; ".join(f"{v} first in {w}" for v, w in fresh.items())))
    script = export_script()
    for dims in shapes:
        problems = compare_values(target, module, script.make_inputs(inputs_spec, dims, seed=sum(dims.values())))
        head = f"at {dims}: " + (f"every value matches onnxruntime ({compare_values.last_count} compared)" if not problems else f"{len(problems)} value(s) differ; first: {problems[0]}")
        lines.append(head)
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Diagnose the exported test models (see tests/model_exports.py)")
    parser.add_argument("models_dir", type=Path)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    for name in args.names or list(MODELS):
        path = args.models_dir / f"{name}.onnx"
        sidecar = json.loads((args.models_dir / f"{name}.json").read_text())
        expected, shapes = MODELS[name]
        print(f"== {name}")
        for line in diagnose(path, expected, shapes, sidecar["inputs"]):
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
