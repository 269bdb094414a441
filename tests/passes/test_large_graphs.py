"""Graphs of real sizes build: long chains fuse into kernels of bounded depth
(a 500-Relu chain used to raise RecursionError in fusion), identical fused kernels are one
kernel, and a 5,000-node chain runs on the GPU with the exact result.

Not timed: ``scripts/build_scaling.py`` measures how build time grows (docs/benchmarks.md, "Build time at scale").
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import relaxweb
from relaxweb.compiler import compile_model
from relaxweb.ir.parser import parse_module
from relaxweb.ir.printer import format_module, module_constants
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.ir.symbolic import IntImm
from relaxweb.ir.tir import (
    Buffer,
    Load,
    TensorProgram,
    expression_depth,
    expression_size,
    maximum,
)
from relaxweb.passes.fuse_ops import MAX_BODY_DEPTH
from tests.helpers import make_model, onnxruntime_outputs

STEP = 1.0 / 1024  # a power of two: x + k * STEP is exact in float32 for the x used here


def chain(count: int, ops: tuple[str, ...] = ("Relu",)) -> onnx.ModelProto:
    """``count`` nodes cycling through ``ops`` ("Add" adds the initializer ``step``), each
    reading the previous one's output."""
    nodes, previous = [], "x"
    for index in range(count):
        op = ops[index % len(ops)]
        output = "y" if index == count - 1 else f"t{index}"
        inputs = [previous, "step"] if op == "Add" else [previous]
        nodes.append(helper.make_node(op, inputs, [output], name=f"{op}_{index}"))
        previous = output
    initializers = {"step": np.array(STEP, dtype=np.float32)} if "Add" in ops else None
    return make_model(nodes, [("x", TensorProto.FLOAT, [4, 8])], ["y"], initializers)


def test_a_500_relu_chain_fuses_into_kernels_of_bounded_depth():
    module = compile_model(chain(500))
    programs = [p for p in module.programs.values() if isinstance(p, TensorProgram)]
    assert len(programs) <= 2  # a full kernel and the rest of the chain
    assert all(expression_depth(p.body) <= MAX_BODY_DEPTH for p in programs)
    assert sum(expression_depth(p.body) - 1 for p in programs) >= MAX_BODY_DEPTH  # both are long chains
    assert 500 / MAX_BODY_DEPTH <= len(module.main.dispatches) <= 2 * 500 / MAX_BODY_DEPTH
    # the text form reads back (Python's parser refuses ~200 nested parentheses)
    assert_structural_equal(parse_module(format_module(module), constants=module_constants(module)), module)


def test_expression_size_and_depth_measure_any_depth():
    """What fusion measures is walked with a stack: deeper than Python's recursion limit."""
    body = Load(Buffer("A", (IntImm(4),), "float32"), (IntImm(0),))
    for _ in range(5000):
        body = maximum(body, 0.0)
    assert expression_depth(body) == 5001
    assert expression_size(body) == 10001


def test_a_5000_node_chain_builds_and_runs_on_the_gpu(tmp_path, device):
    model = chain(5000, ("Add", "Relu"))
    bundle = relaxweb.build(model, tmp_path / "chain")
    assert len(bundle.manifest["kernels"]) <= 4  # identical fused kernels are one kernel
    assert len(bundle.manifest["call_sites"]) <= 2 * 5000 / MAX_BODY_DEPTH
    x = (np.arange(32, dtype=np.float32).reshape(4, 8) - 16) * STEP  # exact in float32
    y = bundle.load(device=device).run({"x": x})["y"]
    np.testing.assert_array_equal(y, np.maximum(x + STEP, 0) + 2499 * STEP)  # relu(v + step), 2500 times
    np.testing.assert_array_equal(y, onnxruntime_outputs(model, {"x": x})[0])
