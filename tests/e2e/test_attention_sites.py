"""The attention sites ``relaxweb inspect`` lists (``passes/fuse_attention.py`` records them,
the manifest's ``attention`` entry carries them, ``api.format_attention`` prints them).

A hand-written model of two attention layers, the first as torch exports it (fused) and the
second whose weights are also a graph output (not fused: the reason says so):

* ``relaxweb inspect MODEL.onnx`` and ``relaxweb inspect DIR`` list both, with the names of
  their nodes; the bundle's manifest validates with the entry (both runtimes' validators:
  tests/conformance/manifest_problems.json has its cases);
* the nodes' names are the model's data: a name with a line break and quotes is in the
  manifest as written and printed escaped on one line;
* a site whose values no node wrote (a module built by hand) names its values instead;
* a model without attention has no entry and prints no listing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import relaxweb
from relaxweb.bundle import write_bundle
from relaxweb.cli import main as cli_main
from relaxweb.compiler import compile_module
from relaxweb.ir import FunctionBuilder, SizeVar, TensorStructInfo
from relaxweb.ir.module import IRModule
from relaxweb.runtime.manifest import validate_manifest
from tests.helpers import make_model

ODD = 'soft"max\nlayer 1'  # a node name with a quote and a line break: data, never code


def two_layer_model():
    """q, k, v [batch, 2, seq, 8]: layer 0 as torch exports it (MatMul, Mul, Add of the mask,
    Softmax, MatMul); layer 1's weights are a graph output too, and its softmax is named ``ODD``."""
    nodes = []
    for layer in (0, 1):
        nodes += [
            helper.make_node("Transpose", ["k"], [f"k_t{layer}"], perm=[0, 1, 3, 2], name=f"/layer{layer}/Transpose"),
            helper.make_node("MatMul", ["q", f"k_t{layer}"], [f"scores{layer}"], name=f"/layer{layer}/MatMul"),
            helper.make_node("Mul", [f"scores{layer}", "scale"], [f"scaled{layer}"], name=f"/layer{layer}/Mul"),
            helper.make_node("Add", [f"scaled{layer}", "mask"], [f"masked{layer}"], name=f"/layer{layer}/Add"),
            helper.make_node("Softmax", [f"masked{layer}"], [f"weights{layer}"], axis=-1,
                             name=ODD if layer else "/layer0/Softmax"),
            helper.make_node("MatMul", [f"weights{layer}", "v"], [f"out{layer}"], name=f"/layer{layer}/MatMul_1"),
        ]
    dims = ["batch", 2, "seq", 8]
    return make_model(nodes, [("q", dims), ("k", dims), ("v", dims), ("mask", ["batch", 1, 1, "seq"])],
                      ["out0", "out1", "weights1"], {"scale": np.array(0.25, np.float32)})


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sites") / "two_layers.onnx"
    path.write_bytes(two_layer_model().SerializeToString())
    return path


EXPECTED = [
    {"status": "fused", "scores": {"node": "/layer0/MatMul"}, "softmax": {"node": "/layer0/Softmax"},
     "output": {"node": "/layer0/MatMul_1"}},
    {"status": "not fused", "reason": "the attention weights (weights1) are also read elsewhere",
     "scores": {"node": "/layer1/MatMul"}, "softmax": {"node": ODD}, "output": {"node": "/layer1/MatMul_1"}},
]


def test_a_bundle_lists_each_site_with_its_nodes(model_file: Path, tmp_path: Path, capsys) -> None:
    bundle = relaxweb.build(model_file, tmp_path / "bundle")
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["attention"] == EXPECTED
    validate_manifest(manifest)
    capsys.readouterr()
    assert cli_main(["inspect", str(tmp_path / "bundle")]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == str(bundle).strip()
    lines = printed.splitlines()
    start = lines.index("attention sites: 2, 1 fused")
    assert lines[start + 1:] == [
        "  0: fused",
        "     scores node '/layer0/MatMul', softmax node '/layer0/Softmax', output node '/layer0/MatMul_1'",
        "  1: not fused: the attention weights (weights1) are also read elsewhere",
        "     scores node '/layer1/MatMul', softmax node 'soft\"max\\nlayer 1', output node '/layer1/MatMul_1'",
    ]


def test_inspect_model_lists_the_same_sites(model_file: Path, capsys) -> None:
    report = relaxweb.inspect(model_file)
    assert list(report.attention) == EXPECTED
    assert str(report).endswith("  1: not fused: the attention weights (weights1) are also read elsewhere\n"
                                "     scores node '/layer1/MatMul', softmax node 'soft\"max\\nlayer 1', "
                                "output node '/layer1/MatMul_1'")
    capsys.readouterr()
    assert cli_main(["inspect", str(model_file)]) == 0
    assert capsys.readouterr().out.strip() == str(report).strip()


def test_a_site_no_node_wrote_names_its_values(tmp_path: Path) -> None:
    """A module built by hand has no model nodes: the entry names the IR's values."""
    b, s = SizeVar("b"), SizeVar("s")
    builder = FunctionBuilder("main")
    q, k, v = (builder.add_param(name, TensorStructInfo((b, 2, s, 8), "float32")) for name in ("q", "k", "v"))
    k_t = builder.emit_op("transpose", k, axes=[0, 1, 3, 2], name_hint="k_t")
    scores = builder.emit_op("matmul", q, k_t, name_hint="scores")
    weights = builder.emit_op("softmax", scores, axes=[3], name_hint="weights")
    out = builder.emit_op("matmul", weights, v, name_hint="out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    manifest = write_bundle(compile_module(module, {}), tmp_path / "bundle", "by hand")
    assert manifest["attention"] == [{"status": "fused", "scores": {"value": "scores"}, "softmax": {"value": "weights"},
                                      "output": {"value": "out"}}]


def test_a_model_without_attention_has_no_entry(tmp_path: Path) -> None:
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", ["n", 4])], ["y"])
    bundle = relaxweb.build(model, tmp_path / "bundle")
    assert "attention" not in bundle.manifest and "attention sites" not in str(bundle)
    assert relaxweb.inspect(model).attention == () and "attention sites" not in str(relaxweb.inspect(model))
