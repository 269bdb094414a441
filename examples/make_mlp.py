"""Write examples/mlp.onnx: a 2-layer MLP with a dynamic batch dimension.

    x[batch, 64] -> MatMul + Add + Relu -> [batch, 128] -> Gemm -> [batch, 10] -> Softmax

Weights are random with a fixed seed, so the file is the same on every machine.  Run it as
``python examples/make_mlp.py [OUT.onnx]``; also writes ``mlp_inputs.npz`` (batch 4) next to
the model for ``relaxweb run``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_mlp(in_features: int = 64, hidden: int = 128, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((in_features, hidden)) / np.sqrt(in_features)).astype(np.float32)
    b1 = (rng.standard_normal(hidden) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((classes, hidden)) / np.sqrt(hidden)).astype(np.float32)  # Gemm transB=1
    b2 = (rng.standard_normal(classes) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["fc1.matmul"], name="fc1/MatMul"),
        helper.make_node("Add", ["fc1.matmul", "fc1.bias"], ["fc1.out"], name="fc1/Add"),
        helper.make_node("Relu", ["fc1.out"], ["relu.out"], name="relu"),
        helper.make_node("Gemm", ["relu.out", "fc2.weight", "fc2.bias"], ["logits"], name="fc2/Gemm", transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", in_features])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])],
        initializer=[
            numpy_helper.from_array(w1, "fc1.weight"),
            numpy_helper.from_array(b1, "fc1.bias"),
            numpy_helper.from_array(w2, "fc2.weight"),
            numpy_helper.from_array(b2, "fc2.bias"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="relaxweb-examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("mlp.onnx")
    onnx.save(make_mlp(), str(out))
    inputs = {"x": np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)}
    np.savez(out.with_name("mlp_inputs.npz"), **inputs)
    print(f"wrote {out} and {out.with_name('mlp_inputs.npz')}")


if __name__ == "__main__":
    main()
