"""onnxruntime's contrib ops (``com.microsoft``) on hand-built models, against onnxruntime.

Each case is a small model with symbolic dims; it runs in the reference interpreter and, built
once into a bundle, on WebGPU (wgpu) and on kernels.wasm at two or more shapes, each compared with onnxruntime's
CPU kernels (the numeric reference of these ops).  The models onnxruntime's transformer
optimizer writes are in ``tests/e2e/test_optimized_models.py``.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.errors import UnsupportedModelError
from tests.helpers import F32, F32_LOOSE, Tolerance, assert_close, build_once, load_bundle, make_model, onnxruntime_outputs, rand

MS = "com.microsoft"
OPSETS = {"": 17, MS: 1}
FLOAT, INT32, INT64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64


def ms_node(op_type: str, inputs, outputs, **attrs):
    return helper.make_node(op_type, list(inputs), list(outputs), domain=MS, **attrs)




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


def check_case(case: Case, backend, folder) -> None:
    """The interpreter and the built bundle on ``backend`` against onnxruntime at every shape."""
    names = [o.name for o in case.model.graph.output]
    session = load_bundle(build_once(case.model, folder, bounds=case.bounds), backend)
    for seed, dims in enumerate(case.shapes):
        feeds = case.feeds(dims, seed)
        expected = case.expected(feeds) if case.expected else onnxruntime_outputs(case.model, feeds)
        reference = relaxweb.run_reference(case.model, feeds)
        actual = session.run(feeds)
        for name, want in zip(names, expected):
            assert_close(reference[name], want, case.tolerance, err_msg=f"interpreter, {name} at {dims}")
            assert_close(actual[name], want, case.tolerance, err_msg=f"{backend}, {name} at {dims}")


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
        # CUDA only in onnxruntime too: left * gelu(right) of x + bias, halved along the last dim
        "BiasSplitGelu": Case(make_model([ms_node("BiasSplitGelu", ["x", "bias"], ["y"])], x_in, ["y"], bias, opset=OPSETS),
                              hidden_feeds("x"), SHAPES, expected=lambda feeds: [_split_gelu(feeds["x"] + bias["bias"])]),
    }


def _split_gelu(biased: np.ndarray) -> np.ndarray:
    left, right = np.split(biased.astype(np.float64), 2, axis=-1)
    erf = np.vectorize(math.erf)
    return (left * 0.5 * right * (1.0 + erf(right / math.sqrt(2.0)))).astype(np.float32)


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
def test_contrib_op_matches_onnxruntime(backend, name: str, tmp_path) -> None:
    check_case(CASES[name], backend, tmp_path / "bundle")


# Attention ---------------------------------------------------------------------------------------

HEADS, HEAD = 2, 8
ATTENTION_SHAPES = [{"batch": 2, "seq": 5, "past": 3}, {"batch": 1, "seq": 1, "past": 4}, {"batch": 3, "seq": 4, "past": 1}]


def padded_mask(batch: int, length: int, dtype=np.int32) -> np.ndarray:
    """1s with a zero tail of growing length per row (every row keeps its first key)."""
    mask = np.ones((batch, length), dtype)
    for row in range(batch):
        mask[row, length - min(row, length - 1):] = 0
    return mask


def attention_cases() -> dict[str, Case]:
    hidden = HEADS * HEAD
    projection = {"weights": rand(hidden, 3 * hidden, seed=11) * 0.5, "bias": rand(3 * hidden, seed=12)}
    x_in = ("x", FLOAT, ["batch", "seq", hidden])
    past_in = ("past", FLOAT, [2, "batch", HEADS, "past", HEAD])

    def feeds(*extra):
        def make(dims, seed):
            batch, seq, past = dims["batch"], dims["seq"], dims["past"]
            values = {"x": rand(batch, seq, hidden, seed=seed)}
            for name in extra:
                if name == "past":
                    values["past"] = rand(2, batch, HEADS, past, HEAD, seed=seed + 1)
                elif name == "mask_total":
                    values["mask"] = padded_mask(batch, past + seq)
                elif name == "mask_seq":
                    values["mask"] = padded_mask(batch, seq)
                elif name == "mask_3d":
                    values["mask"] = (np.random.default_rng(seed).uniform(size=(batch, seq, seq)) > 0.3).astype(np.int32)
                    values["mask"][:, :, 0] = 1
                elif name == "mask_end":
                    values["mask"] = np.array([max(1, seq - row) for row in range(batch)], np.int32)
                elif name == "mask_end_start":
                    ends = [max(1, seq - row) for row in range(batch)]
                    values["mask"] = np.array(ends + [min(row, end - 1) for row, end in enumerate(ends)], np.int32)
                elif name == "attention_bias":
                    values["attention_bias"] = rand(1, HEADS, seq, seq, seed=seed + 2)
            return values

        return make

    def attention(inputs, outputs, extra_inputs, make_feeds, shapes=ATTENTION_SHAPES, **attrs):
        graph_outputs = ["y"] + (["present"] if "present" in outputs else [])
        node = ms_node("Attention", inputs, outputs, num_heads=HEADS, **attrs)
        return Case(make_model([node], [x_in, *extra_inputs], graph_outputs, projection, opset=OPSETS), make_feeds, shapes,
                    F32_LOOSE)

    return {
        "Attention_mask_end_positions": attention(
            ["x", "weights", "bias", "mask"], ["y"], [("mask", INT32, ["batch"])], feeds("mask_end")),
        "Attention_mask_end_positions_checked_length": attention(
            ["x", "weights", "bias", "mask"], ["y"], [("mask", INT32, ["mask_entries"])], feeds("mask_end")),
        "Attention_mask_end_and_start": Case(
            make_model([ms_node("Attention", ["x", "weights", "bias", "mask"], ["y"], num_heads=HEADS)],
                       [("x", FLOAT, [2, "seq", hidden]), ("mask", INT32, [4])], ["y"], projection, opset=OPSETS),
            feeds("mask_end_start"), [{"batch": 2, "seq": 5, "past": 0}, {"batch": 2, "seq": 3, "past": 0}], F32_LOOSE),
        "Attention_raw_mask_past_unidirectional": attention(
            ["x", "weights", "bias", "mask", "past"], ["y", "present"],
            [("mask", INT32, ["batch", "total"]), past_in], feeds("mask_total", "past"), unidirectional=1),
        "Attention_3d_mask_scale": attention(
            ["x", "weights", "bias", "mask"], ["y"], [("mask", INT32, ["batch", "seq", "seq"])], feeds("mask_3d"),
            scale=0.2),
        "Attention_qkv_hidden_sizes_attention_bias": Case(
            make_model([ms_node("Attention", ["x", "weights", "bias", "", "", "attention_bias"], ["y"], num_heads=HEADS,
                                qkv_hidden_sizes=[hidden, hidden, HEADS * 4])],
                       [x_in, ("attention_bias", FLOAT, [1, HEADS, "seq", "seq"])], ["y"],
                       {"weights": projection["weights"][:, : 2 * hidden + HEADS * 4],
                        "bias": projection["bias"][: 2 * hidden + HEADS * 4]}, opset=OPSETS),
            feeds("attention_bias"), ATTENTION_SHAPES, F32_LOOSE),
        "Attention_unidirectional_no_mask_filter_value": attention(
            ["x", "weights", "", "mask"], ["y"], [("mask", INT32, ["batch", "seq"])], feeds("mask_seq"), unidirectional=1,
            mask_filter_value=-1000.0),
    }


def multi_head_attention_cases() -> dict[str, Case]:
    hidden = HEADS * HEAD
    bias = {"bias": rand(3 * hidden, seed=21)}

    def feeds(dims, seed):
        batch, seq, past = dims["batch"], dims["seq"], dims["past"]
        kv = dims.get("kv", seq)
        return {
            "q": rand(batch, seq, hidden, seed=seed), "k": rand(batch, kv, hidden, seed=seed + 1),
            "v": rand(batch, kv, hidden, seed=seed + 2),
            "past_key": rand(batch, HEADS, past, HEAD, seed=seed + 3), "past_value": rand(batch, HEADS, past, HEAD, seed=seed + 4),
            "mask_total": padded_mask(batch, past + seq), "mask_kv": padded_mask(batch, kv),
            "lengths": np.array([max(1, kv - row) for row in range(batch)], np.int32),
            "qkv": rand(batch, seq, HEADS, 3, HEAD, seed=seed + 5), "kv_packed": rand(batch, kv, HEADS, 2, HEAD, seed=seed + 6),
            "k_heads": rand(batch, HEADS, kv, HEAD, seed=seed + 7), "v_heads": rand(batch, HEADS, kv, HEAD, seed=seed + 8),
            "attention_bias": rand(batch, 1, seq, kv, seed=seed + 9),
        }

    def case(inputs, outputs, declared, shapes=ATTENTION_SHAPES, expected=None, **attrs):
        node = ms_node("MultiHeadAttention", inputs, outputs, num_heads=HEADS, **attrs)
        model = make_model([node], declared, [o for o in outputs if o], bias, opset=OPSETS)
        names = {d[0] for d in declared}
        return Case(model, lambda dims, seed: {k: v for k, v in feeds(dims, seed).items() if k in names}, shapes, F32_LOOSE,
                    expected=expected)

    unpacked = make_model([ms_node("MultiHeadAttention", ["q", "k", "v", "bias"], ["y"], num_heads=HEADS)],
                          [("q", FLOAT, ["batch", "seq", hidden]), ("k", FLOAT, ["batch", "kv", hidden]),
                           ("v", FLOAT, ["batch", "kv", hidden])], ["y"], bias, opset=OPSETS)

    def merged(packed: np.ndarray, index: int) -> np.ndarray:
        part = packed[:, :, :, index, :]
        return np.ascontiguousarray(part.reshape(part.shape[0], part.shape[1], -1))

    def unpacked_qkv(values):  # onnxruntime's CPU kernel has no packed layouts: the same attention unpacked
        return onnxruntime_outputs(unpacked, {"q": merged(values["qkv"], 0), "k": merged(values["qkv"], 1),
                                              "v": merged(values["qkv"], 2)})

    def unpacked_kv(values):
        return onnxruntime_outputs(unpacked, {"q": values["q"], "k": merged(values["kv_packed"], 0),
                                              "v": merged(values["kv_packed"], 1)})

    q_in = ("q", FLOAT, ["batch", "seq", hidden])
    kv_in = [("k", FLOAT, ["batch", "kv", hidden]), ("v", FLOAT, ["batch", "kv", hidden])]
    self_kv = [("k", FLOAT, ["batch", "seq", hidden]), ("v", FLOAT, ["batch", "seq", hidden])]
    past = [("past_key", FLOAT, ["batch", HEADS, "past", HEAD]), ("past_value", FLOAT, ["batch", HEADS, "past", HEAD])]
    cross_shapes = [{"batch": 2, "seq": 3, "past": 0, "kv": 6}, {"batch": 1, "seq": 1, "past": 0, "kv": 2}]
    return {
        "MultiHeadAttention_past_raw_mask_unidirectional": case(
            ["q", "k", "v", "bias", "mask_total", "", "past_key", "past_value"], ["y", "present_key", "present_value"],
            [q_in, *self_kv, ("mask_total", INT32, ["batch", "total"]), *past], unidirectional=1),
        "MultiHeadAttention_cross_key_lengths": case(
            ["q", "k", "v", "bias", "lengths"], ["y"], [q_in, *kv_in, ("lengths", INT32, ["batch"])], cross_shapes),
        "MultiHeadAttention_cross_mask_attention_bias": case(
            ["q", "k", "v", "", "mask_kv", "attention_bias"], ["y"],
            [q_in, *kv_in, ("mask_kv", INT32, ["batch", "kv"]), ("attention_bias", FLOAT, ["batch", 1, "seq", "kv"])],
            cross_shapes, scale=0.3),
        "MultiHeadAttention_packed_qkv": case(["qkv", "", "", "bias"], ["y"], [("qkv", FLOAT, ["batch", "seq", HEADS, 3, HEAD])],
                                              expected=unpacked_qkv),
        "MultiHeadAttention_packed_kv": case(
            ["q", "kv_packed", "", "bias"], ["y"], [q_in, ("kv_packed", FLOAT, ["batch", "kv", HEADS, 2, HEAD])], cross_shapes,
            expected=unpacked_kv),
        "MultiHeadAttention_kv_in_heads": case(
            ["q", "k_heads", "v_heads", "bias"], ["y"],
            [q_in, ("k_heads", FLOAT, ["batch", HEADS, "kv", HEAD]), ("v_heads", FLOAT, ["batch", HEADS, "kv", HEAD])],
            cross_shapes),
    }


ATTENTION_CASES = {**attention_cases(), **multi_head_attention_cases()}


@pytest.mark.parametrize("name", sorted(ATTENTION_CASES))
def test_attention_op_matches_onnxruntime(backend, name: str, tmp_path) -> None:
    check_case(ATTENTION_CASES[name], backend, tmp_path / "bundle")


def rotary_cases() -> dict[str, Case]:
    positions, half = 32, 4
    caches = {"cos": np.cos(rand(positions, half, seed=31)), "sin": np.sin(rand(positions, half, seed=32))}
    token_shapes = [{"batch": 2, "seq": 5}, {"batch": 1, "seq": 1}, {"batch": 3, "seq": 7}]

    def feeds(layout):
        def make(dims, seed):
            batch, seq = dims["batch"], dims["seq"]
            rng = np.random.default_rng(seed)
            x = rand(*layout(batch, seq), seed=seed)
            return {"x": x, "ids": rng.integers(0, positions, (batch, seq)).astype(np.int64),
                    "first": np.array([rng.integers(0, positions - seq)], np.int64)}

        return make

    def case(x_shape, layout, ids, interleaved=0, **attrs):
        ids_in = ("ids", INT64, ["batch", "seq"]) if ids == "ids" else ("first", INT64, [1])
        node = ms_node("RotaryEmbedding", ["x", ids, "cos", "sin"], ["y"], interleaved=interleaved, **attrs)
        model = make_model([node], [("x", FLOAT, x_shape), ids_in], ["y"], caches, opset=OPSETS)
        make = feeds(layout)
        return Case(model, lambda dims, seed: {k: v for k, v in make(dims, seed).items() if k in ("x", ids)}, token_shapes)

    return {
        "RotaryEmbedding_3d": case(["batch", "seq", 3 * 2 * half], lambda b, s: (b, s, 3 * 2 * half), "ids", num_heads=3),
        "RotaryEmbedding_3d_interleaved_first_position": case(
            ["batch", "seq", 2 * 2 * half], lambda b, s: (b, s, 2 * 2 * half), "first", interleaved=1, num_heads=2),
        "RotaryEmbedding_4d_interleaved": case(["batch", 2, "seq", 2 * half], lambda b, s: (b, 2, s, 2 * half), "ids",
                                               interleaved=1),
        "RotaryEmbedding_partial": case(["batch", "seq", 2 * 12], lambda b, s: (b, s, 2 * 12), "ids", num_heads=2,
                                        rotary_embedding_dim=2 * half),
    }


ROTARY_CASES = rotary_cases()


@pytest.mark.parametrize("name", sorted(ROTARY_CASES))
def test_rotary_embedding_matches_onnxruntime(backend, name: str, tmp_path) -> None:
    check_case(ROTARY_CASES[name], backend, tmp_path / "bundle")


# GroupQueryAttention -----------------------------------------------------------------------------

GQA_HEADS, GQA_KV_HEADS, GQA_HEAD = 4, 2, 16


def gqa_model(packed: bool = False, with_past: bool = True, seqlens_2d: bool = False, **attrs):
    q_width, kv_width = GQA_HEADS * GQA_HEAD, GQA_KV_HEADS * GQA_HEAD
    inputs = [("query", FLOAT, ["batch", "seq", q_width + 2 * kv_width if packed else q_width])]
    names = ["query", "", ""] if packed else ["query", "key", "value"]
    if not packed:
        inputs += [("key", FLOAT, ["batch", "seq", kv_width]), ("value", FLOAT, ["batch", "seq", kv_width])]
    if with_past:
        inputs += [(n, FLOAT, ["batch", GQA_KV_HEADS, "past", GQA_HEAD]) for n in ("past_key", "past_value")]
        names += ["past_key", "past_value"]
    else:
        names += ["", ""]
    # a [batch, 1] seqlens_k (a ReduceSum with keepdims, as Phi-3's export writes it) reads the same
    inputs += [("seqlens_k", INT32, ["batch", 1] if seqlens_2d else ["batch"]), ("total_sequence_length", INT32, [])]
    names += ["seqlens_k", "total_sequence_length"]
    caches = {}
    if attrs.get("do_rotary"):
        caches = {"cos_cache": np.cos(rand(64, GQA_HEAD // 2, seed=41)), "sin_cache": np.sin(rand(64, GQA_HEAD // 2, seed=42))}
        names += ["cos_cache", "sin_cache"]
    node = ms_node("GroupQueryAttention", names, ["output", "present_key", "present_value"], num_heads=GQA_HEADS,
                   kv_num_heads=GQA_KV_HEADS, **attrs)
    return make_model([node], inputs, ["output", "present_key", "present_value"], caches, opset=OPSETS)


def gqa_feeds(model, batch: int, seq: int, past: int, totals: list[int], seed: int) -> dict:
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value or {"batch": batch, "seq": seq, "past": past}.get(d.dim_param, 0)
                for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rand(*dims, seed=seed + len(feeds))
    feeds["seqlens_k"] = (np.array(totals, np.int32) - 1).reshape(feeds["seqlens_k"].shape)
    feeds["total_sequence_length"] = np.array(max(totals), np.int32)
    return feeds


# (name, model attributes, [(batch, seq, past, each entry's total length)]); on a first prompt
# (past 0) the totals are the prompts' lengths (right padding)
GQA_CASES = {
    "decode": ({}, [(2, 1, 3, [4, 4]), (1, 1, 6, [7]), (1, 2, 2, [4])]),
    "decode_ragged_batch": ({}, [(2, 1, 4, [5, 3]), (3, 1, 2, [3, 2, 1])]),
    "first_prompt_right_padding": ({"with_past": False}, [(2, 5, 0, [5, 3]), (1, 4, 0, [4])]),
    "packed_rotary_local_window": ({"packed": True, "do_rotary": 1, "local_window_size": 3},
                                   [(2, 1, 5, [6, 4]), (1, 3, 4, [7])]),
    "rotary_interleaved_first_prompt": ({"with_past": False, "do_rotary": 1, "rotary_interleaved": 1},
                                        [(2, 4, 0, [4, 2])]),
    "bidirectional_scale": ({"causal": 0, "scale": 0.3}, [(1, 2, 3, [5]), (2, 1, 3, [4, 2])]),
    "seqlens_batch_by_one": ({"seqlens_2d": True}, [(2, 1, 4, [5, 3])]),
    "softcap_local_window": ({"softcap": 0.5, "local_window_size": 2}, [(2, 1, 4, [5, 4]), (1, 3, 4, [7]), (2, 3, 0, [3, 2])]),
}


@pytest.mark.parametrize("name", sorted(GQA_CASES))
def test_group_query_attention_matches_onnxruntime(backend, name: str, tmp_path) -> None:
    """Compared where onnxruntime defines the results: every output row of a real token, and
    the present cache's rows below each entry's total length (the rest is unspecified)."""
    attrs, runs = GQA_CASES[name]
    attrs = dict(attrs)
    model = gqa_model(packed=attrs.pop("packed", False), with_past=attrs.pop("with_past", True),
                      seqlens_2d=attrs.pop("seqlens_2d", False), **attrs)
    session = load_bundle(build_once(model, tmp_path / "bundle"), backend)
    for seed, (batch, seq, past, totals) in enumerate(runs):
        feeds = gqa_feeds(model, batch, seq, past, totals, seed * 10)
        expected = dict(zip(["output", "present_key", "present_value"], onnxruntime_outputs(model, feeds)))
        for where, actual in (("interpreter", relaxweb.run_reference(model, feeds)), (backend, session.run(feeds))):
            for b, total in enumerate(totals):
                rows = seq if past else total  # a padded prompt's tail rows are unspecified
                assert_close(actual["output"][b, :rows], expected["output"][b, :rows], F32_LOOSE,
                             err_msg=f"{where}: output of entry {b} at {(batch, seq, past, totals)}")
                for cache in ("present_key", "present_value"):
                    assert actual[cache].shape == expected[cache].shape
                    assert_close(actual[cache][b, :, :total], expected[cache][b, :, :total], F32,
                                 err_msg=f"{where}: {cache} of entry {b} at {(batch, seq, past, totals)}")


# What is refused ---------------------------------------------------------------------------------


def test_contrib_ops_without_a_converter_are_listed_by_domain_and_node() -> None:
    model = make_model(
        [ms_node("DecoderMaskedSelfAttention", ["x"], ["y"], name="decoder_attention"), ms_node("Gelu", ["y"], ["z"])],
        [("x", FLOAT, ["batch", HIDDEN])], ["z"], opset=OPSETS,
    )
    with pytest.raises(UnsupportedModelError) as raised:
        relaxweb.inspect(model).module  # noqa: B018 - importing is what raises
    assert str(raised.value) == ("the model uses 1 unsupported op type(s): "
                                 "com.microsoft.DecoderMaskedSelfAttention (nodes: decoder_attention)")


@pytest.mark.parametrize("node, inputs, message", [
    (ms_node("Attention", ["x", "weights"], ["y"], num_heads=HEADS, do_rotary=1, name="rotary_attention"),
     [("x", FLOAT, ["batch", "seq", HEADS * HEAD])],
     "com.microsoft.Attention node 'rotary_attention': do_rotary is not supported"),
    (ms_node("MultiHeadAttention", ["x", "x", "x"], ["y", "", "", "qk"], num_heads=HEADS, name="mha"),
     [("x", FLOAT, ["batch", "seq", HEADS * HEAD])], "com.microsoft.MultiHeadAttention node 'mha': the qk output is not supported"),
    (ms_node("GroupQueryAttention", ["x", "x", "x", "", "", "lengths", "total", "", "", "", "bias"], ["y", "k", "v"],
             num_heads=HEADS, kv_num_heads=HEADS, softcap=2.0, name="gqa"),
     [("x", FLOAT, ["batch", "seq", HEADS * HEAD]), ("lengths", INT32, ["batch"]), ("total", INT32, []),
      ("bias", FLOAT, ["batch", HEADS, "seq", "seq"])],
     "com.microsoft.GroupQueryAttention node 'gqa': softcap with an attention_bias input is not supported"),
    (ms_node("RotaryEmbedding", ["x", "ids", "cos", "cos"], ["y"], is_packed_batching=1, name="packed_rope"),
     [("x", FLOAT, ["batch", "seq", 16]), ("ids", INT64, ["batch", "seq"])],
     "com.microsoft.RotaryEmbedding node 'packed_rope': is_packed_batching is not supported"),
])
def test_contrib_attributes_relaxweb_cannot_do_name_the_node(node, inputs, message) -> None:
    initializers = {"weights": rand(HEADS * HEAD, 3 * HEADS * HEAD), "cos": rand(8, 4)}
    used = {name: value for name, value in initializers.items() if name in node.input}
    model = make_model([node], inputs, [o for o in node.output if o], used, opset=OPSETS)
    with pytest.raises(UnsupportedModelError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        relaxweb.inspect(model).module  # noqa: B018


def test_a_mask_longer_than_the_keys_stops_with_the_two_lengths(backend, tmp_path) -> None:
    """The mask names its length on its own ([batch, total]); that it is past + seq is checked
    at run time."""
    case = ATTENTION_CASES["MultiHeadAttention_past_raw_mask_unidirectional"]
    relaxweb.build(case.model, tmp_path / "bundle")
    feeds = case.feeds({"batch": 2, "seq": 3, "past": 2}, 0)
    feeds["mask_total"] = padded_mask(2, 7)
    with pytest.raises(relaxweb.RelaxwebError, match=r"^MultiHeadAttention node 'y': dimension 1 of mask_index is 7, expected 5 \(past \+ seq;"):
        load_bundle(tmp_path / "bundle", backend).run(feeds)
