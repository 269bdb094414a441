"""Models and bundles from strangers: names from a model are data and never reach generated
code as code.

The test builds the same graph twice, once with plain names and once with names that try to
end a comment and inject code into the host module or a shader, and checks that the generated
WAT and WGSL with their comments removed are the same text, and that both bundles compute
the same result at run time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxweb
from relaxweb.browser import run_in_browser
from tests.helpers import in_the_browser, rand

#: Names that end a WAT or WGSL line comment, open or close a block comment, or hold characters
#: outside ASCII: if any reached the code as code, the two bundles' code would differ.
HOSTILE = {
    "input": "x\n(i64.store (i32.const 96) (i64.const 0))\n;;",
    "output": "y\n(i64.store (i32.const 160) (i64.const 3))\n;;",
    "weight": "w\r)) (unreachable) (; */ \u2028 //",
    "dim": "n\n(unreachable)",
    "node": "add\n;; */ </script>",
    "graph": "g\n(func $evil)",
}
PLAIN = {"input": "x", "output": "y", "weight": "w", "dim": "n", "node": "add", "graph": "g"}


def two_step_model(names: dict[str, str]) -> onnx.ModelProto:
    """y = relu(x + w) with every name taken from ``names``."""
    summed = names["node"] + "_sum"
    nodes = [
        helper.make_node("Add", [names["input"], names["weight"]], [summed], name=names["node"]),
        helper.make_node("Relu", [summed], [names["output"]], name=names["node"] + "_relu"),
    ]
    graph = helper.make_graph(
        nodes, names["graph"],
        [helper.make_tensor_value_info(names["input"], TensorProto.FLOAT, [names["dim"], 4])],
        [helper.make_tensor_value_info(names["output"], TensorProto.FLOAT, [names["dim"], 4])],
        [numpy_helper.from_array(np.array([1.0, -2.0, 3.0, -4.0], np.float32), names["weight"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def build(tmp_path: Path, folder: str, names: dict[str, str], file_name: str = "model.onnx") -> Path:
    model_dir = tmp_path / folder
    model_dir.mkdir()
    onnx.save(two_step_model(names), model_dir / file_name)
    out = tmp_path / (folder + "_bundle")
    relaxweb.build(model_dir / file_name, out)
    return out


def code_without_comments(text: str, comment: str) -> list[str]:
    """The lines of generated code with line comments and blank lines removed."""
    lines = (re.sub(re.escape(comment) + ".*", "", line).rstrip() for line in text.splitlines())
    return [line for line in lines if line]


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[Path, Path]:
    tmp_path = tmp_path_factory.mktemp("names")
    plain = build(tmp_path, "plain", PLAIN)
    hostile = build(tmp_path, "hostile", HOSTILE, file_name="m\n(unreachable);;.onnx")
    return plain, hostile


def test_hostile_names_change_no_generated_code(bundles) -> None:
    plain, hostile = bundles
    assert code_without_comments((hostile / "host.wat").read_text(), ";;") == \
        code_without_comments((plain / "host.wat").read_text(), ";;")
    # shaders name the symbolic dims by the IR's sanitized names (letters, digits and _ only)
    renamed = dict(zip((v["name"] for v in manifest(hostile)["symbolic_vars"]),
                       (v["name"] for v in manifest(plain)["symbolic_vars"])))
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) for name in renamed)
    plain_kernels = sorted(p.name for p in (plain / "kernels").iterdir())
    assert plain_kernels == sorted(p.name for p in (hostile / "kernels").iterdir())
    for name in plain_kernels:
        hostile_code = (hostile / "kernels" / name).read_text()
        for old, new in renamed.items():
            hostile_code = re.sub(rf"\b{old}\b", new, hostile_code)
        assert code_without_comments(hostile_code, "//") == \
            code_without_comments((plain / "kernels" / name).read_text(), "//")
    # the names are still shown to people, escaped, on one comment line
    assert "y\\n(i64.store (i32.const 160) (i64.const 3))\\n;;" in (hostile / "host.wat").read_text()


def expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x + np.array([1.0, -2.0, 3.0, -4.0], np.float32), 0)


def test_hostile_names_run_like_plain_ones(bundles) -> None:
    plain, hostile = bundles
    x = rand(2, 4)
    outputs = relaxweb.load(hostile).run({HOSTILE["input"]: x})
    assert list(outputs) == [HOSTILE["output"]]
    np.testing.assert_array_equal(outputs[HOSTILE["output"]], expected(x))
    with pytest.raises(relaxweb.InputShapeError, match="dimension 1"):
        relaxweb.load(hostile).run({HOSTILE["input"]: rand(2, 5)})


@in_the_browser
def test_hostile_names_run_like_plain_ones_in_the_browser(bundles) -> None:
    _, hostile = bundles
    x = rand(3, 4)
    outputs = run_in_browser(hostile, {HOSTILE["input"]: x})
    np.testing.assert_array_equal(outputs[HOSTILE["output"]], expected(x))
