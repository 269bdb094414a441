"""ONNX ops defined as functions (relaxweb/frontend/function_expansion.py): a node of such an
op without a converter of its own is replaced by its body, checked against onnxruntime on
the GPU at two shapes from one build."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from relaxweb.errors import UnsupportedModelError
from relaxweb.frontend.onnx import from_onnx, op_coverage
from relaxweb.ir.printer import format_function
from tests.helpers import F32_LOOSE, assert_close, build_once, load_bundle, make_model, onnxruntime_outputs, rand




def attention_model():
    """ONNX's own Attention (opset 23: a context-dependent function), causal, grouped heads,
    in the 3-D layout torch's exporter writes."""
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="attention", q_num_heads=4, kv_num_heads=2,
                            is_causal=1)
    return make_model([node], [("q", ["batch", "seq", 32]), ("k", ["batch", "seq", 16]), ("v", ["batch", "seq", 16])],
                      [("y", TensorProto.FLOAT, None)], opset=23, ir_version=10)


def mean_variance_model():
    """MeanVarianceNormalization without its ``axes``: the body reads the schema's default [0, 2, 3]."""
    node = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], name="mvn")
    return make_model([node], [("x", ["batch", 3, "height", 5])], ["y"], opset=13)


def window_model():
    """HannWindow's body casts to its ``output_datatype`` attribute, left at its default
    (float), and the window scales an input."""
    nodes = [helper.make_node("HannWindow", ["size"], ["window"], name="window", periodic=0),
             helper.make_node("Mul", ["x", "window"], ["y"], name="apply")]
    return make_model(nodes, [("x", ["batch", 12])], ["y"], {"size": np.array(12, np.int64)}, opset=17)


CASES = {
    "attention": (attention_model, [
        lambda: {"q": rand(2, 5, 32, seed=1), "k": rand(2, 5, 16, seed=2), "v": rand(2, 5, 16, seed=3)},
        lambda: {"q": rand(1, 9, 32, seed=4), "k": rand(1, 9, 16, seed=5), "v": rand(1, 9, 16, seed=6)},
    ]),
    "mean_variance_default_axes": (mean_variance_model, [
        lambda: {"x": rand(2, 3, 4, 5, seed=1)}, lambda: {"x": rand(1, 3, 7, 5, seed=2)},
    ]),
    "window_default_dtype": (window_model, [
        lambda: {"x": rand(2, 12, seed=1)}, lambda: {"x": rand(5, 12, seed=2)},
    ]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_function_ops_match_onnxruntime_from_one_build(backend, name: str, tmp_path) -> None:
    make, feeds_at = CASES[name]
    model = make()
    session = load_bundle(build_once(model, tmp_path / "bundle"), backend)
    for make_feeds in feeds_at:
        feeds = make_feeds()
        expected = onnxruntime_outputs(model, feeds)[0]
        actual = session.run(feeds)["y"]
        assert actual.shape == expected.shape
        assert_close(actual, expected, F32_LOOSE, err_msg=f"{name} at {[v.shape for v in feeds.values()]}")


def test_body_nodes_are_named_after_the_models_node() -> None:
    """A body's values live in the node's namespace (its first output, then the op)."""
    text = format_function(from_onnx(attention_model()).main)
    assert "y_Attention_" in text and "softmax(" in text


def test_an_op_with_a_converter_keeps_it() -> None:
    """LayerNormalization has a body too, but its converter makes one layer_norm op."""
    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=-1)
    model = make_model([node], [("x", [2, 8])], ["y"], {"scale": np.ones(8, np.float32)}, opset=17)
    text = format_function(from_onnx(model).main)
    assert "layer_norm(" in text and "LayerNormalization" not in text


def test_a_body_with_an_unsupported_op_leaves_the_models_op_in_the_listing() -> None:
    """Bernoulli's body draws with RandomUniformLike (unsupported): the error names Bernoulli."""
    node = helper.make_node("Bernoulli", ["x"], ["y"], name="coin")
    model = make_model([node], [("x", [4])], ["y"], opset=15)
    with pytest.raises(UnsupportedModelError, match=r"^the model uses 1 unsupported op type\(s\): Bernoulli \(nodes: coin\)$"):
        from_onnx(model)
    assert op_coverage(model) == [("Bernoulli", 1, False)]


def test_op_coverage_counts_an_expandable_op_as_supported() -> None:
    assert op_coverage(attention_model()) == [("Attention", 1, True)]
