"""onnxruntime's contrib ops (``com.microsoft``) on hand-built models, against onnxruntime.

Each case is a small model with symbolic dims; it runs in the reference interpreter and, built
once into a bundle, on WebGPU (wgpu) at two or more shapes, each compared with onnxruntime's
CPU kernels (the numeric reference of these ops).  The models onnxruntime's transformer
optimizer writes are in ``tests/test_optimized_models.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.errors import UnsupportedModelError
from tests.helpers import F32, F32_LOOSE, Tolerance, assert_close, make_model, rand

MS = "com.microsoft"
OPSETS = {"": 17, MS: 1}
FLOAT, INT32, INT64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64


def ms_node(op_type: str, inputs, outputs, **attrs):
    return helper.make_node(op_type, list(inputs), list(outputs), domain=MS, **attrs)


def onnxruntime_outputs(model, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@dataclass
class Case:
    """A model, and a function making its inputs at each of ``shapes`` (dicts of dim values)."""

    model: object
    feeds: Callable[[dict, int], dict]
    shapes: list[dict]
    tolerance: Tolerance = F32
    bounds: dict = field(default_factory=dict)
    # the expected outputs where onnxruntime's CPU provider has no kernel (BiasAdd: CUDA only)
    expected: Callable[[dict], list] | None = None


def check_case(case: Case, device, folder) -> None:
    """The interpreter and the built bundle on WebGPU against onnxruntime at every shape."""
    names = [o.name for o in case.model.graph.output]
    relaxweb.build(case.model, folder, bounds=case.bounds)
    session = relaxweb.load(folder, device=device)
    for seed, dims in enumerate(case.shapes):
        feeds = case.feeds(dims, seed)
        expected = case.expected(feeds) if case.expected else onnxruntime_outputs(case.model, feeds)
        reference = relaxweb.run_reference(case.model, feeds)
        actual = session.run(feeds)
        for name, want in zip(names, expected):
            assert_close(reference[name], want, case.tolerance, err_msg=f"interpreter, {name} at {dims}")
            assert_close(actual[name], want, case.tolerance, err_msg=f"WebGPU, {name} at {dims}")


SHAPES = [{"batch": 2, "seq": 5}, {"batch": 1, "seq": 1}, {"batch": 3, "seq": 8}]
HIDDEN = 16


def hidden_feeds(*names: str, hidden: int = HIDDEN):
    def feeds(dims, seed):
        return {name: rand(dims["batch"], dims["seq"], hidden, seed=seed * 10 + i) for i, name in enumerate(names)}

    return feeds


def weights(seed: int, **shapes) -> dict[str, np.ndarray]:
    return {name: rand(*shape, seed=seed + i) for i, (name, shape) in enumerate(shapes.items())}


def activation_cases() -> dict[str, Case]:
    x_in = [("x", FLOAT, ["batch", "seq", HIDDEN])]
    bias = weights(1, bias=(HIDDEN,))
    return {
        "Gelu": Case(make_model([ms_node("Gelu", ["x"], ["y"])], x_in, ["y"], opset=OPSETS), hidden_feeds("x"), SHAPES),
        "BiasGelu": Case(make_model([ms_node("BiasGelu", ["x", "bias"], ["y"])], x_in, ["y"], bias, opset=OPSETS),
                         hidden_feeds("x"), SHAPES),
        "FastGelu": Case(make_model([ms_node("FastGelu", ["x", "bias"], ["y"])], x_in, ["y"], bias, opset=OPSETS),
                         hidden_feeds("x"), SHAPES),
        "FastGelu_no_bias": Case(make_model([ms_node("FastGelu", ["x"], ["y"])], x_in, ["y"], opset=OPSETS),
                                 hidden_feeds("x"), SHAPES),
        "QuickGelu": Case(make_model([ms_node("QuickGelu", ["x"], ["y"], alpha=1.5)], x_in, ["y"], opset=OPSETS),
                          hidden_feeds("x"), SHAPES),
        "QuickGelu_default_alpha": Case(make_model([ms_node("QuickGelu", ["x"], ["y"])], x_in, ["y"], opset=OPSETS),
                                        hidden_feeds("x"), SHAPES),
        "BiasAdd": Case(make_model([ms_node("BiasAdd", ["x", "bias", "skip"], ["y"])],
                                   x_in + [("skip", FLOAT, ["batch", "seq", HIDDEN])], ["y"], bias, opset=OPSETS),
                        hidden_feeds("x", "skip"), SHAPES,
                        expected=lambda feeds: [feeds["x"] + bias["bias"] + feeds["skip"]]),
    }


def fused_matmul_cases() -> dict[str, Case]:
    cases = {}
    # A [batch, 4, seq, 8] @ B [batch, 4, 8, seq] with the transposes folded in
    layouts = {
        "plain": ({}, [4, "seq", 8], [4, 8, 6]),
        "transA_transB_alpha": ({"transA": 1, "transB": 1, "alpha": 0.125}, [4, 8, "seq"], [4, 6, 8]),
        "transBatchA": ({"transBatchA": 1}, ["seq", 4, 8], [4, 8, 6]),
        "transBatchB_transB": ({"transBatchB": 1, "transB": 1}, [4, "seq", 8], [6, 4, 8]),
        "transBatchA_transA": ({"transBatchA": 1, "transA": 1}, [8, 4, "seq"], [4, 8, 6]),
    }
    for name, (attrs, a_shape, b_shape) in layouts.items():
        model = make_model([ms_node("FusedMatMul", ["a", "b"], ["y"], **attrs)],
                           [("a", FLOAT, a_shape), ("b", FLOAT, b_shape)], ["y"], opset=OPSETS)

        def feeds(dims, seed, a_shape=a_shape, b_shape=b_shape):
            concrete = lambda shape: [dims["seq"] if d == "seq" else d for d in shape]  # noqa: E731
            return {"a": rand(*concrete(a_shape), seed=seed), "b": rand(*concrete(b_shape), seed=seed + 1)}

        cases[f"FusedMatMul_{name}"] = Case(model, feeds, SHAPES, F32_LOOSE)
    return cases


def normalization_cases() -> dict[str, Case]:
    hidden_in = [("x", FLOAT, ["batch", "seq", HIDDEN]), ("skip", FLOAT, ["batch", "seq", HIDDEN])]
    norm_weights = {"gamma": rand(HIDDEN, seed=3), "beta": rand(HIDDEN, seed=4), "bias": rand(HIDDEN, seed=5)}
    every = ["y", "mean", "inv_std", "sum"]
    cases = {
        "SkipLayerNormalization": Case(
            make_model([ms_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], every, epsilon=1e-5)],
                       hidden_in, every, norm_weights, opset=OPSETS),
            hidden_feeds("x", "skip"), SHAPES, F32_LOOSE),
        "SkipLayerNormalization_no_beta_bias": Case(
            make_model([ms_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["y", "", "", "sum"])],
                       hidden_in, ["y", "sum"], {"gamma": norm_weights["gamma"]}, opset=OPSETS),
            hidden_feeds("x", "skip"), SHAPES, F32_LOOSE),
        "SkipLayerNormalization_broadcast_skip": Case(
            make_model([ms_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"])],
                       [hidden_in[0], ("skip", FLOAT, ["seq", HIDDEN])], ["y"],
                       {k: norm_weights[k] for k in ("gamma", "beta")}, opset=OPSETS),
            lambda dims, seed: {"x": rand(dims["batch"], dims["seq"], HIDDEN, seed=seed),
                                "skip": rand(dims["seq"], HIDDEN, seed=seed + 1)},
            SHAPES, F32_LOOSE),
        "SkipSimplifiedLayerNormalization": Case(
            make_model([ms_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma", "bias"],
                                ["y", "", "inv_std", "sum"], epsilon=1e-6)],
                       hidden_in, ["y", "inv_std", "sum"], {k: norm_weights[k] for k in ("gamma", "bias")}, opset=OPSETS),
            hidden_feeds("x", "skip"), SHAPES, F32_LOOSE),
        "SimplifiedLayerNormalization": Case(
            make_model([helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y", "inv_std"], epsilon=1e-6)],
                       hidden_in[:1], ["y", "inv_std"], {"gamma": norm_weights["gamma"]}, opset=OPSETS),
            hidden_feeds("x"), SHAPES, F32_LOOSE),
        "SimplifiedLayerNormalization_axis1": Case(
            make_model([helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["y"], axis=1)],
                       hidden_in[:1], ["y"], {"gamma": rand(1, HIDDEN, seed=6)}, opset=OPSETS),
            hidden_feeds("x"), [{"batch": 2, "seq": 1}, {"batch": 3, "seq": 1}], F32_LOOSE),
    }
    vocab, positions = 20, 32
    embed_weights = {"words": rand(vocab, HIDDEN, seed=7), "positions": rand(positions, HIDDEN, seed=8),
                     "segments": rand(2, HIDDEN, seed=9), "gamma": norm_weights["gamma"], "beta": norm_weights["beta"]}

    def embed_feeds(dims, seed, with_positions=False):
        rng = np.random.default_rng(seed)
        batch, seq = dims["batch"], dims["seq"]
        mask = np.ones((batch, seq), np.int32)
        for row in range(batch):
            mask[row, seq - min(row, seq - 1):] = 0
        feeds = {"ids": rng.integers(0, vocab, (batch, seq)).astype(np.int32),
                 "segment_ids": rng.integers(0, 2, (batch, seq)).astype(np.int32), "mask": mask}
        if with_positions:
            feeds["position_ids"] = rng.integers(0, positions, (batch, seq)).astype(np.int32)
        return feeds

    token_inputs = [("ids", INT32, ["batch", "seq"]), ("segment_ids", INT32, ["batch", "seq"]), ("mask", INT32, ["batch", "seq"])]
    cases["EmbedLayerNormalization"] = Case(
        make_model([ms_node("EmbedLayerNormalization",
                            ["ids", "segment_ids", "words", "positions", "segments", "gamma", "beta", "mask"],
                            ["y", "mask_index", "embedding_sum"], epsilon=1e-5)],
                   token_inputs, ["y", ("mask_index", INT32, None), "embedding_sum"], embed_weights, opset=OPSETS),
        embed_feeds, SHAPES, F32_LOOSE)
    cases["EmbedLayerNormalization_position_ids"] = Case(
        make_model([ms_node("EmbedLayerNormalization",
                            ["ids", "", "words", "positions", "", "gamma", "beta", "", "position_ids"], ["y", "mask_index"])],
                   token_inputs[:1] + [("position_ids", INT32, ["batch", "seq"])], ["y", ("mask_index", INT32, None)],
                   embed_weights, opset=OPSETS),
        lambda dims, seed: {k: v for k, v in embed_feeds(dims, seed, True).items() if k in ("ids", "position_ids")},
        SHAPES, F32_LOOSE)
    return cases


CASES = {**activation_cases(), **fused_matmul_cases(), **normalization_cases()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_contrib_op_matches_onnxruntime(name: str, device, tmp_path) -> None:
    check_case(CASES[name], device, tmp_path / "bundle")
